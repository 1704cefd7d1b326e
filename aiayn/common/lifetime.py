"""A child process that ends when its parent dies: a sweep's trainers must not outlive a killed driver, or they go on
training pairs that the books, whose claims died with the driver, call pending."""

from __future__ import annotations

import os
import signal
import sys

# set in a child's environment by a driver that starts it as a fresh process (`aiayn table3 --backend subprocess`);
# `aiayn train` then calls die_with_parent() first thing
DIE_WITH_PARENT = "AIAYN_DIE_WITH_PARENT"


def die_with_parent() -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG). The local back
    end's trainers are forked from a forkserver that exits when its driver does; the subprocess back end's are the
    driver's own children. Elsewhere than Linux a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request took hold: go now
        os.kill(os.getpid(), signal.SIGTERM)
