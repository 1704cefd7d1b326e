"""The books of a SLURM sweep: which (row, seed) pairs are done, queued or running (a job SLURM still holds), and
which to submit; the run directory of each.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from aiayn.ablations.presets import get_preset
from aiayn.ablations.table import get_row
from aiayn.common.errors import UserError
from aiayn.lightning_modules.data.corpora import canonical_corpus
from aiayn.lightning_modules.run.rundir import OutDir, RunDir
from aiayn.sweeps import books
from aiayn.sweeps.slurm.options import SlurmOptions


def pairs(opts: SlurmOptions) -> list[tuple[str, int]]:
    preset = get_preset(opts.train.preset)
    if opts.kind == "train":
        return [(get_row(opts.train.row, opts.train.table).row, opts.train.seed)]  # unknown: names the rows there are
    return opts.select.pairs(preset, opts.train.table)


def corpus_of(opts: SlurmOptions) -> str:
    return canonical_corpus(opts.train.data) if opts.train.data else get_preset(opts.train.preset).corpus


def out_of(opts: SlurmOptions) -> OutDir:
    return OutDir(Path(opts.train.out).resolve())


def run_of(opts: SlurmOptions, row: str, seed: int) -> RunDir:
    return out_of(opts).run(get_preset(opts.train.preset).name, corpus_of(opts), row, seed)


def live_jobs() -> set[str]:
    """This user's job ids SLURM still holds (pending, running, requeued), array tasks one by one (`123_4`)."""
    if shutil.which("squeue") is None:
        return set()
    proc = subprocess.run(["squeue", "--me", "-h", "-r", "-o", "%i"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"squeue failed ({proc.stderr.strip()[:200]}); check that the SLURM controller is up")
    return set(proc.stdout.split())


def claims(opts: SlurmOptions, live=live_jobs) -> books.SlurmClaims:
    """Which array task holds which pair (OUT/slurm/pairs/), alive while SLURM holds the task."""
    return books.SlurmClaims(out_of(opts), "pair", live)


def key_of(opts: SlurmOptions, row: str, seed: int) -> str:
    return books.pair_key(get_preset(opts.train.preset).name, corpus_of(opts), row, seed)


def marker(opts: SlurmOptions, row: str, seed: int) -> Path:
    return claims(opts).marker(key_of(opts, row, seed))


def job_of(opts: SlurmOptions, row: str, seed: int) -> str | None:
    return claims(opts).job(key_of(opts, row, seed))


def classify(opts: SlurmOptions, todo: list[tuple[str, int]], live: set[str]) -> dict[str, list]:
    """Split pairs into completed, in SLURM (queued or running) and pending (to submit), by the books every
    back end keeps (sweeps/books.py)."""
    held = books.SlurmClaims(out_of(opts), "pair", lambda: live)
    found = books.states(out_of(opts), get_preset(opts.train.preset).name, corpus_of(opts), todo, held)
    out = {"completed": [], "in_slurm": [], "pending": []}
    for s in found:
        out["completed" if s.state == "completed" else "in_slurm" if s.state == "running" else "pending"].append(s.pair)
    return out
