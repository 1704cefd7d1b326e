"""What each preset's Table 3 tests, decided before its runs: `ablations/predictions.csv`.

One line per (preset, row) that a preset scores, checks or declares not testable:

- `metric`: `bleu` (dev BLEU) or `ppl` (dev perplexity) — the one number the row's verdict is on;
- `predicted`: `worse` or `better` than base in that metric; `equivalent` to base within `margin`; `control`, a
  row beyond the paper's claims predicted worse and never scored, registered only so that an equivalence of its
  knob can count (assay sensitivity: no-pe for E1, whose knob no other row of the paper's table varies); `check`, an
  implementation check reported beside the table and never scored (label smoothing's perplexity floor: a row
  whose difference from base is fixed by arithmetic cannot test the paper); `not testable` in that preset's
  regime; or `not scored` there though testable (e.g. an effect one seed cannot resolve, in a single-seed preset);
- `margin`: for `equivalent` only, the largest relative difference in the metric still called equivalent (0.0125:
  1.25% of dev PPL), fixed with the prediction;
- `center`: for `equivalent` only, where the regime itself predicts a difference the paper's claim does not speak
  to (blank: none, equivalence to base): the relative difference the row is predicted equivalent to, within
  `margin` (e.g. -0.0272 for a row whose extra parameters alone are expected to make it 2.72% better), derived by
  a rule the reason states;
- `seeds`: how many seeds the row trains in a sweep of its preset, where the registration sets it (the power each
  test was given before its runs; blank: the preset's `seeds`, or `base_seeds` for an equivalence);
- `reason`: why, wherever the prediction is not simply the paper's sign (a regime that predicts otherwise, a
  row that cannot be tested there), and why the metric where it is not the paper's clearer one.

Which rows are candidates is fixed by the paper alone. A row may be predicted `worse` or `better` only where the
paper's own difference from base is beyond its single-run noise, |Δ BLEU| ≥ 0.5 or |Δ PPL| ≥ 1.5% of base's 4.92
(`MIN_PAPER_DELTA_BLEU`, `MIN_PAPER_DELTA_PPL`), and only with the paper's sign; it may be predicted `equivalent`
only where the paper's difference is under both. The paper reports one run per row and no spread: its rows that
change nothing that should matter differ from base by at most 0.8% PPL (A3 −0.2%, E1 0%, D2 +0.6%, C3 −0.8%),
and the smallest differences its text calls findings are 1.6-1.9% (A2, B2 and A4: fewer or too many heads,
smaller d_k, §6.2), so 1.5% is a judgement of where the paper's signs stop being noise, not a measurement. `big`
(four knobs at once, and 3x the steps in the paper) is a candidate like any other row by its difference (−12% PPL,
+0.6 BLEU): a compound claim, "bigger models are better", never one variation's effect; a registration that
scores it says how it trains it.

Nothing here changes after the runs that score it: a miss is reported, not re-scored. Each run records the sha256
of its preset's lines (`registration_sha256`), and a test checks that a reference report's runs ran from a commit
that already held them.
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
MIN_PAPER_DELTA_PPL = 0.015  # relative to base's paper PPL
METRICS = ("bleu", "ppl")
SCORED = ("worse", "better", "equivalent")  # a pre-registered test, counted in the table's score
CONTROL = "control"  # tested as `worse`, never scored: the seeds' sensitivity to an equivalence's knob
PREDICTIONS = (*SCORED, CONTROL, "check", "not scored", "not testable")


@dataclass(frozen=True)
class Prediction:
    row: str
    metric: str | None  # None when not testable or not scored
    predicted: str  # one of PREDICTIONS
    reason: str
    margin: float | None = None  # `equivalent` only: the relative margin (0.0125 = 1.25%)
    seeds: int | None = None  # the row's seeds in a sweep of its preset, as registered (None: the preset's)
    center: float | None = None  # `equivalent` only: the relative difference predicted (None: 0, base itself)

    @property
    def scored(self) -> bool:
        return self.predicted in SCORED

    @property
    def control(self) -> bool:
        return self.predicted == CONTROL

    @property
    def tested(self) -> bool:
        """Tested against base in the table's family: a scored row or a control."""
        return self.scored or self.control

    @property
    def worse(self) -> bool:
        return self.predicted in ("worse", CONTROL)

    @property
    def equivalence(self) -> bool:
        return self.predicted == "equivalent"

    @property
    def two_sided(self) -> bool:
        """A difference predicted with an equivalence arm (a later stage's, ablations/stages.py): decided either way,
        the predicted difference by Welch's test or no difference beyond `margin` by TOST (a miss)."""
        return self.predicted in ("worse", "better") and self.margin is not None

    @property
    def check(self) -> bool:
        return self.predicted == "check"


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


def _paper_deltas(row: str) -> tuple[float, float] | None:
    """(|Δ BLEU|, |Δ PPL| relative to base's) of the row in the paper; None where it has no numbers."""
    rows = load_rows()
    r, base = rows[row], rows["base"]
    if row == "base" or r.paper_bleu is None or r.paper_ppl is None:
        return None
    return abs(r.paper_bleu - base.paper_bleu), abs(r.paper_ppl - base.paper_ppl) / base.paper_ppl


def candidates() -> dict[str, tuple[str, ...]]:
    """Row -> the metrics in which the paper's difference from base is beyond its noise (the module docstring)."""
    out = {}
    for name in load_rows():
        deltas = _paper_deltas(name)
        if deltas is None:
            continue
        clear = [
            m for m, d, least in zip(METRICS, deltas, (MIN_PAPER_DELTA_BLEU, MIN_PAPER_DELTA_PPL)) if d >= least - 1e-9
        ]
        if clear:
            out[name] = tuple(clear)
    return out


def equivalence_candidates() -> tuple[str, ...]:
    """The rows the paper does not separate from base in either metric: the only ones that may be predicted
    `equivalent`."""
    out = []
    for name in load_rows():
        deltas = _paper_deltas(name)
        if deltas is not None and deltas[0] < MIN_PAPER_DELTA_BLEU - 1e-9 and deltas[1] < MIN_PAPER_DELTA_PPL - 1e-9:
            out.append(name)
    return tuple(out)


def _margin(text: str, where: str, predicted: str) -> float | None:
    if predicted != "equivalent":
        if text:
            raise UserError(f"{where}: only an equivalent row has a margin; empty the margin cell")
        return None
    try:
        margin = float(text)
    except ValueError:
        raise UserError(
            f"{where}: an equivalent row names its margin, a fraction such as 0.0125; got {text!r}"
        ) from None
    if not 0 < margin < 1:
        raise UserError(f"{where}: margin must be a fraction between 0 and 1 (0.0125 = 1.25%); got {text!r}")
    return margin


def _center(text: str, where: str, predicted: str) -> float | None:
    if not text:
        return None
    if predicted != "equivalent":
        raise UserError(f"{where}: only an equivalent row has a center; empty the center cell")
    try:
        center = float(text)
    except ValueError:
        raise UserError(f"{where}: center is a relative difference such as -0.0272; got {text!r}") from None
    if not -1 < center < 1:
        raise UserError(f"{where}: center must be a fraction between -1 and 1 (-0.0272 = -2.72%); got {text!r}")
    return center


def _seeds(text: str, where: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"{where}: seeds must be a whole number of at least 1 (or blank: the preset's); got {text!r}")
    return int(text)


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
            measured = predicted in (*SCORED, CONTROL, "check")
            if (metric is None) == measured or (metric and metric not in METRICS):
                raise UserError(
                    f"{where}: a scored or checked row names its metric ({' or '.join(METRICS)}), a row "
                    f"not testable none; got metric {metric!r} for {predicted!r}"
                )
            margin = _margin((raw.get("margin") or "").strip(), where, predicted)
            seeds = _seeds((raw.get("seeds") or "").strip(), where)
            center = _center((raw.get("center") or "").strip(), where, predicted)
            if row in out.setdefault(preset, {}):
                raise UserError(f"{where}: row {row} of preset {preset} is listed twice")
            out[preset][row] = Prediction(
                row, metric, predicted, (raw.get("reason") or "").strip(), margin, seeds, center
            )
    return out


@cache
def _all() -> dict[str, dict[str, Prediction]]:
    return _read(PREDICTIONS_FILE)


def predictions(preset: str, text: str | None = None) -> dict[str, Prediction]:
    """The preset's pre-registered lines, in file order ({} for a preset that scores nothing); `text`: a
    predictions.csv's content (e.g. as committed at some commit, to judge an earlier attempt by its own
    registration) instead of the file's."""
    if text is not None:
        return dict(_read(PREDICTIONS_FILE, text).get(preset, {}))
    return dict(_all().get(preset, {}))


def registration_sha256(preset: str, text: str | None = None) -> str | None:
    """A fingerprint of what `preset` pre-registered: the sha256 of its lines (row, metric, prediction, margin,
    reason, and seeds and center where registered, in file order), so that lines of other presets may be added later
    without changing it; None when it registers nothing. `text`: a predictions.csv's content (e.g. as committed at
    some commit) instead of the file's. Every run records it, and each report prints it beside the one it
    scored with."""
    mine = _read(PREDICTIONS_FILE, text).get(preset, {}) if text is not None else _all().get(preset, {})
    if not mine:
        return None
    lines = [
        [p.row, p.metric, p.predicted, p.margin, p.reason]
        + ([p.seeds] if p.seeds is not None else [])
        + ([{"center": p.center}] if p.center is not None else [])
        for p in mine.values()
    ]
    return hashlib.sha256(json.dumps(lines, ensure_ascii=False).encode("utf-8")).hexdigest()


def scored_rows(preset: str) -> list[str]:
    """The rows the preset's verdict is on, in table order."""
    mine = predictions(preset)
    return [r for r in load_rows() if r in mine and mine[r].scored]
