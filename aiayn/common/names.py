"""Names are data, never paths: a row, group, preset or corpus name becomes one component of a path under --out
(OUT/PRESET/CORPUS/ROW/seedS), so each is checked where it enters (a table file, a sweep record, a config) against
one safe set, and every path built from names is checked again to lie under its root."""

from __future__ import annotations

import re
from pathlib import Path

from aiayn.common.errors import UserError

# letters, digits and . _ + - ; starting with a letter or digit (so never "." or ".."), at most 64 characters
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
RULE = "letters, digits, '.', '_', '+' or '-', starting with a letter or digit, at most 64 characters"


def is_name(text: object) -> bool:
    return isinstance(text, str) and NAME.fullmatch(text) is not None


def check_name(kind: str, text: object, where: str = "") -> str:
    """`text` as a `kind` name (row, group, preset, corpus), or a one-line UserError saying what a name may be."""
    if not is_name(text):
        place = f"{where}: " if where else ""
        raise UserError(f"{place}{kind} name {text!r} is not a name ({RULE}); rename it")
    return text


def under(root: Path, *names: str, kinds: tuple[str, ...] = ()) -> Path:
    """`root / name / ...` for names that are each one safe component; a UserError otherwise, so that no name can
    lead a path out of `root` (a traversal `..`, an absolute `/x`, a separator)."""
    for i, name in enumerate(names):
        check_name(kinds[i] if i < len(kinds) else "path", name)
    path = Path(root).joinpath(*names)
    assert Path(root) in path.parents, f"{path} is not under {root}"  # holds for safe names by construction
    return path
