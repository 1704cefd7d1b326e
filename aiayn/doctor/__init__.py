"""`aiayn doctor`: what this project could not check without a GPU, checked in a few minutes on the machine it runs
on (aiayn/doctor/checks.py), as a pass/fail/skip table and a JSON to attach to a bug report.

A tool above the layers, like `aiayn bench` (it trains, benchmarks and starts `aiayn` subprocesses), so it sits
beside the command line. This module holds its options only, without torch, for the command line's parsers.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.common.options import option

# In the order they run; aiayn/doctor/checks.py has one function per name (tests check the two agree).
CHECKS = ("cuda", "bf16", "sdpa", "bf16_loss", "syncs", "throughput", "ddp", "resume", "translate")


@dataclass
class DoctorOptions:
    """What `aiayn doctor` checks and where it writes (aiayn/doctor/checks.py)."""

    json: str | None = option(None, metavar="FILE")
    """write the environment and every check's result here (for a bug report)"""
    checks: tuple[str, ...] = option(
        (), help=f"run only this check (repeatable; default: all): {', '.join(CHECKS)}", flag="--check", metavar="NAME"
    )
    out: str | None = option(None, metavar="DIR")
    """keep the short training runs and their logs here (default: a temporary directory, removed at the end)"""
    cache_dir: str | None = option(None)
    """tokenizer/corpus cache for the short runs (default: $AIAYN_CACHE or ~/.cache/aiayn)"""
    steps: int = option(3, positive=True)
    """throughput: timed optimizer steps per round (3 rounds, after 2 warm-up steps)"""
    timeout: int = option(600, positive=True)
    """seconds each `aiayn train` / `aiayn translate` subprocess may take"""
