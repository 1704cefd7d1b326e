"""`aiayn hpo`: Optuna TPE over the learning-rate factor, warmup, dropout and label smoothing of one
row, with median pruning on `val/ppl` through optuna-integration's PyTorchLightningPruningCallback.

Trials train in this process, one after another, on one device (`--accelerator`, default auto: the
GPU when there is one; every other `aiayn train` option too: data, precision, max tokens): Optuna
must never live inside DDP ranks (every rank would ask for its own trial), so more than one device is
refused. The objective is the final dev perplexity (minimized, the same direction as the pruned
metric); the best parameters are printed and saved.

`--trials N` is the search's size: a rerun runs only the trials still missing, so an interrupted
search resumes. A trial left RUNNING by a killed search (its lock under OUT/.locks/ is free) is
failed and its parameters are enqueued again, with its run directory: the retry resumes that
trial's training from its last checkpoint. (Optuna's own heartbeat exists only for RDB storages and
for `optimize`'s own trials; the lock works for the journal too, as in `aiayn table3`.)
"""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from aiayn.ablations.presets import get_preset, resolve
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json
from aiayn.common.locks import file_lock
from aiayn.common.options import option
from aiayn.lightning_modules.options import TrainOptions
from aiayn.lightning_modules.rundir import RunDir
from aiayn.sweeps.storage import open_storage

log = logging.getLogger(__name__)


@dataclass
class HpoOptions:
    """`aiayn hpo`: how many trials, where Optuna keeps the study, and how each trial trains (`train`:
    every `aiayn train` option; the searched knobs are set per trial on top of its `--set`)."""

    trials: int = option(10, "trials in the search; a rerun runs the missing ones (an interrupted one resumes)")
    storage: str | None = option(None, "Optuna storage URL (default: sqlite:///OUT/hpo.db)")
    train: TrainOptions = field(default_factory=lambda: TrainOptions(progress=False))


def suggest(trial: optuna.Trial, preset) -> dict:
    """The search space, centred on the paper's values (and the preset's warmup)."""
    return {
        "lr_factor": trial.suggest_float("lr_factor", 0.25, 4.0, log=True),
        "warmup": trial.suggest_int("warmup", max(1, preset.warmup // 4), preset.warmup * 4, log=True),
        "P_drop": trial.suggest_float("P_drop", 0.0, 0.4),
        "eps_ls": trial.suggest_float("eps_ls", 0.0, 0.3),
    }


def trial_lock(opts: HpoOptions, number: int) -> Path:
    t = opts.train
    return Path(t.out) / ".locks" / f"hpo-{t.preset}-{t.row}-trial{number:04d}.lock"


def objective(opts: HpoOptions, trial: optuna.Trial) -> float:
    # held while the trial runs: a sign of life for `fail_stale_trials` of a later search
    with file_lock(trial_lock(opts, trial.number)):
        trial.set_user_attr("worker", f"{platform.node()}:{os.getpid()}")
        return _objective(opts, trial)


def _objective(opts: HpoOptions, trial: optuna.Trial) -> float:
    from optuna_integration import PyTorchLightningPruningCallback

    from aiayn.lightning_modules.train import train

    t = opts.train
    preset = get_preset(t.preset)
    params = suggest(trial, preset)
    # a retried trial (its search was killed) goes on in the run directory it started
    run_dir = trial.user_attrs.get("resume_dir") or str(RunDir.hpo_trial(t.out, preset.name, t.row, trial.number).path)
    trial.set_user_attr("run_dir", run_dir)
    metrics = train(
        replace(t, overrides={**t.overrides, **params}, progress=False), run_dir=run_dir,
        callbacks=(PyTorchLightningPruningCallback(trial, monitor="val/ppl"),), val_per_epoch=True,
    )  # fmt: skip
    if metrics.get("status") == "diverged":  # a result, not a crash: the search goes on without it
        trial.set_user_attr("diverged_at_step", metrics["diverged_at_step"])
        raise optuna.TrialPruned(f"diverged: {metrics['error']}")
    trial.set_user_attr("dev_bleu", metrics["dev_bleu"])
    log.info("trial %d: dev PPL %.3f, BLEU %.2f with %s", trial.number, metrics["dev_ppl"], metrics["dev_bleu"], params)
    return metrics["dev_ppl"]


def fail_stale_trials(study: optuna.Study, opts: HpoOptions, grace_s: float = 600.0) -> list[int]:
    """Fail the trials a killed search left RUNNING (their lock is free) and enqueue their parameters
    again with their run directory, which the retry resumes; return their numbers."""
    stale, now = [], time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        started = t.datetime_start.timestamp() if t.datetime_start else now
        if "worker" not in t.user_attrs and now - started < grace_s:
            continue  # between ask() and its lock, in a live search
        with file_lock(trial_lock(opts, t.number)) as free:
            if not free:
                continue  # a live search runs it
            try:
                optuna.trial.Trial(study, t._trial_id).set_user_attr("stale", "its search died; enqueued again")
                study.tell(t.number, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # finished meanwhile
        resume = t.user_attrs.get("run_dir")
        study.enqueue_trial(t.params, user_attrs={"resume_dir": resume} if resume else None)
        log.warning("trial %d was left running by a search that died: failed, its parameters enqueued again%s",
                    t.number, f" (resuming {resume})" if resume else "")  # fmt: skip
        stale.append(t.number)
    return stale


def run_hpo(opts: HpoOptions) -> dict:
    t = opts.train
    if opts.trials < 1:
        raise UserError(f"--trials must be at least 1, got {opts.trials}")
    if t.world_size > 1:
        raise UserError(f"aiayn hpo trains each trial in its own process on one device, not {t.world_size}; drop "
                        f"--devices/--num-nodes (Optuna cannot run inside DDP ranks)")  # fmt: skip
    resolve(t.row, t.preset, t.table)  # unknown row or preset: fail before any study exists
    out = Path(t.out)
    storage = open_storage(opts.storage or f"sqlite:///{(out / 'hpo.db').resolve()}", create_dir=out)
    study = optuna.create_study(
        study_name=f"hpo-{t.preset}-{t.row}",
        storage=storage,
        direction="minimize",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        load_if_exists=True,
    )
    # seeded by the trials so far: a resumed search continues the sampler's sequence, not its start again
    study.sampler = optuna.samplers.TPESampler(seed=t.seed + len(study.get_trials(deepcopy=False)))
    fail_stale_trials(study, opts)
    done = sum(x.state in (TrialState.COMPLETE, TrialState.PRUNED) for x in study.get_trials(deepcopy=False))
    if done < opts.trials:
        log.info("hpo %s: %d of %d trials done, running %d", study.study_name, done, opts.trials, opts.trials - done)
        study.optimize(lambda trial: objective(opts, trial), n_trials=opts.trials - done, catch=())
    complete = [trial for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise UserError(f"no hpo trial of {t.row} at {t.preset} completed (all pruned or failed); add --trials")
    best = study.best_trial
    result = {"row": t.row, "preset": t.preset, "study": study.study_name, "best_trial": best.number,
              "best_dev_ppl": best.value, "best_params": best.params, "dev_bleu": best.user_attrs.get("dev_bleu"),
              "trials": len(study.trials), "pruned": sum(x.state.name == "PRUNED" for x in study.trials),
              "failed": sum(x.state.name == "FAIL" for x in study.trials)}  # fmt: skip
    atomic_write_json(out / "hpo" / t.preset / t.row / "best.json", result)
    return result
