"""The `subprocess` back end: each pair as a fresh `aiayn train` process, handed the driver's spec of its row."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.lifetime import DIE_WITH_PARENT
from aiayn.common.options import to_argv
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.rundir import RunDir, RunMetrics
from aiayn.sweeps.backends import Capabilities, Sweep, register, write_resolved
from aiayn.sweeps.backends.queue import QueueBackend, _result, _threads, attempt_header
from aiayn.sweeps.folders import resolved_file, sweep_log

log = logging.getLogger(__name__)


def train_process_command(opts: TrainOptions, resolved: Path | None = None) -> list[str]:
    """A fresh `aiayn train` process for `opts`: the way to start a run that launches DDP ranks (Lightning starts
    the other ranks by re-running the command line, which only a fresh process has). With `resolved` (the file of
    `write_resolved`), the process trains the driver's spec of the row instead of resolving it again."""
    config = ["--config", str(resolved)] if resolved is not None else []
    return [sys.executable, "-m", "aiayn", "train", *config, *to_argv(opts, always=("row", "preset", "seed"))]


# The launchers' variables a pair's process must not inherit: a driver started under SLURM or torchrun would hand its
# own rank and port to every run.
LAUNCHER_VARIABLES = (
    "SLURM_",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_",
    "PL_",
)
MASTER_PORT_BASE = 29500
PORT_RANGE = 2000  # the ports a driver hands out: from MASTER_PORT_BASE + (its pid mod 1000) x 17, this many


def _free(port: int) -> bool:
    """Whether no process listens on `port` here (a bind to it succeeds; released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


class Ports:
    """The MASTER_PORT of each process a driver starts: a new one every time, never one handed out before nor one in
    use here, so that concurrent DDP runs of one sweep (or of two drivers on one machine) never meet on a port."""

    def __init__(self) -> None:
        first = MASTER_PORT_BASE + (os.getpid() % 1000) * 17
        self._next = itertools.cycle(range(first, first + PORT_RANGE))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            for _ in range(PORT_RANGE):
                port = next(self._next)
                if _free(port):
                    return port
        raise UserError(f"no free port among {PORT_RANGE} for a DDP run's MASTER_PORT here; stop some processes")


PORTS = Ports()  # this driver's


def child_environment(port: int, gpus: str | None, threads: int | None) -> dict:
    """The environment of a pair's own process: ours without the launchers' variables, its GPUs, its threads, and a
    MASTER_PORT of its own (`Ports.take`), so that concurrent DDP runs on one machine do not collide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES)}
    env[DIE_WITH_PARENT] = "1"  # the child asks the kernel to end it when this driver dies (aiayn.common.lifetime)
    env["MASTER_PORT"] = str(port)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES's entries when it is set, else every GPU torch
    sees (counted without starting CUDA here; the runs that use them are fresh processes)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


@register
class SubprocessBackend(QueueBackend):
    """each pair as a fresh `aiayn train` process (what DDP runs need), on its worker's GPUs

    `--gpus-per-job K`: worker i gets the i-th K of the visible GPUs, so N runs at once do not all land on GPU 0."""

    name = "subprocess"
    capabilities = Capabilities(ddp=True, own_gpus=True, trials="processes")

    def check(self, sweep: Sweep) -> None:
        k, t = sweep.gpus_per_job, sweep.train
        if k is None:
            if sweep.jobs > 1 and t.world_size > 1 and t.accelerator != "cpu" and visible_gpus():
                raise UserError(
                    f"--jobs {sweep.jobs} runs of --devices {t.devices} would each train on the same GPUs; pass "
                    f"--gpus-per-job {t.devices} to give each run its own, or --jobs 1"
                )
            return
        if t.accelerator == "cpu":
            raise UserError(f"--gpus-per-job {k} hands out GPUs but --accelerator cpu trains on CPUs; drop one of them")
        if t.devices not in (1, k) or t.num_nodes != 1:
            raise UserError(
                f"--devices {t.devices} and --gpus-per-job {k} disagree: each run trains on its {k} "
                f"GPUs of this machine; drop --devices/--num-nodes"
            )
        gpus = visible_gpus()
        if not gpus:
            raise UserError(
                f"--gpus-per-job {k} hands out GPUs but none is visible; drop --gpus-per-job, or run "
                f"where CUDA_VISIBLE_DEVICES names some"
            )
        if k > 1 and sweep.jobs * k > len(gpus):
            raise UserError(
                f"--jobs {sweep.jobs} x --gpus-per-job {k} needs {sweep.jobs * k} GPUs but {len(gpus)} "
                f"are visible ({','.join(gpus) or 'none'}); lower --jobs or --gpus-per-job"
            )
        if sweep.jobs > len(gpus):  # one-GPU runs, more of them than GPUs: they share, round robin
            log.info(
                "%d runs at once on %d GPU(s): %s each; %s",
                sweep.jobs,
                len(gpus),
                f"{sweep.jobs / len(gpus):g} per GPU",
                mps_state(),
            )
        sweep.train = replace(t, devices=k)

    def slots(self, sweep: Sweep) -> list[str] | None:
        """Each worker's GPUs: the i-th K of the visible ones, or with one GPU each and more workers than GPUs, GPU
        i mod G (several small runs share a GPU: a launch-bound run of the evidence size uses a few percent of
        one)."""
        k = sweep.gpus_per_job
        if k is None:
            return None
        gpus = visible_gpus()
        if k == 1:
            return [gpus[i % len(gpus)] for i in range(sweep.jobs)]
        return [",".join(gpus[i * k : (i + 1) * k]) for i in range(sweep.jobs)]

    def run_one(self, sweep: Sweep, row: str, seed: int, slot: str | None) -> RunMetrics:
        run = sweep.run(row, seed)
        return _result(sweep, row, seed, self.train_process(sweep, row, sweep.run_options(row, seed), run, slot))

    def train_process(self, sweep: Sweep, row: str, opts: TrainOptions, run: RunDir, slot: str | None = None):
        """Its trainer shares the driver's process group: a signal to the group reaches it, one to the driver alone
        lets it finish. One started while the sweep stops would miss the group's signal and train on, the driver
        waiting for it (seen: a pair claimed as `timeout` stopped a sweep ran to its end, and `timeout` killed the
        sweep 10 s on): it is not started, or told at once."""
        if self.stop.signum is not None:
            return None
        sweep_log(run).parent.mkdir(parents=True, exist_ok=True)
        env = child_environment(PORTS.take(), slot, _threads(sweep.jobs))
        with open(sweep_log(run), "a") as out:
            out.write(attempt_header())
            out.flush()
            resolved = write_resolved(resolved_file(run), sweep.specs[row], f"aiayn table3 --backend {self.name}")
            cmd = train_process_command(opts, resolved)
            trainer = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            if self.stop.signum is not None:  # the stop came while it started: before it joined the group's signal
                trainer.send_signal(signal.SIGTERM)
            return trainer.wait()


def mps_state() -> str:
    """Whether NVIDIA's Multi-Process Service runs here (its pipe directory exists), in words: with it, the kernels
    of processes sharing a GPU overlap; without, they take turns."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if os.path.exists(os.path.join(pipe, "control")):
        return f"MPS is running ({pipe}): their kernels overlap"
    return "MPS is not running: their kernels take turns (`nvidia-cuda-mps-control -d` starts it)"
