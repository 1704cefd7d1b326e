"""The `local` back end: each pair in a child of this driver's forkserver, on its share of the CPU threads."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys

from aiayn.common.errors import UserError
from aiayn.common.lifetime import die_with_parent
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.rundir import RunDir, RunMetrics
from aiayn.lightning_modules.run.spec import RunSpec
from aiayn.sweeps.backends import Capabilities, Sweep, register
from aiayn.sweeps.backends.queue import QueueBackend, _result, _threads, attempt_header
from aiayn.sweeps.folders import sweep_log


def _forkserver():
    """A multiprocessing forkserver that has imported Lightning and aiayn once. Each training process is forked
    from it instead of starting a fresh interpreter: importing torch + Lightning takes ~5 s, a tenth of a tiny row.
    (Forked from the forkserver, not from this multi-threaded driver, which fork() would make unsafe.)"""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["aiayn.lightning_modules.run.train"])
    return ctx


def let_the_forkserver_go() -> None:
    """In a forkserver child: close its copy of the driver's keep-alive pipe. CPython hands every child the write end
    of the pipe whose end-of-file tells the forkserver that its driver is gone (multiprocessing.forkserver's
    `_serve_one`), so while a trainer ran, a killed driver's forkserver never saw it and never exited, and the
    trainers that die with it (die_with_parent) trained on to their end. A trainer starts no process of its own
    through the forkserver, so it needs no copy."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def _train_in_child(opts: TrainOptions, spec: RunSpec, logfile: str, threads: int | None) -> None:
    """`train(opts, spec)` in a forkserver child, stdout and stderr to `logfile`; exits with
    the status the `aiayn train` command would."""
    let_the_forkserver_go()
    die_with_parent()
    fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, attempt_header().encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    import torch

    from aiayn.common.errors import print_error
    from aiayn.common.logs import configure_logging
    from aiayn.lightning_modules.run.train import train

    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    configure_logging(logging.INFO)
    try:
        train(opts, spec)
    except UserError as e:
        sys.exit(print_error(e))
    finally:
        # A multiprocessing child leaves through os._exit, so W&B's atexit teardown never runs; run.finish() alone
        # returns before W&B's service has written an offline run's records (W&B's docs: call teardown here).
        if "wandb" in sys.modules:
            sys.modules["wandb"].teardown()
    sys.exit(0)


@register
class LocalBackend(QueueBackend):
    """each pair in a process forked from this driver (Lightning imported once), on its share of the CPU threads"""

    name = "local"
    capabilities = Capabilities(default=True, trials="here")

    def check(self, sweep: Sweep) -> None:
        if sweep.train.world_size > 1 or sweep.gpus_per_job:
            raise UserError(
                "the local back end runs one process per pair; runs on several devices or GPUs of their "
                "own need --backend subprocess"
            )

    def run_one(self, sweep: Sweep, row: str, seed: int, slot: str | None) -> RunMetrics:
        run = sweep.run(row, seed)
        return _result(sweep, row, seed, self.train_process(sweep, row, sweep.run_options(row, seed), run))

    def train_process(self, sweep: Sweep, row: str, opts: TrainOptions, run: RunDir, slot: str | None = None):
        if self.stop.signum is not None:  # stopped while this pair was claimed: not started (told at once if later)
            return None
        sweep_log(run).parent.mkdir(parents=True, exist_ok=True)
        child = _forkserver().Process(
            target=_train_in_child, args=(opts, sweep.specs[row], str(sweep_log(run)), _threads(sweep.jobs))
        )
        child.start()
        with self.stop.child(child.pid):
            child.join()
        return child.exitcode
