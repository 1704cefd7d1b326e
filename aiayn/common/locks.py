"""File locks (fcntl.flock): one process at a time per lock file, on one machine and on shared
filesystems with working flock (local disks, NFSv4, Lustre with `flock` mounts). The kernel drops a
lock when its process dies, however it dies, so a lock is also a sign of life."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def try_lock(path: str | os.PathLike) -> IO | None:
    """An exclusive lock on `path` (created with its directory), held until the returned file is
    closed or the process dies; None at once if another process holds it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def is_held(path: str | os.PathLike) -> bool:
    """Whether a live process holds the lock on `path`, found without writing anything: a lock file that does not
    exist is held by no one (holders create it), and an existing one is probed with a shared lock on a read-only
    descriptor, which an exclusive holder refuses."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's shared lock at once
    return False


@contextmanager
def file_lock(path: str | os.PathLike, wait: bool = False):
    """Hold an exclusive lock on `path` for the `with` block; yields False at once if another process
    holds it (unless `wait`, which blocks until it is free)."""
    if wait:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        held = open(path, "a+")
        fcntl.flock(held, fcntl.LOCK_EX)
    else:
        held = try_lock(path)
    with holding(held) as ok:
        yield ok


@contextmanager
def holding(held: IO | None):
    """For the `with` block: yields whether `held` (a lock file from `try_lock`, or None) is a lock, and releases
    it after the block."""
    if held is None:
        yield False
        return
    try:
        yield True
    finally:
        held.close()  # closing the file releases the lock


@contextmanager
def removed_on_error(path: str | os.PathLike, errors: type[BaseException] | tuple = Exception):
    """For a block that creates the lock file `path` (and its folders) and may fail with one of `errors` (a user's
    mistake found under the lock, e.g. a storage that cannot be opened): on such a failure, the lock file and the
    folders the block created on the way to it are removed again, so that a one-line error leaves nothing behind.
    A lock file that existed before the block is left as it was."""
    path = Path(path)
    top = path
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    existed = path.exists()
    try:
        yield
    except errors:
        if not existed:
            path.unlink(missing_ok=True)
            folder = path.parent
            while folder != top.parent and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
        raise
