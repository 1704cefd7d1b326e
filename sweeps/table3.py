"""`aiayn table3`: every selected (row, seed) of Table 3 trained once, the books kept by sweeps/books.py, the pairs
run by a back end (sweeps/backends.py: `local` by default, `subprocess` for runs on several devices or GPUs of
their own), then the report.

Re-running the same command skips completed pairs and retries failed ones; two drivers on one storage run each
pair once; a pair left running by a dead worker is run again (sweeps/books.py says how each is known).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from aiayn.ablations.presets import MAIN_PRESET, get_preset
from aiayn.ablations.selection import Selection
from aiayn.common.errors import UserError
from aiayn.common.options import option
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.sweeps.backends import Backend, Sweep, backend_for, make_sweep
from aiayn.sweeps.backends.processes import visible_gpus

log = logging.getLogger(__name__)


@dataclass
class SweepOptions:
    """`aiayn table3`: which pairs (`select`), how each trains (`train`: every `aiayn train` option but
    the row and seed, which the sweep sets), where the books and the report go, how many at once."""

    select: Selection = field(default_factory=Selection)
    storage: str | None = option(None, "Optuna storage URL (default: sqlite:///OUT/optuna.db)")
    report: str | None = option(None, "report directory (default: OUT/reports; '' for none)")
    jobs: int | None = option(
        None, "training runs at once, sharing the CPU cores (default: the preset's; tiny: 2)", positive=True
    )
    gpus_per_job: int | None = option(
        None, "GPUs each of the --jobs runs trains on, its own (disjoint CUDA_VISIBLE_DEVICES); sets --devices "
        "(default: 1 each when a GPU is visible for each run)",
        positive=True, metavar="K",
    )  # fmt: skip
    backend: str | None = option(
        None, "what runs the pairs: local (forked from this driver) or subprocess (a fresh `aiayn train` each); "
        "default: local, subprocess for DDP or --gpus-per-job",
    )  # fmt: skip
    fail_on_diverged: bool = option(
        False, "exit 1 when a run diverged, as when one failed (default: a diverged run is a result, reported as "
        "such, and the exit status is 0)",
    )  # fmt: skip
    # the main job without --preset: the evidence regime at a fixed budget, one seed (ablations/presets.py, `quick`)
    train: TrainOptions = field(default_factory=lambda: TrainOptions(progress=False, preset=MAIN_PRESET))


def exit_status(summary: dict, fail_on_diverged: bool = False) -> int:
    """A sweep's exit status for scripts: 0 when every pair it ran completed, 1 when one failed (or diverged, with
    `fail_on_diverged`). Usage errors (2) never get this far."""
    return int(bool(summary.get("failed")) or (fail_on_diverged and bool(summary.get("diverged"))))


def summary_line(summary: dict, opts: SweepOptions) -> str:
    """What `aiayn table3` prints when its sweep ends: completed, failed and diverged of what it ran."""
    return (f"table3 {opts.train.preset}: {summary['completed']} completed, {summary['failed']} failed, "
            f"{summary.get('diverged', 0)} diverged of {summary['ran']} run ({summary['pairs']} pairs in the table)"
            f"; `aiayn status {opts.train.out}` lists each pair")  # fmt: skip


def build_sweep(opts: SweepOptions) -> Sweep:
    """The sweep resolved once: its pairs, and each row's spec (the runs get theirs from here)."""
    preset = get_preset(opts.train.preset)
    jobs = preset.sweep_jobs if opts.jobs is None else opts.jobs
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}; pass --jobs 1 or more")
    sweep = make_sweep(opts.select.pairs(preset, opts.train.table), opts.train, storage=opts.storage, jobs=jobs)
    sweep.gpus_per_job = gpus_per_job(opts, jobs)
    return sweep


def gpus_per_job(opts: SweepOptions, jobs: int) -> int | None:
    """--gpus-per-job, or 1 when the sweep sees a GPU: each of its concurrent one-device runs gets one of its own,
    or, with more runs than GPUs, a share of one (round robin: sweeps/backends/processes.py); N runs at once would
    otherwise all land on cuda:0."""
    t = opts.train
    if opts.gpus_per_job is not None or t.accelerator == "cpu" or t.world_size > 1:
        return opts.gpus_per_job
    return 1 if visible_gpus() else None


def cell_options(opts: SweepOptions) -> list[SweepOptions]:
    """The sweeps `aiayn table3` runs: the preset's, then each of its cells' (`Preset.cells`: a suite such as
    `evidence` with its data-limited cell), each on its own corpus with its own scored rows and seed counts; seeds
    from the same --first-seed, and --seeds/--base-seeds where given. A selection of rows (--rows, --extended) is
    about the preset's own table, so it runs that preset alone."""
    preset = get_preset(opts.train.preset)
    out = [opts]
    if opts.select.rows is not None or opts.select.extended or not preset.cells:
        if preset.cells:
            log.info("--rows/--extended select rows of %s alone: its cells (%s) are not run", preset.name,
                     ", ".join(preset.cells))  # fmt: skip
        return out
    for name in preset.cells:
        select = replace(opts.select, rows=None, extended=False)
        out.append(replace(opts, select=select, train=replace(opts.train, preset=name, data=None, data_dir=None)))
    return out


def run_table3(opts: SweepOptions, backend: Backend | None = None) -> dict:
    """Run what is pending with `backend` (default: the one each sweep needs), the preset's sweep then its cells';
    return a summary of them all (`cells`: each sweep's own)."""
    sweeps = [build_sweep(o) for o in cell_options(opts)]  # every cell resolved before any run
    backends = [backend or backend_for(o.backend, s) for o, s in zip(cell_options(opts), sweeps)]
    for b, s in zip(backends, sweeps):
        b.check(s)
    summaries = [b.launch(s, s.pairs) for b, s in zip(backends, sweeps)]
    if len(summaries) == 1:
        return summaries[0]
    total = {k: sum(int(x.get(k, 0) or 0) for x in summaries) for k in ("completed", "failed", "diverged", "ran",
                                                                          "pairs")}  # fmt: skip
    return {**total, "cells": {s.key: x for s, x in zip(sweeps, summaries)}}
