"""`aiayn hpo`: Optuna TPE over the learning-rate factor, warmup, dropout and label smoothing of one
row, with median pruning on `val/ppl` through optuna-integration's PyTorchLightningPruningCallback.

Trials train in this process, one after another, on one device: Optuna must never live inside DDP
ranks (every rank would ask for its own trial). The objective is the final dev perplexity
(minimized, the same direction as the pruned metric); the best parameters are printed and saved.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna

from aiayn.ablations.presets import get_preset, resolve
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json
from aiayn.common.options import option
from aiayn.lightning_modules.options import TrainOptions
from aiayn.lightning_modules.rundir import RunDir
from aiayn.sweeps.storage import open_storage

log = logging.getLogger(__name__)


@dataclass
class HpoOptions:
    """`aiayn hpo`: how many trials, where Optuna keeps the study, and how each trial trains (`train`:
    every `aiayn train` option; the searched knobs are set per trial on top of its `--set`)."""

    trials: int = option(10, "trials to run (a rerun adds to the same study)")
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


def objective(opts: HpoOptions, trial: optuna.Trial) -> float:
    from optuna_integration import PyTorchLightningPruningCallback

    from aiayn.lightning_modules.train import train

    t = opts.train
    preset = get_preset(t.preset)
    params = suggest(trial, preset)
    run = RunDir.hpo_trial(t.out, preset.name, t.row, trial.number)
    metrics = train(
        replace(t, overrides={**t.overrides, **params}, progress=False), run_dir=run.path,
        callbacks=(PyTorchLightningPruningCallback(trial, monitor="val/ppl"),), val_per_epoch=True,
    )  # fmt: skip
    trial.set_user_attr("run_dir", str(run.path))
    if metrics.get("status") == "diverged":  # a result, not a crash: the search goes on without it
        trial.set_user_attr("diverged_at_step", metrics["diverged_at_step"])
        raise optuna.TrialPruned(f"diverged: {metrics['error']}")
    trial.set_user_attr("dev_bleu", metrics["dev_bleu"])
    log.info("trial %d: dev PPL %.3f, BLEU %.2f with %s", trial.number, metrics["dev_ppl"], metrics["dev_bleu"], params)
    return metrics["dev_ppl"]


def run_hpo(opts: HpoOptions) -> dict:
    t = opts.train
    if opts.trials < 1:
        raise UserError(f"--trials must be at least 1, got {opts.trials}")
    resolve(t.row, t.preset, t.table)  # unknown row or preset: fail before any study exists
    out = Path(t.out)
    storage = open_storage(opts.storage or f"sqlite:///{(out / 'hpo.db').resolve()}", create_dir=out)
    study = optuna.create_study(
        study_name=f"hpo-{t.preset}-{t.row}",
        storage=storage,
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=t.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        load_if_exists=True,
    )
    study.optimize(lambda trial: objective(opts, trial), n_trials=opts.trials, catch=())
    complete = [trial for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise UserError(f"no hpo trial of {t.row} at {t.preset} completed (all pruned or failed); add --trials")
    best = study.best_trial
    result = {"row": t.row, "preset": t.preset, "study": study.study_name, "best_trial": best.number,
              "best_dev_ppl": best.value, "best_params": best.params, "dev_bleu": best.user_attrs.get("dev_bleu"),
              "trials": len(study.trials), "pruned": sum(x.state.name == "PRUNED" for x in study.trials)}  # fmt: skip
    atomic_write_json(out / "hpo" / t.preset / t.row / "best.json", result)
    return result
