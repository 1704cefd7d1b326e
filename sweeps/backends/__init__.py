"""Sweep back ends: what runs the (row, seed) pairs a sweep owes. One interface (`Backend`: claims, launch, status),
one set of books for all (sweeps/books.py), and a registry (`BACKENDS`): a back end is one module of this package
with one class under `@register` (as fairseq's `register_model`), found by `load()` without an import added by hand.

- `local` (local.py): each pair in a process forked from a forkserver that has imported Lightning once, `--jobs` at
  a time, each on its share of the CPU threads (or its GPU).
- `subprocess` (processes.py): each pair as a fresh `python -m aiayn train` process: what a run that starts DDP
  ranks needs (Lightning starts the other ranks by re-running the command line), and a run on GPUs of its own.
- `slurm` (slurm.py): a SLURM job array, one task per pair (`aiayn slurm table3`), built from the sweep and the
  SLURM options (sweeps/slurm/).

The first two share Optuna's queue (queue.py: `QueueBackend`). Every back end is built from the `Sweep` (resolved
once by its driver) plus its own options, and a run that trains in a process of its own is handed the driver's
`RunSpec` in a file (`write_resolved`), never the row again. `aiayn status` asks every registered back end who
holds a pair (`Backend.status_claims`).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from aiayn.ablations.presets import Preset, get_preset
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json
from aiayn.common.secrets import redact
from aiayn.lightning_modules.data.corpora import canonical_corpus, corpus_dirname
from aiayn.lightning_modules.run import loggers
from aiayn.lightning_modules.run.options import TrainOptions, resolved_run
from aiayn.lightning_modules.run.rundir import OutDir, RunMetrics
from aiayn.lightning_modules.run.spec import RunSpec, resolve
from aiayn.sweeps import books
from aiayn.sweeps.books import Pair, PairState

log = logging.getLogger(__name__)


@dataclass
class Sweep:
    """What a sweep is, resolved once by the driver: where its runs go, its preset and corpus, its pairs, the
    options every run trains with (`train`, row and seed set per pair), and each row's spec."""

    out: OutDir
    preset: Preset
    corpus: str
    pairs: list[Pair]
    train: TrainOptions
    specs: dict[str, RunSpec]
    storage: str | None = None  # Optuna storage URL (queue back ends)
    jobs: int = 1  # pairs at once (queue back ends)
    gpus_per_job: int | None = None

    @property
    def key(self) -> str:
        return f"{self.preset.name}-{corpus_dirname(self.corpus)}"

    def pair_key(self, row: str, seed: int) -> str:
        return books.pair_key(self.preset.name, self.corpus, row, seed)

    def run_options(self, row: str, seed: int) -> TrainOptions:
        return replace(self.train, row=row, seed=seed, progress=False)

    def failed(self, row: str, seed: int, error: str) -> RunMetrics:
        return RunMetrics(row=row, seed=seed, preset=self.preset.name, status="failed", data=self.corpus,
                          error=redact(error))  # fmt: skip


class Backend(ABC):
    """Runs a sweep's pairs. `claims` tells the books who holds a pair; `launch` runs (or submits) the pending
    pairs and returns a summary; `status` is every pair's state, the same for every back end."""

    name: ClassVar[str]
    needs_only_the_sweep: ClassVar[bool] = False  # True: `aiayn table3 --backend NAME` can build it (no options)

    def claims(self, sweep: Sweep) -> books.Claims:
        return books.LockClaims(sweep.out, "pair")

    @abstractmethod
    def launch(self, sweep: Sweep, pairs: list[Pair]) -> dict:
        """Run (or submit) `pairs`; return {"ran", "completed", "failed", ...}."""

    def status(self, sweep: Sweep) -> list[PairState]:
        return books.states(sweep.out, sweep.preset.name, sweep.corpus, sweep.pairs, self.claims(sweep))

    def check(self, sweep: Sweep) -> None:  # noqa: B027 (optional: a back end that can run anything refuses nothing)
        """Refuse what this back end cannot do, before anything is written (a UserError)."""

    @classmethod
    def status_claims(cls, out: OutDir) -> books.Claims:
        """Who holds which pair under `out` by this back end's books, read without its options (`aiayn status`)."""
        return books.LockClaims(out, "pair")


def make_sweep(pairs: list[Pair], train: TrainOptions, *, storage: str | None = None, jobs: int = 1) -> Sweep:
    """The sweep of `pairs`, resolved once: each row's spec (the runs get theirs from here, whatever runs them)."""
    preset = get_preset(train.preset)
    loggers.of(train)  # an unknown logger or a missing package: said once, not by every run
    t = train
    specs = {row: resolve(row, preset, tables=t.table, overrides=t.overrides, corpus=t.data, vocab_size=t.vocab_size)
             for row in dict.fromkeys(row for row, _ in pairs)}  # fmt: skip
    corpus = canonical_corpus(t.data) if t.data else preset.corpus  # hf:./local as an absolute path, as the runs say
    return Sweep(OutDir(t.out), preset, corpus, pairs, t, specs, storage, jobs)


def write_resolved(path: Path, spec: RunSpec, driver: str) -> Path:
    """The row as this driver resolved it, for a process of its own to train (lightning_modules/run/options.py)."""
    return atomic_write_json(path, resolved_run(spec.to_dict(), driver))


BACKENDS: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Make a back end known by its name (a class decorator: the one line a new back end adds). Two back ends of
    one name are a programming error, said when the second is imported."""
    known = BACKENDS.get(cls.name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"two sweep back ends are named {cls.name!r}: {known.__module__}.{known.__qualname__} and "
                         f"{cls.__module__}.{cls.__qualname__}")  # fmt: skip
    BACKENDS[cls.name] = cls
    return cls


def load() -> dict[str, type[Backend]]:
    """Every back end of this package, by name: each module of it is imported once, and registers its own."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return BACKENDS


def status_claims(out: OutDir) -> books.Claims:
    """Who holds which pair under `out`, by the books of every back end (`aiayn status`)."""
    kinds = {}
    for cls in load().values():
        claims = cls.status_claims(out)
        kinds.setdefault((type(claims), getattr(claims, "prefix", None)), claims)  # the queue back ends share one
    return books.AnyClaims(*kinds.values())


def backend_for(name: str | None, sweep: Sweep) -> Backend:
    """`--backend NAME` for `aiayn table3` (a back end that needs nothing but the sweep), or the one a sweep needs:
    a fresh process per pair for DDP runs and runs on GPUs of their own, else the local forkserver."""
    if name is None:
        name = "subprocess" if sweep.train.world_size > 1 or sweep.gpus_per_job else "local"
    own = {n: cls for n, cls in load().items() if cls.needs_only_the_sweep}
    if name not in own:
        other = f" (`aiayn {name} table3` runs that one, with its own options)" if name in BACKENDS else ""
        raise UserError(f"unknown back end {name!r} for aiayn table3{other}; choose one of {', '.join(own)}")
    return own[name]()
