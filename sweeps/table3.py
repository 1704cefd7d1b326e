"""`aiayn table3`: every selected (row, seed) of Table 3 trained once, the books kept by sweeps/books.py, the pairs
run by a back end (sweeps/backends.py: `local` by default, `subprocess` for runs on several devices or GPUs of
their own), then the report.

Re-running the same command skips completed pairs and retries failed ones; two drivers on one storage run each
pair once; a pair left running by a dead worker is run again (sweeps/books.py says how each is known).
"""

from __future__ import annotations

import functools
import logging
import typing
from dataclasses import dataclass, field, make_dataclass, replace
from pathlib import Path

from aiayn.ablations.presets import MAIN_PRESET, get_preset
from aiayn.ablations.selection import Selection
from aiayn.common.commands import Command
from aiayn.common.errors import UserError
from aiayn.common.options import LIMITS, option
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.sweeps.backends import (
    Backend,
    BackendNames,
    Sweep,
    SweepSummary,
    backend_for,
    backend_help,
    command_of,
    load,
    make_sweep,
)
from aiayn.sweeps.backends.processes import visible_gpus
from aiayn.sweeps.books import report_dir
from aiayn.sweeps.run import check_launches, run_and_report

log = logging.getLogger(__name__)


# Options a sweep sets for each of its runs, not the user (`aiayn table3` and the back ends' commands do not take
# them), and the flags of those options, each answered with what to use instead.
PER_RUN = ("train.row", "train.seed", "train.progress")
SWEEP_SETS = (
    ("--row", "choose the rows with --rows"),
    ("--seed", "choose the seeds with --seeds and --first-seed"),
    ("--progress", "its runs print one line each as they end"),
    ("--no-progress", "its runs print one line each as they end, without progress bars"),
)


@dataclass
class SweepOptions:
    """`aiayn table3`: which pairs (`select`), how each trains (`train`: every `aiayn train` option but
    the row and seed, which the sweep sets), where the books and the report go, how many at once."""

    # --help's sections (the run options' own follow, from TrainOptions)
    OPTION_GROUPS: typing.ClassVar = (
        ("the sweep", ("storage", "report", "fail_on_diverged", "log_interval", "dry_run")),
        ("back end", ("backend", "jobs", "gpus_per_job")),
    )

    select: Selection = field(default_factory=Selection)
    storage: str | None = option(None)
    """Optuna storage URL (default: sqlite:///OUT/optuna.db)"""
    report: str | None = option(None)
    """report directory (default: OUT/reports; '' for none)"""
    jobs: int | None = option(None, positive=True, at_most=LIMITS["jobs"])
    """training runs at once, sharing the CPU cores (default: the preset's; tiny: 2)"""
    gpus_per_job: int | None = option(None, positive=True, metavar="K")
    """GPUs each of the --jobs runs trains on, its own (disjoint CUDA_VISIBLE_DEVICES); sets --devices (default: 1 each
    when a GPU is visible for each run)"""
    # the registry's back ends, with their help (one with options of its own, slurm, takes them too: `aiayn table3
    # --backend slurm` is `aiayn slurm table3`, whose --help lists them: `options_for`)
    backend: str | None = option(None, help=backend_help(), choices=BackendNames())
    fail_on_diverged: bool = option(False)
    """exit 1 when a run diverged, as when one failed (default: a diverged run is a result, reported as such, and the
    exit status is 0)"""
    log_interval: float = option(60.0, metavar="S")
    """seconds between the sweep's lines on its pairs under way, one per pair: its step of its budget, its last training
    loss, its pace and the training left at it (fairseq's --log-interval); 0: none"""
    dry_run: bool = option(False)
    """list every pair of the sweep and what this command would do with it (run, extend a run capped by an earlier
    --max-steps, leave a done one, wait for a running one), then stop: nothing is trained or written"""
    # the main job without --preset: the evidence regime at a fixed budget, one seed (ablations/presets.py, `quick`)
    train: TrainOptions = field(default_factory=lambda: TrainOptions(progress=False, preset=MAIN_PRESET))


@functools.cache
def options_for(backend: type[Backend]) -> type:
    """The options of `aiayn table3 --backend NAME` for a back end with options of its own: the sweep's and the back
    end's as one dataclass (its command skips those the back end refuses: `backend_commands`), so that
    --help, --config and --print-config cover both and a config file says `backend: NAME`. The sweep's run options
    default as `aiayn table3`'s, but for what the back end sets otherwise (`train_defaults`)."""
    train = SweepOptions().train
    if backend.train_defaults:
        train = replace(train, **backend.train_defaults)
    own = [
        ("train", TrainOptions, field(default_factory=lambda: replace(train))),
        (
            "backend",
            str,
            option(
                backend.name,
                help=f"the sweep's back end: this command is `aiayn table3 --backend {backend.name}`",
                choices=(backend.name,),
            ),
        ),
    ]
    return make_dataclass(f"{backend.__name__}SweepOptions", own, bases=(backend.options, SweepOptions))


def refused(backend: type[Backend]) -> tuple[str, ...]:
    """The options of the sweep that `backend`'s command does not take (Backend.refuses)."""
    return tuple(name for name, _, _ in backend.refuses)


def run_backend(backend: type[Backend], opts, write_report=None) -> int:
    """`aiayn table3 --backend NAME` for a back end with options of its own: its own command where it has one
    (`run_command`: SLURM's array), else the sweep as `aiayn table3` runs it, by this back end built from `opts`."""
    own = getattr(backend, "run_command", None)
    if own is not None:
        return own(opts, write_report)
    return table3(opts, write_report, backend=backend(opts))


def backend_commands(report_writer) -> tuple[Command, ...]:
    """`aiayn NAME table3`, which `aiayn table3 --backend NAME` (or `backend: NAME` in its --config) is, for each
    registered back end with options of its own: built from the registry, so that a back end with an option is one
    folder and no edit here or in aiayn/cli.py. `report_writer(train)`: the report's writer (reports/options.py)."""

    def runner(cls):
        return lambda opts, args: run_backend(cls, opts, report_writer(opts.train))

    return tuple(
        Command(
            command_of(name),
            f"`aiayn table3 --backend {name}`: the sweep with the back end's own options",
            options_for(cls),
            runner(cls),
            skip=PER_RUN + refused(cls),
            sets=SWEEP_SETS,
            refuses=tuple((flag, why) for _, flag, why in cls.refuses),
        )
        for name, cls in sorted(load().items())
        if cls.options is not None
    )


def build_sweep(opts: SweepOptions) -> Sweep:
    """The sweep resolved once: its pairs, and each row's spec (the runs get theirs from here)."""
    preset = get_preset(opts.train.preset)
    jobs = preset.sweep_jobs if opts.jobs is None else opts.jobs
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}; pass --jobs 1 or more")
    sweep = make_sweep(opts.select.pairs(preset, opts.train.table), opts.train, storage=opts.storage, jobs=jobs)
    sweep.gpus_per_job = gpus_per_job(opts, jobs)
    if opts.log_interval < 0:
        raise UserError(f"--log-interval {opts.log_interval:g}: pass a number of seconds, or 0 for no progress lines")
    sweep.log_interval = opts.log_interval
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
            log.info(
                "--rows/--extended select rows of %s alone: its cells (%s) are not run",
                preset.name,
                ", ".join(preset.cells),
            )
        return out
    for name in preset.cells:
        select = replace(opts.select, rows=None, extended=False)
        out.append(replace(opts, select=select, train=replace(opts.train, preset=name, data=None, data_dir=None)))
    return out


def launches(opts: SweepOptions, backend: Backend | None = None) -> list[tuple[Backend, Sweep]]:
    """(back end, sweep) for the preset's sweep and each of its cells', every one resolved before any runs; the back
    end `backend`, `--backend`'s, or the one each sweep needs (sweeps/backends: by capabilities)."""
    sweeps = [(o, build_sweep(o)) for o in cell_options(opts)]
    return [(backend or backend_for(o.backend, s), s) for o, s in sweeps]


def run_table3(opts: SweepOptions, backend: Backend | None = None) -> SweepSummary:
    """Run what is pending (the preset's sweep, then its cells'); what happened, counted over all of them."""
    pairs = launches(opts, backend)
    check_launches(pairs)
    return SweepSummary.total([b.launch(s, s.pairs) for b, s in pairs])


# what a dry run says it would do with a pair in each state of the books
_WOULD = {
    "completed": "done",
    "short": "extend",
    "running": "running elsewhere",
    "failed": "run again",
    "diverged": "run again",
    "pruned": "run again",
    "pending": "run",
}


def dry_run_text(pairs: list[tuple[Backend, Sweep]]) -> str:
    """`aiayn table3 --dry-run`: per sweep, its pairs and what the command would do with each, from the books at the
    steps it wants; nothing is trained or written."""
    lines = []
    for backend, sweep in pairs:
        found = backend.status(sweep)
        todo = {}
        for p in found:
            todo[_WOULD[p.state]] = todo.get(_WOULD[p.state], 0) + 1
        counts = ", ".join(f"{n} {what}" for what, n in todo.items())
        lines.append(
            f"table3 {sweep.preset.name} on {sweep.corpus} ({backend.name}, {sweep.jobs} at a time, into "
            f"{sweep.out.root}): {len(found)} pairs: {counts}"
        )
        width = max((len(p.row) for p in found), default=4)
        for p in found:
            steps = sweep.wanted[p.row]
            if p.state == "short":
                what = f"trained {p.steps} of {steps} steps"
            elif p.state == "completed":
                what = f"{p.steps} steps" + (f", dev BLEU {p.dev_bleu:.2f}" if p.dev_bleu is not None else "")
            elif p.state == "running":
                what = f"held by {p.holder}"
            else:
                what = f"{steps} steps" + (f"; last time: {p.state}: {p.error}" if p.error else "")
            lines.append(f"  {p.row:<{width}}  seed {p.seed:<3} {_WOULD[p.state]:<17}  {what}".rstrip())
    return "\n".join(lines) + "\n"


def table3(opts: SweepOptions, write_report=None, backend: Backend | None = None) -> int:
    """`aiayn table3`: the output and report folders and the storage checked before anything runs, then the sweep,
    its report (`write_report(out, report_dir, preset)`, handed over by the command line) and the exit status
    (sweeps/run.py)."""
    from aiayn.common.files import check_writable_dir
    from aiayn.sweeps.storage import check_driver, check_url

    check_writable_dir(opts.train.out, "--out")
    report = report_dir(opts.report, opts.train.out)
    if report:
        check_writable_dir(report, "--report")
    if opts.dry_run:  # the real run's checks (folders, storage, budgets, what the back end cannot do), then its plan
        if opts.storage:
            check_url(opts.storage, creates=Path(opts.train.out))
            check_driver(opts.storage)  # the real run opens it; a missing driver is refused there
        pairs = launches(opts, backend)
        check_launches(pairs)
        print(dry_run_text(pairs), end="")
        return 0
    if opts.storage:
        check_url(opts.storage, creates=Path(opts.train.out))  # before the sweep takes its setup lock under --out
    writer = (lambda: write_report(opts.train.out, report, opts.train.preset)) if report and write_report else None
    return run_and_report(launches(opts, backend), write_report=writer, fail_on_diverged=opts.fail_on_diverged)
