"""Runs: train one (row, preset, corpus, seed), evaluate or average its checkpoints, translate a file.

Every run lives in a directory that depends only on (preset, corpus, row, seed), so a rerun of the
same command resumes from `checkpoints/last.ckpt` instead of starting over. The directory holds
`config.json` (the resolved config, written before training), `checkpoints/`,
`logs/version_N/metrics.csv` (Lightning's CSV logger, one per attempt: training and validation
curves), `dev.hyp`/`dev.ref` (final dev translations and their references) and `metrics.json`
(the result, written last and atomically).
"""

from __future__ import annotations

import logging
import math
import os
import platform
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import optuna
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from ablations.errors import UserError
from ablations.files import atomic_write_json, atomic_write_text, check_writable_dir
from ablations.presets import MODEL_KEYS, get_preset, model_config, preset_dict, resolve
from ablations.secrets import redact_obj
from lightning_modules.data import TranslationDataModule, derive_accumulation
from lightning_modules.evaluate import TOK_BLEU_LABEL, evaluate
from lightning_modules.model import count_params
from lightning_modules.module import TranslationModule
from lightning_modules.reliability import (
    AtomicCheckpointIO,
    Diverged,
    DivergenceGuard,
    RNGStates,
    hold_run_lock,
    is_launch_rank_zero,
    remove_stale_temps,
)
from lightning_modules.requeue import CHECKPOINT_NAME, slurm_parts

log = logging.getLogger(__name__)


@dataclass
class TrainOptions:
    """`aiayn train` flags (the Trainer's usual ones plus where data and results live)."""

    row: str = "base"
    preset: str = "tiny"
    data: str | None = None  # corpus; None: the preset's
    data_dir: str | None = None
    src_lang: str = "en"
    tgt_lang: str = "de"
    seed: int = 0
    out: str = "runs"
    cache_dir: str | None = None
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_steps: int | None = None  # None: the preset's steps for the row
    max_tokens: int | None = None  # per device per batch; None: the preset's
    vocab_size: int | None = None  # joint BPE vocabulary; None: the preset's
    dev_subset: int | None = -1  # -1: the preset's
    ckpt_every: int | None = None  # optimizer steps between kept checkpoints; None: the preset's
    ckpt_every_minutes: float | None = None  # instead, wall-clock minutes (the paper: 10)
    val_every: int | None = None  # optimizer steps between validations; None: the preset's
    eval_subset: int | None = None  # final evaluation on the first K dev sentences; None: all (the paper)
    num_workers: int = 0
    wandb: bool = False
    progress: bool = True
    # for hyper-parameter search (`aiayn hpo`): knob overrides, a run directory per trial, callbacks
    overrides: dict | None = None  # `--set KEY=VALUE`: model knobs (MODEL_KEYS), warmup, lr_factor
    run_dir: str | None = None
    callbacks: tuple = ()
    val_per_epoch: bool = False  # validate at epoch ends (the pruning callback reports step = epoch)


def run_dir(out: str | Path, preset: str, corpus: str, row: str, seed: int) -> Path:
    return Path(out) / preset / corpus / row / f"seed{seed}"


def world_size(opts: TrainOptions) -> int:
    return opts.devices * opts.num_nodes if isinstance(opts.devices, int) else 1


def device_tokens(preset, world: int) -> int:
    """Tokens per side per device batch when --max-tokens is not given: the preset's budget split over
    the devices, so one optimizer step keeps the preset's tokens (the paper's 25k on 8 GPUs: 3125
    each; on 1 GPU: 25k, or accumulation with a smaller --max-tokens), but above max_len (a
    sentence must fit in a batch)."""
    return min(preset.max_tokens, max(math.ceil(preset.tokens_per_step / world), preset.max_len + 1))


def build_datamodule(opts: TrainOptions, preset) -> TranslationDataModule:
    dev_subset = preset.dev_subset if opts.dev_subset == -1 else opts.dev_subset
    return TranslationDataModule(
        corpus=opts.data or preset.corpus,
        data_dir=opts.data_dir,
        cache_dir=opts.cache_dir,
        vocab_size=opts.vocab_size or preset.vocab_size,
        max_tokens=opts.max_tokens or device_tokens(preset, world_size(opts)),
        src_lang=opts.src_lang,
        tgt_lang=opts.tgt_lang,
        seed=opts.seed,
        dev_subset=dev_subset,
        max_len=preset.max_len,
        num_workers=opts.num_workers,
    )


def data_identity(dm: TranslationDataModule) -> dict:
    """The DataModule arguments that fix which tokens a model sees (saved in config and checkpoint)."""
    return {"corpus": dm.corpus, "data_dir": dm.data_dir, "vocab_size": dm.requested_vocab_size,
            "src_lang": dm.src_lang, "tgt_lang": dm.tgt_lang, "max_len": dm.max_len}  # fmt: skip


def check_run_dir(path: Path, config: dict) -> None:
    """A run directory holds one config: refuse to resume a run of another one."""
    import json

    saved_file = path / "config.json"
    if not saved_file.exists():
        return
    try:
        saved = json.loads(saved_file.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {saved_file} ({e}); delete the run directory {path} to start over") from e
    views = {"model": lambda c: c.get("model"), "data": lambda c: c.get("data"),
             "schedule": lambda c: {k: c.get("train", {}).get(k) for k in SCHEDULE_KEYS}}  # fmt: skip
    for key, view in views.items():
        if view(saved) != view(config):
            old, new = view(saved) or {}, view(config)
            diff = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
            raise UserError(
                f"run directory {path} holds a run of another config ({key} differs: {diff}); "
                f"use another --out or delete that directory"
            )


SCHEDULE_KEYS = ("warmup", "lr_factor")


def apply_overrides(resolved: dict, preset, overrides: dict | None) -> tuple[dict, dict]:
    """The row's knobs and the schedule with `--set` values applied and checked (a UserError naming
    the value); each override is listed among the run's deviations. Setting d_model or h without
    d_k/d_v makes those d_model/h again, as in the paper."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(MODEL_KEYS) - set(SCHEDULE_KEYS))
    if unknown:
        raise UserError(f"--set {unknown[0]}: unknown key; use one of {', '.join((*MODEL_KEYS, *SCHEDULE_KEYS))}")
    resolved = dict(resolved)
    if {"d_model", "h"} & set(overrides):
        for name in ("d_k", "d_v"):
            resolved[name] = overrides.get(name)
    resolved.update({k: v for k, v in overrides.items() if k in MODEL_KEYS})
    schedule = {"warmup": preset.warmup, "lr_factor": preset.lr_factor}
    schedule.update({k: v for k, v in overrides.items() if k in SCHEDULE_KEYS})
    for key in SCHEDULE_KEYS:
        if schedule[key] <= 0:
            raise UserError(f"--set {key}={schedule[key]}: {key} must be positive; change the --set value")
    if overrides:
        given = " ".join(f"{k}={v}" for k, v in overrides.items())
        try:  # the checks of TransformerConfig, before any data is prepared or anything written
            cfg = model_config(resolved, preset.vocab_size)
            resolved["d_k"], resolved["d_v"] = cfg.d_k, cfg.d_v
        except UserError as e:
            raise UserError(f"{str(e.__cause__ or e)} (--set {given}); change the --set value") from e
        resolved["deviations"] = [*resolved["deviations"], f"overridden: {given}"]
    return resolved, schedule


def train(opts: TrainOptions) -> dict:
    """Train one run to completion (or resume it) and return its metrics.json content."""
    preset = get_preset(opts.preset)
    resolved, schedule = apply_overrides(resolve(opts.row, opts.preset), preset, opts.overrides)
    dm = build_datamodule(opts, preset)
    corpus = dm.corpus
    out_dir = Path(opts.run_dir) if opts.run_dir else run_dir(opts.out, preset.name, corpus, resolved["row"], opts.seed)
    check_writable_dir(out_dir, "--out")
    dm.prepare_data()  # corpus, tokenizer and encoded cache; user errors surface here, before any write
    cfg = model_config(resolved, dm.vocab_size, max_len=max(preset.max_len, 512))
    steps = opts.max_steps or resolved["train_steps"]
    world = world_size(opts)
    accumulate = derive_accumulation(preset.tokens_per_step, dm.max_tokens, world)
    config = {
        "row": resolved,
        "preset": preset_dict(preset),
        "model": cfg.to_dict(),
        "data": data_identity(dm),
        "train": {
            "seed": opts.seed, "steps": steps, "accumulate": accumulate, "world_size": world,
            "effective_tokens_per_step": dm.max_tokens * world * accumulate, "precision": opts.precision,
            **schedule,
        },
    }  # fmt: skip
    check_run_dir(out_dir, config)

    # One process per run directory (rank 0 holds the lock until it returns); leftovers of writes
    # that a kill interrupted are removed. Nothing is written before this point.
    run_lock = hold_run_lock(out_dir) if is_launch_rank_zero() else None  # noqa: F841 (held, not used)
    if run_lock is not None:
        remove_stale_temps(out_dir)
    pl.seed_everything(opts.seed, workers=True, verbose=False)
    module = TranslationModule(cfg.to_dict(), **schedule, data=config["data"])
    trainer = build_trainer(opts, preset, out_dir, steps, accumulate, resolved)
    if trainer.is_global_zero:
        atomic_write_json(out_dir / "config.json", redact_obj(config))
        t = config["train"]
        log.info(
            "%d tokens per side per optimizer step = %d per device batch x %d devices x %d accumulated "
            "(preset: %d)", t["effective_tokens_per_step"], dm.max_tokens, world, accumulate, preset.tokens_per_step
        )  # fmt: skip
        if t["effective_tokens_per_step"] > 1.1 * preset.tokens_per_step:
            log.warning("more tokens per step than the preset's; pass a smaller --max-tokens")
    resume = resume_checkpoint(out_dir)
    t0 = time.perf_counter()
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else None)
    except Diverged as e:  # a result, not a crash: last.ckpt keeps the last finite state
        log.warning("%s seed %d diverged: %s", resolved["row"], opts.seed, e)
        if not trainer.is_global_zero:
            return {}
        return write_metrics(out_dir, config, status="diverged", diverged_at_step=e.step, error=str(e))
    except Exception as e:
        if trainer.is_global_zero:
            status = "pruned" if isinstance(e, optuna.TrialPruned) else "failed"
            write_metrics(out_dir, config, status=status, error=f"{type(e).__name__}: {e}")
        raise
    train_time = time.perf_counter() - t0
    if any(getattr(c, "requeued", False) for c in trainer.callbacks):  # RequeueOnSignal: SLURM restarts it
        log.info("%s seed %d: checkpointed at step %d and requeued", resolved["row"], opts.seed, trainer.global_step)
        return {}
    if not trainer.is_global_zero:
        return {}
    # The final evaluation decodes the whole dev set (validation during training may use a subset).
    full_dev = TranslationDataModule(
        **config["data"], cache_dir=opts.cache_dir, max_tokens=dm.max_tokens, dev_subset=opts.eval_subset
    )
    full_dev.setup("validate")
    result = evaluate(module.model, full_dev, "dev")
    # hypotheses and their references side by side: the report's paired bootstrap needs both
    atomic_write_text(out_dir / "dev.hyp", "\n".join(result.pop("hypotheses")) + "\n")
    atomic_write_text(out_dir / "dev.ref", "\n".join(full_dev.references("dev")) + "\n")
    metrics = write_metrics(
        out_dir, config, status="completed", steps=trainer.global_step, params=count_params(cfg),
        train_time_s=round(train_time, 2), tokens_per_s=round(module.total_tokens * world / max(train_time, 1e-9), 1),
        dev_bleu=round(result["bleu"], 2), dev_bleu_signature=result["bleu_signature"],
        dev_tok_bleu=round(result["tok_bleu"], 2), dev_tok_bleu_label=TOK_BLEU_LABEL, dev_ppl=round(result["ppl"], 4),
        dev_sentences=result["n_sentences"],
    )  # fmt: skip
    finish_wandb(trainer, metrics)
    return metrics


def finish_wandb(trainer: pl.Trainer, metrics: dict) -> None:
    """Put the final dev figures in the W&B run's summary and close the run (else the next run in this
    process, e.g. an `aiayn hpo` trial, would log into it)."""
    for logger in trainer.loggers:
        if type(logger).__name__ == "WandbLogger":
            run = logger.experiment
            run.summary.update({"dev/bleu": metrics["dev_bleu"], "dev/ppl": metrics["dev_ppl"], "status": "completed"})
            run.finish()


def resume_checkpoint(out_dir: Path) -> Path | None:
    """The checkpoint a rerun resumes from: the newer of `checkpoints/last.ckpt` (periodic) and
    `checkpoints/requeue.ckpt` (saved on SLURM's warning signal, lightning_modules/requeue.py).
    Newer = higher global step; an unreadable file (killed mid-save) is passed over."""
    candidates = [out_dir / "checkpoints" / "last.ckpt", out_dir / "checkpoints" / CHECKPOINT_NAME]
    best, best_step = None, -1
    for path in candidates:
        if not path.is_file():
            continue
        try:  # mmap: reads the step without loading the tensors
            step = torch.load(path, map_location="cpu", mmap=True, weights_only=False)["global_step"]
        except Exception as e:
            log.warning("not resuming from %s: unreadable (%s: %s)", path, type(e).__name__, e)
            continue
        if step >= best_step:  # on a tie the later candidate (the requeue checkpoint) wins
            best, best_step = path, step
    return best


def write_metrics(out_dir: Path, config: dict, status: str, **fields) -> dict:
    r = config["row"]
    metrics = {
        "row": r["row"], "group": r["group"], "seed": config["train"]["seed"], "preset": r["preset"],
        "data": config["data"]["corpus"], "status": status, **fields,
        "paper_ppl": r["paper_ppl"], "paper_bleu": r["paper_bleu"], "paper_params_m": r["paper_params_m"],
        "config": {k: r[k] for k in MODEL_KEYS}, "deviations": r["deviations"],
        "effective_tokens_per_step": config["train"]["effective_tokens_per_step"],
        "host": platform.node(), "torch": torch.__version__, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    metrics = redact_obj(metrics)
    atomic_write_json(out_dir / "metrics.json", metrics)
    return metrics


def build_trainer(opts: TrainOptions, preset, out_dir: Path, steps: int, accumulate: int, resolved: dict) -> pl.Trainer:
    by_time = opts.ckpt_every_minutes is not None
    ckpt = ModelCheckpoint(
        dirpath=out_dir / "checkpoints",
        filename="step{step:07d}",
        auto_insert_metric_name=False,
        every_n_train_steps=None if by_time else (opts.ckpt_every or preset.ckpt_every),
        train_time_interval=timedelta(minutes=opts.ckpt_every_minutes) if by_time else None,
        save_top_k=preset.keep_ckpts,  # the newest k periodic checkpoints, for "average the last 5 / 20"
        monitor="step",
        mode="max",
        save_last=True,
    )
    # One CSV log per attempt (logs/version_N/metrics.csv): Lightning's CSVLogger deletes an existing
    # metrics.csv when it starts, which would lose the curve before a resume.
    loggers = [CSVLogger(out_dir, name="logs")]
    # under SLURM: Lightning's requeue handler off, ours (checkpoint at a step boundary) on
    slurm_plugins, slurm_callbacks = slurm_parts(out_dir / "checkpoints")
    if opts.wandb:
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(
            WandbLogger(
                project=f"aiayn-{preset.name}", group=resolved["row"], job_type="train",
                name=f"{resolved['row']}-s{opts.seed}", save_dir=str(out_dir), config=resolved,
                offline=not os.environ.get("WANDB_API_KEY"),
            )
        )  # fmt: skip
    return pl.Trainer(
        accelerator=opts.accelerator,
        devices=opts.devices,
        num_nodes=opts.num_nodes,
        strategy=opts.strategy,
        precision=opts.precision,
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        # counts batches, not optimizer steps
        val_check_interval=None if opts.val_per_epoch else min(opts.val_every or preset.val_every, steps) * accumulate,
        check_val_every_n_epoch=1 if opts.val_per_epoch else None,
        num_sanity_val_steps=0,
        # RNGStates: exact resume; DivergenceGuard: NaN/inf loss ends the run as `diverged`
        callbacks=[RNGStates(), DivergenceGuard(), ckpt, *opts.callbacks, *slurm_callbacks],
        plugins=[AtomicCheckpointIO(), *slurm_plugins],  # checkpoints: written to a temporary file and renamed
        logger=loggers,
        default_root_dir=out_dir,
        enable_progress_bar=opts.progress,
        enable_model_summary=False,
        deterministic=opts.accelerator == "cpu",
        use_distributed_sampler=False,  # the token-bucket sampler shards by rank itself
        log_every_n_steps=10,
    )
