"""What each preset's Table 3 tests, decided before its runs: `ablations/predictions.csv`.

One line per (preset, row) that a preset scores or declares not testable:

- `metric`: `bleu` (dev BLEU) or `ppl` (dev perplexity) — the one number the row's verdict is on;
- `predicted`: `worse` or `better` than base in that metric; `not testable` in that preset's regime; or `not
  scored` there though testable (e.g. an effect one seed cannot resolve, in a single-seed preset);
- `reason`: why, wherever the prediction is not simply the paper's sign (a regime that predicts otherwise, a
  row that cannot be tested there), and why the metric where it is not the paper's clearer one.

Which rows are candidates is fixed by the paper alone (`candidates`): a row may be scored only where the
paper's own difference from base is larger than the paper's single-run noise, |Δ BLEU| ≥ 0.5 or |Δ PPL| ≥ 3%
of base's 4.92 (`MIN_PAPER_DELTA_BLEU`, `MIN_PAPER_DELTA_PPL`). The paper reports one run per row and no
spread; its rows that change nothing that should matter differ from base by up to 0.1 BLEU and 0.2% PPL (A3,
E1), and rows of small changes by 0.3-0.4 BLEU and 0.6-1.8% PPL (A2, A4, B2, C3, D2), so a threshold above
those is a judgement of where the paper's signs stop being noise, not a measurement. `big` is the paper's
compute reference, not one variation: never scored.

Nothing here changes after the runs that score it: a miss is reported, not re-scored.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from aiayn.ablations.table import load_rows
from aiayn.common.errors import UserError

PREDICTIONS_FILE = Path(__file__).resolve().parent / "predictions.csv"
MIN_PAPER_DELTA_BLEU = 0.5
MIN_PAPER_DELTA_PPL = 0.03  # relative to base's paper PPL
METRICS = ("bleu", "ppl")
PREDICTIONS = ("worse", "better", "not scored", "not testable")
REFERENCE_ROWS = ("big",)  # a compute reference, never a scored variation


@dataclass(frozen=True)
class Prediction:
    row: str
    metric: str | None  # None when not testable
    predicted: str  # worse | better | not testable
    reason: str

    @property
    def scored(self) -> bool:
        return self.predicted in ("worse", "better")

    @property
    def worse(self) -> bool:
        return self.predicted == "worse"


def paper_direction(row: str, metric: str) -> str | None:
    """worse / better: the paper's sign of the row against base in `metric` (BLEU up or PPL down is better);
    None where the paper has no number or no difference."""
    rows = load_rows()
    r, base = rows[row], rows["base"]
    mine, theirs = (r.paper_bleu, base.paper_bleu) if metric == "bleu" else (r.paper_ppl, base.paper_ppl)
    if mine is None or theirs is None or round(mine - theirs, 6) == 0:
        return None
    better = mine > theirs if metric == "bleu" else mine < theirs
    return "better" if better else "worse"


def candidates() -> dict[str, tuple[str, ...]]:
    """Row -> the metrics in which the paper's difference from base is beyond its noise (the module docstring)."""
    rows = load_rows()
    base = rows["base"]
    out = {}
    for name, r in rows.items():
        if name == "base" or name in REFERENCE_ROWS or r.paper_bleu is None or r.paper_ppl is None:
            continue
        clear = []
        if abs(r.paper_bleu - base.paper_bleu) >= MIN_PAPER_DELTA_BLEU - 1e-9:
            clear.append("bleu")
        if abs(r.paper_ppl - base.paper_ppl) >= MIN_PAPER_DELTA_PPL * base.paper_ppl - 1e-9:
            clear.append("ppl")
        if clear:
            out[name] = tuple(clear)
    return out


def _read(path: Path, text: str | None = None) -> dict[str, dict[str, Prediction]]:
    out: dict[str, dict[str, Prediction]] = {}
    if text is None:
        text = path.read_text(encoding="utf-8")
    with io.StringIO(text, newline="") as f:
        for line, raw in enumerate(csv.DictReader(f), start=2):
            preset, row = (raw.get("preset") or "").strip(), (raw.get("row") or "").strip()
            metric, predicted = (raw.get("metric") or "").strip() or None, (raw.get("predicted") or "").strip()
            where = f"{path} line {line}"
            if predicted not in PREDICTIONS:
                raise UserError(f"{where}: predicted must be one of {', '.join(PREDICTIONS)}, got {predicted!r}")
            if (metric is None) == (predicted in ("worse", "better")) or (metric and metric not in METRICS):
                raise UserError(f"{where}: a scored row names its metric ({' or '.join(METRICS)}), a row not testable "
                                f"none; got metric {metric!r} for {predicted!r}")  # fmt: skip
            if row in out.setdefault(preset, {}):
                raise UserError(f"{where}: row {row} of preset {preset} is listed twice")
            out[preset][row] = Prediction(row, metric, predicted, (raw.get("reason") or "").strip())
    return out


@cache
def _all() -> dict[str, dict[str, Prediction]]:
    return _read(PREDICTIONS_FILE)


def predictions(preset: str) -> dict[str, Prediction]:
    """The preset's pre-registered lines, in file order ({} for a preset that scores nothing)."""
    return dict(_all().get(preset, {}))


def registration_sha256(preset: str, text: str | None = None) -> str | None:
    """A fingerprint of what `preset` pre-registered: the sha256 of its lines (row, metric, prediction, reason, in
    file order), so that lines of other presets may be added later without changing it; None when it registers
    nothing. `text`: a predictions.csv's content (e.g. as committed at some commit) instead of the file's. Every run
    records it, and each report prints it beside the one it scored with."""
    mine = _read(PREDICTIONS_FILE, text).get(preset, {}) if text is not None else _all().get(preset, {})
    if not mine:
        return None
    lines = [[p.row, p.metric, p.predicted, p.reason] for p in mine.values()]
    return hashlib.sha256(json.dumps(lines, ensure_ascii=False).encode("utf-8")).hexdigest()


def scored_rows(preset: str) -> list[str]:
    """The rows the preset's verdict is on, in table order."""
    mine = predictions(preset)
    return [r for r in load_rows() if r in mine and mine[r].scored]
