"""`aiayn table3`: every selected (row, seed) of Table 3 trained once, books kept by Optuna.

Optuna keeps the books, nothing more: one study per (preset, corpus); each (row, seed) is enqueued
once as a fixed-parameter trial; workers pop queued trials (Optuna's pop is atomic: a trial moves
WAITING → RUNNING for exactly one worker) and never let the sampler invent new ones. Each training
run is its own `aiayn train` process (so a DDP run never has Optuna inside its ranks); the trial
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

import fcntl
import json
import logging
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from ablations.errors import UserError
from ablations.presets import get_preset
from ablations.secrets import redact
from ablations.table import load_rows, select_rows
from sweeps.storage import open_storage

log = logging.getLogger(__name__)
MAX_SEED = 9999


@dataclass
class SweepOptions:
    preset: str = "tiny"
    rows: str | None = None
    extended: bool = False
    seeds: int = 1
    storage: str | None = None  # None: sqlite:///OUT/optuna.db
    out: str = "runs"
    report: str | None = "reports"
    data: str | None = None
    data_dir: str | None = None
    wandb: bool = False
    train_args: tuple[str, ...] = ()  # passed through to every `aiayn train`
    jobs: int | None = None  # training processes at once in this driver; None: the preset's sweep_jobs


def grid(opts: SweepOptions) -> list[tuple[str, int]]:
    """The (row, seed) pairs the sweep owes: the table's selected rows × seeds 0..N-1."""
    if not 1 <= opts.seeds <= MAX_SEED + 1:
        raise UserError(f"--seeds must be at least 1, got {opts.seeds}; pass --seeds 1 or more")
    return [(row, seed) for row in select_rows(opts.rows, opts.extended) for seed in range(opts.seeds)]


def study_name(preset: str, corpus: str) -> str:
    return f"table3-{preset}-{corpus}"


def pair_of(trial: optuna.trial.FrozenTrial) -> tuple[str, int] | None:
    params = trial.system_attrs.get("fixed_params") or trial.params
    return (params["row"], int(params["seed"])) if "row" in params and "seed" in params else None


def estimated_cost(row: str, preset: str) -> float:
    """A run's relative cost for ordering the queue: its steps x its parameters (a proxy for FLOPs)."""
    from ablations.presets import model_config, resolve  # lazy: torch is needed only here
    from lightning_modules.model import count_params

    resolved = resolve(row, preset)
    return resolved["train_steps"] * count_params(model_config(resolved, resolved["vocab_size"]))


def enqueue_pending(
    study: optuna.Study, pairs: list[tuple[str, int]], preset: str | None = None
) -> list[tuple[str, int]]:
    """Enqueue every pair that is neither done, queued nor running; failed pairs get a new trial.
    With `preset`, the longest runs are enqueued first (workers pop in enqueue order)."""
    busy = {TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING}
    taken = {pair_of(t) for t in study.get_trials(deepcopy=False) if t.state in busy}
    pending = [p for p in pairs if p not in taken]
    if preset is not None:
        cost = {row: estimated_cost(row, preset) for row in {row for row, _ in pending}}
        pending.sort(key=lambda p: -cost[p[0]])  # stable: seeds stay in order within a row
    for row, seed in pending:
        study.enqueue_trial({"row": row, "seed": seed})
    return pending


def lock_dir(opts: SweepOptions) -> Path:
    return Path(opts.out) / ".locks"


def pair_lock_path(opts: SweepOptions, corpus: str, row: str, seed: int) -> Path:
    return lock_dir(opts) / f"{opts.preset}-{corpus}-{row}-seed{seed}.lock"


def fail_stale_trials(study: optuna.Study, opts: SweepOptions, corpus: str, grace_s: float = 600.0) -> list:
    """Fail the RUNNING trials whose worker is dead, so that their pairs are enqueued again; return
    those pairs. A worker holds its pair's lock while the pair runs and records itself in the trial
    (`worker`), so a claimed trial whose lock is free is stale. A trial not claimed yet (its worker
    is between ask() and the lock, a moment) counts as stale only after `grace_s` seconds."""
    stale = []
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pair = pair_of(t)
        started = t.datetime_start.timestamp() if t.datetime_start else now
        if pair is None or ("worker" not in t.user_attrs and now - started < grace_s):
            continue
        with pair_lock(pair_lock_path(opts, corpus, *pair)) as free:
            if not free:
                continue  # a live worker holds it
            fresh = next(f for f in study.get_trials(deepcopy=False) if f.number == t.number)
            if fresh.state != TrialState.RUNNING:
                continue  # its worker finished it between our two reads
            worker = t.user_attrs.get("worker", "unknown")
            try:
                optuna.trial.Trial(study, t._trial_id).set_user_attr("stale", f"worker {worker} died; enqueued again")
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


@contextmanager
def pair_lock(path: Path, wait: bool = False):
    """An exclusive file lock (fcntl; works across processes on one machine and on most shared
    filesystems); yields False at once if another process holds it, unless `wait`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def train_command(opts: SweepOptions, row: str, seed: int) -> list[str]:
    cmd = [sys.executable, "-m", "ablations.cli", "train", "--row", row, "--seed", str(seed)]
    cmd += ["--preset", opts.preset, "--out", opts.out, "--no-progress"]
    if opts.data:
        cmd += ["--data", opts.data]
    if opts.data_dir:
        cmd += ["--data-dir", opts.data_dir]
    if opts.wandb:
        cmd.append("--wandb")
    return cmd + list(opts.train_args)


def _forkserver():
    """A multiprocessing forkserver that has imported Lightning and aiayn once. Each training process
    is forked from it instead of starting a fresh interpreter: importing torch + Lightning takes ~5 s,
    a tenth of a tiny row. (Forked from the forkserver, not from this multi-threaded driver, which
    fork() would make unsafe.) The forkserver is one per process and starts with the first child; the
    preload list only matters then."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["ablations.cli", "lightning_modules.train"])
    return ctx


def _train_in_child(argv: list[str], logfile: str, threads: int | None) -> None:
    """`aiayn train ARGV` in a forkserver child, stdout and stderr to `logfile`; exits with its status."""
    fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if threads:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    from ablations.cli import main

    sys.argv = ["aiayn", *argv]
    sys.exit(main(argv))


def _one_process(opts: SweepOptions) -> bool:
    """A run that is one process (no DDP ranks to launch) can be forked from the forkserver; Lightning
    launches DDP ranks by re-running the command line, which only a fresh process has."""
    args = list(opts.train_args)
    for flag in ("--devices", "--num-nodes"):
        if flag in args and args[args.index(flag) + 1] != "1":
            return False
    return True


def run_pair(opts: SweepOptions, corpus: str, row: str, seed: int) -> dict:
    """Train one pair in its own process; return its metrics.json (status failed if it died)."""
    from lightning_modules.train import run_dir  # torch-free callers of grid() need not import Lightning

    directory = run_dir(opts.out, opts.preset, corpus, row, seed)
    logfile = directory.parent / f"seed{seed}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    jobs = opts.jobs or 1
    # share the cores: N processes x all cores would thrash
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 and "OMP_NUM_THREADS" not in os.environ else None
    cmd = train_command(opts, row, seed)
    if _one_process(opts):
        child = _forkserver().Process(target=_train_in_child, args=(cmd[3:], str(logfile), threads))
        child.start()
        child.join()
        returncode = child.exitcode
    else:
        env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
        with open(logfile, "w") as out:
            returncode = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    metrics_file = directory / "metrics.json"
    if returncode == 0 and metrics_file.is_file():
        return json.loads(metrics_file.read_text())
    tail = logfile.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return {"row": row, "seed": seed, "status": "failed", "error": redact(f"exit {returncode}: {tail[0][:300]}")}


def _n_finished(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(t.state in (TrialState.COMPLETE, TrialState.FAIL) and "row" in t.params for t in trials)


def work(
    study: optuna.Study, opts: SweepOptions, corpus: str, total: int, runner=None, pace: tuple | None = None
) -> tuple[int, int]:
    """Pop and run queued trials until the queue is empty; returns (completed, failed) by this worker.
    `pace` = (start time, pairs finished before it), shared by a driver's workers, for the sweep's ETA."""
    runner = runner or run_pair
    done = failed = 0
    t_start, finished_before = pace or (time.perf_counter(), _n_finished(study.get_trials(deepcopy=False)))
    while True:
        # Optuna's pop (WAITING -> RUNNING) is a read-then-write; PostgreSQL/MySQL lock the row, SQLite
        # and the journal file do not, and two workers can pop the same trial. A file lock makes it atomic,
        # and checking the queue under it keeps ask() from inventing a trial when the queue is empty.
        with pair_lock(lock_dir(opts) / f"{study.study_name}.pop.lock", wait=True):
            if not any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
                break
            trial = study.ask()
        frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
        pair = pair_of(frozen)  # the queued (row, seed), from the trial's fixed params
        if pair is None:  # a worker on another machine (RDB storage) emptied the queue meanwhile
            study.tell(trial, state=TrialState.FAIL)
            break
        row, seed = pair
        # the queued values; the same choices in every trial (Optuna forbids a changing categorical space)
        trial.suggest_categorical("row", list(load_rows()))
        trial.suggest_int("seed", 0, MAX_SEED)
        with pair_lock(pair_lock_path(opts, corpus, row, seed)) as mine:
            if not mine or completed_elsewhere(study, (row, seed), trial.number):
                # the same pair, enqueued twice by racing drivers, is running or done in another worker
                trial.set_user_attr("skipped", "duplicate of a pair run by another worker")
                study.tell(trial, state=TrialState.PRUNED)
                continue
            trial.set_user_attr("worker", f"{platform.node()}:{os.getpid()}")  # holds the lock: see fail_stale_trials
            t0 = time.perf_counter()
            metrics = runner(opts, corpus, row, seed)
            elapsed = time.perf_counter() - t0
            trial.set_user_attr("metrics", {k: v for k, v in metrics.items() if k != "config"})
            trial.set_user_attr("run_dir", str(Path(opts.out) / opts.preset / corpus / row / f"seed{seed}"))
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
    preset = get_preset(opts.preset)
    corpus = opts.data or preset.corpus
    pairs = grid(opts)
    jobs = opts.jobs = preset.sweep_jobs if opts.jobs is None else opts.jobs
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}; pass --jobs 1 or more")
    out = Path(opts.out)
    name = study_name(preset.name, corpus)
    # Drivers set up in turn: creating a fresh SQLite schema or enqueueing concurrently would race.
    with pair_lock(lock_dir(opts) / f"{name}.setup.lock", wait=True):
        url = opts.storage or f"sqlite:///{(out / 'optuna.db').resolve()}"
        storage = open_storage(url, create_dir=out)
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
        study.set_user_attr("preset", preset.name)
        study.set_user_attr("corpus", corpus)
        fail_stale_trials(study, opts, corpus)
        pending = enqueue_pending(study, pairs, preset=preset.name)
    log.info(
        "table3 %s on %s: %d pairs, %d to run (%s), %d at a time",
        preset.name, corpus, len(pairs), len(pending), study.study_name, jobs,
    )  # fmt: skip
    # Threads suffice: each worker waits on its own training process. Each opens its own storage
    # (Optuna caches trial states per storage object), exactly as separate drivers would.
    pace = (time.perf_counter(), _n_finished(study.get_trials(deepcopy=False)))

    def worker() -> tuple[int, int]:
        one = optuna.load_study(study_name=name, storage=open_storage(url))
        return work(one, opts, corpus, len(pairs), runner, pace)

    with ThreadPoolExecutor(jobs) as pool:
        results = [f.result() for f in [pool.submit(worker) for _ in range(jobs)]]
    done, failed = sum(r[0] for r in results), sum(r[1] for r in results)
    summary = {"pairs": len(pairs), "ran": done + failed, "completed": done, "failed": failed}
    if opts.report:
        from reports.build import write_reports

        summary["report"] = [str(p) for p in write_reports(opts.out, opts.report, preset=preset.name)]
    return summary
