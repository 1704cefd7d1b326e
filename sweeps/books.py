"""The books every sweep keeps the same way, whatever runs its pairs: which (row, seed) pairs are done, which a
live worker or job holds, which failed and which are pending; which Optuna trials a dead worker left RUNNING.

A pair is *done* when its run directory's metrics.json says completed, at the steps the sweep wants of it (its
row's budget at the preset, or `--max-steps`): a run completed at fewer steps (a capped look, `--max-steps 60`) is
*short* and the sweep extends it (resuming it, exactly as after a kill: `callbacks.StepCheckpoints`); one completed at
more steps than wanted cannot be shortened, and a sweep that asks for that is refused in one line
(`longer_than_wanted`). It is *claimed* while its holder lives:
a worker process holds the pair's lock (a kernel flock under OUT/.locks/, released when the process dies,
however it dies) for as long as the pair runs (`LockClaims`), or SLURM holds the array task it was submitted as
(sweeps/backends/slurm/pairs.py's `SlurmClaims`), or a trainer holds its run directory's lock. Otherwise it
failed (metrics.json says how, or, for a pair that failed before it had a run of its own, `seedS.failed.json`
beside its directory) or is pending. Reading the books writes nothing.

Optuna keeps the queue of `aiayn table3` and the trials of `aiayn hpo`. Optuna's own heartbeat exists only for
RDB storages (SQLite included), not for the journal, and is only beaten by `study.optimize`, so a worker that
dies leaves its trial RUNNING. A worker pops its trial and claims it under one lock (`pop_and_claim`), so a
RUNNING trial whose claim is free is stale as soon as that pop lock is free too (`fail_stale_trials`): no grace
period, for every storage.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json, read_json
from aiayn.common.locks import file_lock, holding, is_held, try_lock
from aiayn.common.names import check_name
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.rundir import RunDir, RunMetrics
from aiayn.lightning_modules.run.spec import changed_since, sweep_key
from aiayn.sweeps.folders import SweepOut

log = logging.getLogger(__name__)

Pair = tuple[str, int]
STATES = ("completed", "short", "running", "failed", "diverged", "pruned", "pending")


def worker_name() -> str:
    return f"{platform.node()}:{os.getpid()}"


class Claims(ABC):
    """Who holds a key (a pair, a trial) now."""

    @abstractmethod
    def holder(self, key: str) -> dict | None:
        """{"holder": who, "since": epoch seconds} while a live worker or job holds `key`; None when it is free."""


class LockClaims(Claims):
    """A worker holds OUT/.locks/PREFIX-KEY.lock (a kernel flock) while it runs the key's work, and writes who it
    is into a file beside it."""

    def __init__(self, out: SweepOut, prefix: str):
        self.out, self.prefix = out, prefix

    def path(self, key: str) -> Path:
        return self.out.lock(f"{self.prefix}-{key}")

    def claim(self, key: str) -> AbstractContextManager[bool]:
        """Hold `key` for the `with` block; yields False if a live worker holds it."""
        return holding(self.take(key))

    def take(self, key: str, tries: int = 10):
        """Hold `key` until the returned file is closed (or the process dies); None if a live worker holds it.
        Tried a few times 50 ms apart: `holder` probes a free lock by taking it for a moment."""
        for i in range(tries):
            held = try_lock(self.path(key))
            if held is not None:
                atomic_write_json(self._who(key), {"holder": worker_name(), "since": time.time()})
                return held
            if i + 1 < tries:
                time.sleep(0.05)
        return None

    def holder(self, key: str) -> dict | None:
        if not is_held(self.path(key)):  # read-only: `aiayn status` writes nothing
            return None
        try:
            return read_json(self._who(key), 1 << 16)
        except (OSError, ValueError):
            return {"holder": "unknown", "since": None}

    def _who(self, key: str) -> Path:
        return self.path(key).with_suffix(".who")


class AnyClaims(Claims):
    """The first holder any of several kinds of claims knows of (e.g. local workers and SLURM tasks)."""

    def __init__(self, *kinds: Claims):
        self.kinds = kinds

    def holder(self, key: str) -> dict | None:
        return next((h for h in (c.holder(key) for c in self.kinds) if h is not None), None)


def pair_key(preset: str, corpus: CorpusRef, row: str, seed: int) -> str:
    return f"{sweep_key(preset, corpus)}-{row}-seed{seed}"


@dataclass(frozen=True)
class PairState:
    row: str
    seed: int
    state: str  # one of STATES
    holder: str | None = None  # who runs it (running)
    age_s: float | None = None  # for how long (running)
    error: str | None = None  # its one-line reason (failed, diverged, pruned)
    run_dir: str = ""
    dev_bleu: float | None = None  # its result (completed)
    step: int | None = None  # the newest periodic checkpoint's step (not completed: how far it got)
    steps: int | None = None  # the steps it plans (config.json); completed or short: the steps it trained
    changed: tuple[str, ...] = ()  # completed, but its row resolves otherwise now ("d_model 128 -> 256")
    budget: int | None = None  # completed or short: its row's budget at its preset (metrics.json's budget_steps)
    wanted: int | None = None  # short: the steps the sweep asks of it

    @property
    def capped(self) -> bool:
        """Completed short of its row's budget (`--max-steps`): a look, not the preset's table."""
        return self.steps is not None and self.budget is not None and self.steps < self.budget

    def to_dict(self) -> dict:
        return {
            "row": self.row,
            "seed": self.seed,
            "state": self.state,
            "holder": self.holder,
            "age_s": self.age_s,
            "error": self.error,
            "dev_bleu": self.dev_bleu,
            "run_dir": self.run_dir,
            "step": self.step,
            "steps": self.steps,
            "budget": self.budget,
            "capped": self.capped,
            "wanted": self.wanted,
            "changed": list(self.changed),
        }

    @property
    def pair(self) -> Pair:
        return self.row, self.seed


def budget_of(run: RunDir, metrics: RunMetrics) -> int | None:
    """The row's budget a completed run was resolved for: metrics.json's budget_steps, else (a run of an older
    aiayn) its config.json's spec."""
    if metrics.budget_steps is not None:
        return metrics.budget_steps
    try:
        config = run.read_config()
    except UserError:
        return None
    return config.spec.train_steps if config is not None else None


def states(
    out: SweepOut,
    preset: str,
    corpus: CorpusRef,
    pairs: list[Pair],
    claims: Claims,
    wanted: Mapping[str, int] | None = None,
) -> list[PairState]:
    """The state of each pair, from its run directory and its claim; `wanted`: row -> the steps the sweep asks of
    it (a completed run of fewer is `short`; None: whatever it completed at)."""
    now, found = time.time(), []
    for row, seed in pairs:
        run = out.run(preset, corpus, row, seed)
        metrics = run.read_metrics()
        if metrics is not None and metrics.completed:
            want = (wanted or {}).get(row)
            short = want is not None and metrics.steps is not None and metrics.steps < want
            found.append(
                PairState(
                    row,
                    seed,
                    "short" if short else "completed",
                    run_dir=str(run.path),
                    dev_bleu=metrics.dev_bleu,
                    changed=_changed(run),
                    steps=metrics.steps,
                    budget=budget_of(run, metrics),
                    wanted=want if short else None,
                )
            )
            continue
        held = claims.holder(pair_key(preset, corpus, row, seed))
        if held is None and run.is_training():  # a trainer whose driver died, or `aiayn train` by hand
            held = {"holder": "a trainer holding the run directory's lock", "since": None}
        where = {"run_dir": str(run.path), **_progress(run)}
        failure = run.read_failure() if metrics is None else None
        problem = run.metrics_problem() if metrics is None else None
        if problem is not None:  # a metrics.json there but not one aiayn can read: failed, and why
            failure = {"status": "failed", "error": f"{problem}; delete it to run the pair again"}
        if held is not None:
            since = held.get("since")
            found.append(PairState(row, seed, "running", held.get("holder"), now - since if since else None, **where))
        elif metrics is not None or failure is not None:
            status, error = (
                (metrics.status, metrics.error) if metrics is not None else (failure["status"], failure["error"])
            )
            first = (error or "").strip().splitlines()[:1]
            found.append(PairState(row, seed, status, error=first[0] if first else None, **where))
        else:
            found.append(PairState(row, seed, "pending", **where))
    return found


def longer_than_wanted(
    out: SweepOut, preset: str, corpus: CorpusRef, pairs: list[Pair], wanted: Mapping[str, int]
) -> list:
    """(pair, run directory, steps trained) of every completed run that trained more steps than the sweep asks of it
    now: a run cannot be shortened, so such a sweep is refused before anything runs."""
    out_of = []
    for row, seed in pairs:
        run = out.run(preset, corpus, row, seed)
        metrics = run.read_metrics()
        want = wanted.get(row)
        if metrics is not None and metrics.completed and want is not None and (metrics.steps or 0) > want:
            out_of.append(((row, seed), run.path, metrics.steps))
    return out_of


def _changed(run: RunDir) -> tuple[str, ...]:
    """What its row resolves to differently now than when the completed run ran (spec.changed_since)."""
    try:
        config = run.read_config()
    except UserError:
        return ()
    return tuple(changed_since(config.spec, config.tables)) if config is not None else ()


def _progress(run: RunDir) -> dict:
    """How far an unfinished run got: its newest periodic checkpoint's step of the steps its config.json plans
    (what a rerun resumes near; last.ckpt may be a little newer)."""
    try:
        config = run.read_config()
    except UserError:  # an unreadable config.json: the rerun says so; status shows no progress
        config = None
    return {"step": run.checkpointed_step(), "steps": config.train.steps if config else None}


def record_sweep(out: SweepOut, preset: str, corpus: CorpusRef, pairs: list[Pair], backend: str) -> Path:
    """Add `pairs` to OUT/sweeps/PRESET-CORPUS.json, the pairs that sweep owes (a later command may ask for more
    rows or seeds), which `aiayn status` reads; return its path."""
    key = sweep_key(preset, corpus)
    path = out.sweep_record(key)
    with file_lock(out.lock(f"sweep-{key}.record"), wait=True):
        try:
            old = read_json(path)
        except (OSError, ValueError):
            old = {}
        known = [tuple(p) for p in old.get("pairs", [])]
        merged = known + [p for p in pairs if p not in known]
        backends = sorted({*old.get("backends", []), backend})
        atomic_write_json(
            path,
            {
                "preset": preset,
                "corpus": corpus.name,
                "pairs": [list(p) for p in merged],
                "backends": backends,
                "updated": time.time(),
            },
        )
    return path


def _pair(item) -> Pair:
    """One [row, seed] of a sweep record, checked: a row name and a seed from 0."""
    if not isinstance(item, (list, tuple)) or len(item) != 2:
        raise ValueError(f"pair {item!r} is not [row, seed]")
    row, seed = item
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"pair {item!r}: the seed is not an integer from 0")
    return check_name("row", row), seed


@dataclass(frozen=True)
class SweepRecord:
    preset: str
    corpus: CorpusRef
    pairs: list[Pair]


def recorded_sweeps(out: SweepOut) -> list[SweepRecord]:
    """The sweeps under OUT: each OUT/sweeps/*.json, and, for run directories no record names (a sweep from before
    records, or `aiayn train` runs), one per (preset, corpus directory) with the pairs found on disk."""
    found: dict[tuple[str, str], list[Pair]] = {}
    corpus_of: dict[tuple[str, str], CorpusRef] = {}
    for path in out.sweep_records():
        try:
            doc = read_json(path)
            corpus = CorpusRef.recorded(doc["corpus"])
            key = (check_name("preset", doc["preset"]), corpus.dirname)
            pairs = [_pair(p) for p in doc["pairs"]]
        except UserError as e:  # a name that is not one: never a path (a record saying preset "../..")
            log.warning("skipping sweep record %s: %s", path, e)
            continue
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("skipping sweep record %s: %s", path, f"{type(e).__name__}: {e}".splitlines()[0])
            continue  # a record cut short or hand-edited: its runs are still found below
        found.setdefault(key, []).extend(p for p in pairs if p not in found[key])
        corpus_of[key] = corpus
    for run in out.run_dirs():
        preset, corpus, row, seed = run.path.relative_to(out.root).parts
        pair = (row, int(seed.removeprefix("seed"))) if seed.removeprefix("seed").isdigit() else None
        if pair is not None and pair not in found.setdefault((preset, corpus), []):
            found[(preset, corpus)].append(pair)
            corpus_of.setdefault((preset, corpus), CorpusRef.recorded(corpus))
    return [SweepRecord(preset, corpus_of[(preset, c)], pairs) for (preset, c), pairs in sorted(found.items())]


# ---------------------------------------------------------------- Optuna: pop, claim, stale


@contextmanager
def pop_and_claim(study: optuna.Study, pop_lock: Path, claims: LockClaims, key_of: Callable, ask: Callable):
    """Under the pop lock: `ask()` a trial, take its claim (`key_of(frozen trial)`), record the worker in the trial.
    Yields (trial, frozen trial, held claim or None when a live worker holds the same key). The claim is held
    until the caller closes it; the pop lock only for the ask and the claim."""
    with file_lock(pop_lock, wait=True):
        trial = ask()
        if trial is None:
            yield None, None, None
            return
        frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
        key = key_of(frozen)
        held = claims.take(key) if key is not None else None
        if held is not None:
            trial.set_user_attr("worker", worker_name())  # see fail_stale_trials
    yield trial, frozen, held


def fail_stale_trials(
    study: optuna.Study, pop_lock: Path, claims: Claims, key_of: Callable, on_stale: Callable | None = None
) -> list[optuna.trial.FrozenTrial]:
    """Fail each RUNNING trial whose worker is dead, and call `on_stale(trial)` (e.g. enqueue it again); return them.
    A claimed trial (`worker` recorded) whose claim is free is stale. An unclaimed one was left by a worker that died
    between popping and claiming it: stale too when the pop lock is free; while another process holds the pop lock,
    unclaimed trials are left alone (it may be claiming one)."""
    stale = []
    with file_lock(pop_lock) as pop_free:
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            key = key_of(t)
            if key is None or ("worker" not in t.user_attrs and not pop_free):
                continue
            if claims.holder(key) is not None:
                continue  # a live worker holds it
            fresh = next(f for f in study.get_trials(deepcopy=False) if f.number == t.number)
            if fresh.state != TrialState.RUNNING:
                continue  # its worker finished it between our two reads
            try:
                who = t.user_attrs.get("worker", "unknown")
                optuna.trial.Trial(study, t._trial_id).set_user_attr("stale", f"worker {who} died; enqueued again")
                study.tell(t.number, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # finished after all (our read was older than the storage): not stale
            if on_stale is not None:
                on_stale(t)
            stale.append(t)
    return stale


def report_dir(report: str | None, out: str) -> Path | None:
    """Where a sweep's report goes: `--report DIR`, OUT/reports by default, none for ''."""
    if report == "":
        return None
    return Path(report) if report is not None else SweepOut(out).reports
