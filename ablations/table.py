"""Table 3 as data: rows read from CSV, blank cells inherited from `base` (the paper's caption).

ablations/table3.csv (the paper's rows) and ablations/extended.csv (ours) are always read; a user's own
table file in the same layout joins them with `--table FILE` (its rows may inherit from `base` too).

The knobs (columns) are ablations/knobs.py's; which (row, seed) pairs a sweep owes is ablations/selection.py.
Everything here is "what to run", so nothing imports torch.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from aiayn.ablations.knobs import MODEL_KEYS, PAPER_BASE, TABLE_KNOBS, parse_value
from aiayn.common.errors import UserError
from aiayn.common.files import read_user_text
from aiayn.common.names import check_name
from aiayn.common.options import option

HERE = Path(__file__).resolve().parent
TABLE_FILES = (HERE / "table3.csv", HERE / "extended.csv")
MAX_SEED = 9999


@dataclass(frozen=True)
class Row:
    row: str
    group: str
    knobs: dict  # fully resolved against base: every knob of TABLE_KNOBS
    paper_ppl: float | None
    paper_bleu: float | None
    paper_params_m: float | None
    note: str = ""  # what an extended row is (shown by `aiayn rows` and in reports)

    @property
    def extended(self) -> bool:
        return self.group == "extended"


# Table 3's series: rows of one group that vary one knob against base, read as a trend (a slope per doubling of the
# knob) beside the pairwise tests. (name, knob, rows besides base); the knob's value is each run's own, so rows a
# preset maps to one config fall on one point.
SERIES = (
    ("heads h", "h", ("A1", "A2", "A3", "A4")),
    ("d_k", "d_k", ("B1", "B2")),
    ("depth N", "N", ("C1", "C2", "C3")),
    ("d_model", "d_model", ("C4", "C5")),
    ("d_ff", "d_ff", ("C6", "C7")),
)

# Table 3's families, what a reader asks of it: the paper's lessons, each the rows that vary one kind of thing
# (name, rows; extended rows join the family of their knob). A report says one line per family.
FAMILIES = (
    ("Heads", ("A1", "A2", "A3", "A4")),
    ("d_k", ("B1", "B2")),
    ("Size", ("C1", "C2", "C3", "C4", "C5", "C6", "C7", "big")),
    ("Dropout", ("D1", "D2")),
    ("Label smoothing", ("D3", "D4")),
    ("Positional encoding", ("E1", "no-pe", "rope")),
)

# The columns a table file may have (the layout of ablations/table3.csv and extended.csv).
PAPER_COLUMNS = ("paper_ppl_dev", "paper_bleu_dev", "paper_params_M")
COLUMNS = ("row", "group", *TABLE_KNOBS, *PAPER_COLUMNS, "note")


def _typed(path: Path, line: int, column: str, text: str):
    if column in PAPER_COLUMNS:
        try:
            return float(text)
        except ValueError:
            what = f"{column} must be a number, got {text!r}"
            raise UserError(f"table {path} line {line}: {what}; fix that cell") from None
    try:
        return parse_value(column, text)
    except ValueError as e:
        raise UserError(f"table {path} line {line}: {e}, got {text!r}; fix that cell") from None


TABLE_MAX_BYTES = 1 << 20  # a table of rows is a few KB
# words --rows reads as selections, not as row names
SELECTION_WORDS = {"all": "every paper row", "scored": "the preset's pre-registered rows"}


def read_table(path: str | Path) -> list[tuple[int, dict]]:
    """The rows of one table file as (line number, {column: cell}), checked: a missing or unreadable
    file, an unknown or missing column, a row without a name or a cell of the wrong type is a UserError
    naming the file and line."""
    path = Path(path)
    text = read_user_text(
        path,
        f"table {path}",
        TABLE_MAX_BYTES,
        "pass --table with a UTF-8 CSV file in the layout of ablations/extended.csv",
    )
    # the csv module splits lines itself (at \n and \r\n only): str.splitlines() also split at U+2028 and the like
    # inside a note's cell, and made a phantom row of its second half
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    unknown = [c for c in header if c not in COLUMNS]
    if unknown:
        raise UserError(f"table {path} line 1: unknown column {unknown[0]!r}; the columns are {', '.join(COLUMNS)}")
    twice = next((c for i, c in enumerate(header) if c in header[:i]), None)
    if twice is not None:  # the csv module keeps the last of two: a cell the user wrote would be read as another
        raise UserError(f"table {path} line 1: column {twice!r} appears twice; keep one")
    if "row" not in header:
        raise UserError(
            f"table {path} line 1: no 'row' column; the first column names the row (see ablations/extended.csv)"
        )
    out = []
    for line, raw in enumerate(reader, start=2):
        if None in raw:
            raise UserError(f"table {path} line {line}: more cells than the {len(header)} columns; fix that line")
        name = (raw.get("row") or "").strip()
        if not name:
            raise UserError(f"table {path} line {line}: the row has no name; fill its 'row' cell")
        check_name("row", name, f"table {path} line {line}")
        if name in SELECTION_WORDS:
            raise UserError(
                f"table {path} line {line}: a row cannot be named {name!r}, which --rows reads as "
                f"{SELECTION_WORDS[name]}; give the row another name"
            )
        if (raw.get("group") or "").strip():
            check_name("group", raw["group"].strip(), f"table {path} line {line}")
        cells = {k: _typed(path, line, k, v) for k, v in raw.items() if k not in ("row", "group", "note") and v}
        out.append(
            (
                line,
                {
                    "row": name,
                    "group": (raw.get("group") or "").strip() or name,
                    "note": raw.get("note") or "",
                    **cells,
                },
            )
        )
    return out


def load_rows(tables: tuple[str, ...] = ()) -> dict[str, Row]:
    """Every row of ablations/ (table3.csv, then extended.csv) and then of the user's `tables`, in file
    order, resolved against base. A row name defined twice is a UserError naming both places. Read
    once per state of the files: a user's table edited meanwhile is read again."""
    return _load_rows(tuple(tables), tuple(_stamp(t) for t in tables))


def _stamp(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@cache
def _load_rows(tables: tuple[str, ...], stamps: tuple) -> dict[str, Row]:
    raw, where = [], {}
    for path in (*TABLE_FILES, *(Path(t) for t in tables)):
        for line, r in read_table(path):
            if r["row"] in where:
                raise UserError(
                    f"table {path} line {line}: row {r['row']!r} is already defined ({where[r['row']]}); "
                    f"give the row another name"
                )
            where[r["row"]] = f"{path} line {line}"
            raw.append(r)
    groups: dict[str, str] = {}  # group -> its first row
    for r in raw:
        if r["group"] != r["row"]:
            groups.setdefault(r["group"], r["row"])
    for r in raw:
        if r["row"] in groups:
            name = r["row"]
            raise UserError(
                f"table {where[name]}: row {name!r} has the name of group {name} (of row {groups[name]}), "
                f"which --rows {name} selects whole; give the row another name"
            )
    base_raw = next(r for r in raw if r["row"] == "base")
    base = dict(PAPER_BASE, **{k: v for k, v in base_raw.items() if k in TABLE_KNOBS})
    rows = {}
    for r in raw:
        rows[r["row"]] = Row(
            row=r["row"],
            group=r["group"],
            knobs=dict(base, **{k: v for k, v in r.items() if k in TABLE_KNOBS}),
            paper_ppl=r.get("paper_ppl_dev"),
            paper_bleu=r.get("paper_bleu_dev"),
            paper_params_m=r.get("paper_params_M"),
            note=r["note"],
        )
    return rows


def varied(name: str, tables: tuple[str, ...] = ()) -> frozenset[str]:
    """The model knobs row `name` sets otherwise than base (its training budget aside): what the row varies; empty
    for base and for a row no table defines."""
    rows = load_rows(tuple(tables))
    if name not in rows:
        return frozenset()
    base = rows["base"].knobs
    return frozenset(k for k, v in rows[name].knobs.items() if k in MODEL_KEYS and v != base[k])


def get_row(name: str, tables: tuple[str, ...] = ()) -> Row:
    rows = load_rows(tuple(tables))
    if name not in rows:
        raise UserError(f"unknown row {name!r}; choose one of: {', '.join(rows)} (see `aiayn rows`)")
    return rows[name]


def select_rows(spec: str | None, include_extended: bool = False, tables: tuple[str, ...] = ()) -> list[str]:
    """Resolve `--rows base,A,C3` (row ids and group names) to row ids, in table order.

    None or "all" selects every row but those of the `extended` group (unless asked for): the paper's
    rows, and those of the user's `tables`.
    """
    rows = load_rows(tuple(tables))
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
class RowChoice:
    """Rows of the table by name (`aiayn rows`, `aiayn sweep export`): ids and groups, the extended rows, and the
    rows of a user's own table files."""

    rows: str | None = option(None)
    """row ids and/or groups, comma-separated (default: all paper rows)"""
    extended: bool = option(False)
    """include the extended rows beyond the paper"""
    table: tuple[str, ...] = option((), metavar="FILE")
    """a table file of your own rows, in the layout of ablations/extended.csv, its cells in the paper's units (the
    preset scales them as it scales the paper's rows) (repeatable)"""

    def names(self) -> list[str]:
        """The chosen row ids, in table order."""
        return select_rows(self.rows, include_extended=self.extended, tables=self.table)
