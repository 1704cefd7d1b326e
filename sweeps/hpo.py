"""`aiayn hpo`: Optuna TPE over the learning-rate factor, warmup, dropout and label smoothing of one
row, with median pruning on `val/ppl` through optuna-integration's PyTorchLightningPruningCallback.

Trials train in this process, one after another, on one device: Optuna must never live inside DDP
ranks (every rank would ask for its own trial). The objective is the final dev perplexity
(minimized, the same direction as the pruned metric); the best parameters are printed and saved.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import optuna

from ablations.errors import UserError
from ablations.files import atomic_write_json
from ablations.presets import get_preset, resolve
from sweeps.storage import open_storage

log = logging.getLogger(__name__)


@dataclass
class HpoOptions:
    row: str = "base"
    preset: str = "tiny"
    trials: int = 10
    storage: str | None = None  # None: sqlite:///OUT/hpo.db
    out: str = "runs"
    seed: int = 0
    max_steps: int | None = None
    eval_subset: int | None = None


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

    from lightning_modules.train import TrainOptions, train

    preset = get_preset(opts.preset)
    params = suggest(trial, preset)
    run = Path(opts.out) / "hpo" / preset.name / opts.row / f"trial{trial.number:04d}"
    metrics = train(
        TrainOptions(
            row=opts.row, preset=preset.name, seed=opts.seed, out=opts.out, run_dir=str(run), overrides=params,
            callbacks=(PyTorchLightningPruningCallback(trial, monitor="val/ppl"),), val_per_epoch=True,
            max_steps=opts.max_steps, eval_subset=opts.eval_subset, accelerator="cpu", progress=False,
        )
    )  # fmt: skip
    trial.set_user_attr("run_dir", str(run))
    if metrics.get("status") == "diverged":  # a result, not a crash: the search goes on without it
        trial.set_user_attr("diverged_at_step", metrics["diverged_at_step"])
        raise optuna.TrialPruned(f"diverged: {metrics['error']}")
    trial.set_user_attr("dev_bleu", metrics["dev_bleu"])
    log.info("trial %d: dev PPL %.3f, BLEU %.2f with %s", trial.number, metrics["dev_ppl"], metrics["dev_bleu"], params)
    return metrics["dev_ppl"]


def run_hpo(opts: HpoOptions) -> dict:
    if opts.trials < 1:
        raise UserError(f"--trials must be at least 1, got {opts.trials}")
    resolve(opts.row, opts.preset)  # unknown row or preset: fail before any study exists
    out = Path(opts.out)
    storage = open_storage(opts.storage or f"sqlite:///{(out / 'hpo.db').resolve()}", create_dir=out)
    study = optuna.create_study(
        study_name=f"hpo-{opts.preset}-{opts.row}",
        storage=storage,
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=opts.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        load_if_exists=True,
    )
    study.optimize(lambda t: objective(opts, t), n_trials=opts.trials, catch=())
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise UserError(f"no hpo trial of {opts.row} at {opts.preset} completed (all pruned or failed); add --trials")
    best = study.best_trial
    result = {"row": opts.row, "preset": opts.preset, "study": study.study_name, "best_trial": best.number,
              "best_dev_ppl": best.value, "best_params": best.params, "dev_bleu": best.user_attrs.get("dev_bleu"),
              "trials": len(study.trials), "pruned": sum(t.state.name == "PRUNED" for t in study.trials)}  # fmt: skip
    atomic_write_json(out / "hpo" / opts.preset / opts.row / "best.json", result)
    return result
