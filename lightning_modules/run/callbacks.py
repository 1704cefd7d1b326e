"""What the Trainer gets beyond Lightning's defaults: exact resume, divergence as a result, atomic
checkpoints, and preemption under SLURM.

- :class:`RNGStates` makes a resumed run draw the same random numbers as an uninterrupted one.
  Lightning saves the model, optimizer, scheduler, loop counters and our data loader's position,
  but not the global RNGs (torch CPU and CUDA, numpy, python `random`) that dropout draws from.
  Saving them at checkpoint time is not enough: things between two training batches draw from the
  global torch RNG too (every DataLoader iterator draws a base seed when it starts: a validation
  run, a resumed run's fresh training iterator), and they differ between an uninterrupted run and
  a resumed one. So each training batch starts from the states the previous training batch ended
  with; those states are what a checkpoint holds. Validation, checkpoint writes and restarts then
  leave no trace in the training run's random numbers.
- :class:`AtomicCheckpointIO` (a plugin) writes Lightning's checkpoints to a temporary file beside
  the target and renames it. (Lightning's own `_atomic_save` stages the bytes in memory and, for a
  local path, in a temporary file under /tmp that is then *moved*: a copy across filesystems,
  unsynced, so a kill mid-copy leaves a truncated `last.ckpt`.)
- :class:`RequeueOnSignal`: on SLURM's warning signal, checkpoint at a step boundary and requeue.
- :class:`SigtermWithTheStep`: under DDP, SIGTERM rides in the step's one all-reduce instead of Lightning's
  per-batch broadcast and device read, and every rank stops at the same step.
- :class:`ScheduledValidations`: validations after given optimizer steps beside `--val-every`'s, so that each point
  of the stability rule has its reading whatever the schedule (ablations/stability.py).
- :class:`CtrlCAtTheStep`: Ctrl-C stops training as SIGTERM does, at the end of the step it lands in; a second one
  stops at once.
- :class:`RunFilesInCheckpoint` puts the run's resolved config and its tokenizer into every
  checkpoint, so that a checkpoint copied alone can still translate (lightning_modules/use/translate.py); it is the
  checkpoint's one config (the modules keep no Lightning hyper-parameters). :class:`LogRunConfig` gives the same
  config to the loggers.

Preemption under SLURM. `aiayn slurm` asks SLURM for `--signal=USR1@LEAD --requeue`; every srun task
(DDP rank) gets SIGUSR1 some seconds before the time limit (or `scancel --signal=USR1 JOB` sends it
by hand). :class:`RequeueOnSignal` is the one requeue handler in charge: the Trainer is built with
`SLURMEnvironment(auto_requeue=False)` so Lightning's own handler is off. Lightning 2.6's handler
saves the checkpoint inside the signal handler, wherever each rank happens to be; under DDP one
rank then waits in the save's barrier while another waits in the backward all-reduce, and the job
hangs until SLURM kills it (reproduced here with 2 CPU ranks; Lightning issue #21406). Here the
signal handler only sets a flag; after each optimizer step every rank joins one all-reduce of the
flag (a single scalar), so all ranks see the decision at the same step, save
`checkpoints/requeue.ckpt` together (Lightning's save_checkpoint is collective), and rank 0 runs
`scontrol requeue`. Training then stops; `train()` skips the final evaluation and writes no
metrics.json, and the requeued job runs the same `aiayn train`, which resumes from the newest
checkpoint of the run directory (`RunDir.resume_checkpoint`).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from weakref import proxy

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar

from aiayn.common.files import atomic_torch_save, sha256_bytes
from aiayn.lightning_modules.run.rundir import REQUEUE_CHECKPOINT, RUN_FILES, RUN_FILES_FORMAT

log = logging.getLogger(__name__)


def capture_rng() -> dict:
    """This process's global RNG states, as tensors and plain numbers (checkpoints load with weights_only=True,
    which refuses numpy arrays). CUDA: the generator of this process's own device only, not every visible
    one's, so a run resumed where fewer GPUs are visible restores what it has."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return states


def restore_rng(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if isinstance(states.get("cuda"), torch.Tensor) and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])  # onto the current device, whichever it is now


class RNGStates(pl.Callback):
    """Each training batch starts from the RNG states the previous training batch ended with (see the
    module docstring); checkpoints hold those states, one set per rank. Lightning runs checkpoint callbacks
    after all others, so the states saved at step k are those at the end of step k.

    Ranks draw from their own streams: rank r > 0 is reseeded with seed + r once its rank is known (rank 0 keeps
    the stream of `seed`, so a one-process run is the same whatever the world size it could have had); every
    rank's states are gathered into the checkpoint (rank 0 writes it) and each rank restores its own. Resumed with
    more ranks, the new ones start from their seeds; with fewer, the extra states are not used."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.states: dict | None = None  # at the end of the last training batch
        self._trainer = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer
        if trainer.global_rank > 0:
            seed = self.seed + trainer.global_rank
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.states is not None:
            restore_rng(self.states)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.states = capture_rng()

    def state_dict(self) -> dict:
        """Every rank's states: Lightning builds the checkpoint on every rank at the same point (its save is
        collective), so the ranks gather theirs here and rank 0's file holds them all."""
        ranks = [self.states]
        trainer = self._trainer
        if trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized():
            ranks = [None] * trainer.world_size
            torch.distributed.all_gather_object(ranks, self.states)
        return {"ranks": ranks}

    def load_state_dict(self, state_dict: dict) -> None:
        ranks = state_dict.get("ranks") or []
        rank = self._trainer.global_rank if self._trainer is not None else 0
        self.states = ranks[rank] if rank < len(ranks) else None


# checkpoint[RUN_FILES] = {"format", "config", "tokenizer_model" (bytes), "tokenizer_sha256"}


class RunFilesInCheckpoint(pl.Callback):
    """Every checkpoint carries what it takes to use it alone: the run's resolved config and its
    SentencePiece model (the file's bytes and their sha256; a few hundred KB beside megabytes of
    weights), under `checkpoint["aiayn"]`. Embedded rather than named by a path, so a checkpoint
    copied to another machine needs neither its run directory nor the corpus nor the cache."""

    def __init__(self, config: Callable[[], dict], tokenizer: Callable[[], str | Path]) -> None:
        self._config, self._tokenizer, self.files = config, tokenizer, None  # read at the first save

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self.files is None:
            data = Path(self._tokenizer()).read_bytes()
            self.files = {
                "format": RUN_FILES_FORMAT,
                "config": self._config(),
                "tokenizer_model": data,
                "tokenizer_sha256": sha256_bytes(data),
            }
        checkpoint[RUN_FILES] = self.files


class RoomForShapes(pl.Callback):
    """With --compile and --static-shapes: once the data module is set up (its sampler knows the epoch's batch
    shapes), raise dynamo's recompile limit so that every shape compiles once (transformer/compiled.py)."""

    def __init__(self, share: int) -> None:
        self.share = share

    def on_fit_start(self, trainer: pl.Trainer, pl_module) -> None:
        from aiayn.lightning_modules.transformer.compiled import room_for

        room_for(trainer.datamodule.train_shape_count(), self.share)


class ScheduledValidations(pl.Callback):
    """A validation after each of `steps` (optimizer steps) as well as Lightning's every `val_check_interval`
    batches: Lightning has no public hook for validating at chosen steps, so the fit loop's one decision
    (`_should_check_val_fx`, which Lightning also asks when it resumes mid-epoch) is wrapped once, when fit starts.
    With gradient accumulation the validation follows the batch that completes the step. A Lightning without that
    method gets a warning and `--val-every`'s schedule alone (tests/test_stability_schedule.py pins the method)."""

    def __init__(self, steps) -> None:
        self.steps = frozenset(int(s) for s in steps)

    def on_fit_start(self, trainer: pl.Trainer, pl_module) -> None:
        loop = trainer.fit_loop.epoch_loop
        regular = getattr(loop, "_should_check_val_fx", None)
        if not self.steps or regular is None:
            if self.steps:
                log.warning(
                    "this Lightning (%s) has no _should_check_val_fx: the validations after steps %s are not "
                    "added; the report may call points without one not testable",
                    pl.__version__,
                    sorted(self.steps),
                )
            return

        def should_check(data_fetcher) -> bool:
            due = trainer.global_step in self.steps and not loop._should_accumulate()
            return regular(data_fetcher) or (due and trainer.enable_validation)

        loop._should_check_val_fx = should_check


class LogRunConfig(pl.Callback):
    """The loggers' hyper-parameters: the run's config (secrets masked), as one flat view with one key a value (row,
    seed, the knobs, `train_steps`, `data/source_eos`…: wandb_run.tracker_params), logged once when fit starts.
    Lightning would log the modules' hyper-parameters instead; they hold none (the checkpoint keeps the config once,
    typed).
    W&B gets the same view at init, so not again here."""

    def __init__(self, params: dict) -> None:
        self.params = params

    def on_fit_start(self, trainer: pl.Trainer, pl_module) -> None:
        for logger in trainer.loggers:
            if type(logger).__name__ != "WandbLogger":
                logger.log_hyperparams(self.params)


class StepCheckpoints(ModelCheckpoint):
    """Lightning's ModelCheckpoint, which also checkpoints the final step, and whose periodic checkpoints may hold
    the weights only.

    Saving every n steps, Lightning 2.6 writes no checkpoint when training stops at max_steps between two
    of them (its on_train_end writes last.ckpt only if no checkpoint was written at all): the model the run
    ended with, the one its final evaluation scored, would be in no file, and `aiayn translate --run` would
    use the one of n steps before (the tiny preset: step 200 of 225, 27 BLEU instead of 40). Not on a
    divergence or an interruption: those end with an exception, and on_train_end does not run.

    `periodic_weights_only` (`--weights-only-checkpoints`): the periodic stepNNNNNNN.ckpt files are what
    averaging (the paper's last 5 / 20) and translation read, which is the weights; Adam's two moments would
    triple their size. A resume reads only last.ckpt or requeue.ckpt (RunDir.resume_checkpoint), which keep the
    whole state. (Lightning's own save_weights_only applies to last.ckpt too, and skips the callbacks'
    on_save_checkpoint, so the run files are added here.)

    `keep_whole` (`--keep-last N` with `--keep-for-averaging M`, M = save_top_k > N): the newest N periodic
    checkpoints stay whole (a run can be rewound to them), and each older one, up to M, is rewritten as weights
    only when it falls out of those N: the file a weights-only save of its step would have written, so
    averaging the last M reads M files at a third of the size."""

    def __init__(self, *args, periodic_weights_only: bool = False, keep_whole: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.periodic_weights_only = periodic_weights_only
        self.keep_whole = keep_whole
        self._slim: set[str] = set()  # periodic files known to hold the weights only

    def _save_topk_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict) -> None:
        super()._save_topk_checkpoint(trainer, monitor_candidates)
        if self.periodic_weights_only or self.keep_whole is None or self.keep_whole >= self.save_top_k:
            return
        if trainer.is_global_zero:
            newest_first = sorted(self.best_k_models, key=lambda path: float(self.best_k_models[path]), reverse=True)
            for path in newest_first[self.keep_whole :]:
                self._slim_down(trainer, path)
        trainer.strategy.barrier("StepCheckpoints.keep_whole")

    def _slim_down(self, trainer: pl.Trainer, path: str) -> None:
        """Rewrite the periodic checkpoint `path` with the keys a weights-only save writes (atomically)."""
        if path in self._slim or not os.path.exists(path):
            return
        whole = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if "optimizer_states" in whole:
            keep = set(self._weights_only_checkpoint(trainer))
            trainer.strategy.checkpoint_io.save_checkpoint({k: v for k, v in whole.items() if k in keep}, path)
            log.info("checkpoint %s: kept for averaging, weights only", Path(path).name)
        self._slim.add(path)

    @staticmethod
    def _weights_only_checkpoint(trainer: pl.Trainer) -> dict:
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=True)  # what save_checkpoint does
        for callback in trainer.callbacks:
            if isinstance(callback, RunFilesInCheckpoint):  # a weights-only checkpoint can translate alone too
                callback.on_save_checkpoint(trainer, trainer.lightning_module, checkpoint)
        return checkpoint

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args, **kwargs) -> None:
        """Lightning's periodic saves, and the final step's checkpoint at the same point of the loop: after the
        step, mid-epoch. Saved at on_train_end instead (after Lightning has closed the epoch that max_steps cut
        short), a later, longer budget resumed from it in a new epoch, on other batches than an uninterrupted run's
        (20 steps extended to 40 ended at dev PPL 187.6 against 170.6). Saved here, extending a run is
        resuming it, as after a kill."""
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            self._save_final(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._save_final(trainer)  # a step the batch-end save did not reach (an epoch limit): still in a file
        super().on_train_end(trainer, pl_module)

    def _save_final(self, trainer: pl.Trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):  # skips a step already saved
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        # Lightning sets last_model_path before it saves last.ckpt; every other file here is a periodic one
        if not self.periodic_weights_only or filepath == self.last_model_path:
            return super()._save_checkpoint(trainer, filepath)
        checkpoint = self._weights_only_checkpoint(trainer)
        trainer.strategy.save_checkpoint(checkpoint, filepath)
        trainer.strategy.barrier("StepCheckpoints.save_weights")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoints written to a temporary file beside the target, fsynced and renamed:
    a kill mid-write leaves the previous file (or none), never a truncated one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options")
        atomic_torch_save(checkpoint, path)


REQUEUE_SIGNAL = signal.SIGUSR1


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes: `ARRAYJOB_TASK` for an array task, else the job id."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")


class RequeueOnSignal(pl.Callback):
    """Checkpoint to `ckpt_dir/requeue.ckpt` and requeue the SLURM job after the step in which any
    rank received `REQUEUE_SIGNAL`. Installs its (flag-only) signal handler when constructed, so a
    signal during data preparation is not lost either."""

    def __init__(self, ckpt_dir: str | Path) -> None:
        self.path = Path(ckpt_dir) / REQUEUE_CHECKPOINT
        self.signalled = False
        self.requeued = False
        self._last_step = -1
        signal.signal(REQUEUE_SIGNAL, self._on_signal)

    def _on_signal(self, signum, frame) -> None:  # only a flag: no I/O, no collectives in a handler
        self.signalled = True

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module, optimizer) -> None:
        if hasattr(pl_module, "step_flags"):  # TranslationModule reduces it with the step's counts: no extra sync
            pl_module.step_flags["requeue"] = self.signalled

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self._last_step:  # inside an accumulation window: not a step boundary
            return
        self._last_step = trainer.global_step
        decisions = getattr(pl_module, "step_decisions", {})
        # every rank reaches this point after every optimizer step, so the all-reduce (another module's) lines up
        wanted = (
            decisions["requeue"]
            if "requeue" in decisions
            else trainer.strategy.reduce_boolean_decision(self.signalled, all=False)
        )
        if not wanted:
            return
        log.info("requeue signal: saving %s at step %d", self.path, trainer.global_step)
        trainer.save_checkpoint(self.path)
        if trainer.is_global_zero:
            self._requeue()
        self.requeued = True
        trainer.should_stop = True

    def _requeue(self) -> None:
        job = slurm_job_id()
        if job is None:
            log.warning("requeue signal outside SLURM: checkpoint saved, nothing to requeue")
            return
        proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if proc.returncode == 0:
            log.info("requeued SLURM job %s", job)
        else:
            log.warning("scontrol requeue %s failed (%s)", job, proc.stderr.strip() or proc.returncode)


class SigtermWithTheStep(pl.Callback):
    """SIGTERM under DDP without a collective of its own. Lightning 2.6 asks every rank, before every training
    batch, whether rank 0 received SIGTERM: a broadcast and an `.item()` (`_TrainingEpochLoop.
    _broadcast_sigterm_tensor`), that is a second collective and a second host-device synchronization per step,
    and its SIGTERM handler broadcasts once more from inside the signal handler. Here the handler only sets a flag
    (and forwards the signal to the ranks this process launched, as Lightning's does); the flag rides in the
    step's one all-reduce (`TranslationModule.step_flags`, as the requeue flag does), and the epoch loop's check
    before the next batch reads the step's decision: every rank raises Lightning's `SIGTERMException` at the same
    step, whichever rank got the signal. The flag reaches Lightning (`received_sigterm`) only with that decision, so
    no rank stops alone at a step the others go on with. One rank: nothing changes (Lightning broadcasts nothing).
    A Lightning without these internals: nothing changes either, and tests/test_ddp.py's collective count says so."""

    def __init__(self) -> None:
        self.active = False
        self.pending = False  # this rank got SIGTERM; not yet decided

    def on_train_start(self, trainer: pl.Trainer, pl_module) -> None:
        if trainer.world_size <= 1 or not hasattr(pl_module, "step_flags"):
            return
        loop, connector = trainer.fit_loop.epoch_loop, getattr(trainer, "_signal_connector", None)
        notifier = getattr(connector, "_sigterm_notifier_fn", None)
        handlers = getattr(signal.getsignal(signal.SIGTERM), "signal_handlers", None)  # Lightning's _HandlersCompose
        if not hasattr(loop, "_broadcast_sigterm_tensor") or not isinstance(handlers, list) or notifier not in handlers:
            return  # another Lightning: its SIGTERM handling is left as it is
        handlers[handlers.index(notifier)] = lambda signum, frame: self._on_signal(trainer, signum)
        loop._broadcast_sigterm_tensor = lambda: self._check(trainer, pl_module)
        self.active = True

    def _on_signal(self, trainer: pl.Trainer, signum) -> None:  # a flag and a forward: no I/O, no collectives
        if not self.pending and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)
        self.pending = True

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module, optimizer) -> None:
        if self.active:
            pl_module.step_flags["sigterm"] = self.pending

    @staticmethod
    def _check(trainer: pl.Trainer, pl_module) -> None:
        if getattr(pl_module, "step_decisions", {}).get("sigterm"):
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            log.warning(
                "rank %d: SIGTERM, every rank stops before step %d", trainer.global_rank, trainer.global_step + 1
            )
            trainer._signal_connector.received_sigterm = True
            raise SIGTERMException()


class CtrlCAtTheStep(pl.Callback):
    """Ctrl-C (SIGINT, to the trainer alone or to its whole process group) stops training as SIGTERM does: a flag,
    read by Lightning at the end of the step it lands in (under DDP every rank at the same step: SigtermWithTheStep),
    then `train()`'s one line, "stopped by SIGINT at step N". A second Ctrl-C stops at once (KeyboardInterrupt).

    Python's own answer, KeyboardInterrupt raised wherever the main thread is, can land inside a finalizer (a
    DataLoader iterator's `__del__` joining its workers at an epoch's end, slow under load); Python prints it and
    drops it there, and the run trained on (a Ctrl-C to the group left a trainer training for 22
    minutes). Active while fit runs, where Lightning's SIGTERM handler is installed (the main thread); the previous
    SIGINT handler is back at teardown."""

    def __init__(self) -> None:
        self.signum: int | None = None  # SIGINT once a Ctrl-C arrived during training
        self._previous = None

    def on_train_start(self, trainer: pl.Trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if not isinstance(getattr(signal.getsignal(signal.SIGTERM), "signal_handlers", None), list):
            return  # not Lightning's handler (another program's own, in this process): Ctrl-C left as it is
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:  # a flag and Lightning's SIGTERM handler: no I/O of ours
        if self.signum is not None:
            signal.default_int_handler(signum, frame)  # the second Ctrl-C: KeyboardInterrupt, now
        self.signum = signal.SIGINT
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            handler(signal.SIGTERM, frame)

    def teardown(self, trainer: pl.Trainer, pl_module, stage: str) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def slurm_parts(ckpt_dir: str | Path, world_size: int = 1) -> tuple[list, list]:
    """(plugins, callbacks) for the Trainer: under srun with one task per device, SLURM's environment with
    Lightning's requeue handler off and ours on. Inside a SLURM allocation but not one task per device (`aiayn train
    --devices 2` in an sbatch script without srun, or a sweep's local DDP runs on a node SLURM gave it), Lightning
    would still pick its SLURM environment from the inherited SLURM_* variables, and then fail its ntasks check or
    wait for ranks SLURM never starts: there the run launches its own ranks (Lightning's local environment, a free
    MASTER_PORT of its own). Elsewhere nothing."""
    from lightning.pytorch.plugins.environments import LightningEnvironment, SLURMEnvironment

    if not SLURMEnvironment.detect():
        return [], []
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) != world_size:
        return [LightningEnvironment()], []
    return [SLURMEnvironment(auto_requeue=False)], [RequeueOnSignal(ckpt_dir)]


class StepsProgressBar(RichProgressBar):
    """Lightning's Rich progress bar (its default where rich is installed), whose training description reads
    "Epoch 0/-2" when a run is bounded by steps (max_epochs -1; Lightning #21925, fixed upstream after 2.6): the
    epoch, and the steps the run trains to, instead."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        text = f"Epoch {current_epoch}"
        if trainer.max_epochs not in (None, -1):
            text += f"/{trainer.max_epochs - 1}"
        if trainer.max_steps and trainer.max_steps > 0:
            text += f" (to step {trainer.max_steps})"
        width = len(self.validation_description)
        return f"{text:{width}}" if width > len(text) else text


def progress_bar() -> list:
    """The progress bar a run shows (with --progress): StepsProgressBar where rich is installed; else none here, and
    Lightning's TQDM bar."""
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

    return [StepsProgressBar()] if _RICH_AVAILABLE else []
