"""One report against another, verdict by verdict: `aiayn report --against DIR` writes `table3-PRESET-against.md` and
`.csv` beside each report, from the two reports' own files (`table3-PRESET.csv` and `.json`), so that a table trained
again (another machine, a GPU, another torch) is read against the committed one (reports/reference/evidence) at a
glance: which scored rows kept their verdict, which did not, and each side's Δ, interval and seeds.

Both sides are read from their written files, not from runs: a reference is whatever a report once wrote.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pandas as pd

from aiayn.ablations.predictions import SCORED
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text, read_json, read_user_text
from aiayn.common.names import is_name
from aiayn.reports import stats
from aiayn.reports.render import delta_ci, fmt_number

log = logging.getLogger(__name__)
COLUMNS = ("delta_ppl_pct", "delta_ppl_ci_low", "delta_ppl_ci_high", "n")


FIX = "name a report folder, e.g. reports/reference/evidence"
TABLE_MAX_BYTES = 1 << 20  # a report's table is a line a row: a few KB


def reference_dir(path: str) -> Path:
    """The folder `--against` names, checked before anything is read or written: it must hold a report's table,
    and every table in it must read as one (`_side`)."""
    folder = Path(path)
    tables = _tables(folder) if folder.is_dir() else []
    if not tables:
        raise UserError(f"--against {path}: not a folder holding a report's table3-PRESET.csv; {FIX}")
    for csv in tables:
        _side(csv)
        _commits(csv)
    return folder


def _tables(folder: Path) -> list[Path]:
    """A report folder's tables (table3-PRESET.csv), not the files beside them."""
    beside = ("-runs.csv", "-slopes.csv", "-curves.csv", "-against.csv")
    return sorted(p for p in folder.glob("table3-*.csv") if not p.name.endswith(beside))


def _side(csv: Path) -> pd.DataFrame:
    """A report's scored rows: row -> predicted, verdict, Δ PPL % and its interval, seeds; a file that is not a
    report's table (empty, another CSV, not UTF-8, too large, no file) is one line."""
    text = read_user_text(csv, f"--against table {csv}", TABLE_MAX_BYTES, FIX)
    try:
        table = pd.read_csv(io.StringIO(text), dtype={"row": str, "predicted": str, "verdict": str})
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as e:
        raise UserError(f"--against table {csv} is not a report's table ({type(e).__name__}); {FIX}") from None
    missing = [c for c in ("row", "predicted", "verdict", *COLUMNS) if c not in table.columns]
    if missing:
        raise UserError(f"--against table {csv} has no column {missing[0]!r}: not a report's table; {FIX}")
    try:
        for col in COLUMNS:
            table[col] = pd.to_numeric(table[col]).astype("Int64" if col == "n" else float)
    except (TypeError, ValueError) as e:
        raise UserError(f"--against table {csv}: its {col!r} column is not numbers ({e}); {FIX}") from None
    bad = next((r for r in table["row"] if not is_name(r)), None)
    if bad is not None:
        raise UserError(f"--against table {csv} has a row named {str(bad)[:40]!r}, which is no row name; {FIX}")
    twice = sorted(set(table["row"][table["row"].duplicated()]))
    if twice:
        raise UserError(f"--against table {csv} lists row(s) {', '.join(twice)} twice: not a report's table; {FIX}")
    for col in ("predicted", "verdict"):  # a report's words, one line each (a newline made a Markdown heading)
        table[col] = table[col].map(lambda v: v if pd.isna(v) else " ".join(str(v).split())[:60])
    scored = table[table["predicted"].isin(SCORED) & table["verdict"].notna()]
    return scored.set_index("row")[["predicted", "verdict", *COLUMNS]]


def _commits(csv: Path) -> list[str]:
    """The commits the report's runs recorded, from its .json beside its .csv ([] where there is none); a .json that
    is not a report's (no file, too large, not JSON, nested too deep) is one line, read before anything is written."""
    path = csv.with_suffix(".json")
    if not path.exists() and not path.is_symlink():
        return []
    try:
        doc = read_json(path, TABLE_MAX_BYTES)
    except ValueError as e:
        raise UserError(f"--against {path}: {e}; {FIX}") from None
    commits = (doc.get("runs_recorded") or {}).get("commits") if isinstance(doc.get("runs_recorded"), dict) else None
    return [c for c in commits if isinstance(c, str) and is_name(c)] if isinstance(commits, list) else []


def _scored(verdicts: pd.Series) -> pd.Series:
    """A verdict the score counts: given, and not "not run" (a registered row none of the runs holds)."""
    return ~verdicts.isin(["", stats.NOT_RUN])


def compare(mine: Path, reference: Path) -> pd.DataFrame:
    """One line per row scored on either side (the reference's order, then rows only these runs scored): each side's
    prediction, verdict, Δ PPL % with its 95% interval and seeds (the reference's columns suffixed _reference), and
    whether both were scored (`compared`) and the same."""
    a, b = _side(reference), _side(mine)
    rows = list(a.index) + [r for r in b.index if r not in a.index]
    lines = pd.DataFrame({"row": rows})
    for side, suffix in ((a, "_reference"), (b, "")):
        got = side.reindex(rows)
        for col in ("predicted", "verdict"):
            lines[col + suffix] = got[col].fillna("").to_numpy()
        for col in COLUMNS:
            lines[col + suffix] = got[col].astype("Int64" if col == "n" else float).array
    lines["compared"] = _scored(lines["verdict_reference"]) & _scored(lines["verdict"])
    lines["same"] = lines["compared"] & (lines["verdict_reference"] == lines["verdict"])
    lines["predicted_changed"] = lines["compared"] & (lines["predicted_reference"] != lines["predicted"])
    return lines


def lead(lines: pd.DataFrame) -> str:
    """'8 of 10 scored verdicts the same; different: C5 (significant agree there, inconclusive here), ...; passes:
    the reference 9 of 10, these runs 8 of 10; the predicted sign ...: the reference 10 of 10, these runs 9 of 10.'
    (passes, signs and scored tests as the report's score counts them)"""
    both = lines[lines["compared"]]
    differ = both[~both["same"]]
    text = f"**{int(both['same'].sum())} of {len(both)} scored verdicts the same**"
    if len(differ):
        text += "; different: " + ", ".join(
            f"{r.row} ({r.verdict_reference} there, {r.verdict} here)" for r in differ.itertuples()
        )
    one_side = lines[_scored(lines["verdict_reference"]) != _scored(lines["verdict"])]
    if len(one_side):
        text += "; scored on one side only: " + ", ".join(one_side["row"])
    passes = [
        f"{int(lines[c].isin(stats.PASSING).sum())} of {int(_scored(lines[c]).sum())}"
        for c in ("verdict_reference", "verdict")
    ]
    changed = lines[lines["predicted_changed"]]
    if len(changed):
        text += "; predicted differently (another registration): " + ", ".join(changed["row"])
    signs = [
        f"{int(lines[c].isin((stats.SIGNIFICANT_AGREE, stats.AGREE)).sum())} of {int(_scored(lines[c]).sum())}"
        for c in ("verdict_reference", "verdict")
    ]
    return (
        text + f"; passes: the reference {passes[0]}, these runs {passes[1]}; the predicted sign (significant or "
        f"not): the reference {signs[0]}, these runs {signs[1]}."
    )


def _deltas(lines: pd.DataFrame, suffix: str) -> list[str]:
    cols = [lines[c + suffix] for c in COLUMNS[:3]]
    return [delta_ci(d, lo, hi) for d, lo, hi in zip(*cols)]


def markdown(lines: pd.DataFrame, mine: Path, reference: Path, notice: str) -> str:
    predicted = lines["predicted_reference"].where(lines["predicted_reference"] != "", lines["predicted"])
    shown = pd.DataFrame(
        {
            "row": lines["row"],
            "predicted": predicted,
            "verdict (reference)": lines["verdict_reference"],
            "verdict (these runs)": lines["verdict"],
            "same": [
                "yes" if same else "**no**" if compared else "" for same, compared in zip(lines.same, lines.compared)
            ],
            "Δ PPL % [95%] (reference)": _deltas(lines, "_reference"),
            "Δ PPL % [95%] (these runs)": _deltas(lines, ""),
            "seeds (reference)": lines["n_reference"].map(lambda x: fmt_number(x, "d")),
            "seeds (these runs)": lines["n"].map(lambda x: fmt_number(x, "d")),
        }
    )
    align = ["left"] * 5 + ["right"] * 4
    ran = [", ".join(c[:10] for c in _commits(p)) for p in (reference, mine)]
    ran = [f"ran from {c}" if c else "recorded no commit" for c in ran]
    title = f"# {mine.stem} against {reference.parent}/{reference.name}"
    table = shown.to_markdown(index=False, disable_numparse=True, colalign=align)
    tail = (
        f"The reference's runs {ran[0]}; these runs {ran[1]}. A verdict is each report's own "
        "(its stability rule and Holm family, reports/verdicts.py); each report's notes say how it was reached."
    )
    return "\n".join([notice, "", title, "", lead(lines), "", table, "", tail, ""])


def write_against(mine_csv: Path, reference: Path, notice: str) -> list[Path]:
    """Write MINE-against.md and .csv beside the report `mine_csv` when `reference` (a folder) holds a report of the
    same name; [] (with a warning) when it holds none."""
    ref_csv = reference / mine_csv.name
    if not ref_csv.is_file():
        log.warning(
            "--against %s holds no %s (it holds %s): %s not compared",
            reference,
            mine_csv.name,
            ", ".join(sorted(p.name for p in reference.glob("table3-*.csv"))),
            mine_csv.stem,
        )
        return []
    lines = compare(mine_csv, ref_csv)
    stem = mine_csv.with_name(f"{mine_csv.stem}-against")
    return [
        atomic_write_text(stem.with_suffix(".md"), markdown(lines, mine_csv, ref_csv, notice)),
        atomic_write_text(stem.with_suffix(".csv"), lines.to_csv(index=False, lineterminator="\n")),
    ]
