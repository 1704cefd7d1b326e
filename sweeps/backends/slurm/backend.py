"""The `slurm` back end: a SLURM job array, one task per pending pair, built from the sweep and SLURM's own options
(SlurmOptions: the resources, --dry-run, --wait); SLURM holds a pair's claim while it holds the array task. Reached as
`aiayn table3 --backend slurm ...` or `aiayn slurm table3 ...` (the same command)."""

from __future__ import annotations

import logging

from aiayn.common.errors import UserError
from aiayn.sweeps import books
from aiayn.sweeps.backends import Backend, Capabilities, Sweep, SweepSummary, make_sweep, register
from aiayn.sweeps.backends.slurm.checks import check
from aiayn.sweeps.backends.slurm.options import (
    FOLLOW_RESOURCES,
    REFUSED,
    SlurmOptions,
    SlurmSweepOptions,
    slurm_options,
    with_accelerator,
)
from aiayn.sweeps.backends.slurm.pairs import SlurmClaims, claims, live_jobs, pairs
from aiayn.sweeps.backends.slurm.submit import submit
from aiayn.sweeps.books import Pair
from aiayn.sweeps.folders import SweepOut

log = logging.getLogger(__name__)


@register
class SlurmBackend(Backend):
    """a SLURM job array, one task per pending pair, requeued on preemption (its options: `--backend slurm --help`)"""

    name = "slurm"
    options = SlurmSweepOptions
    capabilities = Capabilities(
        ddp=True,
        own_gpus=True,
        no_trials="its job array is the sweep's pairs, fixed when it "
        "is submitted, and a trial's parameters are chosen as the trial starts",
    )
    refuses = REFUSED
    train_defaults = FOLLOW_RESOURCES

    def __init__(self, opts: SlurmOptions):
        self.opts = opts

    @classmethod
    def from_options(cls, opts: SlurmOptions) -> tuple[SlurmBackend, Sweep]:
        """The back end and the sweep it runs, from its options: the sweep resolved once, here."""
        opts = with_accelerator(opts)
        todo = pairs(opts)  # an unknown preset, row or group, or --seeds 0
        check(opts)
        return cls(opts), make_sweep(todo, opts.train)

    @classmethod
    def run_command(cls, opts, write_report=None) -> int:
        """`aiayn table3 --backend slurm` (`aiayn slurm table3`): the sweep's options and SLURM's as one array."""
        return slurm(slurm_options(opts), write_report)

    def claims(self, sweep: Sweep) -> books.Claims:
        return claims(sweep)

    @classmethod
    def status_claims(cls, out: SweepOut) -> books.Claims:
        return SlurmClaims(out, "pair", _live_jobs_or_none)

    def check(self, sweep: Sweep) -> None:
        check(self.opts)

    def launch(self, sweep: Sweep, pairs: list[Pair]) -> SweepSummary:
        return submit(self.opts, sweep, pairs)

    def summary_lines(self, summary: SweepSummary, sweep: Sweep) -> list[str]:
        """The script (a dry run), the pairs queued or submitted, the job and script, the disk estimate and the
        report's job, as # lines; with --wait, each pair's result."""
        d, opts = summary.details, self.opts
        dry = opts.dry_run
        lines = [d["text"].rstrip("\n")] if dry and d.get("text") else []
        lines.append(
            f"# slurm {opts.kind} {opts.train.preset}: {summary.pairs} pairs, {summary.completed} completed, "
            f"{d['in_slurm']} queued or running, {d['pending']} "
            f"{'to submit (dry run: nothing submitted)' if dry else 'submitted'}"
            + (f"; job {d['job']}, script {d['script']}" if d.get("job") else "")
            + (f"; script {d['script']}" if dry and d.get("script") else "")
        )
        if d.get("disk"):
            lines.append(f"# {d['disk']}")
        if d.get("report_job"):
            lines.append(
                f"# report: job {d['report_job']} writes it when the array has ended "
                f"(--dependency=afterany:{d['job']}); script {d['report_script']}"
            )
        elif d.get("report_script") and dry:
            lines.append(
                f"# report: script {d['report_script']}, submitted after the array with "
                f"`sbatch --dependency=afterany:<array job> {d['report_script']}`"
            )
        lines += [f"{pair}: {status}" for pair, status in summary.results.items()]
        return lines

    def report_now(self, summary: SweepSummary) -> bool:
        """With --wait, once something completed; otherwise the report is a job that runs after the array."""
        return "completed" in summary.results.values()


def _live_jobs_or_none() -> set[str]:
    try:
        return live_jobs()
    except UserError as e:  # squeue failed: every SLURM-held pair shows as not held, and the user is told why
        log.warning("%s; SLURM tasks are shown as not running", e)
        return set()


def slurm(opts: SlurmOptions, write_report=None) -> int:
    """`aiayn slurm table3|train` (and `aiayn table3 --backend slurm`): the array submitted (or written, with
    --dry-run), its report a job after it, or written here after --wait, and the exit status (sweeps/run.py)."""
    from aiayn.sweeps.books import report_dir
    from aiayn.sweeps.run import run_and_report

    backend, sweep = SlurmBackend.from_options(opts)  # checked, and the rows resolved once
    report = report_dir(opts.report, opts.train.out) if opts.kind == "table3" else None
    writer = (lambda: write_report(opts.train.out, report, opts.train.preset)) if report and write_report else None
    return run_and_report([(backend, sweep)], write_report=writer, fail_on_diverged=opts.fail_on_diverged)
