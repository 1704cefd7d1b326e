"""Table 3 as data: rows read from CSV, blank cells inherited from `base` (the paper's caption)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ablations.errors import UserError

HERE = Path(__file__).resolve().parent
TABLE_FILES = (HERE / "table3.csv", HERE / "extended.csv")

# The architecture/regularization columns a row may set; everything else is the paper's results.
KNOBS = {
    "N": int, "d_model": int, "d_ff": int, "h": int, "d_k": int, "d_v": int,
    "P_drop": float, "eps_ls": float, "pe": str, "norm_first": lambda s: s.strip().lower() == "true",
    "train_steps": int,
}  # fmt: skip
PAPER_BASE = {"norm_first": False}  # the paper's base is post-LN; the CSV of the paper has no such column


@dataclass(frozen=True)
class Row:
    row: str
    group: str
    knobs: dict  # fully resolved against base: every key of KNOBS
    paper_ppl: float | None
    paper_bleu: float | None
    paper_params_m: float | None
    note: str = ""

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
