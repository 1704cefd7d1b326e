"""The `slurm` back end: a SLURM job array, one task per pending pair (`aiayn slurm table3`), built from the sweep and
the SLURM options (sweeps/slurm.py writes the script and keeps the books); SLURM holds a pair's claim while it holds
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
