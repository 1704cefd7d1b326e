"""Logging for aiayn's own modules: one handler on the `aiayn` logger, secrets masked."""

from __future__ import annotations

import logging

from aiayn.common.secrets import RedactFilter


def configure_logging(level: int = logging.INFO) -> None:
    """aiayn's loggers (all under `aiayn.`) print to stderr with secrets masked. The root logger is
    left alone: Lightning has its own handler, so a root handler would print each of its lines twice."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter())
    logger = logging.getLogger("aiayn")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
