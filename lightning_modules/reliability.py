"""What lets a run survive a kill: exact resume, divergence as a result, atomic checkpoints, one
process per run directory.

- :class:`RNGStates` makes a resumed run draw the same random numbers as an uninterrupted one.
  Lightning saves the model, optimizer, scheduler, loop counters and our data loader's position,
  but not the global RNGs (torch CPU and CUDA, numpy, python `random`) that dropout draws from.
  Saving them at checkpoint time is not enough: things between two training batches draw from the
  global torch RNG too (every DataLoader iterator draws a base seed when it starts: a validation
  run, a resumed run's fresh training iterator), and they differ between an uninterrupted run and
  a resumed one. So each training batch starts from the states the previous training batch ended
  with; those states are what a checkpoint holds. Validation, checkpoint writes and restarts then
  leave no trace in the training run's random numbers.
- :class:`DivergenceGuard` stops a run whose loss is NaN or inf (:class:`Diverged`, with the step)
  before the checkpoint of that step is written, so `last.ckpt` keeps the last finite state.
- :class:`AtomicCheckpointIO` writes Lightning's checkpoints to a temporary file beside the target
  and renames it. (Lightning's own `_atomic_save` stages the bytes in memory and, for a local path,
  in a temporary file under /tmp that is then *moved*: a copy across filesystems, unsynced, so a
  kill mid-copy leaves a truncated `last.ckpt`.)
- :func:`hold_run_lock` keeps two processes (a restarted sweep worker and the orphan of a killed
  one, or two hands typing the same command) from training one run directory at once.
"""

from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ablations.errors import UserError
from ablations.files import atomic_torch_save


def capture_rng() -> dict:
    """The global RNG states, as tensors and plain numbers (Lightning loads checkpoints with
    weights_only=True, which refuses numpy arrays)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RNGStates(pl.Callback):
    """Each training batch starts from the RNG states the previous training batch ended with (see the
    module docstring); checkpoints hold those states. Lightning runs checkpoint callbacks after all
    others, so the states saved at step k are those at the end of step k."""

    def __init__(self) -> None:
        self.states: dict | None = None  # at the end of the last training batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.states is not None:
            restore_rng(self.states)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.states = capture_rng()

    def state_dict(self) -> dict:
        return {"states": self.states}

    def load_state_dict(self, state_dict: dict) -> None:
        self.states = state_dict.get("states")


class Diverged(Exception):
    """The training loss became NaN or inf at optimizer step `step` (1-based)."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss {loss} at optimizer step {step}")
        self.step, self.loss = step, loss


class DivergenceGuard(pl.Callback):
    """Raise :class:`Diverged` when the training loss is not finite on any rank (all ranks agree, so
    none is left waiting in a collective). Runs before the checkpoint callback, so the diverged
    step is never saved."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step + 1  # the optimizer step this batch belongs to

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        bad = trainer.strategy.reduce_boolean_decision(not bool(torch.isfinite(loss.detach()).all()), all=False)
        if bad:
            raise Diverged(self._step, float(loss.detach().float()))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoints written to a temporary file beside the target, fsynced and renamed:
    a kill mid-write leaves the previous file (or none), never a truncated one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options")
        atomic_torch_save(checkpoint, path)


def hold_run_lock(directory: Path):
    """An exclusive lock on `directory/.lock`, held until the returned file is closed (or the process
    dies); a UserError if another process holds it. Creates `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    f = open(directory / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise UserError(
            f"run directory {directory} is being trained by another process; wait for it to finish or stop it"
        ) from None
    return f


def remove_stale_temps(directory: Path) -> list[Path]:
    """Temporary files of atomic writes that a kill left behind (never read; removed on restart)."""
    stale = [p for p in directory.rglob(".*.tmp") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def is_launch_rank_zero() -> bool:
    """Whether this process is global rank 0, from the launcher's environment (before any Trainer
    exists): RANK, LOCAL_RANK, SLURM_PROCID (Lightning's order) and, across nodes, NODE_RANK."""
    from lightning.fabric.utilities.rank_zero import _get_rank

    return (_get_rank() or 0) == 0 and int(os.environ.get("NODE_RANK", "0") or 0) == 0
