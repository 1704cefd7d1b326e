"""Atomic writes: a reader (or a kill) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_beside(path: Path) -> tuple[int, str]:
    """A temporary file in the target's directory (so os.replace is atomic), with the permissions a
    plain open() would give (mkstemp's are owner-only)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o666 & ~_umask())
    return fd, tmp


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
