"""`aiayn table3`: every selected (row, seed) of Table 3 trained once, books kept by Optuna.

Optuna keeps the books, nothing more: one study per (preset, corpus); each (row, seed) is enqueued
once as a fixed-parameter trial; workers pop queued trials (Optuna's pop is atomic: a trial moves
WAITING → RUNNING for exactly one worker) and never let the sampler invent new ones. Each training
run is its own process (so a DDP run never has Optuna inside its ranks); the trial
records the run directory and the metrics, and its value is the dev BLEU.

Re-running the same command skips completed pairs and retries failed ones. Two workers on one
storage run each pair once: the queue pop is atomic, and a per-pair file lock guards the rare race
where two drivers enqueue the same pair at the same moment.

Pairs are enqueued longest first (estimated cost: steps x parameters), so that with `--jobs N` (N
training processes at once, each with its share of the CPU threads) the long `big` row does not
start last and leave the other workers idle (longest-processing-time-first scheduling).

A worker that dies (SIGKILL, node lost) leaves its trial RUNNING. Optuna's heartbeat would fail such
trials, but it exists only for RDB storages (SQLite included), not for the journal, and is only
beaten by `study.optimize`, not by ask/tell workers. Our sign of life is the per-pair lock instead:
the worker holds it (a kernel flock, released when its process dies, however it dies) for as long
as the pair runs. `fail_stale_trials`, at every driver start, fails each RUNNING trial whose lock
is free, and the pair is enqueued again; the same for every storage.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import optuna
from optuna.trial import TrialState

from aiayn.ablations.presets import get_preset, resolve
from aiayn.ablations.selection import Selection
from aiayn.common.errors import UserError
from aiayn.common.locks import file_lock
from aiayn.common.options import option, to_argv
from aiayn.common.secrets import redact
from aiayn.lightning_modules.options import TrainOptions
from aiayn.lightning_modules.rundir import RunDir
from aiayn.sweeps.storage import open_storage

log = logging.getLogger(__name__)


@dataclass
class SweepOptions:
    """`aiayn table3`: which pairs (`select`), how each trains (`train`: every `aiayn train` option but
    the row and seed, which the sweep sets), where the books and the report go, how many at once."""

    select: Selection = field(default_factory=Selection)
    storage: str | None = option(None, "Optuna storage URL (default: sqlite:///OUT/optuna.db)")
    report: str | None = option(None, "report directory (default: OUT/reports; '' for none)")
    jobs: int | None = option(
        None, "training runs at once, sharing the CPU cores (default: the preset's; tiny: 2)", positive=True
    )
    gpus_per_job: int | None = option(
        None, "GPUs each of the --jobs runs trains on, its own (disjoint CUDA_VISIBLE_DEVICES); sets --devices",
        positive=True, metavar="K",
    )  # fmt: skip
    train: TrainOptions = field(default_factory=lambda: TrainOptions(progress=False))


def report_dir(report: str | None, out: str) -> Path | None:
    """Where a sweep's report goes: `--report DIR`, OUT/reports by default, none for ''."""
    if report == "":
        return None
    return Path(report) if report is not None else Path(out) / "reports"


def study_name(preset: str, corpus: str) -> str:
    return f"table3-{preset}-{corpus}"


def pair_of(trial: optuna.trial.FrozenTrial) -> tuple[str, int] | None:
    """The (row, seed) a trial stands for: its user attributes `row` and `seed`. A study made before
    aiayn 0.2 kept them as fixed parameters (the row a categorical over the rows of that day); those
    trials are read as they are, so an old study keeps its completed pairs and takes new rows."""
    attrs = trial.user_attrs
    if "row" in attrs and "seed" in attrs:
        return str(attrs["row"]), int(attrs["seed"])
    params = trial.system_attrs.get("fixed_params") or trial.params
    return (params["row"], int(params["seed"])) if "row" in params and "seed" in params else None


def estimated_cost(row: str, preset: str, tables: tuple[str, ...] = ()) -> float:
    """A run's relative cost for ordering the queue: its steps x its parameters (a proxy for FLOPs)."""
    from aiayn.lightning_modules.config import params_of  # lazy: torch is needed only here

    resolved = resolve(row, preset, tables)
    return resolved["train_steps"] * params_of(resolved)


def enqueue_pending(
    study: optuna.Study, pairs: list[tuple[str, int]], preset: str | None = None, tables: tuple[str, ...] = ()
) -> list[tuple[str, int]]:
    """Enqueue every pair that is neither done, queued nor running; failed pairs get a new trial.
    With `preset`, the longest runs are enqueued first (workers pop in enqueue order).

    The pair is the trial's user attributes, not a parameter: Optuna requires a categorical
    parameter to keep the same choices in every trial of a study, so a row stored as one would freeze
    the table at the study's first run (a row added later failed with "CategoricalDistribution does
    not support dynamic value space"). The trial has no parameters at all: nothing is sampled."""
    busy = {TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING}
    taken = {pair_of(t) for t in study.get_trials(deepcopy=False) if t.state in busy}
    pending = [p for p in pairs if p not in taken]
    if preset is not None:
        cost = {row: estimated_cost(row, preset, tables) for row in {row for row, _ in pending}}
        pending.sort(key=lambda p: -cost[p[0]])  # stable: seeds stay in order within a row
    for row, seed in pending:
        study.enqueue_trial({}, user_attrs={"row": row, "seed": seed})
    return pending


def lock_dir(opts: SweepOptions) -> Path:
    return Path(opts.train.out) / ".locks"


def pair_lock_path(opts: SweepOptions, corpus: str, row: str, seed: int) -> Path:
    return lock_dir(opts) / f"{opts.train.preset}-{corpus}-{row}-seed{seed}.lock"


def pop_lock_path(opts: SweepOptions, study: optuna.Study) -> Path:
    return lock_dir(opts) / f"{study.study_name}.pop.lock"


def fail_stale_trials(study: optuna.Study, opts: SweepOptions, corpus: str) -> list:
    """Fail the RUNNING trials whose worker is dead, so that their pairs are enqueued again; return
    those pairs. A worker holds its pair's lock while the pair runs and records itself in the trial
    (`worker`), so a claimed trial whose lock is free is stale. A worker pops and claims a trial under
    the pop lock (`work`), so a trial found unclaimed while that lock is free was left by a worker that
    died between the two (or by aiayn 0.1, which crashed there on a grown table): stale too. While
    another process holds the pop lock, unclaimed trials are left alone: it may be claiming one."""
    stale = []
    with file_lock(pop_lock_path(opts, study)) as pop_free:
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            pair = pair_of(t)
            if pair is None or ("worker" not in t.user_attrs and not pop_free):
                continue
            with file_lock(pair_lock_path(opts, corpus, *pair)) as free:
                if not free:
                    continue  # a live worker holds it
                fresh = next(f for f in study.get_trials(deepcopy=False) if f.number == t.number)
                if fresh.state != TrialState.RUNNING:
                    continue  # its worker finished it between our two reads
                worker = t.user_attrs.get("worker", "unknown")
                try:
                    optuna.trial.Trial(study, t._trial_id).set_user_attr(
                        "stale", f"worker {worker} died; enqueued again"
                    )
                    study.tell(t.number, state=TrialState.FAIL)
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # finished after all (our read was older than the storage): not stale
                log.warning("trial %d (%s seed %d) was left running by dead worker %s: failed, enqueued again",
                            t.number, *pair, worker)  # fmt: skip
                stale.append(pair)
    return stale


def completed_elsewhere(study: optuna.Study, pair: tuple[str, int], number: int) -> bool:
    return any(
        t.state == TrialState.COMPLETE and t.number != number and pair_of(t) == pair
        for t in study.get_trials(deepcopy=False)
    )


def _forkserver():
    """A multiprocessing forkserver that has imported Lightning and aiayn once. Each training process
    is forked from it instead of starting a fresh interpreter: importing torch + Lightning takes ~5 s,
    a tenth of a tiny row. (Forked from the forkserver, not from this multi-threaded driver, which
    fork() would make unsafe.) The forkserver is one per process and starts with the first child; the
    preload list only matters then."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["aiayn.lightning_modules.train"])
    return ctx


def _train_in_child(opts: TrainOptions, logfile: str, threads: int | None) -> None:
    """`train(opts)` in a forkserver child, stdout and stderr to `logfile`; exits with the status the
    `aiayn train` command would."""
    fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
        train(opts)
    except UserError as e:
        sys.exit(print_error(e))
    sys.exit(0)


def train_process_command(opts: TrainOptions) -> list[str]:
    """A fresh `aiayn train` process for `opts`: the way to start a run that launches DDP ranks
    (Lightning starts the other ranks by re-running the command line, which only a fresh process has)."""
    return [sys.executable, "-m", "aiayn", "train", *to_argv(opts, always=("row", "preset", "seed"))]


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES's entries when it is set, else every GPU
    torch sees (counted without starting CUDA here; the runs that use them are fresh processes)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_slots(opts: SweepOptions, jobs: int) -> list[str] | None:
    """With --gpus-per-job K: the CUDA_VISIBLE_DEVICES of each of the `jobs` workers, K GPUs each,
    disjoint (worker i gets the i-th K of the visible GPUs), so that N runs at once on one machine do
    not all land on GPU 0. None without --gpus-per-job. Also makes each run's --devices K."""
    k = opts.gpus_per_job
    if k is None:
        return None
    t = opts.train
    if t.accelerator == "cpu":
        raise UserError(f"--gpus-per-job {k} hands out GPUs but --accelerator cpu trains on CPUs; drop one of them")
    if t.devices not in (1, k) or t.num_nodes != 1:
        raise UserError(f"--devices {t.devices} and --gpus-per-job {k} disagree: each run trains on its {k} GPUs "
                        f"of this machine; drop --devices/--num-nodes")  # fmt: skip
    gpus = visible_gpus()
    if jobs * k > len(gpus):
        raise UserError(f"--jobs {jobs} x --gpus-per-job {k} needs {jobs * k} GPUs but {len(gpus)} are visible "
                        f"({','.join(gpus) or 'none'}); lower --jobs or --gpus-per-job")  # fmt: skip
    opts.train = replace(t, devices=k)
    return [",".join(gpus[i * k : (i + 1) * k]) for i in range(jobs)]


def run_pair(opts: SweepOptions, corpus: str, row: str, seed: int, gpus: str | None = None) -> dict:
    """Train one pair in its own process; return its metrics.json (status failed if it died). `gpus`:
    the CUDA_VISIBLE_DEVICES of this run (--gpus-per-job)."""
    run = RunDir.of(opts.train.out, opts.train.preset, corpus, row, seed)
    run.sweep_log.parent.mkdir(parents=True, exist_ok=True)
    train_opts = replace(opts.train, row=row, seed=seed, progress=False)
    jobs = opts.jobs or 1
    # share the cores: N processes x all cores would thrash
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 and "OMP_NUM_THREADS" not in os.environ else None
    # A run on its own GPUs is a fresh process: CUDA reads CUDA_VISIBLE_DEVICES once, at its start, and
    # a process forked from the forkserver would inherit whatever CUDA state that one has.
    if train_opts.world_size == 1 and gpus is None:
        child = _forkserver().Process(target=_train_in_child, args=(train_opts, str(run.sweep_log), threads))
        child.start()
        child.join()
        returncode = child.exitcode
    else:
        env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        with open(run.sweep_log, "w") as out:
            cmd = train_process_command(train_opts)
            returncode = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    metrics = run.read_metrics()
    if returncode == 0 and metrics is not None:
        return metrics
    tail = run.sweep_log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return {"row": row, "seed": seed, "status": "failed", "error": redact(f"exit {returncode}: {tail[0][:300]}")}


def _n_finished(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(t.state in (TrialState.COMPLETE, TrialState.FAIL) and pair_of(t) is not None for t in trials)


def work(
    study: optuna.Study, opts: SweepOptions, corpus: str, total: int, runner=None, pace: tuple | None = None
) -> tuple[int, int]:
    """Pop and run queued trials until the queue is empty; returns (completed, failed) by this worker.
    `pace` = (start time, pairs finished before it), shared by a driver's workers, for the sweep's ETA."""
    runner = runner or run_pair
    done = failed = 0
    t_start, finished_before = pace or (time.perf_counter(), _n_finished(study.get_trials(deepcopy=False)))
    while True:
        with contextlib.ExitStack() as held:
            # Optuna's pop (WAITING -> RUNNING) is a read-then-write; PostgreSQL/MySQL lock the row, SQLite
            # and the journal file do not, and two workers can pop the same trial. A file lock makes it atomic,
            # and checking the queue under it keeps ask() from inventing a trial when the queue is empty. The
            # trial is claimed (its pair's lock taken, the worker recorded) under the same lock, so that
            # fail_stale_trials never sees a live worker's trial unclaimed.
            with file_lock(pop_lock_path(opts, study), wait=True):
                if not any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
                    break
                trial = study.ask()
                frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
                pair = pair_of(frozen)  # the queued (row, seed), from the trial's user attributes
                if pair is None:  # a worker on another machine (RDB storage) emptied the queue meanwhile
                    study.tell(trial, state=TrialState.FAIL)
                    break
                row, seed = pair
                if "row" not in frozen.user_attrs:  # queued by aiayn 0.1 as fixed parameters: say it the new way
                    trial.set_user_attr("row", row)
                    trial.set_user_attr("seed", seed)
                mine = held.enter_context(file_lock(pair_lock_path(opts, corpus, row, seed)))
                duplicate = not mine or completed_elsewhere(study, (row, seed), trial.number)
                if not duplicate:
                    trial.set_user_attr("worker", f"{platform.node()}:{os.getpid()}")  # see fail_stale_trials
            if duplicate:
                # the same pair, enqueued twice by racing drivers, is running or done in another worker
                trial.set_user_attr("skipped", "duplicate of a pair run by another worker")
                study.tell(trial, state=TrialState.PRUNED)
                continue
            t0 = time.perf_counter()
            metrics = runner(opts, corpus, row, seed)
            elapsed = time.perf_counter() - t0
            trial.set_user_attr("metrics", {k: v for k, v in metrics.items() if k != "config"})
            trial.set_user_attr("run_dir", str(RunDir.of(opts.train.out, opts.train.preset, corpus, row, seed).path))
            if metrics.get("status") == "completed":  # told while holding the lock: no duplicate can start
                study.tell(trial, metrics["dev_bleu"])
                done += 1
                result = f"BLEU {metrics['dev_bleu']:.2f}"
            else:
                study.tell(trial, state=TrialState.FAIL)
                failed += 1
                result = f"{metrics.get('status', 'failed').upper()} ({metrics.get('error', '?')})"
        trials = study.get_trials(deepcopy=False)
        finished = sum(t.state == TrialState.COMPLETE for t in trials)
        # the driver's pace so far (all its workers) x what is left; longest pairs run first, so it errs long
        ran = max(_n_finished(trials) - finished_before, 1)
        eta = (time.perf_counter() - t_start) / ran * max(total - finished, 0)
        log.info("[%d/%d] %s seed %d: %s in %s; ETA %s", finished, total, row, seed, result, _hms(elapsed), _hms(eta))
    return done, failed


def _hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def run_table3(opts: SweepOptions, runner=None) -> dict:
    """Enqueue what is pending, work the queue, write the report; return a summary."""
    preset = get_preset(opts.train.preset)
    corpus = opts.train.data or preset.corpus
    pairs = opts.select.pairs(preset, opts.train.table)
    jobs = opts.jobs = preset.sweep_jobs if opts.jobs is None else opts.jobs
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}; pass --jobs 1 or more")
    slots = gpu_slots(opts, jobs)
    out = Path(opts.train.out)
    name = study_name(preset.name, corpus)
    # Drivers set up in turn: creating a fresh SQLite schema or enqueueing concurrently would race.
    with file_lock(lock_dir(opts) / f"{name}.setup.lock", wait=True):
        url = opts.storage or f"sqlite:///{(out / 'optuna.db').resolve()}"
        storage = open_storage(url, create_dir=out)
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
        study.set_user_attr("preset", preset.name)
        study.set_user_attr("corpus", corpus)
        fail_stale_trials(study, opts, corpus)
        pending = enqueue_pending(study, pairs, preset=preset.name, tables=opts.train.table)
    log.info(
        "table3 %s on %s: %d pairs, %d to run (%s), %d at a time",
        preset.name, corpus, len(pairs), len(pending), study.study_name, jobs,
    )  # fmt: skip
    # Threads suffice: each worker waits on its own training process. Each opens its own storage
    # (Optuna caches trial states per storage object), exactly as separate drivers would.
    pace = (time.perf_counter(), _n_finished(study.get_trials(deepcopy=False)))

    def worker(i: int) -> tuple[int, int]:
        one = optuna.load_study(study_name=name, storage=open_storage(url))
        # worker i trains its pairs one after another on its own GPUs (slot i)
        mine = runner if slots is None else partial(runner or run_pair, gpus=slots[i])
        return work(one, opts, corpus, len(pairs), mine, pace)

    if slots is not None:
        log.info("table3: %d runs at once, each on its own GPUs: %s", jobs, " | ".join(slots))
    with ThreadPoolExecutor(jobs) as pool:
        results = [f.result() for f in [pool.submit(worker, i) for i in range(jobs)]]
    done, failed = sum(r[0] for r in results), sum(r[1] for r in results)
    return {"pairs": len(pairs), "ran": done + failed, "completed": done, "failed": failed}
