"""`aiayn bench`'s entry: the model beside its peers (run.py), or with --trainer Lightning's loop beside the bare
step (trainer.py)."""

from __future__ import annotations

from aiayn.bench import BenchOptions


def bench(opts: BenchOptions) -> None:
    """Run the benchmark `opts` asks for; torch is imported by the module that runs it."""
    if opts.trainer:
        from aiayn.bench.trainer import main
    else:
        from aiayn.bench.run import main
    main(opts)
