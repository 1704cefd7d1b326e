"""`aiayn bench`'s entry: the model beside its peers (run.py), or with --trainer Lightning's loop beside the bare
step (trainer.py), or with --pack K seeds packed beside the K stepped one after another (packed.py)."""

from __future__ import annotations

from aiayn.bench import BenchOptions
from aiayn.common.errors import UserError


def bench(opts: BenchOptions) -> None:
    """Run the benchmark `opts` asks for; torch is imported by the module that runs it."""
    if opts.trainer and opts.pack:
        raise UserError("--trainer and --pack are two benches; pass one")
    if opts.residual_dtype != "fp32" and (opts.trainer or opts.pack):
        raise UserError("--residual-dtype is the bare step's (aiayn bench without --trainer or --pack); drop one")
    if opts.trainer:
        from aiayn.bench.trainer import main
    elif opts.pack:
        from aiayn.bench.packed import main
    else:
        from aiayn.bench.run import main
    main(opts)
