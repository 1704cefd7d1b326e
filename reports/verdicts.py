"""The pre-registered verdicts of one preset's Table 3: each scored row (ablations/predictions.csv) against base,
on its metric, over seeds, after convergence is checked.

Convergence is judged on the whole dev set's perplexity (val/ppl, teacher-forced, logged at every validation):
a run has converged when its dev perplexity fell by less than `CONVERGED_MAX_DROP` over the last quarter of
its steps; a run whose perplexity rose has converged (it is no longer improving). How the fall is measured is
the preset's `convergence`, one of two rules, each fixed before the runs it judges:

- `endpoints`: the mean of the two validations nearest 75% of the steps against the mean of the last two, so one
  noisy validation does not decide it (`last_quarter_drop`);
- `line`: a least-squares line through log dev perplexity at every validation from the one nearest 75% of the
  steps to the last, its fall over that span (`last_quarter_fit`). It uses every validation of the quarter, so a
  slow, uneven curve (a model without dropout on little data) is judged by its trend, not by which two
  validations happen to sit at the window's ends.

A row has converged when every one of its completed seeds has. A row that has not converged, while base has,
gets no sign verdict; when base has not converged, no row does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from aiayn.ablations.predictions import Prediction, predictions
from aiayn.ablations.table import load_rows
from aiayn.reports import stats

CONVERGED_MAX_DROP = 0.05


def last_quarter_drop(curve: pd.DataFrame, metric: str = "val/ppl") -> float:
    """How much `metric` fell over the last quarter of the curve, as a fraction of its value there (negative: it
    rose), by the `endpoints` rule; NaN with fewer than 4 validations."""
    if len(curve) < 4:
        return math.nan
    steps, values = curve["step"].to_numpy(), curve[metric].to_numpy(dtype=float)
    near = np.argsort(np.abs(steps - 0.75 * steps[-1]), kind="stable")[:2]
    before, after = values[near].mean(), values[-2:].mean()
    return float(1.0 - after / before)


def last_quarter_fit(curve: pd.DataFrame, metric: str = "val/ppl") -> float:
    """How much `metric` fell over the last quarter by the `line` rule: a least-squares line through log(metric) at
    every validation from the one nearest 75% of the last step (ties: the earlier) to the last; the fraction
    1 - exp(slope * span) (negative: it rose). NaN with fewer than 4 validations in all or 3 in the window."""
    if len(curve) < 4:
        return math.nan
    steps, values = curve["step"].to_numpy(dtype=float), curve[metric].to_numpy(dtype=float)
    start = int(np.argmin(np.abs(steps - 0.75 * steps[-1])))
    x, y = steps[start:], np.log(values[start:])
    if len(x) < 3:
        return math.nan
    slope = np.polyfit(x, y, 1)[0]
    return float(1.0 - math.exp(slope * (x[-1] - x[0])))


# rule -> (how it measures the fall, in words; the function that measures it)
_RULES = {
    "endpoints": (
        "mean of the two validations nearest 75% of the steps against the mean of the last two",
        last_quarter_drop,
    ),
    "line": (
        "a least-squares line through log dev perplexity at every validation from the one nearest 75% of the "
        "steps to the last, its fall over that span",
        last_quarter_fit,
    ),
}
CONVERGENCE_RULES = tuple(_RULES)


def _known(rule: str) -> tuple:
    if rule not in _RULES:
        raise ValueError(f"unknown convergence rule {rule!r}; one of {', '.join(CONVERGENCE_RULES)}")
    return _RULES[rule]


def rule_text(rule: str = "endpoints") -> str:
    """The convergence rule `rule` (CONVERGENCE_RULES) in words, as the reports print it."""
    return (
        f"converged: the whole dev set's perplexity fell by less than {CONVERGED_MAX_DROP:.0%} over the last quarter "
        f"of the run ({_known(rule)[0]}; a rise counts as converged), for every seed of the row"
    )


def convergence_drop(curve: pd.DataFrame, rule: str = "endpoints", metric: str = "val/ppl") -> float:
    """The last-quarter fall of `metric` by the convergence rule `rule` (CONVERGENCE_RULES)."""
    return _known(rule)[1](curve, metric)


@dataclass(frozen=True)
class Verdict:
    row: str
    metric: str | None
    predicted: str
    delta_worse: float  # how much worse than base in the metric (log-PPL difference, or BLEU points); NaN if none
    p: float  # Welch's two-sided p (NaN: no test)
    p_holm: float
    verdict: str
    n_row: int = 0  # completed seeds behind the numbers
    n_base: int = 0


def _worse_by(metric: str, row: list[float], base: list[float]) -> float:
    """Positive when the row is worse: log-PPL means (PPL up) or BLEU means (BLEU down)."""
    if not row or not base:
        return math.nan
    if metric == "ppl":
        return float(np.mean(np.log(row)) - np.mean(np.log(base)))
    return float(np.mean(base) - np.mean(row))


def _sample(metric: str, values: list[float]) -> list[float]:
    return list(np.log(values)) if metric == "ppl" else list(values)


def judge(preset: str, values: dict[str, dict[str, list[float]]], converged: dict[str, bool | None]) -> dict:
    """row -> Verdict for every row the preset's predictions name. `values[row]["ppl"|"bleu"]`: the per-seed dev
    numbers of the row's completed runs; `converged[row]`: True, False or None (no curve)."""
    preds: dict[str, Prediction] = predictions(preset)
    base_ok = converged.get("base") is not False
    tests, out = {}, {}
    for row, pred in preds.items():
        if not pred.scored:
            label = stats.NOT_TESTABLE if pred.predicted == "not testable" else stats.NOT_SCORED
            out[row] = Verdict(row, None, pred.predicted, math.nan, math.nan, math.nan, label)
            continue
        mine, base = values.get(row, {}).get(pred.metric, []), values.get("base", {}).get(pred.metric, [])
        worse = _worse_by(pred.metric, mine, base)
        if mine and base and (not base_ok or converged.get(row) is False):
            out[row] = Verdict(row, pred.metric, pred.predicted, worse, math.nan, math.nan, stats.NOT_CONVERGED,
                               len(mine), len(base))  # fmt: skip
            continue
        p = stats.welch_p(_sample(pred.metric, mine), _sample(pred.metric, base)) if mine and base else math.nan
        tests[row] = (pred, worse, p, len(mine), len(base))
    adjusted = stats.holm({row: t[2] for row, t in tests.items()})
    for row, (pred, worse, p, n_row, n_base) in tests.items():
        v = stats.verdict(worse, pred.worse, adjusted[row], n_row, n_base)
        out[row] = Verdict(row, pred.metric, pred.predicted, worse, p, adjusted[row], v, n_row, n_base)
    return {row: out[row] for row in load_rows() if row in out}  # in table order


def score(verdicts: dict[str, Verdict]) -> dict:
    """The table's verdict in numbers: scored rows, how many agree (and significantly), and the trivial
    predictors on the same set."""
    scored = [v for v in verdicts.values() if v.predicted in ("worse", "better")]
    count = {name: sum(v.verdict == name for v in scored) for name in stats.VERDICTS}
    agreeing = count[stats.SIGNIFICANT_AGREE] + count[stats.AGREE]
    return {
        "scored": len(scored),
        "agree": agreeing,
        "significant_agree": count[stats.SIGNIFICANT_AGREE],
        "counts": count,
        "trivial": stats.trivial_scores([v.predicted == "worse" for v in scored], agreeing),
    }
