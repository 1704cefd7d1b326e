"""Logging for aiayn's own modules and Optuna's: one handler on the `aiayn` and `optuna` loggers, secrets masked."""

from __future__ import annotations

import logging
import sys
import warnings

from aiayn.common.secrets import RedactFilter

# Lightning's start-up lines on settings aiayn decides itself (the accelerator is the run's --accelerator, recorded in
# its config.json; the loggers are --logger's) and an advertisement: noise on every run
LIGHTNING_NOISE = ("GPU available:", "TPU available:", "HPU available:", "💡 Tip:")
LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIGHTNING_NOISE)


class _Stderr(logging.StreamHandler):
    """A handler that writes to the sys.stderr of the moment (a redirect, a test's capture), not the one it was made
    with: Optuna logs from wherever a study is opened, after the stream of an earlier command may have closed."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(level: int = logging.INFO) -> None:
    """aiayn's loggers (all under `aiayn.`) and Optuna's print to stderr with secrets masked. The root logger is
    left alone: Lightning has its own handler, so a root handler would print each of its lines twice."""
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter())
    for name in ("aiayn", "optuna"):  # Optuna's default handler is off where aiayn opens a study (sweeps/storage.py)
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
    for name in LIGHTNING_LOGGERS:
        noisy = logging.getLogger(name)
        if not any(isinstance(f, _Quiet) for f in noisy.filters):
            noisy.addFilter(_Quiet())
    # a resumed attempt (a rerun, a SLURM requeue) writes into its run's own checkpoints/ by design
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    # Lightning's own pytree helper builds torch's deprecated LeafSpec on every step's outputs: not ours to change
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
