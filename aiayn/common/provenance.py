"""Where a run's code came from: the commit of the checkout aiayn runs from, and whether its tracked files differ
from that commit (a dirty tree). Every run records both in metrics.json, and a report prints them, so that a
reader can check out exactly the code that produced a number.

Only a checkout of aiayn itself counts: the git work tree must be the directory that holds the `aiayn` package
(an editable install, or `python -m aiayn` in a checkout). An installed wheel has no commit to name, and a
virtual environment that happens to sit inside some other git repository must not borrow that repository's
commit, so both record none. A copy made without `.git` (a GPU machine's) names its commit in $AIAYN_SOURCE
("COMMIT", or "COMMIT+dirty"), as the GPU calls set it from the copy's `.gpucheck/source`; only where no checkout
answers.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding aiayn/ (a checkout's root)


@dataclass(frozen=True)
class Source:
    commit: str | None  # the full hex commit, None where aiayn does not run from a git checkout of itself
    dirty: bool | None  # tracked files differ from the commit (untracked files, e.g. runs/, do not count)

    def describe(self) -> str:
        if self.commit is None:
            return "no git checkout (an installed package)"
        return self.commit[:12] + (" (dirty tree)" if self.dirty else "")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


SOURCE_ENV = "AIAYN_SOURCE"


def named_source() -> Source:
    """The commit $AIAYN_SOURCE names ("COMMIT" or "COMMIT+dirty", the commit 7-40 hex digits); Source(None, None)
    where it is unset or names none."""
    text = os.environ.get(SOURCE_ENV, "").strip().lower()
    commit, _, dirty = text.partition("+")
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit) or dirty not in ("", "dirty"):
        return Source(None, None)
    return Source(commit, dirty == "dirty")


def source_of(root: Path) -> Source:
    """The commit and cleanliness of the git checkout whose top level is `root`; else the commit $AIAYN_SOURCE
    names (`named_source`), else Source(None, None)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(root).resolve():
        return named_source()
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return Source(commit, None if status is None else bool(status))


@functools.cache
def source() -> Source:
    """This process's aiayn checkout (computed once: a run's code does not change under it)."""
    return source_of(PACKAGE_ROOT)
