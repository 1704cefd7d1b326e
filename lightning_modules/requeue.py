"""Preemption under SLURM: on the warning signal, checkpoint at a step boundary and requeue the job.

`aiayn slurm` asks SLURM for `--signal=USR1@LEAD --requeue`; every srun task (DDP rank) gets SIGUSR1
some seconds before the time limit (or `scancel --signal=USR1 JOB` sends it by hand).

This callback is the one requeue handler in charge: the Trainer is built with
`SLURMEnvironment(auto_requeue=False)` so Lightning's own handler is off. Lightning 2.6's handler
saves the checkpoint inside the signal handler, wherever each rank happens to be; under DDP one
rank then waits in the save's barrier while another waits in the backward all-reduce, and the job
hangs until SLURM kills it (reproduced here with 2 CPU ranks; Lightning issue #21406). Here the
signal handler only sets a flag; after each optimizer step every rank joins one all-reduce of the
flag (a single scalar), so all ranks see the decision at the same step, save
`checkpoints/requeue.ckpt` together (Lightning's save_checkpoint is collective), and rank 0 runs
`scontrol requeue`. Training then stops; `train()` skips the final evaluation and writes no
metrics.json, and the requeued job runs the same `aiayn train`, which resumes from the newest
checkpoint of the run directory (lightning_modules.train.resume_checkpoint).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path

import lightning.pytorch as pl

log = logging.getLogger(__name__)

REQUEUE_SIGNAL = signal.SIGUSR1
CHECKPOINT_NAME = "requeue.ckpt"


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes: `ARRAYJOB_TASK` for an array task, else the job id."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")


class RequeueOnSignal(pl.Callback):
    """Checkpoint to `ckpt_dir/requeue.ckpt` and requeue the SLURM job after the step in which any
    rank received `REQUEUE_SIGNAL`. Installs its (flag-only) signal handler when constructed, so a
    signal during data preparation is not lost either."""

    def __init__(self, ckpt_dir: str | Path) -> None:
        self.path = Path(ckpt_dir) / CHECKPOINT_NAME
        self.signalled = False
        self.requeued = False
        self._last_step = -1
        signal.signal(REQUEUE_SIGNAL, self._on_signal)

    def _on_signal(self, signum, frame) -> None:  # only a flag: no I/O, no collectives in a handler
        self.signalled = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self._last_step:  # inside an accumulation window: not a step boundary
            return
        self._last_step = trainer.global_step
        # every rank reaches this point after every optimizer step, so the all-reduce lines up
        if not trainer.strategy.reduce_boolean_decision(self.signalled, all=False):
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


def slurm_parts(ckpt_dir: str | Path) -> tuple[list, list]:
    """(plugins, callbacks) for the Trainer: under SLURM, its environment with Lightning's requeue
    handler off and ours on; elsewhere nothing."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    if not SLURMEnvironment.detect():
        return [], []
    return [SLURMEnvironment(auto_requeue=False)], [RequeueOnSignal(ckpt_dir)]
