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
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from aiayn.ablations.predictions import SCORED, Prediction, predictions
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


def smoothing_floor(eps_ls: float, vocab_size: int) -> float:
    """The dev perplexity of a model that predicts its label-smoothed target exactly, against one-hot references:
    probability 1 − ε + ε/V on every reference token, so 1/(1 − ε + ε/V) (1.111 for ε 0.1 and V 1000). Where a
    model has nearly no errors left, rows that change ε differ from base by these floors: a test of the arithmetic
    of smoothing, not of the paper."""
    return 1.0 / (1.0 - eps_ls + eps_ls / vocab_size)


# How far (relative) below its floor a row's dev PPL may sit before the check fails. A trained model is not exactly
# at the smoothed optimum: the smoothed loss barely charges extra confidence on the reference (p = 0.95 instead of
# 0.90 costs 0.02 nats when the rest is spread evenly), and attempt 4's R1 pilot ended base at 1.081 against its
# 1.111, 2.7% below (BENCHMARKS.md). Smoothing that is not applied at all puts ε 0.2's row near 1.0, 20% below its
# 1.25: that is what the check catches.
CHECK_TOLERANCE = 0.05


@dataclass(frozen=True)
class Verdict:
    row: str
    metric: str | None
    predicted: str
    delta_worse: float  # how much worse than base in the metric (log-PPL difference, or BLEU points); NaN if none
    p: float  # the pre-registered test's p: Welch's two-sided, or TOST's for an equivalence (NaN: no test)
    p_holm: float
    verdict: str
    n_row: int = 0  # completed seeds behind the numbers
    n_base: int = 0
    ci_low: float = math.nan  # Welch's 95% interval of delta_worse (NaN: no test)
    ci_high: float = math.nan
    margin: float | None = None  # an equivalence's margin in the metric's scale (log PPL), as registered
    cell: str = ""  # the preset whose runs these are (a suite judges several together)
    floor: float | None = None  # a check's floor (dev PPL), with `ppl` the row's measured mean
    ppl: float | None = None

    @property
    def passed(self) -> bool:
        return self.verdict in stats.PASSING


@dataclass(frozen=True)
class Cell:
    """One preset's inputs to its verdicts: per row, the per-seed dev numbers of its completed runs
    (`values[row]["ppl"|"bleu"]`), whether it converged (True, False, None: no curve), and, for label smoothing's
    checks, the perplexity floor of its ε and vocabulary."""

    preset: str
    values: dict
    converged: dict
    floors: dict = field(default_factory=dict)


def _worse_by(metric: str, row: list[float], base: list[float]) -> float:
    """Positive when the row is worse: log-PPL means (PPL up) or BLEU means (BLEU down)."""
    if not row or not base:
        return math.nan
    if metric == "ppl":
        return float(np.mean(np.log(row)) - np.mean(np.log(base)))
    return float(np.mean(base) - np.mean(row))


def _sample(metric: str, values: list[float]) -> list[float]:
    """Per-seed values, oriented so that larger is worse (log PPL; BLEU negated)."""
    return list(np.log(values)) if metric == "ppl" else [-v for v in values]


def _check(row: str, pred: Prediction, cell: Cell) -> Verdict:
    mine = cell.values.get(row, {}).get("ppl", [])
    floor = cell.floors.get(row)
    if not mine or floor is None:
        label = stats.INCONCLUSIVE
        mean = None
    else:
        mean = float(np.exp(np.mean(np.log(mine))))
        label = stats.CHECK_PASSED if mean >= floor * (1 - CHECK_TOLERANCE) else stats.CHECK_FAILED
    return Verdict(row, "ppl", pred.predicted, math.nan, math.nan, math.nan, label, len(mine), 0, cell=cell.preset,
                   floor=floor, ppl=mean)  # fmt: skip


@dataclass(frozen=True)
class _Test:
    pred: Prediction
    worse: float
    p: float  # the registered test's: Welch's two-sided, or TOST's
    p_diff: float  # Welch's two-sided, for every test (an equivalence refuted by a significant difference)
    n_row: int
    n_base: int
    ci: tuple[float, float]
    margin: float | None


def _test(pred: Prediction, mine: list[float], base: list[float]) -> _Test:
    a, b = _sample(pred.metric, mine), _sample(pred.metric, base)
    margin = _metric_margin(pred)
    _, low, high = stats.welch_ci(a, b)
    p_diff = stats.welch_p(a, b)
    p = stats.tost_p(a, b, margin) if pred.equivalence else p_diff
    return _Test(pred, _worse_by(pred.metric, mine, base), p, p_diff, len(mine), len(base), (low, high), margin)


def judge_cells(cells: list[Cell]) -> dict[tuple[str, str], Verdict]:
    """(preset, row) -> Verdict for every row the cells' predictions name, the scored ones tested together: one Holm
    family over every cell's pre-registered tests (a suite such as `evidence` with its data-limited cell). An
    equivalence counts only where its own cell shows a row predicted worse significantly worse (assay sensitivity);
    it is refuted when Welch's difference test, Bonferroni-adjusted over the family, is significant."""
    out: dict[tuple[str, str], Verdict] = {}
    tests: dict[tuple[str, str], _Test] = {}
    for cell in cells:
        base_ok = cell.converged.get("base") is not False
        for row, pred in predictions(cell.preset).items():
            key = (cell.preset, row)
            if pred.check:
                out[key] = _check(row, pred, cell)
                continue
            if not pred.scored:
                label = stats.NOT_TESTABLE if pred.predicted == "not testable" else stats.NOT_SCORED
                out[key] = Verdict(row, None, pred.predicted, math.nan, math.nan, math.nan, label, cell=cell.preset)
                continue
            mine = cell.values.get(row, {}).get(pred.metric, [])
            base = cell.values.get("base", {}).get(pred.metric, [])
            if mine and base and (not base_ok or cell.converged.get(row) is False):
                out[key] = Verdict(row, pred.metric, pred.predicted, _worse_by(pred.metric, mine, base), math.nan,
                                   math.nan, stats.NOT_CONVERGED, len(mine), len(base), margin=_metric_margin(pred),
                                   cell=cell.preset)  # fmt: skip
                continue
            tests[key] = _test(pred, mine, base) if mine and base else _Test(pred, math.nan, math.nan, math.nan,
                                                                              len(mine), len(base), (math.nan,) * 2,
                                                                              _metric_margin(pred))  # fmt: skip
    adjusted = stats.holm({key: t.p for key, t in tests.items()})
    family = sum(not math.isnan(t.p) for t in tests.values())

    def verdict(key, t: _Test, label: str) -> Verdict:
        return Verdict(key[1], t.pred.metric, t.pred.predicted, t.worse, t.p, adjusted[key], label, t.n_row, t.n_base,
                       *t.ci, t.margin, cell=key[0])  # fmt: skip

    for key, t in tests.items():
        if not t.pred.equivalence:
            out[key] = verdict(key, t, stats.verdict(t.worse, t.pred.worse, adjusted[key], t.n_row, t.n_base))
    sensitive = {key[0] for key, t in tests.items() if t.pred.worse and out[key].verdict == stats.SIGNIFICANT_AGREE}
    for key, t in tests.items():
        if t.pred.equivalence:
            refuted = min(1.0, t.p_diff * family) if not math.isnan(t.p_diff) else math.nan
            out[key] = verdict(key, t, stats.equivalence_verdict(adjusted[key], refuted, t.worse, key[0] in sensitive))
    order = {row: i for i, row in enumerate(load_rows())}
    cell_order = [c.preset for c in cells]
    return dict(sorted(out.items(), key=lambda kv: (cell_order.index(kv[0][0]), order.get(kv[0][1], len(order)))))


def _metric_margin(pred: Prediction) -> float | None:
    """An equivalence margin in the tested scale: log(1 + m) on dev log-PPL for a relative margin m on PPL; on BLEU,
    points."""
    if pred.margin is None:
        return None
    return math.log1p(pred.margin) if pred.metric == "ppl" else pred.margin


def judge(preset: str, values: dict[str, dict[str, list[float]]], converged: dict[str, bool | None],
          floors: dict | None = None) -> dict:  # fmt: skip
    """row -> Verdict for every row the preset's predictions name (one cell; `judge_cells` for a suite)."""
    return {row: v for (_, row), v in judge_cells([Cell(preset, values, converged, floors or {})]).items()}


def score(verdicts: dict[str, Verdict]) -> dict:
    """The table's verdict in numbers: scored tests, how many passed as pre-registered (significant in the predicted
    direction, or equivalent with assay sensitivity), how many agree in sign, and what trivial predictors score on
    the same set ("every change hurts" passes at most the rows predicted worse; random signs on the directional
    ones)."""
    scored = [v for v in verdicts.values() if v.predicted in SCORED]
    count = {name: sum(v.verdict == name for v in scored) for name in stats.VERDICTS}
    directional = [v for v in scored if v.predicted in ("worse", "better")]
    agreeing = count[stats.SIGNIFICANT_AGREE] + count[stats.AGREE]
    return {
        "scored": len(scored),
        "passed": sum(v.passed for v in scored),
        "agree": agreeing,
        "significant_agree": count[stats.SIGNIFICANT_AGREE],
        "equivalent": count[stats.EQUIVALENT],
        "counts": count,
        "trivial": {
            **stats.trivial_scores([v.predicted == "worse" for v in directional], agreeing),
            "every_change_hurts_of_all": sum(v.predicted == "worse" for v in scored),
        },
        "checks": [
            {"row": v.row, "cell": v.cell, "floor": v.floor, "ppl": v.ppl, "verdict": v.verdict}
            for v in verdicts.values() if v.predicted == "check"
        ],
    }  # fmt: skip
