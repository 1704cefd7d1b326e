"""The pre-registered verdicts of one preset's Table 3: each scored row (ablations/predictions.csv) against base,
on its metric, over seeds, by the paper's own protocol.

**A fixed budget, compared at the end** (as the paper trained every Table 3 row for the same 100k steps and compared
them there): every row trains its preset's steps and is judged on its final dev numbers. No run is required to have
stopped improving: how much a row still learns at the budget is part of what the row is (learning speed and capacity
together, as in the paper), so the last-quarter fall of every run is reported beside the verdicts, never used as a
gate.

**The stability rule**: no verdict may rest on one lucky validation. The family of pre-registered tests is run at
each of `STABILITY` (the validations nearest 75% and 87.5% of the budget, on the whole dev set's perplexity as logged
during training, and the final evaluation at 100%), each time with its own Holm adjustment; a test passes only when
it passes at all three, and a one-seed sign counts only where the sign is the same at all three. A test that
passes at 100% but not at an earlier point is `not stable` (a miss), whatever it was there.

The last-quarter fall (`last_quarter_drop`, `last_quarter_fit`): how much dev perplexity fell over the last quarter
of the run, measured by the preset's `convergence` rule, fixed before the runs it describes:

- `endpoints`: the mean of the two validations nearest 75% of the steps against the mean of the last two;
- `line`: a least-squares line through log dev perplexity at every validation from the one nearest 75% of the
  steps to the last, its fall over that span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from aiayn.ablations.predictions import MIN_PAPER_DELTA_BLEU, MIN_PAPER_DELTA_PPL, SCORED, Prediction, predictions
from aiayn.ablations.stability import READINGS, STABILITY, WINDOW, point_steps, point_value  # noqa: F401
from aiayn.ablations.table import load_rows, varied
from aiayn.reports import stats


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
    """How the reports measure the last-quarter fall (`rule`: CONVERGENCE_RULES), in words, and what it is for."""
    return (
        f"last-quarter fall: how much the whole dev set's perplexity fell over the last quarter of the run "
        f"({_known(rule)[0]}; negative: it rose), the largest over the row's seeds; learning speed and capacity "
        "together at this budget, as in the paper, reported and never used as a gate"
    )


def stability_text(reading: str = "nearest") -> str:
    """The stability rule in words, as the reports print it (`reading`: READINGS, the preset's)."""
    points = ", ".join(f"{f:.1%}".replace(".0%", "%") for f in STABILITY)
    if reading == "median3":
        where = (
            f"at {points} of the budget, each seed read as the median of its {WINDOW} validations nearest the "
            f"point (dev perplexity logged during training; 100%: the last {WINDOW}, the final evaluation "
            "among them, so that no point rests on one validation)"
        )
    else:
        where = (
            f"at the validations nearest {points} of the budget (dev perplexity logged during training; 100%: "
            "the final evaluation)"
        )
    return (
        f"stability: every test is made again {where}, each time Holm-adjusted over the family; a test passes only "
        "when it passes at all three, and a one-seed sign counts only when it is the same at all three"
    )


def convergence_drop(curve: pd.DataFrame, rule: str = "endpoints", metric: str = "val/ppl") -> float:
    """The last-quarter fall of `metric` by the rule `rule` (CONVERGENCE_RULES)."""
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
# 1.111, 2.7% below (docs/history/benchmarks.md). Smoothing that is not applied at all puts ε 0.2's row near 1.0,
# 20% below its 1.25: that is what the check catches.
CHECK_TOLERANCE = 0.05


@dataclass(frozen=True)
class Point:
    """One scored test at one point of the stability rule."""

    fraction: float  # of the budget (STABILITY)
    delta_worse: float  # the row against base there (log PPL, or BLEU points; positive: worse); NaN if no data
    p_holm: float  # the registered test's Holm-adjusted p there (NaN: no test)
    verdict: str  # the test's verdict there alone
    n_row: int
    n_base: int
    p: float = math.nan  # its place's p before Holm's adjustment
    holm_divisor: int = 1  # the tests at that point whose p is as large or larger: Holm's divisor of α for it


@dataclass(frozen=True)
class Verdict:
    row: str
    metric: str | None
    predicted: str
    delta_worse: float  # how much worse than base in the metric (log-PPL difference, or BLEU points); NaN if none
    p: float  # the pre-registered test's p at 100%: Welch's two-sided, or TOST's for an equivalence (NaN: no test)
    p_holm: float
    verdict: str  # after the stability rule
    n_row: int = 0  # completed seeds behind the numbers
    n_base: int = 0
    ci_low: float = math.nan  # Welch's 95% interval of delta_worse (NaN: no test)
    ci_high: float = math.nan
    margin: float | None = None  # an equivalence's margin in the metric's scale (log PPL), as registered
    cell: str = ""  # the preset whose runs these are (a suite judges several together)
    floor: float | None = None  # a check's floor (dev PPL), with `ppl` the row's measured mean
    ppl: float | None = None
    points: tuple[Point, ...] = ()  # the test at each point of the stability rule (STABILITY), 100% last
    tost_low: float = math.nan  # an equivalence's 1 - 2α interval of delta_worse (TOST at α: is it inside ±margin)
    tost_high: float = math.nan
    center: float = 0.0  # an equivalence's predicted difference in the metric's scale (log PPL), as registered
    alpha: float = stats.ALPHA  # the level its family was tested at

    @property
    def passed(self) -> bool:
        """Significant as predicted, or equivalent where equivalence is the prediction (a difference predicted and
        found equivalent is a decided miss)."""
        return self.verdict == stats.SIGNIFICANT_AGREE or (
            self.verdict == stats.EQUIVALENT and self.predicted == "equivalent"
        )

    @property
    def why(self) -> str:
        """One line: why the test passed or failed, point by point."""
        return why(self)


@dataclass(frozen=True)
class Cell:
    """One preset's inputs to its verdicts: per row, the per-seed dev numbers of its completed runs at the end
    (`values[row]["ppl"|"bleu"]`: the final evaluation), the same at the stability rule's earlier points
    (`points[fraction][row][...]`, from the validations logged during training), and, for label smoothing's checks,
    the perplexity floor of its ε and vocabulary."""

    preset: str
    values: dict
    points: dict = field(default_factory=dict)
    floors: dict = field(default_factory=dict)
    # row -> its parameter count as the preset resolves it (what "more parameters help" predicts from)
    params: dict = field(default_factory=dict)
    # the predictions.csv text whose lines for this preset are judged (None: today's file); an earlier attempt is
    # judged by its own registration, as committed before its runs
    registration: str | None = None
    # scored rows with no run at all among the runs reported (a sweep of --rows base,C1): `not run`, outside the
    # family and the score, not "inconclusive" (which is a row whose runs failed or said nothing)
    absent: frozenset = frozenset()
    # the level every test of the family is made at: α, or Šidák's share of it for a table of stages (stages.level)
    alpha: float = stats.ALPHA
    # a later stage's tests (row -> Prediction, ablations/stages.py) instead of the registration's
    tests: dict | None = None

    def at(self, fraction: float) -> dict:
        """Per row, the per-seed numbers the tests read at `fraction` of the budget: the earlier points' readings, and
        at 100% the final evaluation (or its own reading where the preset reads a window there, `median3`)."""
        if fraction != STABILITY[-1]:
            return self.points.get(fraction, {})
        if fraction not in self.points:
            return self.values
        # a window at 100% where the curve gives one; a metric logged only at the end (BLEU, where no validation
        # decodes) is the final evaluation there, as "nearest" reads it
        read = self.points[fraction]
        return {row: {m: read.get(row, {}).get(m) or v for m, v in final.items()} for row, final in self.values.items()}


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
    return Verdict(
        row,
        "ppl",
        pred.predicted,
        math.nan,
        math.nan,
        math.nan,
        label,
        len(mine),
        0,
        cell=cell.preset,
        floor=floor,
        ppl=mean,
    )


@dataclass(frozen=True)
class _Test:
    pred: Prediction
    worse: float
    p: float  # the test's place in the family: Welch's two-sided, TOST's, or the smaller of both (two-sided design)
    p_diff: float  # Welch's two-sided, for every test (an equivalence refuted by a significant difference)
    n_row: int
    n_base: int
    ci: tuple[float, float]
    margin: float | None
    tost_ci: tuple[float, float] = (math.nan, math.nan)
    p_tost: float = math.nan  # an equivalence's or a two-sided design's TOST


def _test(pred: Prediction, mine: list[float], base: list[float], alpha: float = stats.ALPHA) -> _Test:
    if not mine or not base:
        return _Test(pred, math.nan, math.nan, math.nan, len(mine), len(base), (math.nan,) * 2, _metric_margin(pred))
    a, b = _sample(pred.metric, mine), _sample(pred.metric, base)
    margin = _metric_margin(pred)
    _, low, high = stats.welch_ci(a, b)
    # an equivalence is to its registered center (0: base itself); its refutation, a difference from that center
    shifted = [x - _metric_center(pred) for x in a]
    p_diff = stats.welch_p(shifted, b) if pred.equivalence else stats.welch_p(a, b)
    tosted = pred.equivalence or pred.two_sided
    p_tost = stats.tost_p(shifted, b, margin) if tosted else math.nan
    # a two-sided design's arms test disjoint nulls (a difference of 0; one beyond the margin): one place in the family
    p = p_tost if pred.equivalence else min(p_diff, p_tost) if pred.two_sided else p_diff
    tost = stats.welch_ci(a, b, level=1 - 2 * alpha)[1:] if tosted else (math.nan, math.nan)
    worse = _worse_by(pred.metric, mine, base)
    return _Test(pred, worse, p, p_diff, len(mine), len(base), (low, high), margin, tost, p_tost)


def every_change_hurts(pred: Prediction, cell: Cell | None = None) -> Prediction:
    """The trivial guess: every scored row worse than base, in the metric the row is scored on."""
    return Prediction(pred.row, pred.metric, "worse", "every change hurts") if pred.scored else pred


def more_parameters_help(pred: Prediction, cell: Cell) -> Prediction:
    """The sharper naive guess a reviewer proposes first: a row with more parameters than base is better,
    every other change (as many parameters or fewer) worse, by its parameter count at the preset against base's
    (`Cell.params`). Where either count is unknown it makes no prediction (the test is not scored for it)."""
    if not pred.scored:
        return pred
    mine, base = cell.params.get(pred.row), cell.params.get("base")
    if mine is None or base is None:
        return Prediction(pred.row, None, "not scored", "parameter count unknown")
    return Prediction(pred.row, pred.metric, "better" if mine > base else "worse", "more parameters help")


# Within this fraction of base's parameter count, "the parameter count alone" predicts no difference.
SAME_COUNT = 0.01


def _count_margin(pred: Prediction, cell: Cell) -> float:
    """The equivalence margin "the parameter count alone" tests a row of base's count within: the test's own where it
    registered one; else the smallest its preset registers for an equivalence on the same metric; else the
    registration rules' own bound on the paper's noise in that metric (ablations/predictions.py: 1.5% of dev PPL,
    0.5 BLEU)."""
    if pred.margin is not None:
        return pred.margin
    registration = (
        predictions(cell.preset) if cell.registration is None else predictions(cell.preset, cell.registration)
    )
    same = [p.margin for p in registration.values() if p.equivalence and p.metric == pred.metric and p.margin]
    if same:
        return min(same)
    return MIN_PAPER_DELTA_PPL if pred.metric == "ppl" else MIN_PAPER_DELTA_BLEU


def parameter_count_alone(pred: Prediction, cell: Cell) -> Prediction:
    """The capacity guess taken at its word: a row with more parameters than base is better, one with fewer worse,
    and one within SAME_COUNT of base's count equivalent to base (within `_count_margin`). Where either count is
    unknown it makes no prediction."""
    if not pred.scored:
        return pred
    mine, base = cell.params.get(pred.row), cell.params.get("base")
    if mine is None or base is None:
        return Prediction(pred.row, None, "not scored", "parameter count unknown")
    if abs(mine / base - 1) <= SAME_COUNT:
        margin = _count_margin(pred, cell)
        return Prediction(pred.row, pred.metric, "equivalent", "the parameter count alone", margin=margin)
    return Prediction(pred.row, pred.metric, "better" if mine > base else "worse", "the parameter count alone")


# The naive baselines every report judges on the same numbers by the same rules as the registered predictions:
# name (the JSON's key) -> (what the reports call it, the predictor)
BASELINES = {
    "every_change_hurts": ("every change hurts", every_change_hurts),
    "more_parameters_help": ("more parameters help, every other change hurts", more_parameters_help),
    "parameter_count_alone": ("the parameter count alone", parameter_count_alone),
}


def judge_baselines(cells: list[Cell]) -> dict[str, dict]:
    """name -> (preset, row) -> Verdict: each of BASELINES judged on the cells' numbers by `judge_cells`."""
    return {name: judge_cells(cells, predict) for name, (_, predict) in BASELINES.items()}


def _registered(cell: Cell, predict) -> dict[str, Prediction]:
    """The cell's tests: its registration's (or a later stage's, `Cell.tests`), or a baseline's predictions of them;
    a baseline predicts a stage's test as it predicts the registered one (without the stage's equivalence arm)."""
    if cell.tests is not None:
        preds = cell.tests
        if predict:
            return {row: predict(replace(p, margin=None), cell) for row, p in preds.items()}
        return dict(preds)
    preds = predictions(cell.preset) if cell.registration is None else predictions(cell.preset, cell.registration)
    return {row: predict(p, cell) for row, p in preds.items()} if predict else preds


def _judge_at(cells: list[Cell], fraction: float, predict) -> dict[tuple[str, str], tuple[_Test, float, str]]:
    """(preset, row) -> (test, Holm-adjusted p, verdict) of every scored row at one point of the stability rule, the
    cells' tests in one Holm family."""
    tests: dict[tuple[str, str], _Test] = {}
    alpha = cells[0].alpha if cells else stats.ALPHA
    for cell in cells:
        values = cell.at(fraction)
        for row, pred in _registered(cell, predict).items():
            if pred.tested and row not in cell.absent:
                mine = values.get(row, {}).get(pred.metric, [])
                tests[(cell.preset, row)] = _test(pred, mine, values.get("base", {}).get(pred.metric, []), alpha)
    adjusted = stats.holm({key: t.p for key, t in tests.items()})
    family = sum(not math.isnan(t.p) for t in tests.values())
    out = {}
    for key, t in tests.items():
        if t.pred.two_sided:
            out[key] = (t, adjusted[key], _two_sided_verdict(t, adjusted[key], alpha))
        elif not t.pred.equivalence:
            out[key] = (t, adjusted[key], stats.verdict(t.worse, t.pred.worse, adjusted[key], t.n_row, t.n_base, alpha))
    # assay sensitivity is the registration's: its rows of a knob, significant as it predicted them, whoever predicts
    registered = out if predict is None else _judge_at(cells, fraction, None)
    seen = [key for key, (_, _, label) in registered.items() if label == stats.SIGNIFICANT_AGREE]
    for key, t in tests.items():
        if t.pred.equivalence:
            refuted = min(1.0, t.p_diff * family) if not math.isnan(t.p_diff) else math.nan
            assay = any(other[0] == key[0] and _same_knob(other[1], key[1]) for other in seen)
            label = stats.equivalence_verdict(adjusted[key], refuted, t.worse, assay, _outside(t), alpha)
            out[key] = (t, adjusted[key], label)
    return out


def _divisor(judged: dict, key) -> int:
    """Holm's divisor of α for the test `key` among the tests `judged` at one point: how many have a p as large as
    its or larger (1 for the largest; the family's size for the smallest)."""
    mine = judged[key][0].p
    ps = [t.p for t, _, _ in judged.values() if not math.isnan(t.p)]
    return max(1, sum(p >= mine for p in ps)) if not math.isnan(mine) else len(ps) or 1


def _same_knob(row: str, equivalent: str) -> bool:
    """Whether `row` varies only knobs that the row predicted `equivalent` varies (B1's d_k, A1's heads for A3; no-pe
    for E1): a difference it shows is one the equivalence's own knob can make, so the seeds can see one there. A
    naive predictor's equivalence is judged by the same registered rows, so that it wins or loses on its own
    prediction only."""
    mine = varied(row)
    return bool(mine) and mine <= varied(equivalent)


def _outside(t: _Test) -> bool:
    """An equivalence's 1 - 2α interval (TOST's) wholly outside its registered band, center ± margin."""
    low, high = t.tost_ci
    if t.margin is None or math.isnan(low) or math.isnan(high):
        return False
    center = _metric_center(t.pred)
    return low > center + t.margin or high < center - t.margin


def _two_sided_verdict(t: _Test, p_holm: float, alpha: float) -> str:
    """A two-sided design at one point: decided by whichever arm its place in the family rejects (the smaller p),
    the difference (`significant agree` or `significant disagree`) or the equivalence (`equivalent`: the predicted
    difference ruled out beyond the margin, a miss); `inconclusive` where neither."""
    if math.isnan(p_holm) or p_holm >= alpha:
        return stats.INCONCLUSIVE
    if t.p_diff <= t.p_tost:
        return stats.verdict(t.worse, t.pred.worse, p_holm, t.n_row, t.n_base, alpha)
    return stats.EQUIVALENT


def stable_verdict(labels: list[str], two_sided: bool = False) -> str:
    """The verdict after the stability rule, from the test's verdicts at each point (100% last): a pass stands only
    when it is the same pass at every point (`not stable`: passed at the end, not at an earlier point); a sign without
    significance (`agree`, as with one seed a side) only when every point agrees in sign, else the sign says nothing
    (`inconclusive`); anything else at 100% stands as it is. A two-sided design's decision (`two_sided`) stands when it
    is the same at every point; an equivalence that does not is `inconclusive`, a difference `not stable`."""
    final = labels[-1]
    same = all(label == final for label in labels)
    if two_sided and final == stats.EQUIVALENT:
        return final if same else stats.INCONCLUSIVE
    if final in stats.PASSING:
        return final if same else stats.NOT_STABLE
    if final == stats.AGREE:
        agreeing = (stats.AGREE, stats.SIGNIFICANT_AGREE)
        return final if all(label in agreeing for label in labels) else stats.INCONCLUSIVE
    return final


def judge_cells(cells: list[Cell], predict=None) -> dict[tuple[str, str], Verdict]:
    """(preset, row) -> Verdict for every row the cells' predictions name, the scored ones tested together: one Holm
    family over every cell's pre-registered tests (a suite such as `evidence` with its data-limited cell), at each
    point of the stability rule. An equivalence counts only where its own cell shows a row of the same knob (one
    that varies only knobs the equivalence varies) significantly different as predicted at the same point (assay
    sensitivity); it is refuted when Welch's difference test,
    Bonferroni-adjusted over the family, is significant. `predict(prediction, cell)`: another predictor's predictions
    instead of the registered ones (BASELINES), judged on the same numbers by the same rules."""
    out = _untested(cells, predict)
    at = {fraction: _judge_at(cells, fraction, predict) for fraction in STABILITY}
    for key, (t, p_holm, _) in at[STABILITY[-1]].items():
        points = tuple(
            Point(
                f,
                at[f][key][0].worse,
                at[f][key][1],
                at[f][key][2],
                at[f][key][0].n_row,
                at[f][key][0].n_base,
                at[f][key][0].p,
                _divisor(at[f], key),
            )
            for f in STABILITY
        )
        verdict = stable_verdict([p.verdict for p in points], t.pred.two_sided)
        if verdict == stats.NOT_STABLE and any(p.n_row == 0 or p.n_base == 0 for p in points[:-1]):
            verdict = stats.NOT_TESTABLE  # no validation near a point: the rule cannot be applied, not a lost sign
        out[key] = Verdict(
            key[1],
            t.pred.metric,
            t.pred.predicted,
            t.worse,
            t.p,
            p_holm,
            verdict,
            t.n_row,
            t.n_base,
            *t.ci,
            t.margin,
            cell=key[0],
            points=points,
            tost_low=t.tost_ci[0],
            tost_high=t.tost_ci[1],
            center=_metric_center(t.pred),
            alpha=cells[0].alpha,
        )
    order = {row: i for i, row in enumerate(load_rows())}
    cell_order = [c.preset for c in cells]
    return dict(sorted(out.items(), key=lambda kv: (cell_order.index(kv[0][0]), order.get(kv[0][1], len(order)))))


def _untested(cells: list[Cell], predict) -> dict[tuple[str, str], Verdict]:
    """The verdicts no test at the points gives: a check's, a row not scored or not testable, a scored row not run."""
    out: dict[tuple[str, str], Verdict] = {}
    for cell in cells:
        for row, pred in _registered(cell, predict).items():
            if pred.check:
                out[(cell.preset, row)] = _check(row, pred, cell)
            elif not pred.tested:
                label = stats.NOT_TESTABLE if pred.predicted == "not testable" else stats.NOT_SCORED
                out[(cell.preset, row)] = Verdict(
                    row, None, pred.predicted, math.nan, math.nan, math.nan, label, cell=cell.preset
                )
            elif row in cell.absent:
                out[(cell.preset, row)] = Verdict(
                    row, pred.metric, pred.predicted, math.nan, math.nan, math.nan, stats.NOT_RUN, cell=cell.preset
                )
    return out


def _metric_center(pred: Prediction) -> float:
    """An equivalence's center in the tested scale, oriented as `_sample` (positive: worse): log(1 + c) on dev
    log-PPL for a relative center c on PPL; on BLEU, -c points (a center of +1 BLEU is 1 better)."""
    if pred.center is None:
        return 0.0
    return math.log1p(pred.center) if pred.metric == "ppl" else -pred.center


def _metric_margin(pred: Prediction) -> float | None:
    """An equivalence margin in the tested scale: log(1 + m) on dev log-PPL for a relative margin m on PPL; on BLEU,
    points."""
    if pred.margin is None:
        return None
    return math.log1p(pred.margin) if pred.metric == "ppl" else pred.margin


def judge(
    preset: str, values: dict[str, dict[str, list[float]]], points: dict | None = None, floors: dict | None = None
) -> dict:
    """row -> Verdict for every row the preset's predictions name (one cell; `judge_cells` for a suite)."""
    return {row: v for (_, row), v in judge_cells([Cell(preset, values, points or {}, floors or {})]).items()}


def _pct(fraction: float) -> str:
    return f"{fraction:.1%}".replace(".0%", "%")


def _p(x: float) -> str:
    return "no test" if math.isnan(x) else f"{x:.2g}" if x >= 0.001 else f"{x:.1e}"


def why(v: Verdict) -> str:
    """Why a scored test passed or failed, in one line, from its verdict at each point of the stability rule."""
    if not v.points:
        return v.verdict
    held = [p for p in v.points if p.verdict == v.points[-1].verdict]
    # an equivalence's p is TOST's; its `significant disagree` is the two-sided test's refutation, not that p
    label = "TOST Holm p" if v.predicted == "equivalent" else "Holm p"
    each = "; ".join(
        f"{_pct(p.fraction)}: {p.verdict}" + (f" ({label} {_p(p.p_holm)})" if not math.isnan(p.p_holm) else "")
        for p in v.points
    )
    if v.verdict == stats.NOT_TESTABLE:
        missing = ", ".join(_pct(p.fraction) for p in v.points if p.n_row == 0 or p.n_base == 0)
        return (
            f"not testable: no validation near {missing} of the budget, where the stability rule tests it again "
            f"(a run that validated too rarely: rerun with a smaller --val-every) ({each})"
        )
    if v.verdict == stats.NOT_STABLE:
        lost = [_pct(p.fraction) for p in v.points if p not in held]
        return f"{v.points[-1].verdict} at 100% but not at {', '.join(lost)}: not stable ({each})"
    if v.passed:
        return f"{v.verdict} at every point ({each})"
    if v.verdict == stats.AGREE:
        return f"the predicted sign at every point, without a test that could make it significant ({each})"
    return f"{v.verdict} at 100% ({each})"


def _name(key: tuple[str, str], cells: set[str]) -> str:
    return key[1] if len(cells) <= 1 else f"{key[1]} [{key[0]}]"


def baseline_score(verdicts: dict, judged: dict) -> dict:
    """One baseline's score on the registered tests (`judged`: its verdicts on the same numbers): how many it passes
    and agrees with in sign, the tests where it predicts otherwise than the registration, and which of those went
    to either side."""
    scored = {(v.cell, v.row): v for v in verdicts.values() if v.predicted in SCORED and v.verdict != stats.NOT_RUN}
    theirs = {(v.cell, v.row): v for v in judged.values()}
    mine = {k: theirs[k] for k in scored if k in theirs and theirs[k].predicted in SCORED}
    cells = {k[0] for k in scored}
    differ = [k for k in scored if k in mine and mine[k].predicted != scored[k].predicted]
    return {
        "passed": sum(v.passed for v in mine.values()),
        "agree": sum(v.verdict in (stats.SIGNIFICANT_AGREE, stats.AGREE) for v in mine.values()),
        "scored": len(mine),
        "predictions": {_name(k, cells): v.predicted for k, v in mine.items()},
        "verdicts": {_name(k, cells): v.verdict for k, v in mine.items()},
        "differs_on": [_name(k, cells) for k in differ],
        "passed_where_registered_did_not": [_name(k, cells) for k in differ if mine[k].passed and not scored[k].passed],
        "registered_passed_where_it_did_not": [
            _name(k, cells) for k in differ if scored[k].passed and not mine[k].passed
        ],
    }


def score(verdicts: dict, baselines: dict | None = None) -> dict:
    """The table's verdict in numbers: scored tests, how many passed as pre-registered (significant in the predicted
    direction, or equivalent with assay sensitivity, at every point of the stability rule), how many agree in sign;
    each naive baseline judged on the same numbers by the same rules (`baselines`: name -> its verdicts, from
    `judge_baselines`; BASELINES), and random signs on the directional tests."""
    scored = [v for v in verdicts.values() if v.predicted in SCORED and v.verdict != stats.NOT_RUN]
    count = {name: sum(v.verdict == name for v in scored) for name in stats.VERDICTS}
    directional = [v for v in scored if v.predicted in ("worse", "better")]
    agreeing = count[stats.SIGNIFICANT_AGREE] + count[stats.AGREE]
    return {
        "scored": len(scored),
        "not_run": [v.row for v in verdicts.values() if v.verdict == stats.NOT_RUN],
        "passed": sum(v.passed for v in scored),
        "agree": agreeing,
        "significant_agree": count[stats.SIGNIFICANT_AGREE],
        "equivalent": count[stats.EQUIVALENT],
        "counts": count,
        "baselines": {
            name: {"label": BASELINES[name][0], **baseline_score(verdicts, judged)}
            for name, judged in (baselines or {}).items()
        },
        "random_signs": stats.random_signs(len(directional), agreeing),
        "checks": [
            {"row": v.row, "cell": v.cell, "floor": v.floor, "ppl": v.ppl, "verdict": v.verdict}
            for v in verdicts.values()
            if v.predicted == "check"
        ],
    }
