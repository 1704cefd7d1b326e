"""A training run on W&B, as W&B's users run it: Lightning's WandbLogger, set up by W&B's conventions.

- Mode: aiayn.common.wandb_mode (WANDB_MODE, else online with credentials from WANDB_API_KEY,
  `wandb login`'s ~/.netrc or W&B's settings, else offline), said in the log with the reason.
- One W&B run per run directory: its id is kept in the run directory (RunDir.wandb_attempt) and
  passed with resume="allow", so a rerun or a SLURM requeue continues the same W&B run online.
  Offline, where W&B cannot resume, each attempt after the first is its own W&B run (`ID-aN`), and
  the log names the attempts. W&B's own variables are honoured: WANDB_RUN_ID (set by `wandb agent`
  for a sweep's run), WANDB_PROJECT, WANDB_ENTITY.
- Config: every knob that defines the run (the row's, the schedule's, seed, precision, accumulation,
  the real tokens per optimizer step, the preset and its rule, the corpus and tokenizer identity).
- Summary: the final figures of metrics.json; optionally the final checkpoint as a model artifact
  (it carries its tokenizer and config, so it is usable alone).

`mode` goes to `wandb.init` through the logger's kwargs rather than WandbLogger(offline=True), which
sets os.environ["WANDB_MODE"] for the whole process (a later run in the process, an hpo trial, would
inherit it).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict

from aiayn.ablations.knobs import MODEL_KEYS
from aiayn.common.wandb_mode import wandb_mode
from aiayn.lightning_modules.run.rundir import RunConfig, RunDir, RunMetrics
from aiayn.lightning_modules.run.spec import experiment_name

log = logging.getLogger(__name__)

# metrics.json fields that go into the W&B run's summary, under W&B's slash-named metric keys
SUMMARY = {
    "dev_bleu": "dev/bleu",
    "dev_tok_bleu": "dev/tok_bleu",
    "dev_ppl": "dev/ppl",
    "dev_bleu_signature": "dev/bleu_signature",
    "dev_sentences": "dev/sentences",
    "params": "params",
    "steps": "steps",
    "train_time_s": "train_time_s",
    "tokens_per_s": "tokens_per_s",
    "diverged_at_step": "diverged_at_step",
    "error": "error",
}


def wandb_config(config: RunConfig) -> dict:
    """The W&B run config of a run's config.json: the row's knobs at the top (W&B groups and filters by
    top-level keys; `row` and `seed` are also the sweep's parameters), every section beside them. The other loggers
    get the same view (callbacks.LogRunConfig)."""
    spec, train = config.spec, config.train
    return {
        "row": spec.row,
        "seed": train.seed,
        "group": spec.group,
        "preset": spec.preset.name,
        "corpus": config.data.corpus.name,
        **{k: getattr(spec.model, k) for k in MODEL_KEYS},
        "train_steps": train.steps,
        "precision": train.precision,
        "accumulate": train.accumulate,
        "world_size": train.world_size,
        "effective_tokens_per_step": train.effective_tokens_per_step,
        "warmup": spec.schedule.warmup,
        "lr_factor": spec.schedule.lr_factor,
        "preset_rule": spec.preset.rule(),
        "deviations": [str(d) for d in spec.deviations],
        "paper": asdict(spec.paper),
        "model": config.model,
        "data": config.data.to_dict(),
        "train": config.to_dict()["train"],
        "preset_config": asdict(spec.preset),
        "tokenizer_sha256": config.tokenizer_sha256,
        "options": config.options,
    }


def tracker_params(config: RunConfig) -> dict:
    """`wandb_config`'s view with one key per value, for TensorBoard and MLflow, which flatten its sections into keys
    beside the top-level ones (`d_model` and `model/d_model`, `seed` and `train/seed`, `row` and `options/row`): the
    knobs and the training plan once, at the top, the data and the paper's numbers as sections."""
    view = wandb_config(config)
    for section in ("model", "train", "preset_config", "options"):  # each repeats what the top holds
        view.pop(section)
    view.update({k: v for k, v in config.model.items() if k not in view})  # vocab_size, max_len
    view["data"] = {k: v for k, v in view["data"].items() if k not in view}  # corpus, vocab_size, max_len: above
    return view


def init_kwargs(run: RunDir, config: RunConfig, mode: str, why: str) -> dict | None:
    """The arguments of this attempt's WandbLogger (and so of wandb.init), or None when W&B is
    disabled. Records the attempt in the run directory and says in the log where it goes."""
    row, seed, preset = config.spec.row, config.train.seed, config.spec.preset.name
    if mode == "disabled":
        log.info("W&B disabled (%s): %s seed %d is not logged to W&B", why, row, seed)
        return None
    attempt = run.wandb_attempt(mode, row, seed, given_id=os.environ.get("WANDB_RUN_ID") or None)
    if mode == "online":
        log.info(
            "W&B online (%s): W&B run %s, attempt %d of %s (resume=allow)",
            why,
            attempt["id"],
            attempt["attempt"],
            run.path,
        )
    elif attempt["id"] != attempt["base_id"]:
        log.warning(
            "W&B offline (%s). W&B cannot resume an offline run, so attempt %d of %s is its own W&B run %s "
            "(%r; earlier attempts: %s); `wandb sync %s/wandb/offline-run-*` uploads each",
            why,
            attempt["attempt"],
            run.path,
            attempt["id"],
            attempt["name"],
            ", ".join(attempt["earlier"]),
            run.path,
        )
    else:
        log.info("W&B offline (%s): W&B run %s in %s/wandb", why, attempt["id"], run.path)
    return {
        "project": os.environ.get("WANDB_PROJECT") or experiment_name(preset, config.data.corpus),
        "group": row,
        "job_type": "train",
        "name": attempt["name"],
        "id": attempt["id"],
        "resume": "allow",
        "mode": mode,
        "save_dir": str(run.path),
        "config": wandb_config(config),
    }


def wandb_logger(run: RunDir, config: RunConfig):
    """Lightning's WandbLogger for this attempt of `run` (None when W&B is disabled)."""
    kwargs = init_kwargs(run, config, *wandb_mode())
    if kwargs is None:
        return None
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(**kwargs)
    # Lightning passes wandb.init anonymous=None whatever it is given, and W&B warns on every run that the setting has
    # no effect: the key is dropped before the run starts (WandbLogger keeps wandb.init's arguments in _wandb_init)
    getattr(logger, "_wandb_init", {}).pop("anonymous", None)
    logger.aiayn_base_id = run.read_wandb_record()["id"]  # the model artifact's name
    return logger


def _wandb_loggers(trainer) -> list:
    return [lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger"]


def finish(
    trainer,
    metrics: RunMetrics | None,
    *,
    checkpoint=None,
    preempted: bool = False,
    steps: int = 0,
    exit_code: int = 0,
    status: str = "requeued",
) -> None:
    """Put the run's result into the W&B run's summary (and, with `checkpoint`, log that file as a
    model artifact), then finish the W&B run, so that the next run in this process (an hpo trial)
    starts its own. `preempted`: stopped at step `steps` to go on later (`status`: "requeued" by SLURM, or "stopped"
    by SIGTERM), so W&B marks the run preempting."""
    for logger in _wandb_loggers(trainer):
        experiment = logger.experiment
        values = metrics.to_dict() if metrics is not None else {"status": status, "steps": steps}
        summary = {SUMMARY[k]: v for k, v in values.items() if k in SUMMARY}
        if metrics is not None and metrics.budget_steps is not None:
            summary.update({"budget/budget_steps": metrics.budget_steps, "budget/capped": metrics.capped})
        experiment.summary.update({"status": values["status"], **summary})
        if checkpoint is not None:
            _log_checkpoint(experiment, checkpoint, logger.aiayn_base_id, metrics)
        if preempted:
            experiment.mark_preempting()
        experiment.finish(exit_code=exit_code)


def _log_checkpoint(experiment, path, base_id: str, metrics: RunMetrics) -> None:
    """The final checkpoint as the W&B model artifact `model-<run id>` (logged by us at the end rather
    than by WandbLogger(log_model=True), which uploads every kept checkpoint: up to 20 here)."""
    import wandb

    values = metrics.to_dict()
    meta = {k: values[k] for k in ("row", "seed", "preset", "data", "steps", "dev_bleu", "dev_ppl") if k in values}
    artifact = wandb.Artifact(
        f"model-{base_id}",
        type="model",
        metadata=meta,
        description="aiayn checkpoint; carries its tokenizer and config (aiayn translate --ckpt)",
    )
    artifact.add_file(str(path), name="last.ckpt")
    experiment.log_artifact(artifact, aliases=["latest", f"step{metrics.steps or 0}"])
