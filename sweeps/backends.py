"""Sweep back ends: what runs the (row, seed) pairs a sweep owes. One interface (`Backend`: claims, launch, status),
one set of books for all (sweeps/books.py), and a registry (`BACKENDS`): adding a back end (Ray, submitit, a cloud
batch service) is one file with one class, and one line here.

- `local`: each pair in a process forked from a forkserver that has imported Lightning once, `--jobs` at a time,
  each on its share of the CPU threads (or its GPU).
- `subprocess`: each pair as a fresh `python -m aiayn train` process: what a run that starts DDP ranks needs
  (Lightning starts the other ranks by re-running the command line), and a run on GPUs of its own.
- `slurm` (sweeps/slurm.py): a SLURM job array, one task per pair (`aiayn slurm table3`).

The first two share Optuna's queue (`QueueBackend`): each pair is enqueued once as a fixed trial whose user
attributes name it; workers pop and claim trials (books.pop_and_claim) and never let the sampler invent new ones;
a trial's value is the run's dev BLEU. Pairs are enqueued longest first (a spec's cost: steps × parameters), so
that with N workers the long `big` row does not start last (longest-processing-time-first scheduling).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import optuna
from optuna.trial import TrialState

from aiayn.ablations.presets import Preset
from aiayn.ablations.table import MAX_SEED, select_rows
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json
from aiayn.common.lifetime import DIE_WITH_PARENT, die_with_parent
from aiayn.common.locks import file_lock
from aiayn.common.options import to_argv
from aiayn.common.secrets import redact
from aiayn.common.text import clock
from aiayn.lightning_modules.corpora import corpus_dirname
from aiayn.lightning_modules.options import TrainOptions, resolved_run
from aiayn.lightning_modules.rundir import OutDir, RunMetrics
from aiayn.lightning_modules.spec import RunSpec
from aiayn.sweeps import books
from aiayn.sweeps.books import Pair, PairState
from aiayn.sweeps.storage import open_storage

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

    def claims(self, sweep: Sweep) -> books.Claims:
        return books.LockClaims(sweep.out, "pair")

    @abstractmethod
    def launch(self, sweep: Sweep, pairs: list[Pair]) -> dict:
        """Run (or submit) `pairs`; return {"ran", "completed", "failed", ...}."""

    def status(self, sweep: Sweep) -> list[PairState]:
        return books.states(sweep.out, sweep.preset.name, sweep.corpus, sweep.pairs, self.claims(sweep))

    def check(self, sweep: Sweep) -> None:  # noqa: B027 (optional: a back end that can run anything refuses nothing)
        """Refuse what this back end cannot do, before anything is written (a UserError)."""


# ---------------------------------------------------------------- Optuna's queue


def study_name(preset: str, corpus: str) -> str:
    return f"table3-{preset}-{corpus_dirname(corpus)}"  # also its pop lock's file name


def pair_of(trial: optuna.trial.FrozenTrial) -> Pair | None:
    """The (row, seed) a trial stands for: its user attributes `row` and `seed`."""
    attrs = trial.user_attrs
    return (str(attrs["row"]), int(attrs["seed"])) if "row" in attrs and "seed" in attrs else None


def enqueue_pending(study: optuna.Study, pairs: list[Pair], cost: dict[str, float] | None = None) -> list[Pair]:
    """Enqueue every pair that is neither done, queued nor running; failed pairs get a new trial. With `cost`
    (row -> relative cost), the longest runs first (workers pop in enqueue order).

    The pair is the trial's user attributes: that is what the books read. It is also given as the trial's two
    parameters, row (categorical) and seed, for tools that plot parameters (optuna-dashboard), where the row is one
    of the fixed choices `ROW_CHOICES` (Optuna requires a categorical parameter to keep the same choices in every
    trial of a study; a row of a user's table has none). Nothing is sampled: the values are the enqueued ones."""
    busy = {TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING}
    taken = {pair_of(t) for t in study.get_trials(deepcopy=False) if t.state in busy}
    pending = [p for p in pairs if p not in taken]
    if cost is not None:
        pending.sort(key=lambda p: -cost[p[0]])  # stable: seeds stay in order within a row
    for row, seed in pending:
        params = {"row": row, "seed": seed} if row in ROW_CHOICES else {}
        study.enqueue_trial(params, user_attrs={"row": row, "seed": seed})
    return pending


# the rows of ablations/ (the paper's and the extended ones), the same in every study: the row parameter's choices
ROW_CHOICES = tuple(select_rows("all", True))


def set_params(trial: optuna.Trial, pair: Pair) -> None:
    """The popped trial's row and seed as its parameters (enqueued, so these return them: nothing is sampled)."""
    row, seed = pair
    if row in ROW_CHOICES:
        trial.suggest_categorical("row", ROW_CHOICES)
        trial.suggest_int("seed", 0, MAX_SEED)


def _n_finished(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(t.state in (TrialState.COMPLETE, TrialState.FAIL) and pair_of(t) is not None for t in trials)


def _hms(seconds: float) -> str:
    return clock(seconds)


class QueueBackend(Backend):
    """Pairs through Optuna's queue, `sweep.jobs` worker threads in this process, each waiting on one run at a
    time (`run_one`). A rerun of the same command skips completed pairs and retries failed ones; two drivers on
    one storage run each pair once."""

    def launch(self, sweep: Sweep, pairs: list[Pair]) -> dict:
        name = study_name(sweep.preset.name, sweep.corpus)
        url = sweep.storage or sweep.out.study_url("table3")
        claims = self.claims(sweep)
        key_of = self._key_of(sweep)
        # drivers set up in turn: creating a fresh SQLite schema or enqueueing concurrently would race
        with file_lock(sweep.out.lock(f"{name}.setup"), wait=True):
            storage = open_storage(url, create_dir=sweep.out.root)
            study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
            study.set_user_attr("preset", sweep.preset.name)
            study.set_user_attr("corpus", sweep.corpus)
            for t in books.fail_stale_trials(study, self.pop_lock(sweep), claims, key_of):
                log.warning("trial %d (%s seed %d) was left running by dead worker %s: failed, enqueued again",
                            t.number, *pair_of(t), t.user_attrs.get("worker", "unknown"))  # fmt: skip
            cost = {row: spec.cost() for row, spec in sweep.specs.items()}
            pending = enqueue_pending(study, pairs, cost)
            books.record_sweep(sweep.out, sweep.preset.name, sweep.corpus, sweep.pairs, self.name)
        log.info("table3 %s on %s: %d pairs, %d to run (%s), %d at a time", sweep.preset.name, sweep.corpus,
                 len(sweep.pairs), len(pending), name, sweep.jobs)  # fmt: skip
        slots = self.slots(sweep)
        pace = (time.perf_counter(), _n_finished(study.get_trials(deepcopy=False)))

        def worker(i: int) -> tuple[int, int]:
            # its own storage object: Optuna caches trial states per storage, as separate drivers would
            one = optuna.load_study(study_name=name, storage=open_storage(url))
            return self.work(one, sweep, claims, slots[i] if slots else None, pace)

        with ThreadPoolExecutor(sweep.jobs) as pool:
            results = [f.result() for f in [pool.submit(worker, i) for i in range(sweep.jobs)]]
        done, failed, diverged = (sum(r[i] for r in results) for i in range(3))
        return {"pairs": len(sweep.pairs), "ran": done + failed + diverged, "completed": done, "failed": failed,
                "diverged": diverged}  # fmt: skip

    def pop_lock(self, sweep: Sweep) -> Path:
        return sweep.out.lock(f"{study_name(sweep.preset.name, sweep.corpus)}.pop")

    def _key_of(self, sweep: Sweep):
        return lambda t: sweep.pair_key(*pair_of(t)) if pair_of(t) is not None else None

    def slots(self, sweep: Sweep) -> list[str] | None:
        """Each worker's GPUs (CUDA_VISIBLE_DEVICES), or None."""
        return None

    @abstractmethod
    def run_one(self, sweep: Sweep, row: str, seed: int, slot: str | None) -> RunMetrics:
        """Train one pair to its end; its metrics (status failed when it died)."""

    def work(self, study: optuna.Study, sweep: Sweep, claims, slot, pace) -> tuple[int, int, int]:
        """Pop and run queued trials until the queue is empty; returns (completed, failed, diverged) by this
        worker."""
        done = failed = diverged = 0
        t_start, finished_before = pace
        key_of = self._key_of(sweep)
        wanted = set(sweep.pairs)

        def ask():
            if not any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
                return None  # checked under the pop lock: ask() would invent a trial on an empty queue
            return study.ask()

        while True:
            with books.pop_and_claim(study, self.pop_lock(sweep), claims, key_of, ask) as (trial, frozen, held):
                if trial is None:
                    break
                pair = pair_of(frozen)
                if pair is None:  # a worker on another machine (RDB storage) emptied the queue meanwhile
                    study.tell(trial, state=TrialState.FAIL)
                    break
                set_params(trial, pair)
                if held is None or self._completed_elsewhere(study, pair, trial.number):
                    # the same pair, enqueued twice by racing drivers, is running or done in another worker
                    if held is not None:
                        held.close()
                    trial.set_user_attr("skipped", "duplicate of a pair run by another worker")
                    study.tell(trial, state=TrialState.PRUNED)
                    continue
                try:
                    t0 = time.perf_counter()
                    metrics = self.run_one(sweep, *pair, slot)
                    elapsed = time.perf_counter() - t0
                    run = sweep.out.run(sweep.preset.name, sweep.corpus, *pair)
                    trial.set_user_attr("metrics", {k: v for k, v in metrics.to_dict().items() if k != "config"})
                    trial.set_user_attr("run_dir", str(run.path))
                    if metrics.completed:
                        run.clear_failure()
                    elif run.read_metrics() is None:  # it failed before training: the books must say so too
                        run.write_failure(metrics.status, metrics.error)
                    if metrics.completed:  # told while holding the claim: no duplicate can start
                        study.tell(trial, metrics.dev_bleu)
                        done += 1
                        result = f"BLEU {metrics.dev_bleu:.2f}"
                    else:
                        study.tell(trial, state=TrialState.FAIL)
                        diverged += metrics.status == "diverged"
                        failed += metrics.status != "diverged"
                        result = f"{metrics.status.upper()} ({metrics.error or '?'})"
                finally:
                    held.close()
            trials = study.get_trials(deepcopy=False)
            # of this sweep's pairs: the study also holds other seed sets run into the same --out
            finished = sum(t.state == TrialState.COMPLETE and pair_of(t) in wanted for t in trials)
            # the driver's pace so far (all its workers) x what is left; longest pairs run first, so it errs long
            ran = max(_n_finished(trials) - finished_before, 1)
            eta = (time.perf_counter() - t_start) / ran * max(len(sweep.pairs) - finished, 0)
            log.info("[%d/%d] %s seed %d: %s in %s; ETA %s", finished, len(sweep.pairs), *pair, result,
                     _hms(elapsed), _hms(eta))  # fmt: skip
        return done, failed, diverged

    @staticmethod
    def _completed_elsewhere(study: optuna.Study, pair: Pair, number: int) -> bool:
        return any(
            t.state == TrialState.COMPLETE and t.number != number and pair_of(t) == pair
            for t in study.get_trials(deepcopy=False)
        )


def _threads(jobs: int) -> int | None:
    """CPU threads per run when `jobs` share the machine: N processes x all cores would thrash."""
    if jobs <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (os.cpu_count() or 1) // jobs)


# ---------------------------------------------------------------- local: forked from a forkserver


def _forkserver():
    """A multiprocessing forkserver that has imported Lightning and aiayn once. Each training process is forked
    from it instead of starting a fresh interpreter: importing torch + Lightning takes ~5 s, a tenth of a tiny row.
    (Forked from the forkserver, not from this multi-threaded driver, which fork() would make unsafe.)"""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["aiayn.lightning_modules.train"])
    return ctx


def _train_in_child(opts: TrainOptions, spec: RunSpec, logfile: str, threads: int | None) -> None:
    """`train(opts, spec)` in a forkserver child, stdout and stderr to `logfile`; exits with the status the
    `aiayn train` command would."""
    die_with_parent()
    fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, attempt_header().encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    import torch

    from aiayn.common.errors import print_error
    from aiayn.common.logs import configure_logging
    from aiayn.lightning_modules.train import train

    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    configure_logging(logging.INFO)
    try:
        train(opts, spec)
    except UserError as e:
        sys.exit(print_error(e))
    finally:
        # A multiprocessing child leaves through os._exit, so W&B's atexit teardown never runs; run.finish() alone
        # returns before W&B's service has written an offline run's records (W&B's docs: call teardown here).
        if "wandb" in sys.modules:
            sys.modules["wandb"].teardown()
    sys.exit(0)


def attempt_header() -> str:
    """The line that opens each attempt in a pair's log: a rerun appends, so the earlier attempts' output stays."""
    return f"===== aiayn: attempt started {time.strftime('%Y-%m-%d %H:%M:%S %z')} (pid {os.getpid()}) =====\n"


def _result(sweep: Sweep, row: str, seed: int, returncode: int | None) -> RunMetrics:
    run = sweep.out.run(sweep.preset.name, sweep.corpus, row, seed)
    metrics = run.read_metrics()
    if returncode == 0 and metrics is not None:
        return metrics
    try:
        tail = run.sweep_log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    except FileNotFoundError:  # the process died before it opened its log; the driver's stderr has why
        tail = ["no log: the run's process died before it started (its error is in the sweep's own output)"]
    return sweep.failed(row, seed, f"exit {returncode}: {tail[0][:300]}")


class LocalBackend(QueueBackend):
    """Each pair in a child of this driver's forkserver, on its share of the CPU threads."""

    name = "local"

    def check(self, sweep: Sweep) -> None:
        if sweep.train.world_size > 1 or sweep.gpus_per_job:
            raise UserError("the local back end runs one process per pair; runs on several devices or GPUs of their "
                            "own need --backend subprocess")  # fmt: skip

    def run_one(self, sweep: Sweep, row: str, seed: int, slot: str | None) -> RunMetrics:
        run = sweep.out.run(sweep.preset.name, sweep.corpus, row, seed)
        run.sweep_log.parent.mkdir(parents=True, exist_ok=True)
        child = _forkserver().Process(
            target=_train_in_child,
            args=(sweep.run_options(row, seed), sweep.specs[row], str(run.sweep_log), _threads(sweep.jobs)),
        )
        child.start()
        child.join()
        return _result(sweep, row, seed, child.exitcode)


# ---------------------------------------------------------------- subprocess: a fresh `aiayn train` per pair


def train_process_command(opts: TrainOptions, resolved: Path | None = None) -> list[str]:
    """A fresh `aiayn train` process for `opts`: the way to start a run that launches DDP ranks (Lightning starts
    the other ranks by re-running the command line, which only a fresh process has). With `resolved` (the file of
    `write_resolved`), the process trains the driver's spec of the row instead of resolving it again."""
    config = ["--config", str(resolved)] if resolved is not None else []
    return [sys.executable, "-m", "aiayn", "train", *config, *to_argv(opts, always=("row", "preset", "seed"))]


def write_resolved(path: Path, spec: RunSpec, driver: str) -> Path:
    """The row as this driver resolved it, for a process of its own to train (lightning_modules/options.py)."""
    return atomic_write_json(path, resolved_run(spec.to_dict(), driver))


# The scheduler's and the launcher's variables a child must not inherit: inside an sbatch allocation Lightning
# would pick its SLURM environment (and fail the ntasks check or wait for ranks SLURM never starts), and two
# concurrent DDP runs would meet on one MASTER_PORT.
LAUNCHER_VARIABLES = ("SLURM_", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE",
                      "RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_", "PL_")  # fmt: skip
MASTER_PORT_BASE = 29500


def child_environment(slot_index: int, gpus: str | None, threads: int | None) -> dict:
    """The environment of a pair's own process: ours without the launchers' variables, its GPUs, its threads, and a
    MASTER_PORT of its own (the slot's), so that concurrent DDP runs on one machine do not collide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES)}
    env[DIE_WITH_PARENT] = "1"  # the child asks the kernel to end it when this driver dies (aiayn.common.lifetime)
    env["MASTER_PORT"] = str(MASTER_PORT_BASE + 17 * slot_index + os.getpid() % 1000)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES's entries when it is set, else every GPU torch
    sees (counted without starting CUDA here; the runs that use them are fresh processes)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class SubprocessBackend(QueueBackend):
    """Each pair as a fresh `aiayn train` process, on the GPUs of its worker's slot (`--gpus-per-job K`: worker i
    gets the i-th K of the visible GPUs, so N runs at once do not all land on GPU 0)."""

    name = "subprocess"

    def check(self, sweep: Sweep) -> None:
        k, t = sweep.gpus_per_job, sweep.train
        if k is None:
            return
        if t.accelerator == "cpu":
            raise UserError(f"--gpus-per-job {k} hands out GPUs but --accelerator cpu trains on CPUs; drop one of them")
        if t.devices not in (1, k) or t.num_nodes != 1:
            raise UserError(f"--devices {t.devices} and --gpus-per-job {k} disagree: each run trains on its {k} "
                            f"GPUs of this machine; drop --devices/--num-nodes")  # fmt: skip
        gpus = visible_gpus()
        if sweep.jobs * k > len(gpus):
            raise UserError(f"--jobs {sweep.jobs} x --gpus-per-job {k} needs {sweep.jobs * k} GPUs but {len(gpus)} "
                            f"are visible ({','.join(gpus) or 'none'}); lower --jobs or --gpus-per-job")  # fmt: skip
        sweep.train = replace(t, devices=k)

    def slots(self, sweep: Sweep) -> list[str] | None:
        k = sweep.gpus_per_job
        if k is None:
            return None
        gpus = visible_gpus()
        return [",".join(gpus[i * k : (i + 1) * k]) for i in range(sweep.jobs)]

    def run_one(self, sweep: Sweep, row: str, seed: int, slot: str | None) -> RunMetrics:
        run = sweep.out.run(sweep.preset.name, sweep.corpus, row, seed)
        run.sweep_log.parent.mkdir(parents=True, exist_ok=True)
        slots = self.slots(sweep) or []
        index = slots.index(slot) if slot in slots else 0
        env = child_environment(index, slot, _threads(sweep.jobs))
        with open(run.sweep_log, "a") as out:
            out.write(attempt_header())
            out.flush()
            resolved = write_resolved(run.resolved_file, sweep.specs[row], f"aiayn table3 --backend {self.name}")
            cmd = train_process_command(sweep.run_options(row, seed), resolved)
            returncode = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        return _result(sweep, row, seed, returncode)


BACKENDS: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Make a back end known by its name (a class decorator: the one line a new back end adds)."""
    BACKENDS[cls.name] = cls
    return cls


register(LocalBackend)
register(SubprocessBackend)


def backend_for(name: str | None, sweep: Sweep) -> Backend:
    """`--backend NAME` for `aiayn table3` (a back end of Optuna's queue), or the one a sweep needs: a fresh process
    per pair for DDP runs and runs on GPUs of their own, else the local forkserver."""
    if name is None:
        name = "subprocess" if sweep.train.world_size > 1 or sweep.gpus_per_job else "local"
    queue = [n for n, cls in BACKENDS.items() if issubclass(cls, QueueBackend)]
    if name not in queue:
        other = f" (`aiayn {name} table3` runs that one)" if name in BACKENDS else ""
        raise UserError(f"unknown back end {name!r} for aiayn table3{other}; choose one of {', '.join(queue)}")
    return BACKENDS[name]()
