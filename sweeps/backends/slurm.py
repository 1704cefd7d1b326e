"""The `slurm` back end: a SLURM job array, one task per pending pair (`aiayn slurm table3`), built from the sweep and
the SLURM options (sweeps/slurm/ writes the script and keeps the books); SLURM holds a pair's claim while it holds
the array task."""

from __future__ import annotations

import logging

from aiayn.common.errors import UserError
from aiayn.lightning_modules.run.rundir import OutDir
from aiayn.sweeps import books
from aiayn.sweeps.backends import Backend, Sweep, make_sweep, register
from aiayn.sweeps.books import Pair

log = logging.getLogger(__name__)


@register
class SlurmBackend(Backend):
    """`aiayn slurm table3|train`: `opts` are its own options (resources, --dry-run, --wait)."""

    name = "slurm"

    def __init__(self, opts):
        self.opts = opts

    @classmethod
    def from_options(cls, opts) -> tuple[SlurmBackend, Sweep]:
        """The back end and the sweep it runs, from `aiayn slurm`'s options: the sweep resolved once, here."""
        from aiayn.sweeps import slurm

        slurm.check(opts)
        return cls(opts), make_sweep(slurm.pairs(opts), opts.train)

    def claims(self, sweep: Sweep) -> books.Claims:
        from aiayn.sweeps import slurm

        return slurm.claims(self.opts)

    @classmethod
    def status_claims(cls, out: OutDir) -> books.Claims:
        return books.SlurmClaims(out, "pair", _live_jobs_or_none)

    def check(self, sweep: Sweep) -> None:
        from aiayn.sweeps import slurm

        slurm.check(self.opts)

    def launch(self, sweep: Sweep, pairs: list[Pair]) -> dict:
        from aiayn.sweeps import slurm

        return slurm.submit(self.opts, pairs, sweep.specs)


def _live_jobs_or_none() -> set[str]:
    from aiayn.sweeps.slurm import live_jobs

    try:
        return live_jobs()
    except UserError as e:  # squeue failed: every SLURM-held pair shows as not held, and the user is told why
        log.warning("%s; SLURM tasks are shown as not running", e)
        return set()


def summary_text(summary: dict, opts) -> str:
    """What `aiayn slurm` prints of a launch (`summary`, SlurmBackend.launch's) for its options `opts` (SlurmOptions):
    the pairs, queued or submitted, the job and script, the disk estimate and the report's job, as # lines."""
    dry = opts.dry_run
    lines = [f"# slurm {opts.kind} {opts.train.preset}: {summary['pairs']} pairs, {summary['completed']} completed, "
             f"{summary['in_slurm']} queued or running, {summary['pending']} "
             f"{'to submit (dry run: nothing submitted)' if dry else 'submitted'}"
             + (f"; job {summary['job']}, script {summary['script']}" if summary["job"] else "")
             + (f"; script {summary['script']}" if dry and summary["script"] else "")]  # fmt: skip
    if summary.get("disk"):
        lines.append(f"# {summary['disk']}")
    if summary.get("report_job"):
        lines.append(f"# report: job {summary['report_job']} writes it when the array has ended "
                     f"(--dependency=afterany:{summary['job']}); script {summary['report_script']}")  # fmt: skip
    elif summary.get("report_script") and dry:
        lines.append(f"# report: script {summary['report_script']}, submitted after the array with "
                     f"`sbatch --dependency=afterany:<array job> {summary['report_script']}`")  # fmt: skip
    return "\n".join(lines)
