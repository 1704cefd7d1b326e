"""One run, as a recipe: plan → prepare → fit → evaluate → record.

`train(opts, spec)` is the function every caller uses: the command line (`aiayn train`), the sweep's worker
processes (`aiayn table3`), `aiayn hpo`'s trials. The driver resolves the run once (`spec.resolve`, a frozen
`RunSpec`) and hands it over; `plan` adds the data and the run directory, and what config.json will say;
`prepare` makes the corpus and tokenizer and takes the run directory; `fit` trains with Lightning (resuming from
the directory's checkpoint); `evaluate` beam-decodes the whole dev set on the device the run trained on;
`record` writes metrics.json. What a caller adds (HPO's pruning callback and its "pruned" status, a run
directory of its own) comes as `Hooks`; the integrations a run chooses from its options and environment (SLURM's
requeue handler, the loggers of --logger) are `integrations`. Nothing here imports Optuna.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.exceptions import SIGTERMException

from aiayn.ablations import stability
from aiayn.ablations.presets import Preset
from aiayn.common.errors import UserError
from aiayn.common.files import (
    can_create_in,
    check_links,
    check_path_length,
    check_writable_dir,
    disk_full,
    load_torch_file,
    nearest_existing,
    sha256_file,
)
from aiayn.common.locks import file_lock
from aiayn.common.secrets import redact_obj
from aiayn.lightning_modules.data.batching import release_workers
from aiayn.lightning_modules.data.datamodule import DataIdentity, DataPlan, TranslationDataModule, derive_accumulation
from aiayn.lightning_modules.data.tokenizer import segmentation_sha256
from aiayn.lightning_modules.run import disk, wandb_run
from aiayn.lightning_modules.run import loggers as run_loggers
from aiayn.lightning_modules.run.callbacks import (
    AtomicCheckpointIO,
    CtrlCAtTheStep,
    LogRunConfig,
    RNGStates,
    RoomForShapes,
    RunFilesInCheckpoint,
    ScheduledValidations,
    SigtermWithTheStep,
    StepCheckpoints,
    progress_bar,
    slurm_parts,
)
from aiayn.lightning_modules.run.devices import (
    autocast,
    check_strategy,
    data_workers,
    pad_multiple,
    prepare_matmuls,
    residual_stream_dtype,
    resolve_precision,
    trained_precision,
    uses_cuda,
)
from aiayn.lightning_modules.run.evaluate import evaluate
from aiayn.lightning_modules.run.module import Diverged, TranslationModule
from aiayn.lightning_modules.run.options import (
    DECODE_MAX_TOKENS,
    LOOK_EVAL,
    TRAINER_DEFAULTS,
    ConfigFile,
    TrainOptions,
    eval_sentences,
    options_record,
)
from aiayn.lightning_modules.run.rundir import OutDir, RunConfig, RunDir, RunMetrics, TrainPlan
from aiayn.lightning_modules.run.spec import RunSpec, spec_of
from aiayn.lightning_modules.transformer.compiled import compile_model
from aiayn.lightning_modules.transformer.loss import grad_w_path
from aiayn.lightning_modules.transformer.model import residual_stream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hooks:
    """What a caller adds to one run (`aiayn hpo`: its pruning callback, validation at epoch ends, its trial's
    run directory, and which of its exceptions mean "pruned")."""

    callbacks: tuple = ()
    val_per_epoch: bool = False  # validate at epoch ends (a pruning callback reports the epoch as its step)
    run_dir: str | Path | None = None  # instead of OUT/PRESET/CORPUS/ROW/seedN
    kind: str = "table3"  # metrics.json's kind: "hpo" keeps a trial out of Table 3 reports
    status_of: Callable[[BaseException], str | None] = field(default=lambda e: None)  # an exception -> a status


def device_tokens(preset: Preset, world: int) -> int:
    """Real target tokens per device batch when --max-tokens is not given: the preset's budget split over
    the devices, so one optimizer step keeps the preset's tokens (the paper's 25k on 8 GPUs: 3125
    each; on 1 GPU: 25k, or accumulation with a smaller --max-tokens), but above max_len (a
    sentence must fit in a batch)."""
    return min(preset.max_tokens, max(math.ceil(preset.tokens_per_step / world), preset.max_len + 1))


def source_eos(opts: TrainOptions, run: RunDir | None = None) -> bool:
    """Whether sources end with </s>: --source-eos, else the run directory's own (a run resumes as it started),
    else yes (the paper's convention)."""
    if opts.source_eos is not None:
        return opts.source_eos == "yes"
    try:
        saved = run.read_config() if run is not None else None
    except UserError:
        saved = None
    return saved.data.source_eos if saved is not None else True


def build_datamodule(
    opts: TrainOptions, spec: RunSpec, tokenizer: Path | None = None, run: RunDir | None = None
) -> TranslationDataModule:
    preset = spec.preset
    max_tokens = opts.max_tokens or device_tokens(preset, opts.world_size)
    identity = DataIdentity(
        spec.corpus,
        opts.data_dir,
        spec.model.vocab_size,
        opts.src_lang,
        opts.tgt_lang,
        preset.max_len,
        opts.train_pairs or preset.train_pairs,
        source_eos(opts, run),
    )
    return TranslationDataModule(
        DataPlan(
            identity,
            opts.cache_dir,
            max_tokens,
            derive_accumulation(preset.tokens_per_step, max_tokens, opts.world_size),
            opts.seed,
            num_workers=data_workers(opts.num_workers, opts.accelerator),
            pin_memory=uses_cuda(opts.accelerator),
            pad_to=pad_multiple(opts.pad_to, opts.accelerator),
            static_shapes=opts.static_shapes,
            tokenizer=tokenizer,
        )
    )


def tokenizer_for(opts: TrainOptions, run: RunDir) -> Path | None:
    """The SentencePiece model a run uses instead of training one: `--tokenizer`, else the run's own
    (a resumed run keeps the tokenizer it started with, whatever the cache holds now); None: train one."""
    own = run.tokenizer_file if run.tokenizer_file.is_file() else None
    if opts.tokenizer and not Path(opts.tokenizer).is_file():
        raise UserError(f"tokenizer {opts.tokenizer} does not exist; pass --tokenizer with a SentencePiece .model file")
    if opts.tokenizer and own and segmentation_sha256(opts.tokenizer) != segmentation_sha256(own):
        raise UserError(
            f"run directory {run.path} was trained with another tokenizer than --tokenizer {opts.tokenizer}; "
            f"use another --out or drop --tokenizer"
        )
    return Path(opts.tokenizer) if opts.tokenizer else own


def is_launch_rank_zero() -> bool:
    """Whether this process is global rank 0, from the launcher's environment (before any Trainer
    exists): RANK, LOCAL_RANK, SLURM_PROCID (Lightning's order) and, across nodes, NODE_RANK."""
    from lightning.fabric.utilities.rank_zero import _get_rank

    return (_get_rank() or 0) == 0 and int(os.environ.get("NODE_RANK", "0") or 0) == 0


@dataclass
class Plan:
    """A run resolved from its options and spec, before any data is prepared: what config.json will say."""

    spec: RunSpec
    run: RunDir
    dm: TranslationDataModule
    config: RunConfig  # its tokenizer sha256 is None until the tokenizer exists
    train_time: float = 0.0  # seconds in fit(), this attempt

    @property
    def preset(self) -> Preset:
        return self.spec.preset


def plan(opts: TrainOptions, spec: RunSpec | None = None, run_dir: str | Path | None = None) -> Plan:
    """Resolve a run without preparing data or writing anything (`aiayn train --print-config`)."""
    spec = spec or spec_of(opts)
    run_loggers.of(opts)  # an unknown logger or a missing package: said before anything is prepared
    spec.corpus.check_data_dir(opts.data_dir)
    check_device(opts)
    check_path_length(opts.out, "--out")  # before the run's folder under it is looked at
    check_links(opts.out, "--out")
    check_cache_dir(opts.cache_dir)
    check_memory(spec, opts)
    if opts.keep_last is not None and opts.keep_last < 1:
        raise UserError(
            f"--keep-last {opts.keep_last} keeps no periodic checkpoint (nothing to average); pass 1 or "
            f"more (last.ckpt is kept besides)"
        )
    whole, kept = disk.kept_checkpoints(opts, spec.preset)
    if kept < whole:
        raise UserError(
            f"--keep-for-averaging {kept} keeps fewer periodic checkpoints than --keep-last {whole}; pass "
            f"--keep-for-averaging {whole} or more, or a smaller --keep-last"
        )
    trains_in = resolve_precision(opts.precision, opts.accelerator)
    if opts.residual_dtype == "bf16" and not trains_in.startswith("bf16"):
        raise UserError(
            f"--residual-dtype bf16 keeps the residual stream in bf16 under bf16-mixed, but this run "
            f"trains in {trains_in}; pass --precision bf16-mixed or drop --residual-dtype"
        )
    minutes = opts.ckpt_every_minutes
    if minutes is not None and not (math.isfinite(minutes) and minutes > 0):
        raise UserError(
            f"--ckpt-every-minutes must be a positive number of minutes, got {minutes}; pass e.g. "
            "--ckpt-every-minutes 10"
        )
    if opts.val_bleu_sentences is not None and opts.val_bleu_sentences < 0:
        raise UserError(
            f"--val-bleu-sentences must be 0 or more, got {opts.val_bleu_sentences}; pass 0 for no BLEU during training"
        )
    run = RunDir(Path(run_dir)) if run_dir else OutDir(opts.out).run_of(spec, opts.seed)
    dm = build_datamodule(opts, spec, tokenizer_for(opts, run), run)
    steps = opts.max_steps or spec.train_steps
    tokenizer = dm.plan.tokenizer
    config = RunConfig(
        spec=spec,
        data=dm.data,
        train=TrainPlan(
            seed=opts.seed,
            steps=steps,
            accumulate=dm.plan.accumulate,
            world_size=opts.world_size,
            effective_tokens_per_step=dm.plan.max_tokens * opts.world_size * dm.plan.accumulate,
            precision=resolve_precision(opts.precision, opts.accelerator),
        ),
        tokenizer_sha256=sha256_file(tokenizer) if tokenizer else None,
        tokenizer_segmentation=segmentation_sha256(tokenizer) if tokenizer else None,
        options=options_record(opts),  # `aiayn train --config config.json` trains this run again
    )
    return Plan(spec, run, dm, config)


def check_device(opts: TrainOptions) -> None:
    """A GPU asked for where none is visible, a strategy Lightning does not know, a negative worker count: one line
    now, not Lightning's or the DataLoader's exception after the run directory."""
    if opts.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(
            f"--accelerator {opts.accelerator}: no GPU is visible here (torch sees none); pass "
            "--accelerator cpu, or auto to use a GPU where there is one"
        )
    if opts.strategy != "auto":
        check_strategy(opts.strategy)
    if opts.num_workers is not None and opts.num_workers < 0:
        raise UserError(
            f"--num-workers {opts.num_workers}: a count of loader processes cannot be negative; pass 0 "
            "(load in the trainer's process) or more"
        )


def check_cache_dir(cache_dir: str | None) -> None:
    """The tokenizer and corpus cache (--cache-dir, AIAYN_CACHE, ...) must be a directory this process can write, or
    be creatable: one line now, not a NotADirectoryError from the first corpus write."""
    from aiayn.lightning_modules.data.corpora import default_cache_dir

    where = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    flag = "--cache-dir" if cache_dir else "AIAYN_CACHE (or --cache-dir)"
    check_path_length(where, flag)
    check_links(where, flag)
    probe = nearest_existing(where)
    if not probe.is_dir():
        raise UserError(
            f"cache directory {where} cannot be used: {probe} is not a directory; point {flag} at a directory"
        )
    if not can_create_in(probe):
        raise UserError(
            f"cache directory {where} is not writable (nearest existing: {probe}); point {flag} at a "
            "directory you can write"
        )


BYTES_PER_PARAMETER = 16  # fp32 weights, their gradients, and Adam's two moments


def check_memory(spec: RunSpec, opts: TrainOptions) -> None:
    """A model whose weights, gradients and Adam state alone exceed this machine's memory (a table row of d_model
    2^20): one line now, not an allocation error or the OOM killer. On a CPU only (a GPU's memory is known once
    CUDA starts); activations come on top, so this is a floor, not a promise."""
    if uses_cuda(opts.accelerator):
        return
    need = spec.model.params() * BYTES_PER_PARAMETER
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise UserError(
            f"row {spec.row} has {spec.model.params() / 1e9:.1f}B parameters: their weights, gradients and "
            f"Adam state take {need / 2**30:.0f} GB, more than this machine's {have / 2**30:.0f} GB; "
            "shrink the row (its d_model, d_ff, N or vocabulary)"
        )


def prepare(p: Plan):
    """Corpus, tokenizer and encoded cache (user errors surface here, before any write; under a lock, so that ranks
    and runs sharing a cache make it once), the config checked
    against the run directory's, and the directory taken: its lock (held by rank 0 until the process ends; the
    returned file) and the temporary files a kill left removed. Nothing is written before this point."""
    check_writable_dir(p.run.path, "--out")
    # once per node: the DDP ranks (and concurrent runs) of a cold cache take turns; the first makes it, the others
    # find it made. The lock is the node's (its temp directory), so that a bad corpus still writes nothing.
    key = hashlib.sha1(str(p.dm.plan.cache_dir.resolve()).encode()).hexdigest()[:12]
    with file_lock(Path(tempfile.gettempdir()) / f"aiayn-prepare-{key}.lock", wait=True):
        try:
            p.dm.prepare_data()
        except OSError as e:  # a full cache disk: the one line of a full disk, naming the cache
            full = disk_full(p.dm.plan.cache_dir / "…", e, None)
            if full is None:
                raise
            raise UserError(
                f"no space left on the cache's disk ({p.dm.plan.cache_dir}) to prepare the corpus and "
                f"tokenizer; free space there or point AIAYN_CACHE (or --cache-dir) at a disk with "
                "room"
            ) from None
    model = p.dm.tokenizer_model
    p.config = replace(p.config, tokenizer_sha256=sha256_file(model), tokenizer_segmentation=segmentation_sha256(model))
    p.run.check_config(p.config)
    p.run.check_resume_plan(p.config)
    lock = p.run.hold_lock() if is_launch_rank_zero() else None
    if lock is not None:
        p.run.remove_stale_temps()
    return lock


def train(opts: TrainOptions, spec: RunSpec | None = None, hooks: Hooks = Hooks()) -> RunMetrics | None:
    """Train one run to completion (or resume it), evaluate it and record it; return its metrics (None on ranks
    other than 0, and when the run was checkpointed for a SLURM requeue)."""
    started = time.perf_counter()
    p = plan(opts, spec, hooks.run_dir)
    lock = prepare(p)  # noqa: F841 (held, not used)
    done = finished(p)
    if done is not None:
        return done
    prepare_matmuls(opts.accelerator, opts.matmul_precision)
    pl.seed_everything(opts.seed, workers=True, verbose=False)
    module = TranslationModule(
        p.spec.model, **p.config.schedule, val_bleu_sentences=_val_bleu_sentences(opts, p.preset)
    )
    residual_stream(module.model, residual_stream_dtype(opts.residual_dtype, p.config.train.precision))
    cuda = uses_cuda(opts.accelerator)
    share = compile_model(module.model, opts.compile, dynamic=not p.dm.plan.static_shapes, cuda=cuda)
    if share and p.dm.plan.static_shapes:  # room for every training shape, counted once the data is set up
        hooks = replace(hooks, callbacks=(*hooks.callbacks, RoomForShapes(share)))
    trainer = build_trainer(opts, p, hooks)
    if trainer.is_global_zero:
        p.run.write_config(p.config)
        p.run.write_tokenizer(p.dm.tokenizer_model)
        _log_budget(p, opts)
        if opts.eval_subset is None and eval_sentences(opts, p.config.spec.train_steps, hooks.kind) is not None:
            log.info("a look: --max-steps %d of the row's %d, %s", opts.max_steps, p.config.spec.train_steps, LOOK_EVAL)
    try:
        ended = fit(trainer, module, p, opts, hooks)
        if ended is not None or not trainer.is_global_zero:
            return ended if isinstance(ended, RunMetrics) else None
        evaluating = time.perf_counter()
        result = evaluate_run(trainer, module, p, eval_sentences(opts, p.config.spec.train_steps, hooks.kind))
        result["eval_time_s"] = time.perf_counter() - evaluating
        result["wall_time_s"] = time.perf_counter() - started
        return record(trainer, module, p, opts, hooks, result)
    finally:
        release_workers()  # the run's loader workers end with it, however it ended (hpo trains many in one process)


def finished(p: Plan) -> RunMetrics | None:
    """A run directory whose run already completed the steps asked of it now: its metrics as they are (rerunning the
    command neither trains, evaluates nor rewrites them); None where there is something to train, including a run
    completed at fewer steps (a capped look: it is extended, resuming where it stopped). Asking a completed run for
    fewer steps than it trained is refused in one line: a run cannot be shortened."""
    try:
        metrics = p.run.read_metrics()
    except (OSError, ValueError):
        return None
    if metrics is None or not metrics.completed or metrics.steps is None:
        return None
    planned = p.config.train.steps
    if metrics.steps > planned:
        raise UserError(
            f"run directory {p.run.path} already trained {metrics.steps} steps, and this command asks for "
            f"{planned} (--max-steps): a run cannot be shortened; pass another --out for a shorter look, "
            "or drop --max-steps"
        )
    if metrics.steps < planned:
        log.info(
            "%s seed %d completed %d of the %d steps asked now: extending it",
            p.spec.row,
            metrics.seed,
            metrics.steps,
            planned,
        )
        return None
    log.info(
        "%s seed %d already completed its %d steps in %s: nothing to train (delete the directory to train it anew)",
        p.spec.row,
        metrics.seed,
        planned,
        p.run.path,
    )
    return metrics


def print_plan(opts: TrainOptions, spec: RunSpec) -> None:
    """`aiayn train --print-config`: the run's resolved config.json on stdout (what `aiayn train --config` reads
    back) and its disk estimate on stderr; nothing prepared, trained or written."""
    from aiayn.lightning_modules.run.disk import estimate

    print(json.dumps(plan(opts, spec).config.to_dict(), indent=2))
    print(f"# {estimate(opts, spec).describe()}", file=sys.stderr)


def with_recorded_tokenizer(opts: TrainOptions, spec: RunSpec, recorded: ConfigFile | None) -> TrainOptions:
    """With --config RUN/config.json of a run elsewhere (`recorded`): RUN's tokenizer.model, when it is the one that
    config.json names (so the run is reproduced even where the cache holds another tokenizer)."""
    if recorded is None or recorded.spec is None or opts.tokenizer or not recorded.tokenizer_sha256:
        return opts
    source = Path(recorded.source).parent
    sibling = source / "tokenizer.model"
    elsewhere = OutDir(opts.out).run_of(spec, opts.seed).path.resolve() != source.resolve()
    if elsewhere and sibling.is_file() and sha256_file(sibling) == recorded.tokenizer_sha256:
        return replace(opts, tokenizer=str(sibling))
    return opts


def _val_bleu_sentences(opts: TrainOptions, preset: Preset) -> int:
    return preset.val_bleu_sentences if opts.val_bleu_sentences is None else opts.val_bleu_sentences


def _log_budget(p: Plan, opts: TrainOptions) -> None:
    t = p.config.train
    log.info(
        "budget: %d real target tokens per optimizer step = %d per device batch x %d devices x %d accumulated "
        "(preset: %d); the tokens that arrive are logged as train/src_tokens_per_step, train/tgt_tokens_per_step",
        t.effective_tokens_per_step,
        p.dm.plan.max_tokens,
        t.world_size,
        t.accumulate,
        p.preset.tokens_per_step,
    )
    if t.effective_tokens_per_step > 1.1 * p.preset.tokens_per_step:
        log.warning("more tokens per step than the preset's; pass a smaller --max-tokens")


STOPPED = "stopped"  # fit() ended without a result to evaluate: a SLURM requeue, or a rank other than 0 diverged


def fit(trainer: pl.Trainer, module: TranslationModule, p: Plan, opts: TrainOptions, hooks: Hooks):
    """Lightning's fit, resuming from the run directory's newest checkpoint. None when training ended as planned;
    the metrics written when it ended otherwise (diverged; pruned and failed are raised again), STOPPED when
    there is nothing to record here."""
    resume = p.run.resume_checkpoint()
    if resume is not None:
        check_fits(resume, module)  # before fit: a misfit is the user's file, not a failed run
    started = time.perf_counter()
    row, seed = p.spec.row, opts.seed
    try:
        trainer.fit(module, datamodule=p.dm, ckpt_path=str(resume) if resume else None, weights_only=True)
    except Diverged as e:  # a result, not a crash: last.ckpt keeps the last finite state
        log.warning("%s seed %d diverged: %s", row, seed, e)
        if not trainer.is_global_zero:
            return STOPPED
        metrics = p.run.write_metrics(p.config, "diverged", kind=hooks.kind, diverged_at_step=e.step, error=str(e))
        wandb_run.finish(trainer, metrics, exit_code=1)
        return metrics
    except SIGTERMException:  # Lightning's SystemExit without a code: exit 0 would read as a finished run
        ctrl_c = next((c.signum for c in trainer.callbacks if isinstance(c, CtrlCAtTheStep) and c.signum), None)
        _stopped(trainer, row, seed, ctrl_c or signal.SIGTERM)
    except SystemExit as e:  # Lightning's answer to KeyboardInterrupt (a second Ctrl-C): teardown, then exit 1
        if e.code != 1 or trainer.state.status != TrainerStatus.INTERRUPTED:
            raise
        _stopped(trainer, row, seed, signal.SIGINT)
    except Exception as e:
        if trainer.is_global_zero:
            status = hooks.status_of(e) or "failed"
            try:
                metrics = p.run.write_metrics(p.config, status, kind=hooks.kind, error=f"{type(e).__name__}: {e}")
            except (OSError, UserError) as again:  # a full disk refuses this record too: the first error is the news
                log.warning("could not record the failure in %s: %s", p.run.metrics_file, again)
                metrics = RunMetrics(p.spec.row, opts.seed, p.preset.name, status, error=f"{type(e).__name__}: {e}")
            wandb_run.finish(trainer, metrics, exit_code=1)
        raise
    p.train_time = time.perf_counter() - started
    if _requeued(trainer):  # SLURM restarts it
        log.info("%s seed %d: checkpointed at step %d and requeued", row, seed, trainer.global_step)
        if trainer.is_global_zero:
            wandb_run.finish(trainer, None, preempted=True, steps=trainer.global_step)
        return STOPPED
    return None


def check_fits(path: Path, module: pl.LightningModule) -> None:
    """The checkpoint a run resumes from fits the model and the optimizer it resumes (`misfit`): otherwise one line
    naming what does not fit, before training, and nothing recorded (Lightning's load_state_dict raised inside fit,
    a traceback, and the run was written failed)."""
    problem = misfit(load_torch_file(path, map_location="cpu", mmap=True), module)
    if problem:
        raise UserError(
            f"checkpoint {path} does not fit this run: {problem}; move it out of {path.parent} and run again"
        )


def misfit(state, module: pl.LightningModule) -> str | None:
    """What of a checkpoint does not fit `module` (None: it fits): its weights by name and shape, its one Adam's
    parameters by count and its moments by shape, in the order configure_optimizers hands them over."""
    weights = state.get("state_dict") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        return "it holds no weights (state_dict)"
    mine = module.state_dict()
    missing, extra = [k for k in mine if k not in weights], [k for k in weights if k not in mine]
    if missing or extra:
        name, what = (missing[0], "missing") if missing else (extra[0], "not one of the model's")
        more = len(missing) + len(extra) - 1
        return f"weight {name} {what}" + (f" ({more} more names differ)" if more else "")
    for name, tensor in mine.items():
        theirs = weights[name]
        if tuple(getattr(theirs, "shape", ())) != tuple(tensor.shape):
            return f"weight {name} of shape {list(getattr(theirs, 'shape', []))}, the model's {list(tensor.shape)}"
    optimizers = state.get("optimizer_states")
    if not isinstance(optimizers, list) or len(optimizers) != 1 or not isinstance(optimizers[0], dict):
        return "its optimizer state is not the one Adam's the run trains with"
    groups, moments = optimizers[0].get("param_groups"), optimizers[0].get("state")
    ids = [i for g in groups for i in g.get("params", [])] if isinstance(groups, list) else []
    params = list(module.parameters())
    if len(ids) != len(params) or not isinstance(moments, dict):
        return f"its optimizer state holds {len(ids)} parameters, the model has {len(params)}"
    for i, param in zip(ids, params):
        held = moments.get(i, {})
        for key in ("exp_avg", "exp_avg_sq"):
            value = held.get(key) if isinstance(held, dict) else None
            if value is not None and tuple(value.shape) != tuple(param.shape):
                shapes = f"{list(value.shape)}, the model's {list(param.shape)}"
                return f"its optimizer's {key} of parameter {i} has shape {shapes}"
    return None


def _requeued(trainer: pl.Trainer) -> bool:
    """Whether RequeueOnSignal asked SLURM to requeue this run's job (on its warning signal)."""
    return any(getattr(c, "requeued", False) for c in trainer.callbacks)


def _stopped(trainer: pl.Trainer, row: str, seed: int, signum: signal.Signals):
    """A run stopped by a signal (a scheduler's SIGTERM, Ctrl-C's SIGINT; to the main process or its whole group) is
    not a finished run: one line, no metrics.json, W&B told it was stopped, and exit 128 + the signal's number."""
    name = signal.Signals(signum).name
    if _requeued(trainer):  # and this is SLURM's kill
        resumes = "SLURM requeued its job, which resumes it from its checkpoint: nothing to run again"
    else:
        resumes = "its checkpoints are kept and the same command resumes it"
    log.warning("%s seed %d stopped by %s at step %d; %s", row, seed, name, trainer.global_step, resumes)
    if trainer.is_global_zero:
        wandb_run.finish(trainer, None, preempted=True, steps=trainer.global_step, status="stopped")
    raise SystemExit(128 + signum) from None


def evaluate_run(trainer: pl.Trainer, module: TranslationModule, p: Plan, sentences: int | None) -> dict:
    """The final evaluation: the whole dev set or its first `sentences` (options.eval_sentences; validation during
    training may use a subset of it for BLEU), beam search in batches of at least DECODE_MAX_TOKENS (the training
    batch if larger), as `aiayn translate` does: more sentences per decoder step (the tiny preset's 1024: 6.55 ->
    5.09 s for its 1000 dev sentences). On the device the run trained on: Lightning's teardown at the end of fit()
    moved the model to the CPU (a paper-scale beam decode of newstest2013 there would take hours)."""
    plan = p.dm.plan
    full_dev = TranslationDataModule(
        DataPlan(
            p.config.data,
            plan.cache_dir,
            max(plan.max_tokens, DECODE_MAX_TOKENS),
            dev_subset=sentences,
            pad_to=plan.pad_to,
            static_shapes=plan.static_shapes,
            tokenizer=p.dm.tokenizer_model,
        )
    )
    full_dev.setup("validate")
    device = trainer.strategy.root_device
    module.to(device)
    with autocast(device, p.config.train.precision):
        result = evaluate(module.model, full_dev, "dev")
    p.run.write_dev(result.pop("hypotheses"), full_dev.references("dev"))
    return result


def record(trainer, module: TranslationModule, p: Plan, opts: TrainOptions, hooks: Hooks, result: dict) -> RunMetrics:
    """metrics.json of a completed run (and its W&B summary)."""
    per_step = real_tokens_per_step(module)
    log.info(
        "real tokens per optimizer step (mean over %d steps): %.0f source, %.0f target (budget: %d target)",
        module.trained["steps"],
        per_step["src_tokens_per_step"],
        per_step["tgt_tokens_per_step"],
        p.config.train.effective_tokens_per_step,
    )
    # the training steps' seconds (validations not counted) over every attempt: a run resumed, or re-recorded from
    # its last checkpoint, keeps its measured throughput; wall_time_s is this attempt's whole time
    train_time = module.train_seconds or p.train_time
    tokens = module.trained_counts()
    metrics = p.run.write_metrics(
        p.config,
        "completed",
        kind=hooks.kind,
        steps=trainer.global_step,
        params=p.spec.model.params(),
        train_time_s=round(train_time, 2),
        tokens_per_s=round((tokens["src_tokens"] + tokens["tgt_tokens"]) / max(train_time, 1e-9), 1),
        dev_bleu=round(result["bleu"], 2),
        dev_bleu_signature=result["bleu_signature"],
        dev_tok_bleu=round(result["tok_bleu"], 2),
        dev_tok_bleu_label=result["tok_bleu_label"],
        dev_ppl=round(result["ppl"], 4),
        dev_sentences=result["n_sentences"],
        eval_time_s=round(result["eval_time_s"], 2),
        wall_time_s=round(result["wall_time_s"], 2),
        **per_step,
        grad_w_path=grad_w_path(trainer.strategy.root_device.type),
        precision=trained_precision(p.config.train.precision)
        + (", bf16 residual stream" if residual_stream_dtype(opts.residual_dtype, p.config.train.precision) else ""),
    )
    checkpoint = p.run.last_checkpoint
    run_loggers.log_final(trainer, metrics, logged_params(trainer), checkpoint if opts.log_model else None)
    wandb_run.finish(trainer, metrics, checkpoint=checkpoint if opts.wandb_checkpoints or opts.log_model else None)
    return metrics


def logged_params(trainer) -> dict:
    """The flat config the loggers got as hyper-parameters when fit started (callbacks.LogRunConfig)."""
    return next((c.params for c in trainer.callbacks if isinstance(c, LogRunConfig)), {})


def real_tokens_per_step(module: TranslationModule) -> dict:
    """Mean real source and target tokens per optimizer step over the run (all devices, every attempt)."""
    t = module.trained_counts()
    steps = max(t["steps"], 1)
    return {
        "src_tokens_per_step": round(t["src_tokens"] / steps, 1),
        "tgt_tokens_per_step": round(t["tgt_tokens"] / steps, 1),
    }


@dataclass(frozen=True)
class Integrations:
    """What a run plugs in from its options and environment: loggers, SLURM's requeue handler."""

    loggers: list
    callbacks: list
    plugins: list


def integrations(opts: TrainOptions, p: Plan) -> Integrations:
    """The loggers of --logger, one version (or run) per attempt under the run directory (lightning_modules/
    loggers.py); under SLURM, Lightning's requeue handler off and ours (a checkpoint at a step boundary) on."""
    config = RunConfig.from_dict(redact_obj(p.config.to_dict()))
    loggers = run_loggers.build(run_loggers.of(opts), p.run, config, rank_zero=is_launch_rank_zero(), out_root=opts.out)
    plugins, callbacks = slurm_parts(p.run.checkpoints, opts.world_size)
    return Integrations(loggers, [LogRunConfig(wandb_run.tracker_params(config)), *callbacks], plugins)


def strategy(opts: TrainOptions):
    """DDP without broadcasting buffers every forward (the model's are constant: the sinusoid and rotary tables),
    for `--strategy ddp` or several devices; any other strategy as given."""
    if opts.strategy == "ddp" or (opts.strategy == "auto" and opts.world_size > 1):
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(broadcast_buffers=False)
    return opts.strategy


def validations(opts: TrainOptions, preset: Preset, steps: int, per_epoch: bool = False) -> tuple[int, tuple[int, ...]]:
    """(every how many optimizer steps a run validates, 0 at epoch ends; the steps it validates besides): the stability
    rule's points each get their validations, whatever --val-every says (ablations/stability.py)."""
    every = 0 if per_epoch else min(opts.val_every or preset.val_every, steps)
    return every, stability.scheduled(steps, every, preset.stability) if opts.stability_validations else ()


def build_trainer(opts: TrainOptions, p: Plan, hooks: Hooks = Hooks()) -> pl.Trainer:
    preset, run, steps, accumulate = p.preset, p.run, p.config.train.steps, p.config.train.accumulate
    # every checkpoint carries the config and the tokenizer: it can translate without the run directory
    embed = RunFilesInCheckpoint(lambda: redact_obj(p.config.to_dict()), lambda: p.dm.tokenizer_model)
    callbacks, val_per_epoch = (embed, *hooks.callbacks), hooks.val_per_epoch
    every_steps, every_minutes = disk.checkpoint_every(opts, preset)
    whole, kept = disk.kept_checkpoints(opts, preset)
    ckpt = StepCheckpoints(
        dirpath=run.checkpoints,
        filename="step{step:07d}",
        auto_insert_metric_name=False,
        every_n_train_steps=every_steps,
        train_time_interval=timedelta(minutes=every_minutes) if every_minutes is not None else None,
        save_top_k=kept,  # the newest k periodic ones, to "average the last 5 / 20"
        keep_whole=whole,
        monitor="step",
        mode="max",
        save_last=True,  # always the whole state: the resume point
        periodic_weights_only=disk.weights_only(opts, preset),
    )
    extra = integrations(opts, p)
    every, at = validations(opts, preset, steps, val_per_epoch)
    points = ScheduledValidations(at)
    return pl.Trainer(
        accelerator=opts.accelerator,
        devices=opts.devices,
        num_nodes=opts.num_nodes,
        strategy=strategy(opts),
        precision=p.config.train.precision,
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        # counts batches, not optimizer steps
        val_check_interval=None if val_per_epoch else every * accumulate,
        check_val_every_n_epoch=1 if val_per_epoch else None,
        num_sanity_val_steps=0,
        # RNGStates: exact resume (the module itself ends a run whose loss is not finite: Diverged); under DDP,
        # SigtermWithTheStep puts Lightning's per-batch SIGTERM broadcast into the step's one all-reduce
        callbacks=[
            RNGStates(opts.seed),
            SigtermWithTheStep(),
            CtrlCAtTheStep(),
            points,
            ckpt,
            *callbacks,
            *extra.callbacks,
            *(progress_bar() if opts.progress else []),
        ],
        plugins=[AtomicCheckpointIO(), *extra.plugins],  # checkpoints: written to a temporary file and renamed
        logger=extra.loggers,
        default_root_dir=run.path,
        enable_progress_bar=opts.progress,
        enable_model_summary=False,
        deterministic=opts.accelerator == "cpu",
        use_distributed_sampler=False,  # the token-bucket sampler shards by rank itself
        **{**TRAINER_DEFAULTS, **opts.trainer},  # --trainer KEY=VALUE: what aiayn does not set (TRAINER_OWNED)
    )
