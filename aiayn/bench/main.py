"""`aiayn bench`'s entry: the model beside its peers (run.py), or with --trainer Lightning's loop beside the bare
step (trainer.py)."""

from __future__ import annotations

from aiayn.bench import BenchOptions
from aiayn.common.errors import UserError


def bench(opts: BenchOptions) -> None:
    """Run the benchmark `opts` asks for; torch is imported by the module that runs it."""
    if opts.residual_dtype == "bf16" and opts.trainer:
        raise UserError("--residual-dtype is the bare step's (aiayn bench without --trainer); drop one")
    if opts.trainer:
        from aiayn.bench.trainer import main
    else:
        from aiayn.bench.run import main
    main(opts)
