"""The books of a SLURM sweep: which (row, seed) pairs of the sweep it is handed are done, queued or running (a job
SLURM still holds), and which to submit.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from aiayn.ablations.presets import get_preset
from aiayn.ablations.table import get_row
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json, read_json
from aiayn.sweeps.backends import Sweep
from aiayn.sweeps.backends.slurm.options import SlurmOptions
from aiayn.sweeps.books import Claims
from aiayn.sweeps.folders import SweepOut


class SlurmClaims(Claims):
    """An array task holds the pair it was submitted for while SLURM holds the task (queued, running or
    requeued); OUT/slurm/pairs/PREFIX-KEY.json names the task."""

    def __init__(self, out: SweepOut, prefix: str, live: Callable[[], set[str]]):
        self.out, self.prefix, self._live, self._cache = out, prefix, live, None

    def marker(self, key: str) -> Path:
        return self.out.backend("slurm") / "pairs" / f"{self.prefix}-{key}.json"

    def record(self, key: str, job: str, script: str) -> None:
        atomic_write_json(self.marker(key), {"job": job, "script": script, "submitted": time.time()})

    def job(self, key: str) -> str | None:
        try:
            return read_json(self.marker(key), 1 << 16)["job"]
        except (OSError, ValueError, KeyError):
            return None

    def holder(self, key: str) -> dict | None:
        job = self.job(key)
        if job is None:
            return None  # never submitted: no need to ask SLURM
        if self._cache is None:
            self._cache = self._live()
        if job not in self._cache:
            return None
        try:
            since = read_json(self.marker(key), 1 << 16).get("submitted")
        except (OSError, ValueError):
            since = None
        return {"holder": f"SLURM job {job}", "since": since}


def pairs(opts: SlurmOptions) -> list[tuple[str, int]]:
    """The pairs the options ask for (`aiayn slurm train`: its one row and seed; table3: its selection), from which
    the sweep is made, once (backends.make_sweep): everything below works on that sweep."""
    preset = get_preset(opts.train.preset)
    if opts.kind == "train":
        return [(get_row(opts.train.row, opts.train.table).row, opts.train.seed)]  # unknown: names the rows there are
    return opts.select.pairs(preset, opts.train.table)


def live_jobs() -> set[str]:
    """This user's job ids SLURM still holds (pending, running, requeued), array tasks one by one (`123_4`)."""
    if shutil.which("squeue") is None:
        return set()
    proc = subprocess.run(["squeue", "--me", "-h", "-r", "-o", "%i"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"squeue failed ({proc.stderr.strip()[:200]}); check that the SLURM controller is up")
    return set(proc.stdout.split())


def claims(sweep: Sweep, live=live_jobs) -> SlurmClaims:
    """Which array task holds which pair of `sweep` (OUT/slurm/pairs/), alive while SLURM holds the task."""
    return SlurmClaims(sweep.out, "pair", live)


def marker(sweep: Sweep, row: str, seed: int) -> Path:
    return claims(sweep).marker(sweep.pair_key(row, seed))


def job_of(sweep: Sweep, row: str, seed: int) -> str | None:
    return claims(sweep).job(sweep.pair_key(row, seed))


def classify(sweep: Sweep, todo: list[tuple[str, int]], live: set[str]) -> dict[str, list]:
    """Split pairs into completed, in SLURM (queued or running) and pending (to submit), by the books every
    back end keeps (sweeps/books.py), at the steps the sweep wants of each row."""
    found = sweep.states(claims(sweep, lambda: live), todo)
    out = {"completed": [], "in_slurm": [], "pending": []}
    for s in found:
        out["completed" if s.state == "completed" else "in_slurm" if s.state == "running" else "pending"].append(s.pair)
    return out
