"""Table 3 as data: rows read from CSV, blank cells inherited from `base` (the paper's caption).

Also what a sweep owes (the (row, seed) grid) and the knobs a user may change per run (`--set`):
everything here is "what to run", so nothing imports torch.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.options import option

HERE = Path(__file__).resolve().parent
TABLE_FILES = (HERE / "table3.csv", HERE / "extended.csv")
MAX_SEED = 9999


def _bool(text: str) -> bool:
    return text.strip().lower() == "true"


# The columns a row may set, with their types: the model's knobs (named with the paper's symbols, as
# lightning_modules.model.TransformerConfig's fields) and the row's training steps. Everything else
# in a table file is the paper's results or a note.
MODEL_KNOBS = {
    "N": int, "d_model": int, "d_ff": int, "h": int, "d_k": int, "d_v": int,
    "P_drop": float, "eps_ls": float, "pe": str, "norm_first": _bool,
}  # fmt: skip
KNOBS = {**MODEL_KNOBS, "train_steps": int}
MODEL_KEYS = tuple(MODEL_KNOBS)
SCHEDULE_KNOBS = {"warmup": int, "lr_factor": float}  # the preset's schedule, also overridable per run
OVERRIDABLE = {**MODEL_KNOBS, **SCHEDULE_KNOBS}  # what `--set KEY=VALUE` may change
PAPER_BASE = {"norm_first": False}  # the paper's base is post-LN; the CSV of the paper has no such column


@dataclass(frozen=True)
class Row:
    row: str
    group: str
    knobs: dict  # fully resolved against base: every key of KNOBS
    paper_ppl: float | None
    paper_bleu: float | None
    paper_params_m: float | None
    note: str = ""  # what an extended row is (shown by `aiayn rows` and in reports)

    @property
    def extended(self) -> bool:
        return self.group == "extended"


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


@cache
def load_rows() -> dict[str, Row]:
    """Every row of every table file, in file order, resolved against base."""
    raw = []
    for path in TABLE_FILES:
        with path.open(newline="", encoding="utf-8") as f:
            raw.extend(csv.DictReader(f))
    base_raw = next(r for r in raw if r["row"] == "base")
    base = dict(PAPER_BASE, **{k: KNOBS[k](v) for k, v in base_raw.items() if k in KNOBS and v})
    rows = {}
    for r in raw:
        knobs = dict(base, **{k: KNOBS[k](v) for k, v in r.items() if k in KNOBS and v not in (None, "")})
        rows[r["row"]] = Row(
            row=r["row"],
            group=r["group"],
            knobs=knobs,
            paper_ppl=_number(r.get("paper_ppl_dev")),
            paper_bleu=_number(r.get("paper_bleu_dev")),
            paper_params_m=_number(r.get("paper_params_M")),
            note=r.get("note") or "",
        )
    return rows


def get_row(name: str) -> Row:
    rows = load_rows()
    if name not in rows:
        raise UserError(f"unknown row {name!r}; choose one of: {', '.join(rows)} (see `aiayn rows`)")
    return rows[name]


def select_rows(spec: str | None, include_extended: bool = False) -> list[str]:
    """Resolve `--rows base,A,C3` (row ids and group names) to row ids, in table order.

    None or "all" selects the paper's rows (plus the `extended` group if asked for).
    """
    rows = load_rows()
    if spec in (None, "", "all"):
        return [r for r, row in rows.items() if include_extended or not row.extended]
    chosen = set()
    for item in (s.strip() for s in spec.split(",")):
        if item in rows:
            chosen.add(item)
        elif any(row.group == item for row in rows.values()):
            chosen.update(r for r, row in rows.items() if row.group == item)
        else:
            groups = sorted({row.group for row in rows.values()})
            raise UserError(
                f"unknown row or group {item!r} in --rows; rows are {', '.join(rows)}; groups are {', '.join(groups)}"
            )
    return [r for r in rows if r in chosen]


@dataclass
class Selection:
    """Which (row, seed) pairs a sweep owes: the selected rows × seeds 0..N-1."""

    rows: str | None = option(None, "row ids and/or groups, comma-separated (default: all paper rows)")
    extended: bool = option(False, "include the extended rows beyond the paper (ablations/extended.csv)")
    seeds: int = option(1, "seeds 0..N-1 per row")

    def pairs(self) -> list[tuple[str, int]]:
        if not 1 <= self.seeds <= MAX_SEED + 1:
            raise UserError(f"--seeds must be at least 1, got {self.seeds}; pass --seeds 1 or more")
        return [(row, seed) for row in select_rows(self.rows, self.extended) for seed in range(self.seeds)]


def parse_overrides(items: list[str] | tuple[str, ...] | None) -> dict:
    """`--set KEY=VALUE` (repeatable, or several pairs in one): each value typed as its column."""
    out = {}
    for item in (pair for arg in items or () for pair in arg.split()):
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise UserError(f"--set {item}: expected KEY=VALUE; e.g. --set d_model=256")
        if key not in OVERRIDABLE:
            raise UserError(f"--set {key}: unknown key; use one of {', '.join(OVERRIDABLE)}")
        if key == "norm_first" and text.lower() not in ("true", "false"):
            raise UserError(f"--set {item}: norm_first must be true or false; e.g. --set norm_first=true")
        try:
            out[key] = OVERRIDABLE[key](text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(OVERRIDABLE[key], "a value")
            raise UserError(f"--set {item}: {key} must be {kind}; e.g. --set {key}=1") from None
    return out


def format_overrides(overrides: dict) -> list[str]:
    """The `--set` values that `parse_overrides` reads back as `overrides`."""
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]
