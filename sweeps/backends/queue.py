"""Optuna's queue, shared by the back ends that run pairs from this machine (local, subprocess): each pair is enqueued
once as a fixed trial whose user attributes name it; workers pop and claim trials (books.pop_and_claim) and never
let the sampler invent new ones; a trial's value is the run's dev BLEU. Pairs are enqueued longest first (a spec's
cost: steps x parameters), so that with N workers the long `big` row does not start last (longest-processing-time-
first scheduling)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
from optuna.trial import TrialState

from aiayn.ablations.table import MAX_SEED, load_rows
from aiayn.common.errors import UserError
from aiayn.common.locks import file_lock, removed_on_error
from aiayn.common.text import clock
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.devices import usable_cpus
from aiayn.lightning_modules.run.options import LOOK_EVAL
from aiayn.lightning_modules.run.rundir import RunMetrics
from aiayn.lightning_modules.run.spec import sweep_key
from aiayn.sweeps import books
from aiayn.sweeps.backends import Backend, Sweep, SweepSummary
from aiayn.sweeps.backends.progress import Progress
from aiayn.sweeps.books import Pair
from aiayn.sweeps.folders import sweep_log
from aiayn.sweeps.storage import check_readable, open_storage

log = logging.getLogger(__name__)


class Stop:
    """A sweep driver stopped by a signal (SIGTERM: a scheduler, `timeout`, `kill`; SIGINT: Ctrl-C), to the driver
    or its whole process group. It used to die at once by SIGTERM's default action, silently, its pairs
    left `running` in the books. Now its workers claim no new pair, its trainers are told (a SIGTERM each, so that
    one sent to the driver alone reaches them: each stops in one line and keeps its checkpoints), and once they have
    ended the driver says in one line what stopped and exits 128 + the signal; the same command resumes the pairs."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._children: set[int] = set()
        self._lock = threading.Lock()

    def _handle(self, signum, frame) -> None:
        self.signum = self.signum or signum
        with self._lock:
            children = list(self._children)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    @contextlib.contextmanager
    def handling(self):
        """SIGTERM and SIGINT handled as above while the sweep runs (from the main thread only, where Python runs
        signal handlers; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        before = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)

    @contextlib.contextmanager
    def child(self, pid: int):
        """A trainer process that a stop is forwarded to while it runs (and at once if the stop came first)."""
        with self._lock:
            self._children.add(pid)
        if self.signum is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            yield
        finally:
            with self._lock:
                self._children.discard(pid)


def study_name(preset: str, corpus: CorpusRef) -> str:
    return f"table3-{sweep_key(preset, corpus)}"  # also its pop lock's file name


def pair_of(trial: optuna.trial.FrozenTrial) -> Pair | None:
    """The (row, seed) a trial stands for: its user attributes `row` and `seed`."""
    attrs = trial.user_attrs
    return (str(attrs["row"]), int(attrs["seed"])) if "row" in attrs and "seed" in attrs else None


def trained_steps(trial: optuna.trial.FrozenTrial) -> int | None:
    """The steps the run of a completed trial trained (its recorded metrics), None where it recorded none."""
    steps = (trial.user_attrs.get("metrics") or {}).get("steps")
    return int(steps) if isinstance(steps, int) else None


def done_at(trial: optuna.trial.FrozenTrial, wanted: dict[str, int] | None) -> bool:
    """A completed trial whose run trained the steps the sweep wants of its row (`wanted`: row -> steps; None:
    whatever it trained). A trial completed at fewer (a look capped by --max-steps) is not done: the pair is
    enqueued again and its run extended."""
    if trial.state != TrialState.COMPLETE:
        return False
    pair, steps = pair_of(trial), trained_steps(trial)
    return wanted is None or pair is None or steps is None or steps >= wanted.get(pair[0], 0)


def rows_of_study(study: optuna.Study, rows: list[str]) -> list[str]:
    """The choices of the study's `row` parameter: the rows of the sweep's table (ablations/ and the user's --table
    files) when the study was created, kept in the study (user attribute `rows`). Optuna fixes a categorical
    parameter's choices for a study's life ("CategoricalDistribution does not support dynamic value space"), so a row
    added to the table later is named by its trial's user attribute `row` alone."""
    if "rows" not in study.user_attrs:
        study.set_user_attr("rows", list(rows))
    return list(study.user_attrs["rows"])


def _params(pair: Pair, choices: list[str]) -> dict:
    row, seed = pair
    return {"row": row, "seed": seed} if row in choices else {"seed": seed}


def enqueue_pending(
    study: optuna.Study,
    pairs: list[Pair],
    choices: list[str],
    cost: dict[str, float] | None = None,
    wanted: dict[str, int] | None = None,
) -> list[Pair]:
    """Enqueue every pair that is neither done (`done_at` the steps `wanted` of its row), queued nor running; failed
    and stopped pairs and runs completed at fewer steps get a new trial. With `cost` (row -> relative cost), the
    longest runs first (workers pop in enqueue order).

    The pair is the trial's user attributes: that is what the books read. It is also the trial's parameters, so that
    Optuna's tools show the table: the row a categorical over `choices` (`rows_of_study`), the seed an integer on a
    fixed range (0..MAX_SEED); optuna-dashboard's trial table and `trials_dataframe()` have a row column, and
    `get_param_importances` weighs the row against the seed. Nothing is sampled: the values are the enqueued ones."""
    busy = {TrialState.WAITING, TrialState.RUNNING}
    taken = {pair_of(t) for t in study.get_trials(deepcopy=False) if t.state in busy or done_at(t, wanted)}
    pending = [p for p in pairs if p not in taken]
    if cost is not None:
        pending.sort(key=lambda p: -cost[p[0]])  # stable: seeds stay in order within a row
    for row, seed in pending:
        study.enqueue_trial(_params((row, seed), choices), user_attrs={"row": row, "seed": seed})
    return pending


def set_params(trial: optuna.Trial, frozen: optuna.trial.FrozenTrial, choices: list[str]) -> None:
    """The popped trial's enqueued parameters set (nothing is sampled): the row where it was enqueued with one."""
    if "row" in frozen.system_attrs.get("fixed_params", {}):
        trial.suggest_categorical("row", choices)
    trial.suggest_int("seed", 0, MAX_SEED)


def _n_finished(trials: list[optuna.trial.FrozenTrial]) -> int:
    return sum(t.state in (TrialState.COMPLETE, TrialState.FAIL) and pair_of(t) is not None for t in trials)


def _hms(seconds: float) -> str:
    return clock(seconds)


class QueueBackend(Backend):
    """Pairs through Optuna's queue, `sweep.jobs` worker threads in this process, each waiting on one run at a
    time (`run_one`). A rerun of the same command skips completed pairs and retries failed ones; two drivers on
    one storage run each pair once."""

    @functools.cached_property
    def stop(self) -> Stop:
        """This driver's stop on a signal; a `run_one` that can name its trainer process registers it with
        `stop.child` (the local back end; the subprocess back end's trainers share the driver's process group, so a
        signal to the group reaches them, and one to the driver alone lets the pairs under way finish and starts no
        other)."""
        return Stop()

    def progress(self, sweep: Sweep) -> Progress:
        """This driver's lines on its pairs under way (progress.py), every `sweep.log_interval` seconds."""
        self.under_way = Progress(sweep.log_interval)
        return self.under_way

    def launch(self, sweep: Sweep, pairs: list[Pair]) -> SweepSummary:
        name = study_name(sweep.preset.name, sweep.corpus)
        url = sweep.storage or sweep.out.study_url("table3")
        claims = self.claims(sweep)
        key_of = self._key_of(sweep)
        check_readable(url)  # a garbled database or journal: one line, and no lock left beside it
        # drivers set up in turn: creating a fresh SQLite schema or enqueueing concurrently would race
        setup = sweep.out.lock(f"{name}.setup")
        with removed_on_error(setup, UserError), file_lock(setup, wait=True):  # a storage refused: no lock left
            storage = open_storage(url, create_dir=sweep.out.root)
            study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
            study.set_user_attr("preset", sweep.preset.name)
            study.set_user_attr("corpus", sweep.corpus.name)
            for t in books.fail_stale_trials(study, self.pop_lock(sweep), claims, key_of):
                log.warning(
                    "trial %d (%s seed %d) was left running by dead worker %s: failed, enqueued again",
                    t.number,
                    *pair_of(t),
                    t.user_attrs.get("worker", "unknown"),
                )
            cost = {row: spec.cost() for row, spec in sweep.specs.items()}
            choices = rows_of_study(study, list(load_rows(sweep.train.table)))
            outside = sorted({row for row, _ in pairs} - set(choices))
            if outside:
                log.info(
                    "%s: not among the rows this study was created with, so named by their trials' user attribute "
                    "`row` alone (Optuna fixes a parameter's choices for a study's life)",
                    ", ".join(outside),
                )
            enqueue_pending(study, pairs, choices, cost, sweep.wanted)
            sweep.record(self.name)
        # to run: every pair of this sweep queued, those enqueued now and those a stopped call left queued
        queued = {pair_of(t) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
        log.info(
            "table3 %s on %s: %d pairs, %d to run (%s), %d at a time",
            sweep.preset.name,
            sweep.corpus,
            len(sweep.pairs),
            len(queued & set(pairs)),
            name,
            sweep.jobs,
        )
        if sweep.train.max_steps is not None and sweep.train.eval_subset is None:
            log.info("a look: every run stops at --max-steps %d, %s", sweep.train.max_steps, LOOK_EVAL)
        slots = self.slots(sweep)
        pace = (time.perf_counter(), _n_finished(study.get_trials(deepcopy=False)))

        def worker(i: int) -> tuple[int, int]:
            # its own storage object: Optuna caches trial states per storage, as separate drivers would
            one = optuna.load_study(study_name=name, storage=open_storage(url))
            return self.work(one, sweep, claims, slots[i] if slots else None, pace)

        done = failed = diverged = 0
        while True:
            with self.stop.handling(), self.progress(sweep), ThreadPoolExecutor(sweep.jobs) as pool:
                results = [f.result() for f in [pool.submit(worker, i) for i in range(sweep.jobs)]]
            done, failed, diverged = (x + sum(r[i] for r in results) for i, x in enumerate((done, failed, diverged)))
            if self.stop.signum is not None:
                name = signal.Signals(self.stop.signum).name
                log.warning(
                    "table3 %s stopped by %s: %d pair(s) completed in this call; the stopped ones keep their "
                    "checkpoints and the same command resumes them",
                    sweep.preset.name,
                    name,
                    done,
                )
                raise SystemExit(128 + self.stop.signum)
            # a peer driver that died while this one worked left its pairs running in the books: theirs are failed
            # and enqueued again, and this driver runs them (it used to exit 0 with them pending, without a word)
            with file_lock(sweep.out.lock(f"{name}.setup"), wait=True):
                again = books.fail_stale_trials(study, self.pop_lock(sweep), claims, key_of)
                for t in again:
                    log.warning(
                        "trial %d (%s seed %d) was left running by dead worker %s: failed, run again here",
                        t.number,
                        *pair_of(t),
                        t.user_attrs.get("worker", "unknown"),
                    )
                enqueue_pending(
                    study, [p for p in pairs if p in {pair_of(t) for t in again}], choices, cost, sweep.wanted
                )
            if not again:
                break
        elsewhere = self._running_elsewhere(study, sweep)
        if elsewhere:
            log.info(
                "%d pair(s) of this sweep are being run by another driver (%s): theirs to finish; `aiayn status "
                "%s` lists them",
                len(elsewhere),
                ", ".join(f"{r} seed {s}" for r, s in elsewhere[:6]),
                sweep.out.root,
            )
        return SweepSummary(
            pairs=len(sweep.pairs),
            ran=done + failed + diverged,
            completed=done,
            failed=failed,
            diverged=diverged,
            elsewhere=len(elsewhere),
        )

    @staticmethod
    def _running_elsewhere(study: optuna.Study, sweep: Sweep) -> list[Pair]:
        """The sweep's pairs still RUNNING in the books after this driver's workers ended: another live driver's."""
        wanted = set(sweep.pairs)
        return sorted(
            pair_of(t)
            for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.RUNNING and pair_of(t) in wanted
        )

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

    def _claim(self, study, sweep: Sweep, claims, key_of, ask, held_by) -> tuple[tuple | None, bool]:
        """Claim the next queued trial, its claim held in the ExitStack `held_by` until it closes: ((trial, pair), or
        None where there was none to run, and whether the queue was empty)."""
        trial, frozen, held = held_by.enter_context(
            books.pop_and_claim(study, self.pop_lock(sweep), claims, key_of, ask)
        )
        if trial is None:
            return None, True
        pair = pair_of(frozen)
        if pair is None:  # a worker on another machine (RDB storage) emptied the queue meanwhile
            study.tell(trial, state=TrialState.FAIL)
            return None, True
        set_params(trial, frozen, rows_of_study(study, []))
        if held is None or self._completed_elsewhere(study, pair, trial.number, sweep.wanted):
            # the same pair, enqueued twice by racing drivers, is running or done in another worker
            if held is not None:
                held.close()
            trial.set_user_attr("skipped", "duplicate of a pair run by another worker")
            study.tell(trial, state=TrialState.PRUNED)
            return None, False
        held_by.callback(held.close)
        return (trial, pair), False

    def work(self, study: optuna.Study, sweep: Sweep, claims, slot, pace) -> tuple[int, int, int]:
        """Pop and run queued trials until the queue is empty; returns (completed, failed, diverged) by this
        worker."""
        done = failed = diverged = 0
        t_start, finished_before = pace
        key_of = self._key_of(sweep)
        wanted = set(sweep.pairs)

        def ask():
            if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                return None  # checked under the pop lock: ask() would invent a trial on an empty queue
            return study.ask()

        while self.stop.signum is None:  # a stopped sweep claims no new pair
            with contextlib.ExitStack() as claimed_now:
                claimed, empty = self._claim(study, sweep, claims, key_of, ask, claimed_now)
                if empty:
                    break
                if claimed is None:
                    continue
                trial, (row, seed) = claimed
                t0 = time.perf_counter()
                under_way = getattr(self, "under_way", None) or Progress(0)
                under_way.start(row, seed, sweep.run(row, seed), sweep.wanted[row])
                try:
                    metrics = self.run_one(sweep, row, seed, slot)
                finally:
                    under_way.end(row, seed)
                elapsed = time.perf_counter() - t0
                result, counts = self._settle(study, trial, (row, seed), metrics, sweep)  # told while claimed
                done, failed, diverged = done + counts[0], failed + counts[1], diverged + counts[2]
            trials = study.get_trials(deepcopy=False)
            # of this sweep's pairs: the study also holds other seed sets run into the same --out
            finished = sum(t.state == TrialState.COMPLETE and pair_of(t) in wanted for t in trials)
            # the driver's pace so far (all its workers) x what is left; longest pairs run first, so it errs long
            ran = max(_n_finished(trials) - finished_before, 1)
            eta = (time.perf_counter() - t_start) / ran * max(len(sweep.pairs) - finished, 0)
            # a stopped sweep starts nothing more: no time is left to estimate, only the command that resumes it
            left = f"ETA {_hms(eta)}" if self.stop.signum is None else "stopped: the same command resumes the rest"
            # a completed pair is counted ([k/N]); one that failed, diverged or was stopped is not, and says so
            tag = (
                f"{finished}/{len(sweep.pairs)}"
                if counts[0]
                else ("failed", "diverged", "stopped")[0 if counts[1] else 1 if counts[2] else 2]
            )
            log.info("[%s] %s seed %d: %s in %s; %s", tag, row, seed, result, _hms(elapsed), left)
        return done, failed, diverged

    def _settle(self, study: optuna.Study, trial, pair: Pair, metrics: RunMetrics, sweep: Sweep):
        """A pair's trial told how its run ended, its run's books kept; (what the log line says, (completed, failed,
        diverged) counts)."""
        run = sweep.run(*pair)
        trial.set_user_attr("metrics", {k: v for k, v in metrics.to_dict().items() if k != "config"})
        trial.set_user_attr("run_dir", str(run.path))
        if metrics.completed:
            run.clear_failure()
        elif run.read_metrics() is None and self.stop.signum is None:  # failed before training: the books must say
            run.write_failure(metrics.status, metrics.error)  # so too (a pair stopped with its sweep did not fail)
        if metrics.completed:  # told while holding the claim: no duplicate can start
            study.tell(trial, metrics.dev_bleu)
            return f"BLEU {metrics.dev_bleu:.2f}", (1, 0, 0)
        if self.stop.signum is not None:  # stopped with the sweep: not a failure; queued again at once
            # Optuna's word for a trial stopped before its end is PRUNED: the pair itself is pending, as the books say,
            # so a WAITING trial holds it in the study (optuna-dashboard) until a driver resumes it
            trial.set_user_attr("stopped", signal.Signals(self.stop.signum).name)
            study.tell(trial, state=TrialState.PRUNED)
            user_attrs = {"row": pair[0], "seed": pair[1], "resumes": trial.number}
            study.enqueue_trial(_params(pair, rows_of_study(study, [])), user_attrs=user_attrs)
            return f"stopped by {signal.Signals(self.stop.signum).name}", (0, 0, 0)
        study.tell(trial, state=TrialState.FAIL)
        is_diverged = metrics.status == "diverged"
        return f"{metrics.status.upper()} ({metrics.error or '?'})", (0, int(not is_diverged), int(is_diverged))

    @staticmethod
    def _completed_elsewhere(study: optuna.Study, pair: Pair, number: int, wanted: dict[str, int]) -> bool:
        """The pair done at the sweep's steps by another trial (a racing driver's) meanwhile."""
        return any(
            t.number != number and pair_of(t) == pair and done_at(t, wanted) for t in study.get_trials(deepcopy=False)
        )


def _threads(jobs: int) -> int | None:
    """CPU threads per run when `jobs` share the machine: N processes x all cores would thrash."""
    if jobs <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, usable_cpus() // jobs)


def attempt_header() -> str:
    """The line that opens each attempt in a pair's log: a rerun appends, so the earlier attempts' output stays."""
    return f"===== aiayn: attempt started {time.strftime('%Y-%m-%d %H:%M:%S %z')} (pid {os.getpid()}) =====\n"


def _result(sweep: Sweep, row: str, seed: int, returncode: int | None, log_file: Path | None = None) -> RunMetrics:
    run = sweep.run(row, seed)
    metrics = run.read_metrics()
    if returncode == 0 and metrics is not None:
        return metrics
    try:
        tail = (log_file or sweep_log(run)).read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    except FileNotFoundError:  # the process died before it opened its log; the driver's stderr has why
        tail = ["no log: the run's process died before it started (its error is in the sweep's own output)"]
    return sweep.failed(row, seed, f"exit {returncode}: {tail[0][:300]}")
