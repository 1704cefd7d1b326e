"""One run: train a (row, preset, corpus, seed) to completion, or resume it, and evaluate it.

`train(TrainOptions(...))` is the function every caller uses: the command line (`aiayn train`), the
sweep's worker processes (`aiayn table3`), `aiayn hpo`'s trials. It resolves the row at the preset's
scale (ablations/), applies `--set` overrides, prepares the data, writes the resolved config into the
run directory (lightning_modules/rundir.py owns its layout), fits with Lightning, decodes the whole dev
set on the device it trained on, and writes `metrics.json`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import optuna
from lightning.pytorch.loggers import CSVLogger

from aiayn.ablations.presets import Preset, get_preset, preset_dict, resolve
from aiayn.ablations.table import MODEL_KEYS
from aiayn.common.errors import UserError
from aiayn.common.files import check_writable_dir, sha256_file
from aiayn.common.secrets import redact_obj
from aiayn.lightning_modules import wandb_run
from aiayn.lightning_modules.callbacks import (
    AtomicCheckpointIO,
    Diverged,
    DivergenceGuard,
    RNGStates,
    RunFilesInCheckpoint,
    StepCheckpoints,
    slurm_parts,
)
from aiayn.lightning_modules.config import apply_overrides, model_config
from aiayn.lightning_modules.data import TranslationDataModule, derive_accumulation
from aiayn.lightning_modules.evaluate import evaluate
from aiayn.lightning_modules.model import TransformerConfig, count_params
from aiayn.lightning_modules.module import TranslationModule
from aiayn.lightning_modules.options import DECODE_MAX_TOKENS, TrainOptions, options_record
from aiayn.lightning_modules.rundir import RunDir

log = logging.getLogger(__name__)


def device_tokens(preset: Preset, world: int) -> int:
    """Real target tokens per device batch when --max-tokens is not given: the preset's budget split over
    the devices, so one optimizer step keeps the preset's tokens (the paper's 25k on 8 GPUs: 3125
    each; on 1 GPU: 25k, or accumulation with a smaller --max-tokens), but above max_len (a
    sentence must fit in a batch)."""
    return min(preset.max_tokens, max(math.ceil(preset.tokens_per_step / world), preset.max_len + 1))


def build_datamodule(opts: TrainOptions, preset: Preset, tokenizer: Path | None = None) -> TranslationDataModule:
    max_tokens = opts.max_tokens or device_tokens(preset, opts.world_size)
    return TranslationDataModule(
        corpus=opts.data or preset.corpus,
        data_dir=opts.data_dir,
        cache_dir=opts.cache_dir,
        vocab_size=opts.vocab_size or preset.vocab_size,
        max_tokens=max_tokens,
        accumulate=derive_accumulation(preset.tokens_per_step, max_tokens, opts.world_size),
        src_lang=opts.src_lang,
        tgt_lang=opts.tgt_lang,
        seed=opts.seed,
        max_len=preset.max_len,
        num_workers=opts.num_workers,
        tokenizer=tokenizer,
        train_pairs=opts.train_pairs or preset.train_pairs,
    )


def tokenizer_for(opts: TrainOptions, run: RunDir) -> Path | None:
    """The SentencePiece model a run uses instead of training one: `--tokenizer`, else the run's own
    (a resumed run keeps the tokenizer it started with, whatever the cache holds now); None: train one."""
    own = run.tokenizer_file if run.tokenizer_file.is_file() else None
    if opts.tokenizer and not Path(opts.tokenizer).is_file():
        raise UserError(f"tokenizer {opts.tokenizer} does not exist; pass --tokenizer with a SentencePiece .model file")
    if opts.tokenizer and own and sha256_file(opts.tokenizer) != sha256_file(own):
        raise UserError(
            f"run directory {run.path} was trained with another tokenizer than --tokenizer {opts.tokenizer}; "
            f"use another --out or drop --tokenizer"
        )
    return Path(opts.tokenizer) if opts.tokenizer else own


def data_identity(dm: TranslationDataModule) -> dict:
    """The DataModule arguments that fix which tokens a model sees (saved in config and checkpoint)."""
    return {"corpus": dm.corpus, "data_dir": dm.data_dir, "vocab_size": dm.requested_vocab_size,
            "src_lang": dm.src_lang, "tgt_lang": dm.tgt_lang, "max_len": dm.max_len,
            "train_pairs": dm.train_pairs}  # fmt: skip


def is_launch_rank_zero() -> bool:
    """Whether this process is global rank 0, from the launcher's environment (before any Trainer
    exists): RANK, LOCAL_RANK, SLURM_PROCID (Lightning's order) and, across nodes, NODE_RANK."""
    from lightning.fabric.utilities.rank_zero import _get_rank

    return (_get_rank() or 0) == 0 and int(os.environ.get("NODE_RANK", "0") or 0) == 0


@dataclass
class Plan:
    """A run resolved from its options, before any data is prepared: what config.json will say."""

    preset: Preset
    resolved: dict  # the row at the preset's scale, --set applied
    schedule: dict
    run: RunDir
    dm: TranslationDataModule
    cfg: TransformerConfig
    steps: int
    accumulate: int
    config: dict  # config.json; its tokenizer sha256 is None until the tokenizer exists


def row_of(opts: TrainOptions) -> dict:
    """The row to train: from the table (ablations/ and --table), or, for `aiayn train --config` of a
    run's config.json, that run's own row as it was resolved (so the run is reproduced even if its
    table changed since or is not at hand); its --set values are applied again by the caller."""
    if opts.row_config is None:
        return resolve(opts.row, opts.preset, opts.table)
    row = dict(opts.row_config)
    row["deviations"] = [d for d in row.get("deviations", []) if not str(d).startswith("overridden: ")]
    try:
        now = resolve(opts.row, opts.preset, opts.table)
    except UserError:
        now = None  # the table is not at hand: the config's row is all there is
    changed = {k: (row.get(k), now[k]) for k in (*MODEL_KEYS, "train_steps") if now and row.get(k) != now[k]}
    if changed:
        log.warning("row %s of the config file differs from its table now (config, table: %s); training the "
                    "config file's", opts.row, changed)  # fmt: skip
    return row


def plan(opts: TrainOptions, run_dir: str | Path | None = None) -> Plan:
    """Resolve a run without preparing data or writing anything (`aiayn train --print-config`)."""
    preset = get_preset(opts.preset)
    if opts.val_bleu_sentences is not None and opts.val_bleu_sentences < 0:
        raise UserError(f"--val-bleu-sentences must be 0 or more, got {opts.val_bleu_sentences}; pass 0 for no BLEU "
                        "during training")  # fmt: skip
    resolved, schedule = apply_overrides(row_of(opts), preset, opts.overrides)
    corpus = opts.data or preset.corpus
    run = RunDir(Path(run_dir)) if run_dir else RunDir.of(opts.out, preset.name, corpus, resolved["row"], opts.seed)
    tokenizer = tokenizer_for(opts, run)
    dm = build_datamodule(opts, preset, tokenizer)
    cfg = model_config(resolved, dm.vocab_size, max_len=max(preset.max_len, 512))
    steps = opts.max_steps or resolved["train_steps"]
    world = opts.world_size
    accumulate = dm.accumulate
    config = {
        "row": resolved,
        "preset": preset_dict(preset),
        "model": cfg.to_dict(),
        "data": data_identity(dm),
        "train": {
            "seed": opts.seed, "steps": steps, "accumulate": accumulate, "world_size": world,
            # the budget: real target tokens (EOS included) per optimizer step; metrics.json has what arrived
            "effective_tokens_per_step": dm.max_tokens * world * accumulate, "precision": opts.precision,
            **schedule,
        },
        "tokenizer": {"file": run.tokenizer_file.name, "sha256": sha256_file(tokenizer) if tokenizer else None},
        "options": options_record(opts),  # `aiayn train --config config.json` trains this run again
    }  # fmt: skip
    return Plan(preset, resolved, schedule, run, dm, cfg, steps, accumulate, config)


def train(
    opts: TrainOptions,
    *,
    run_dir: str | Path | None = None,
    callbacks: tuple = (),
    val_per_epoch: bool = False,
) -> dict:
    """Train one run to completion (or resume it) and return its metrics.json content ({} on ranks
    other than 0, and when the run was checkpointed for a SLURM requeue).

    For `aiayn hpo`: `run_dir` instead of OUT/PRESET/CORPUS/ROW/seedN, extra Lightning `callbacks`
    (Optuna's pruning callback) and validation at epoch ends (`val_per_epoch`: the pruning callback
    reports the epoch as its step)."""
    p = plan(opts, run_dir)
    preset, resolved, schedule, run, dm, cfg, steps, accumulate, config = (
        p.preset, p.resolved, p.schedule, p.run, p.dm, p.cfg, p.steps, p.accumulate, p.config
    )  # fmt: skip
    world = opts.world_size
    check_writable_dir(run.path, "--out")
    dm.prepare_data()  # corpus, tokenizer and encoded cache; user errors surface here, before any write
    config["tokenizer"]["sha256"] = sha256_file(dm.tokenizer_model)
    run.check_config(config)

    # One process per run directory (rank 0 holds the lock until it returns); leftovers of writes
    # that a kill interrupted are removed. Nothing is written before this point.
    run_lock = run.hold_lock() if is_launch_rank_zero() else None  # noqa: F841 (held, not used)
    if run_lock is not None:
        run.remove_stale_temps()
    pl.seed_everything(opts.seed, workers=True, verbose=False)
    bleu_k = preset.val_bleu_sentences if opts.val_bleu_sentences is None else opts.val_bleu_sentences
    module = TranslationModule(cfg.to_dict(), **schedule, val_bleu_sentences=bleu_k, data=config["data"])
    # every checkpoint carries the config and the tokenizer: it can translate without the run directory
    embed = RunFilesInCheckpoint(redact_obj(config), dm.tokenizer_model)
    trainer = build_trainer(opts, preset, run, steps, accumulate, config, (embed, *callbacks), val_per_epoch)
    if trainer.is_global_zero:
        run.write_config(config)
        run.write_tokenizer(dm.tokenizer_model)
        t = config["train"]
        log.info(
            "budget: %d real target tokens per optimizer step = %d per device batch x %d devices x %d accumulated "
            "(preset: %d); the tokens that arrive are logged as train/src_tokens_per_step, train/tgt_tokens_per_step",
            t["effective_tokens_per_step"], dm.max_tokens, world, accumulate, preset.tokens_per_step
        )  # fmt: skip
        if t["effective_tokens_per_step"] > 1.1 * preset.tokens_per_step:
            log.warning("more tokens per step than the preset's; pass a smaller --max-tokens")
    resume = run.resume_checkpoint()
    t0 = time.perf_counter()
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else None, weights_only=True)
    except Diverged as e:  # a result, not a crash: last.ckpt keeps the last finite state
        log.warning("%s seed %d diverged: %s", resolved["row"], opts.seed, e)
        if not trainer.is_global_zero:
            return {}
        metrics = run.write_metrics(config, status="diverged", diverged_at_step=e.step, error=str(e))
        wandb_run.finish(trainer, metrics, exit_code=1)
        return metrics
    except Exception as e:
        if trainer.is_global_zero:
            status = "pruned" if isinstance(e, optuna.TrialPruned) else "failed"
            metrics = run.write_metrics(config, status=status, error=f"{type(e).__name__}: {e}")
            wandb_run.finish(trainer, metrics, exit_code=1)
        raise
    train_time = time.perf_counter() - t0
    if any(getattr(c, "requeued", False) for c in trainer.callbacks):  # RequeueOnSignal: SLURM restarts it
        log.info("%s seed %d: checkpointed at step %d and requeued", resolved["row"], opts.seed, trainer.global_step)
        if trainer.is_global_zero:
            wandb_run.finish(trainer, {"steps": trainer.global_step}, preempted=True)
        return {}
    if not trainer.is_global_zero:
        return {}
    per_step = real_tokens_per_step(module)
    log.info(
        "real tokens per optimizer step (mean over %d steps): %.0f source, %.0f target (budget: %d target)",
        module.trained["steps"], per_step["src_tokens_per_step"], per_step["tgt_tokens_per_step"],
        config["train"]["effective_tokens_per_step"],
    )  # fmt: skip
    # The final evaluation decodes the whole dev set (validation during training may use a subset).
    # Beam search in batches of at least DECODE_MAX_TOKENS (the training batch if larger), as `aiayn translate`
    # does: more sentences per decoder step (the tiny preset's 1024: 6.55 -> 5.09 s for its 1000 dev sentences).
    full_dev = TranslationDataModule(
        **config["data"], cache_dir=opts.cache_dir, max_tokens=max(dm.max_tokens, DECODE_MAX_TOKENS),
        dev_subset=opts.eval_subset, tokenizer=dm.tokenizer_model,
    )  # fmt: skip
    full_dev.setup("validate")
    # On the device the run trained on: Lightning's teardown at the end of fit() moved the model to the CPU
    # (a paper-scale beam decode of newstest2013 there would take hours).
    module.to(trainer.strategy.root_device)
    result = evaluate(module.model, full_dev, "dev")
    run.write_dev(result.pop("hypotheses"), full_dev.references("dev"))
    metrics = run.write_metrics(
        config, status="completed", steps=trainer.global_step, params=count_params(cfg),
        train_time_s=round(train_time, 2), tokens_per_s=round(module.total_tokens * world / max(train_time, 1e-9), 1),
        dev_bleu=round(result["bleu"], 2), dev_bleu_signature=result["bleu_signature"],
        dev_tok_bleu=round(result["tok_bleu"], 2), dev_tok_bleu_label=result["tok_bleu_label"],
        dev_ppl=round(result["ppl"], 4), dev_sentences=result["n_sentences"], **per_step,
    )  # fmt: skip
    wandb_run.finish(trainer, metrics, checkpoint=run.last_checkpoint if opts.wandb_checkpoints else None)
    return metrics


def real_tokens_per_step(module: TranslationModule) -> dict:
    """Mean real source and target tokens per optimizer step over the run (all devices, every attempt)."""
    t, steps = module.trained, max(module.trained["steps"], 1)
    return {
        "src_tokens_per_step": round(t["src_tokens"] / steps, 1),
        "tgt_tokens_per_step": round(t["tgt_tokens"] / steps, 1),
    }


def build_trainer(
    opts: TrainOptions,
    preset: Preset,
    run: RunDir,
    steps: int,
    accumulate: int,
    config: dict,
    callbacks: tuple = (),
    val_per_epoch: bool = False,
) -> pl.Trainer:
    by_time = opts.ckpt_every_minutes is not None
    ckpt = StepCheckpoints(
        dirpath=run.checkpoints,
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
    loggers = [CSVLogger(run.path, name=run.logs.name)]
    # under SLURM: Lightning's requeue handler off, ours (checkpoint at a step boundary) on
    slurm_plugins, slurm_callbacks = slurm_parts(run.checkpoints)
    if opts.wandb and is_launch_rank_zero():  # W&B logs from rank 0 only (its other ranks record no attempt)
        logger = wandb_run.wandb_logger(run, redact_obj(config))
        loggers += [logger] if logger is not None else []
    return pl.Trainer(
        accelerator=opts.accelerator,
        devices=opts.devices,
        num_nodes=opts.num_nodes,
        strategy=opts.strategy,
        precision=opts.precision,
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        # counts batches, not optimizer steps
        val_check_interval=None if val_per_epoch else min(opts.val_every or preset.val_every, steps) * accumulate,
        check_val_every_n_epoch=1 if val_per_epoch else None,
        num_sanity_val_steps=0,
        # RNGStates: exact resume; DivergenceGuard: NaN/inf loss ends the run as `diverged`
        callbacks=[RNGStates(), DivergenceGuard(), ckpt, *callbacks, *slurm_callbacks],
        plugins=[AtomicCheckpointIO(), *slurm_plugins],  # checkpoints: written to a temporary file and renamed
        logger=loggers,
        default_root_dir=run.path,
        enable_progress_bar=opts.progress,
        enable_model_summary=False,
        deterministic=opts.accelerator == "cpu",
        use_distributed_sampler=False,  # the token-bucket sampler shards by rank itself
        log_every_n_steps=10,
    )
