"""Sweep back ends: what runs the (row, seed) pairs a sweep owes. One interface (`Backend`: check, claims, launch,
status), one set of books for all (sweeps/books.py), and a registry (`BACKENDS`): a back end is one module or package
of this folder with one class under `@register` (as torchtune's recipe registry and fairseq's `register_model`;
`register` refuses a class that is not a Backend, and a second of one name), found by `load()` without an import
added by hand. What a back end can do is declared as data (`Capabilities`), as are its own options (`options`, a
dataclass beside the sweep's), so that `aiayn table3 --backend NAME` and `--backend`'s help
and completion come from the registry, and the choice of a back end for a sweep is a lookup, not code.

- `local` (local.py): each pair in a process forked from a forkserver that has imported Lightning once, `--jobs` at
  a time, each on its share of the CPU threads (or its GPU).
- `subprocess` (processes.py): each pair as a fresh `python -m aiayn train` process: what a run that starts DDP
  ranks needs (Lightning starts the other ranks by re-running the command line), and a run on GPUs of its own.
- `slurm` (slurm/): a SLURM job array, one task per pair, built from the sweep and SLURM's options; it keeps its own
  books of which array task holds a pair (its folder OUT/slurm, `SweepOut.backend`).

The first two share Optuna's queue (queue.py: `QueueBackend`). Every back end is built from the `Sweep` (resolved
once by its driver) plus its own options, and a run that trains in a process of its own is handed the driver's
`RunSpec` in a file (`write_resolved`), never the row again. `launch` returns a `SweepSummary`; "sweep, then report,
then the exit status" is sweeps/run.py's, once for every back end. `aiayn status` asks every registered back end who
holds a pair (`Backend.status_claims`).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from aiayn.ablations.presets import Preset, get_preset
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json
from aiayn.common.secrets import redact
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run import loggers
from aiayn.lightning_modules.run.options import TrainOptions, resolved_run
from aiayn.lightning_modules.run.rundir import RunDir, RunMetrics
from aiayn.lightning_modules.run.spec import RunSpec, resolve, run_corpus, sweep_key
from aiayn.sweeps import books
from aiayn.sweeps.books import Pair, PairState
from aiayn.sweeps.folders import SweepOut

log = logging.getLogger(__name__)


@dataclass
class Sweep:
    """What a sweep is, resolved once by the driver: where its runs go, its preset and corpus, its pairs, the
    options every run trains with (`train`, row and seed set per pair), and each row's spec."""

    out: SweepOut
    preset: Preset
    corpus: CorpusRef
    pairs: list[Pair]
    train: TrainOptions
    specs: dict[str, RunSpec]
    storage: str | None = None  # Optuna storage URL (queue back ends)
    jobs: int = 1  # pairs at once (queue back ends)
    gpus_per_job: int | None = None
    log_interval: float = 60.0  # seconds between the driver's lines on the pairs under way (queue back ends; 0: none)

    @property
    def key(self) -> str:
        return sweep_key(self.preset.name, self.corpus)

    def pair_key(self, row: str, seed: int) -> str:
        return books.pair_key(self.preset.name, self.corpus, row, seed)

    def run(self, row: str, seed: int) -> RunDir:
        """The run directory of a pair: OUT/PRESET/CORPUS/ROW/seedS."""
        return self.out.run(self.preset.name, self.corpus, row, seed)

    def run_options(self, row: str, seed: int) -> TrainOptions:
        return replace(self.train, row=row, seed=seed, progress=False)

    @property
    def wanted(self) -> dict[str, int]:
        """row -> the steps this sweep trains it to: `--max-steps`, else the row's budget at the preset."""
        return {row: self.train.max_steps or spec.train_steps for row, spec in self.specs.items()}

    def states(self, claims: books.Claims, pairs: list[Pair] | None = None) -> list[PairState]:
        """Each pair's state in the books (`pairs`, default every pair), at the steps this sweep wants (a run
        completed at fewer is `short`)."""
        return books.states(
            self.out, self.preset.name, self.corpus, self.pairs if pairs is None else pairs, claims, self.wanted
        )

    def check_budgets(self) -> None:
        """A pair completed at more steps than this sweep asks (a full run under a later `--max-steps 60`) cannot be
        shortened: one line naming the flag, before anything runs (a sweep never reports a table of another budget
        as this one)."""
        longer = books.longer_than_wanted(self.out, self.preset.name, self.corpus, self.pairs, self.wanted)
        if longer:
            (row, seed), path, steps = longer[0]
            flag = f"--max-steps {self.train.max_steps}" if self.train.max_steps else f"the budget {self.wanted[row]}"
            raise UserError(
                f"{row} seed {seed} already trained {steps} steps in {path}; {flag} asks for "
                f"{self.wanted[row]}, and a run cannot be shortened ({len(longer)} run(s) so): pass "
                "another --out for a shorter look, or drop --max-steps"
            )

    def record(self, backend: str) -> None:
        """Write the pairs this sweep owes into the books (OUT/sweeps/KEY.json), where `aiayn status` finds the sweep
        before any of its runs has a directory: each back end's `launch` does so before its pairs start."""
        books.record_sweep(self.out, self.preset.name, self.corpus, self.pairs, backend)

    def failed(self, row: str, seed: int, error: str) -> RunMetrics:
        return RunMetrics(
            row=row, seed=seed, preset=self.preset.name, status="failed", data=self.corpus.name, error=redact(error)
        )


@dataclass(frozen=True)
class Capabilities:
    """What a back end can do, as data (a sweep's back end is chosen by them: `backend_for`)."""

    ddp: bool = False  # trains runs of several devices (DDP ranks start as fresh processes of their own)
    own_gpus: bool = False  # hands each concurrent run GPUs of its own (--gpus-per-job)
    default: bool = False  # what a sweep uses when it needs nothing more
    # how it runs `aiayn hpo`'s trials (sweeps/hpo.py): "here" (one after another in the search's process), "processes"
    # (each in a fresh process, --jobs at once, reporting to the study's storage), None (it cannot: its reason)
    trials: str | None = None
    no_trials: str = ""


@dataclass
class SweepSummary:
    """What a launch did, the same for every back end: the table's pairs, the runs it ran and how each ended, the
    pairs another driver holds (`elsewhere`), each pair's result where the back end waited for them (`results`), and
    what a back end says of itself (`details`: SLURM's job, script, disk estimate, report job)."""

    pairs: int = 0
    ran: int = 0
    completed: int = 0
    failed: int = 0
    diverged: int = 0
    elsewhere: int = 0
    results: dict = field(default_factory=dict)  # "row:seed" -> status
    details: dict = field(default_factory=dict)

    @classmethod
    def of(cls, d: dict) -> SweepSummary:
        """From a back end's dict: its known counts, the rest as details."""
        known = {k for k in cls.__dataclass_fields__ if k != "details"}
        return cls(**{k: v for k, v in d.items() if k in known}, details={k: v for k, v in d.items() if k not in known})

    @classmethod
    def total(cls, parts: list[SweepSummary]) -> SweepSummary:
        """Several sweeps' (a preset's and its cells') counts added up; the first's details."""
        counts = {
            k: sum(getattr(p, k) for p in parts)
            for k in ("pairs", "ran", "completed", "failed", "diverged", "elsewhere")
        }
        results = {k: v for p in parts for k, v in p.results.items()}
        return cls(**counts, results=results, details=parts[0].details if parts else {})

    def exit_status(self, fail_on_diverged: bool = False) -> int:
        """0 when every pair it ran (or waited for) completed; 1 when one failed, or diverged with
        `fail_on_diverged`. Usage errors (2) never get this far."""
        waited = any(status != "completed" for status in self.results.values())
        return int(bool(self.failed) or waited or (fail_on_diverged and bool(self.diverged)))

    def counts(self) -> dict:
        """The counts alone (`elsewhere` only where another driver holds some), for a line or a script."""
        keys = ("pairs", "ran", "completed", "failed", "diverged") + (("elsewhere",) if self.elsewhere else ())
        return {k: getattr(self, k) for k in keys}

    def to_dict(self) -> dict:
        return asdict(self)


class Backend(ABC):
    """Runs a sweep's pairs. `claims` tells the books who holds a pair; `launch` runs (or submits) the pending
    pairs and returns a `SweepSummary`; `status` is every pair's state, the same for every back end. Declared as data:
    `capabilities`, and, for a back end with options of its own, `options` (a dataclass beside the sweep's: `aiayn
    table3 --backend NAME` is `aiayn NAME table3`, which takes both)."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()
    # its own options, a dataclass beside the sweep's (None: it is built from the sweep alone): `aiayn table3 --backend
    # NAME` (and `aiayn NAME table3`) takes both, and the back end is built from them (`cls(options)`)
    options: ClassVar[type | None] = None
    # options of `aiayn table3` it cannot honour, each (option, flag, what it does instead): its command refuses them
    refuses: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    # the sweep's run options it sets otherwise by default (SLURM: devices that follow the resources)
    train_defaults: ClassVar[dict] = {}

    def claims(self, sweep: Sweep) -> books.Claims:
        return books.LockClaims(sweep.out, "pair")

    @abstractmethod
    def launch(self, sweep: Sweep, pairs: list[Pair]) -> SweepSummary:
        """Run (or submit) `pairs`; say what happened. Before any pair starts, record the sweep
        (`sweep.record(self.name)`): `aiayn status` finds a sweep by that record until its runs have directories."""

    def summary_lines(self, summary: SweepSummary, sweep: Sweep) -> list[str]:
        """What the command prints when the sweep ends."""
        elsewhere = f", {summary.elsewhere} run by another driver" if summary.elsewhere else ""
        return [
            f"table3 {sweep.preset.name}: {summary.completed} completed, {summary.failed} failed, "
            f"{summary.diverged} diverged of {summary.ran} run ({summary.pairs} pairs in the table{elsewhere}); "
            f"`aiayn status {sweep.out.root}` lists each pair"
        ]

    def report_now(self, summary: SweepSummary) -> bool:
        """Whether the sweep's report can be written when launch returns (its runs ran here); a scheduler's back end
        writes it in a job of its own, unless it waited."""
        return True

    def status(self, sweep: Sweep) -> list[PairState]:
        return sweep.states(self.claims(sweep))

    def check(self, sweep: Sweep) -> None:  # noqa: B027 (optional: a back end that can run anything refuses nothing)
        """Refuse what this back end cannot do, before anything is written (a UserError). Every sweep's budgets are
        checked beside it (`sweeps.run.check_launches`)."""

    @classmethod
    def status_claims(cls, out: SweepOut) -> books.Claims:
        """Who holds which pair under `out` by this back end's books, read without its options (`aiayn status`)."""
        return books.LockClaims(out, "pair")


def make_sweep(pairs: list[Pair], train: TrainOptions, *, storage: str | None = None, jobs: int = 1) -> Sweep:
    """The sweep of `pairs`, resolved once: each row's spec (the runs get theirs from here, whatever runs them)."""
    preset = get_preset(train.preset)
    loggers.of(train)  # an unknown logger or a missing package: said once, not by every run
    t, corpus = train, run_corpus(train.data, preset, train.hf_splits)
    specs = {
        row: resolve(row, preset, tables=t.table, overrides=t.overrides, corpus=corpus, vocab_size=t.vocab_size)
        for row in dict.fromkeys(row for row, _ in pairs)
    }
    return Sweep(SweepOut(t.out), preset, corpus, pairs, t, specs, storage, jobs)


def write_resolved(path: Path, spec: RunSpec, driver: str) -> Path:
    """The row as this driver resolved it, for a process of its own to train (lightning_modules/run/options.py)."""
    return atomic_write_json(path, resolved_run(spec.to_dict(), driver))


BACKENDS: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Make a back end known by its name (a class decorator: the one line a new back end adds). A class that is not a
    Backend, or two back ends of one name, are programming errors, said when the module is imported."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"{cls!r} is not a sweep back end: register a subclass of aiayn.sweeps.backends.Backend")
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise TypeError(f"{cls.__qualname__} has no name: set the class attribute `name`")
    known = BACKENDS.get(cls.name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(
            f"two sweep back ends are named {cls.name!r}: {known.__module__}.{known.__qualname__} and "
            f"{cls.__module__}.{cls.__qualname__}"
        )
    BACKENDS[cls.name] = cls
    return cls


def load() -> dict[str, type[Backend]]:
    """Every back end of this package, by name: each module of it is imported once, and registers its own."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return BACKENDS


def status_claims(out: SweepOut) -> books.Claims:
    """Who holds which pair under `out`, by the books of every back end (`aiayn status`)."""
    kinds = {}
    for cls in load().values():
        claims = cls.status_claims(out)
        kinds.setdefault((type(claims), getattr(claims, "prefix", None)), claims)  # the queue back ends share one
    return books.AnyClaims(*kinds.values())


def needs(sweep: Sweep) -> dict[str, bool]:
    """What a sweep asks of its back end, as Capabilities' fields: DDP runs, GPUs of its own for each run."""
    return {"ddp": sweep.train.world_size > 1, "own_gpus": bool(sweep.gpus_per_job)}


def backend_for(name: str | None, sweep: Sweep) -> Backend:
    """`--backend NAME` for a sweep (a back end built from the sweep alone; one with options of its own is its own
    command), or the one the sweep needs, by the registry's capabilities: among back ends without options, the
    `default` one when the sweep needs nothing more, else the first that can do what it needs."""
    found = load()
    plain = {n: cls for n, cls in found.items() if cls.options is None}
    if name is None:
        wanted = {k for k, v in needs(sweep).items() if v}
        fits = [cls for cls in plain.values() if all(getattr(cls.capabilities, k) for k in wanted)]
        if not wanted:
            fits = [cls for cls in fits if cls.capabilities.default] or fits
        if not fits:
            raise UserError(
                f"no sweep back end here can run this sweep (it needs {', '.join(sorted(wanted))}); pass "
                f"--backend with one of {', '.join(found)}"
            )
        return fits[0]()
    if name not in plain:
        other = f" (`aiayn {command_of(name)}` takes its own options)" if name in found else ""
        raise UserError(f"unknown back end {name!r} for this sweep{other}; choose one of {', '.join(plain)}")
    return plain[name]()


def backend_help() -> str:
    """`--backend`'s help, from the registry: each back end's name and the first line of its docstring."""

    def said(cls) -> str:  # its docstring's first paragraph, on one line
        return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split()).rstrip(".")

    lines = "; ".join(f"{name}: {said(cls)}" for name, cls in sorted(load().items()))
    return f"what runs the pairs: {lines} (default: local, subprocess for DDP or --gpus-per-job)"


class BackendNames(Sequence):
    """The registry's names, sorted, read each time they are asked for (`--backend`'s choices, its completion): a
    back end registered after the parser was built (a plugin's, a test's) is a choice too."""

    def __getitem__(self, index):
        return sorted(load())[index]

    def __len__(self) -> int:
        return len(load())


def command_of(name: str) -> str | None:
    """The command that takes back end `name`'s own options (`aiayn table3 --backend slurm` is `aiayn slurm
    table3`), or None for one built from the sweep alone or unknown."""
    cls = load().get(name)
    return f"{name} table3" if cls is not None and cls.options is not None else None
