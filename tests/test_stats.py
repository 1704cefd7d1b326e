"""The report's statistics on hand-made cases: Welch's t-test, Holm's correction, each verdict, the trivial
predictors, and the pre-registered verdicts of a preset (reports/stats.py, reports/verdicts.py)."""

import math

import numpy as np
import pandas as pd
import pytest

from aiayn.ablations import predictions as P
from aiayn.reports import stats, verdicts


def t_cdf_two_sided(t: float, df: float, n: int = 200_001) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom, by Simpson's rule over the density from 0 to
    |t|: an implementation independent of scipy's, to check it against."""
    x = np.linspace(0.0, abs(t), n)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    h = x[1] - x[0]
    integral = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 1.0 - 2.0 * integral


def test_welch_p_is_the_two_sided_p_of_welchs_t_computed_by_hand():
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 7.0]
    # by hand: means 2 and 16/3, variances 1 and 7/3; se² = 1/3 + 7/9 = 10/9; t = (2 - 16/3) / sqrt(10/9) = -3.1623
    va, vb = 1 / 3, (7 / 3) / 3
    t = (2 - 16 / 3) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)  # Welch-Satterthwaite: 3.4483
    assert round(t, 4) == -3.1623 and round(df, 4) == 3.4483
    assert stats.welch_p(a, b) == pytest.approx(t_cdf_two_sided(t, df), abs=1e-9)
    assert round(stats.welch_p(a, b), 4) == 0.0419


def test_welch_p_is_undefined_without_two_values_a_side_or_any_spread():
    assert math.isnan(stats.welch_p([1.0], [2.0, 3.0]))
    assert math.isnan(stats.welch_p([1.0, 1.0], [2.0, 2.0]))
    assert stats.welch_p([1.0, 1.0], [2.0, 2.5]) < 0.5  # one side without spread is still a test


def test_holm_adjusts_step_down_and_keeps_the_order():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06
    adjusted = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "untested": math.nan})
    assert {k: round(v, 10) for k, v in adjusted.items() if k != "untested"} == {
        "a": 0.03,
        "b": 0.06,
        "c": 0.06,
        "d": 0.02,
    }
    assert math.isnan(adjusted["untested"])  # and it did not count in m = 4
    assert stats.holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}  # capped at 1


@pytest.mark.parametrize(
    "delta_worse, predicted_worse, p_holm, n_row, n_base, expected",
    [
        (0.2, True, 0.01, 4, 8, stats.SIGNIFICANT_AGREE),
        (-0.2, True, 0.01, 4, 8, stats.SIGNIFICANT_DISAGREE),
        (-0.2, False, 0.2, 4, 8, stats.AGREE),  # predicted better, is better, not significant
        (0.2, False, 0.2, 4, 8, stats.DISAGREE),
        (0.2, True, math.nan, 1, 1, stats.AGREE),  # one seed: the sign, no test
        (0.2, True, 0.05, 4, 8, stats.AGREE),  # p = alpha is not below it
        (0.0, True, 0.01, 4, 8, stats.INCONCLUSIVE),  # no difference has no sign
        (math.nan, True, math.nan, 0, 8, stats.INCONCLUSIVE),  # no run of the row
    ],
)
def test_each_verdict(delta_worse, predicted_worse, p_holm, n_row, n_base, expected):
    assert stats.verdict(delta_worse, predicted_worse, p_holm, n_row, n_base) == expected


def test_random_signs_on_the_same_set():
    t = stats.random_signs(5, agreeing=5)
    assert (t["directional_tests"], t["expected_agree"]) == (5, 2.5)
    assert t["p_at_least_as_many"] == 1 / 32  # all 5 signs right by chance
    assert stats.random_signs(10, agreeing=9)["p_at_least_as_many"] == 11 / 1024  # 9 or 10 of 10
    assert stats.binomial_tail(0, 7) == 1.0


def _curve(values, every=100):
    return pd.DataFrame({"step": [every * (i + 1) for i in range(len(values))], "val/ppl": values})


def test_convergence_is_the_last_quarters_drop_in_dev_perplexity():
    # 8 validations, last at 800: the two nearest 600 are 600 and 500 (ties go to the earlier), mean 1.25; last
    # two 1.2 and 1.1, mean 1.15: drop 1 - 1.15/1.25 = 0.08 -> still improving
    flat = _curve([9.0, 3.0, 2.0, 1.5, 1.3, 1.2, 1.2, 1.1])
    assert verdicts.last_quarter_drop(flat) == pytest.approx(0.08)
    rising = _curve([9.0, 3.0, 2.0, 1.5, 1.3, 1.2, 1.25, 1.3])  # overfitting: no longer improving
    assert verdicts.last_quarter_drop(rising) < 0
    assert math.isnan(verdicts.last_quarter_drop(_curve([9.0, 3.0, 2.0])))


def test_the_line_rule_fits_every_validation_of_the_last_quarter():
    # last at 800: the window starts at 600 (nearest 75%); 600, 700, 800 fall by x0.98 each: the line through log
    # PPL is exact, its fall over the 200 steps 1 - 0.98^2
    geometric = _curve([9.0, 3.0, 2.0, 1.5, 1.3, 1.0, 0.98, 0.98**2])
    assert verdicts.last_quarter_fit(geometric) == pytest.approx(1 - 0.98**2)
    # one high validation in the middle moves the endpoints rule by its share of a mean; the line sees it as scatter
    # around the trend: 1.0, 1.2, 0.96 fits a fall of exactly 4% over the span (slope log(0.96)/200)
    bumpy = _curve([9.0, 3.0, 2.0, 1.5, 1.3, 1.0, 1.2, 0.96])
    assert verdicts.last_quarter_fit(bumpy) == pytest.approx(0.04)
    assert verdicts.convergence_drop(bumpy, "line") == verdicts.last_quarter_fit(bumpy)
    assert verdicts.convergence_drop(bumpy, "endpoints") == verdicts.last_quarter_drop(bumpy)
    rising = _curve([9.0, 3.0, 2.0, 1.5, 1.3, 1.2, 1.25, 1.3])
    assert verdicts.last_quarter_fit(rising) < 0
    assert math.isnan(verdicts.last_quarter_fit(_curve([9.0, 3.0, 2.0])))
    with pytest.raises(ValueError, match="unknown convergence rule"):
        verdicts.convergence_drop(bumpy, "median")


def test_every_preset_names_a_known_convergence_rule():
    from aiayn.ablations.presets import PRESETS

    assert {p.convergence for p in PRESETS.values()} <= set(verdicts.CONVERGENCE_RULES)


def held(values: dict) -> dict:
    """The stability rule's earlier points with the same numbers as the end: a test that is about something else."""
    return {f: values for f in verdicts.STABILITY[:-1]}


def test_judge_gives_every_category_its_test_and_holm_over_the_tests_made(monkeypatch):
    preds = {
        "A1": P.Prediction("A1", "ppl", "worse", ""),
        "C1": P.Prediction("C1", "ppl", "worse", ""),
        "C4": P.Prediction("C4", "ppl", "worse", ""),
        "D3": P.Prediction("D3", "ppl", "better", ""),
        "D4": P.Prediction("D4", "bleu", "worse", ""),
        "B1": P.Prediction("B1", None, "not scored", "one seed cannot"),
        "D1": P.Prediction("D1", None, "not testable", "nothing to overfit"),
    }
    monkeypatch.setattr(verdicts, "predictions", lambda preset: preds)
    base = {"ppl": [5.0, 5.1, 5.2, 5.05], "bleu": [20.0, 20.4, 20.2, 20.1]}
    values = {
        "base": base,
        "A1": {"ppl": [6.0, 6.2, 6.1], "bleu": [1.0, 2.0, 3.0]},  # clearly worse
        "C1": {"ppl": [6.4, 6.8], "bleu": [1.0, 2.0]},  # worse, two seeds
        "D3": {"ppl": [5.3, 5.4, 5.35], "bleu": [1.0, 2.0, 3.0]},  # predicted better: significantly worse
        "D4": {"ppl": [5.0], "bleu": [19.0]},  # one seed: BLEU down, the sign agrees, no test
    }
    out = verdicts.judge("any", values, held(values))
    p_a1 = stats.welch_p(np.log([6.0, 6.2, 6.1]), np.log(base["ppl"]))
    p_c1 = stats.welch_p(np.log([6.4, 6.8]), np.log(base["ppl"]))
    p_d3 = stats.welch_p(np.log([5.3, 5.4, 5.35]), np.log(base["ppl"]))
    assert (out["A1"].p, out["C1"].p, out["D3"].p) == (pytest.approx(p_a1), pytest.approx(p_c1), pytest.approx(p_d3))
    # Holm over the three tests made (A1, C1, D3): D4 has one seed, C4 no run
    assert [out[r].p_holm for r in ("A1", "C1", "D3")] == pytest.approx(
        list(stats.holm({"A1": p_a1, "C1": p_c1, "D3": p_d3}).values())
    )
    c1 = stats.SIGNIFICANT_AGREE if out["C1"].p_holm < stats.ALPHA else stats.AGREE
    assert {r: v.verdict for r, v in out.items()} == {
        "A1": stats.SIGNIFICANT_AGREE,
        "C1": c1,
        "C4": stats.INCONCLUSIVE,
        "D3": stats.SIGNIFICANT_DISAGREE,
        "D4": stats.AGREE,
        "B1": stats.NOT_SCORED,
        "D1": stats.NOT_TESTABLE,
    }
    assert out["D4"].delta_worse == pytest.approx(20.175 - 19.0)  # BLEU points below base's mean
    assert out["A1"].delta_worse == pytest.approx(np.mean(np.log([6.0, 6.2, 6.1])) - np.mean(np.log(base["ppl"])))
    trivial = verdicts.judge_cells([verdicts.Cell("any", values, held(values))], verdicts.every_change_hurts)
    summary = verdicts.score(out, {"every_change_hurts": trivial})
    assert (summary["scored"], summary["agree"]) == (5, 3 if c1 == stats.AGREE else 3)
    # "every change hurts" on the same numbers: it passes A1, C1 where significant, and D3 (significantly worse,
    # which the registered "better" fails)
    hurts = summary["baselines"]["every_change_hurts"]
    assert hurts["passed"] == 2 + (c1 == stats.SIGNIFICANT_AGREE)
    assert trivial[("any", "D3")].verdict == stats.SIGNIFICANT_AGREE
    assert hurts["differs_on"] == ["D3"] and hurts["passed_where_registered_did_not"] == ["D3"]


def test_the_stability_rule_refuses_a_pass_that_does_not_hold_at_every_point(monkeypatch):
    """A1 is significantly worse at the end; at 75% its seeds are within base's: `not stable`, and its `why` says
    where. Without a validation at a point (a run that logged none there) the rule cannot be applied: `not testable`,
    naming the point, never `not stable`, and not a pass either."""
    monkeypatch.setattr(verdicts, "predictions", lambda preset: {"A1": P.Prediction("A1", "ppl", "worse", "")})
    base, worse = [5.0, 5.1, 5.2, 5.05], [6.0, 6.2, 6.1]
    end = {"base": {"ppl": base}, "A1": {"ppl": worse}}
    early = {"base": {"ppl": base}, "A1": {"ppl": [5.0, 5.3, 5.1]}}
    out = verdicts.judge("any", end, {0.75: early, 0.875: end})["A1"]
    assert [p.verdict for p in out.points] == [stats.AGREE, stats.SIGNIFICANT_AGREE, stats.SIGNIFICANT_AGREE]
    assert out.verdict == stats.NOT_STABLE and not out.passed and "but not at 75%" in out.why
    assert verdicts.judge("any", end, held(end))["A1"].verdict == stats.SIGNIFICANT_AGREE
    unlogged = verdicts.judge("any", end, {0.875: end})["A1"]  # nothing at 75%
    assert unlogged.verdict == stats.NOT_TESTABLE and not unlogged.passed
    assert unlogged.why.startswith("not testable: no validation near 75% of the budget")
    # a miss at the end stays the miss it is, whatever it was earlier
    assert verdicts.stable_verdict([stats.SIGNIFICANT_AGREE, stats.SIGNIFICANT_AGREE, stats.DISAGREE]) == (
        stats.DISAGREE
    )


def t_cdf(t: float, df: float) -> float:
    """P(T <= t), from the independent two-sided tail above."""
    tail = t_cdf_two_sided(t, df) / 2
    return 1 - tail if t >= 0 else tail


def test_tost_is_the_larger_one_sided_p_worked_by_hand():
    # a = base + 0.001 exactly: means differ by d = 0.001; both variances 1e-4 / 3 (spread 0.01), n 4 and 4
    a, b = [0.011, 0.001, 0.021, 0.011], [0.01, 0.0, 0.02, 0.01]
    # by hand: var of (0.01, 0, 0.02, 0.01) = (0 + 1e-4 + 1e-4 + 0) / 3 = 6.667e-5; se² = 2 * 6.667e-5 / 4 = 3.333e-5
    se = math.sqrt(2 * (2e-4 / 3) / 4)
    df = 6.0  # equal variances and sizes: Welch-Satterthwaite gives n_a + n_b - 2
    margin = math.log1p(0.0125)  # 1.25% of PPL on log PPL: 0.012423
    t_low, t_high = (0.001 + margin) / se, (0.001 - margin) / se  # 2.3248 and -1.9784
    assert (round(t_low, 4), round(t_high, 4)) == (2.3248, -1.9784)
    p_low, p_high = 1 - t_cdf(t_low, df), t_cdf(t_high, df)  # 0.0295 and 0.0476: the worse side decides
    assert stats.tost_p(a, b, margin) == pytest.approx(max(p_low, p_high), abs=1e-6)
    assert round(stats.tost_p(a, b, margin), 4) == 0.0476
    # the same difference with a margin of half the size is not shown equivalent
    assert stats.tost_p(a, b, margin / 2) > 0.05
    assert math.isnan(stats.tost_p([0.0], b, margin))


def test_welch_interval_worked_by_hand():
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 7.0]  # as test_welch_p...: d = -10/3, se = sqrt(10/9), df 3.4483
    d, low, high = stats.welch_ci(a, b)
    # the 97.5% point of t with df 3.4483, by bisection on the independent tail above: 2.961
    lo_t, hi_t = 1.0, 10.0
    for _ in range(60):
        mid = (lo_t + hi_t) / 2
        lo_t, hi_t = (mid, hi_t) if t_cdf_two_sided(mid, 3.4483) > 0.05 else (lo_t, mid)
    half = lo_t * math.sqrt(10 / 9)
    assert round(lo_t, 3) == 2.961
    assert d == pytest.approx(-10 / 3) and low == pytest.approx(d - half, abs=1e-4)
    assert high == pytest.approx(d + half, abs=1e-4)
    assert math.isnan(stats.welch_ci([1.0], b)[1])


def test_the_slope_and_its_interval_worked_by_hand():
    # x = log2 of the knob (1, 2, 4 heads -> 0, 1, 2), two runs at each; y = 1, 1.2 | 1.5, 1.5 | 2.1, 1.9
    x, y = [0, 0, 1, 1, 2, 2], [1.0, 1.2, 1.5, 1.5, 2.1, 1.9]
    # by hand: x̄ = 1, ȳ = 1.5333; Sxx = 4 (four points at ±1); Sxy = (-1)(1 + 1.2 - 2·1.5333) + (1)(2.1 + 1.9 -
    # 2·1.5333) = 0.8667 + 0.9333 = 1.8 -> b = 0.45; residuals: 1 - 1.0833 = -0.0833, 1.2 - 1.0833 = 0.1167, 1.5 -
    # 1.5333 = -0.0333 (twice), 2.1 - 1.9833 = 0.1167, 1.9 - 1.9833 = -0.0833: SSR = 0.04333; se = sqrt(0.04333 / 4
    # / 4) = 0.05204; t(0.975, 4) = 2.7764: half-width 0.1445
    b, low, high = stats.slope(x, y)
    assert b == pytest.approx(0.45)
    assert (high - b) == pytest.approx(2.7764 * math.sqrt(0.0433333 / 4 / 4), abs=1e-4)
    assert low == pytest.approx(2 * b - high)
    assert math.isnan(stats.slope([1, 2], [1.0, 2.0])[1]) and math.isnan(stats.slope([1, 1, 1], [1, 2, 3])[0])


@pytest.mark.parametrize(
    "p_tost, p_diff, assay, expected",
    [
        (0.01, 0.9, True, stats.EQUIVALENT),
        (0.01, 0.9, False, stats.EQUIVALENT_UNASSAYED),  # the table never showed it can see a difference
        (0.3, 0.001, True, stats.SIGNIFICANT_DISAGREE),  # a difference, shown
        (0.3, 0.4, True, stats.INCONCLUSIVE),  # neither: too few seeds, or a difference near the margin
        (math.nan, math.nan, True, stats.INCONCLUSIVE),
    ],
)
def test_each_equivalence_verdict(p_tost, p_diff, assay, expected):
    assert stats.equivalence_verdict(p_tost, p_diff, 0.01, assay) == expected


@pytest.mark.parametrize("p_diff", [0.001, 0.4], ids=["significant", "not significant"])
def test_an_equivalence_whose_interval_lies_outside_its_margin_is_not_equivalent(p_diff):
    """The data show a difference larger than the margin: a sharper miss than `inconclusive` or a difference alone."""
    assert stats.equivalence_verdict(0.3, p_diff, 0.05, True, outside=True) == stats.NOT_EQUIVALENT
    assert stats.equivalence_verdict(0.01, p_diff, 0.05, True, outside=True) == stats.EQUIVALENT  # TOST decides first


def test_an_interval_beyond_the_margin_at_every_point_is_judged_not_equivalent(monkeypatch):
    """Through the report's own judging: a row 3% worse with seeds 0.2% apart has its 90% interval wholly above a
    1.25% margin; one 1% worse with seeds 2% apart straddles the margin and stays inconclusive."""
    _preds(monkeypatch, {"x": {"A3": ("ppl", "equivalent", "", 0.0125), "E1": ("ppl", "equivalent", "", 0.0125)}})
    base = [5.00, 5.01, 4.99, 5.00, 5.005, 4.995]
    values = {
        "base": {"ppl": base},
        "A3": {"ppl": [x * 1.03 for x in base]},
        "E1": {"ppl": [5.05 * f for f in (0.98, 1.02, 1.0, 0.97, 1.03, 1.0)]},
    }
    family = verdicts.judge_cells([verdicts.Cell("x", values, held(values))])
    a3, e1 = family[("x", "A3")], family[("x", "E1")]
    assert a3.tost_low > math.log1p(0.0125) and a3.verdict == stats.NOT_EQUIVALENT
    assert [p.verdict for p in a3.points] == [stats.NOT_EQUIVALENT] * 3
    assert e1.tost_low < math.log1p(0.0125) < e1.tost_high and e1.verdict == stats.INCONCLUSIVE


def _preds(monkeypatch, table: dict):
    def lines(preset):
        return {row: P.Prediction(row, *spec) for row, spec in table.get(preset, {}).items()}

    monkeypatch.setattr(verdicts, "predictions", lines)


def test_an_equivalence_counts_only_where_its_cell_shows_a_row_of_its_own_knob_significantly_worse(monkeypatch):
    m = 0.0125
    lines = {"A3": ("ppl", "equivalent", "", m), "A1": ("ppl", "worse", ""), "C4": ("ppl", "worse", "")}
    _preds(monkeypatch, {"x": lines})
    base = [1.300, 1.305, 1.310, 1.302, 1.308, 1.297, 1.303, 1.306]
    same = [1.301, 1.306, 1.303, 1.299, 1.309, 1.304, 1.300, 1.307]  # within 0.1% of base, spread alike
    worse = [1.45, 1.46, 1.44, 1.455]
    flat = [1.30, 1.31, 1.29, 1.305]  # a row the seeds cannot tell from base
    # A1 varies the heads as A3 does: its difference shows the seeds can see what that knob does
    values = {"base": {"ppl": base}, "A3": {"ppl": same}, "A1": {"ppl": worse}, "C4": {"ppl": flat}}
    sensitive = verdicts.judge("x", values, held(values))
    assert sensitive["A1"].verdict == stats.SIGNIFICANT_AGREE and sensitive["A3"].verdict == stats.EQUIVALENT
    assert sensitive["A3"].margin == pytest.approx(math.log1p(m))
    # the same A3 beside a capacity row (C4: d_model) significantly worse and its own knob's row flat: equivalent,
    # but not counted, for a difference in width says nothing of whether the seeds can see one in the heads
    values = {"base": {"ppl": base}, "A3": {"ppl": same}, "A1": {"ppl": flat}, "C4": {"ppl": worse}}
    blind = verdicts.judge("x", values, held(values))
    assert blind["C4"].verdict == stats.SIGNIFICANT_AGREE
    assert blind["A3"].verdict == stats.EQUIVALENT_UNASSAYED and not blind["A3"].passed
    s = verdicts.score(sensitive)
    assert (s["scored"], s["passed"], s["equivalent"]) == (3, 2, 1)
    # TOST's own 90% interval is the one inside the margin; it is printed (it was blank where no test was made)
    a3 = sensitive["A3"]
    assert -a3.margin < a3.tost_low < a3.tost_high < a3.margin and a3.ci_low < a3.tost_low


def test_a_suite_tests_its_cells_in_one_holm_family_each_against_its_own_base(monkeypatch):
    _preds(monkeypatch, {"main": {"C4": ("ppl", "worse", "")}, "cell": {"D1": ("ppl", "worse", "")}})
    main_values = {"base": {"ppl": [1.3, 1.31, 1.29]}, "C4": {"ppl": [1.4, 1.42, 1.41]}}
    cell_values = {"base": {"ppl": [2.0, 2.1, 2.05]}, "D1": {"ppl": [2.6, 2.7, 2.65]}}
    main = verdicts.Cell("main", main_values, held(main_values))
    cell = verdicts.Cell("cell", cell_values, held(cell_values))
    out = verdicts.judge_cells([main, cell])
    assert list(out) == [("main", "C4"), ("cell", "D1")]
    p_c4 = stats.welch_p(np.log([1.4, 1.42, 1.41]), np.log([1.3, 1.31, 1.29]))
    p_d1 = stats.welch_p(np.log([2.6, 2.7, 2.65]), np.log([2.0, 2.1, 2.05]))  # against the cell's own base
    assert out[("cell", "D1")].p == pytest.approx(p_d1)
    assert out[("main", "C4")].p_holm == pytest.approx(
        min(1.0, 2 * min(p_c4, p_d1)) if p_c4 < p_d1 else max(min(1.0, 2 * p_d1), p_c4)
    )


def test_label_smoothings_floor_is_a_check_never_a_score(monkeypatch):
    assert verdicts.smoothing_floor(0.1, 1000) == pytest.approx(1 / 0.9001)  # 1.1110
    assert verdicts.smoothing_floor(0.2, 1000) == pytest.approx(1 / 0.8002)  # 1.2497
    assert verdicts.smoothing_floor(0.0, 1000) == 1.0
    _preds(monkeypatch, {"x": {"D4": ("ppl", "check", "arithmetic"), "D3": ("ppl", "check", "arithmetic")}})
    values = {"base": {"ppl": [1.3, 1.31]}, "D4": {"ppl": [1.40, 1.41]}, "D3": {"ppl": [1.20, 1.21]}}
    floors = {"D4": verdicts.smoothing_floor(0.2, 1000), "D3": 1.0}
    out = verdicts.judge("x", values, floors=floors)
    assert out["D4"].verdict == stats.CHECK_PASSED and out["D4"].floor == pytest.approx(1.2497, abs=1e-4)
    near = verdicts.judge("x", {**values, "D4": {"ppl": [1.20, 1.21]}}, floors=floors)
    assert near["D4"].verdict == stats.CHECK_PASSED  # 3.6% below: a trained model is not exactly at its target
    below = verdicts.judge("x", {**values, "D4": {"ppl": [1.02, 1.03]}}, floors=floors)
    assert below["D4"].verdict == stats.CHECK_FAILED  # 18% below ε 0.2's floor: as if it were not smoothed at all
    assert verdicts.score(out)["scored"] == 0 and len(verdicts.score(out)["checks"]) == 2


def _hand_made_predictions() -> dict:
    return {
        "A3": P.Prediction("A3", "ppl", "equivalent", "", margin=0.05),
        "C5": P.Prediction("C5", "ppl", "better", ""),
        "C6": P.Prediction("C6", "ppl", "worse", ""),
        "E1": P.Prediction("E1", "ppl", "equivalent", "", margin=0.05),
        "no-pe": P.Prediction("no-pe", "ppl", "control", ""),
    }


def test_both_naive_baselines_on_a_hand_made_table(monkeypatch):
    """ "every change hurts" and "more parameters help, every other change hurts" judged on the same numbers
    by the same rules as the registration. The table: C5 (more parameters) is better, C6 (fewer) worse, A3 (as many)
    worse, E1 (more: a learned table) as good as base, no-pe (a control, never scored) worse. The registration
    predicts C5 better, C6 worse, A3 and E1 equivalent: it passes C5, C6 and E1 (no-pe, of its knob, shows the seeds
    see a difference there); "every change hurts" passes C6 and A3 (significantly worse) and fails C5 and E1; "more
    parameters help" passes C5, C6, A3 and fails E1 (not significantly better)."""
    preds = _hand_made_predictions()
    monkeypatch.setattr(verdicts, "predictions", lambda preset: preds)
    base = [5.00, 5.02, 4.98, 5.01, 4.99, 5.00]
    values = {
        "base": {"ppl": base},
        "A3": {"ppl": [x * 1.10 for x in base]},  # 10% worse: outside the 5% margin
        "C5": {"ppl": [x * 0.80 for x in base]},
        "C6": {"ppl": [x * 1.20 for x in base]},
        "E1": {"ppl": [5.01, 5.00, 4.99, 5.02, 4.98, 5.00]},  # within 0.5%: equivalent
        "no-pe": {"ppl": [x * 1.30 for x in base]},
    }
    params = {"base": 1000, "A3": 1000, "C5": 2000, "C6": 800, "E1": 1100, "no-pe": 1000}
    cells = [verdicts.Cell("any", values, held(values), params=params)]
    family = verdicts.judge_cells(cells)
    baselines = verdicts.judge_baselines(cells)
    assert {k[1]: v.predicted for k, v in baselines["more_parameters_help"].items()} == {
        "A3": "worse",
        "C5": "better",
        "C6": "worse",
        "E1": "better",
        "no-pe": "control",
    }
    s = verdicts.score(family, baselines)
    assert (s["scored"], s["passed"]) == (4, 3)
    assert family[("any", "no-pe")].verdict == stats.SIGNIFICANT_AGREE and family[("any", "E1")].passed
    hurts, params_help = s["baselines"]["every_change_hurts"], s["baselines"]["more_parameters_help"]
    assert (hurts["passed"], params_help["passed"]) == (2, 3)
    assert hurts["differs_on"] == ["A3", "C5", "E1"]
    assert hurts["registered_passed_where_it_did_not"] == ["C5", "E1"]
    assert hurts["passed_where_registered_did_not"] == ["A3"]
    assert params_help["differs_on"] == ["A3", "E1"]
    assert params_help["passed_where_registered_did_not"] == ["A3"]
    assert params_help["registered_passed_where_it_did_not"] == ["E1"]
    # a row whose parameter count is unknown gets no prediction from it (not scored for it)
    unknown = verdicts.judge_baselines([verdicts.Cell("any", values, held(values), params={"base": 1000})])
    judged = unknown["more_parameters_help"].values()
    assert all(v.predicted == "not scored" for v in judged if v.row != "no-pe")  # a control stays as registered


def test_the_parameter_count_alone_on_a_hand_made_table(monkeypatch):
    """The third naive predictor: more parameters better, fewer worse, within 1% of base's count equivalent within
    the test's margin (a directional test's: its preset's equivalence margin on that metric). The table: A1 (base's
    count, registered worse) is 10% worse; A3 (base's count) as good as base; C5 (more) better; C6 (fewer) worse; E1
    (10% more: a learned table) as good as base; the control no-pe 30% worse. The registration passes all five (A1
    and no-pe show the seeds see what the heads and the encoding do); the count alone predicts A1 equivalent (within
    A3's 5%) and E1 better: it passes A3, C5, C6, and misses A1 (not equivalent) and E1; a control it leaves as
    registered."""
    preds = {"A1": P.Prediction("A1", "ppl", "worse", ""), **_hand_made_predictions()}
    monkeypatch.setattr(verdicts, "predictions", lambda preset: preds)
    base = [5.00, 5.02, 4.98, 5.01, 4.99, 5.00]
    near = [5.01, 5.00, 4.99, 5.02, 4.98, 5.00]  # within 0.5%
    values = {
        "base": {"ppl": base},
        "A1": {"ppl": [x * 1.10 for x in base]},
        "A3": {"ppl": near},
        "C5": {"ppl": [x * 0.80 for x in base]},
        "C6": {"ppl": [x * 1.20 for x in base]},
        "E1": {"ppl": near},
        "no-pe": {"ppl": [x * 1.30 for x in base]},
    }
    params = {"base": 1000, "A1": 1000, "A3": 1005, "C5": 2000, "C6": 800, "E1": 1100, "no-pe": 1000}
    cells = [verdicts.Cell("any", values, held(values), params=params)]
    judged = verdicts.judge_baselines(cells)["parameter_count_alone"]
    assert {k[1]: (v.predicted, v.margin) for k, v in judged.items()} == {
        "A1": ("equivalent", pytest.approx(math.log1p(0.05))),
        "A3": ("equivalent", pytest.approx(math.log1p(0.05))),
        "C5": ("better", None),
        "C6": ("worse", None),
        "E1": ("better", None),
        "no-pe": ("control", None),
    }
    s = verdicts.score(verdicts.judge_cells(cells), verdicts.judge_baselines(cells))
    count = s["baselines"]["parameter_count_alone"]
    assert (s["passed"], count["passed"], count["label"]) == (5, 3, "the parameter count alone")
    assert count["verdicts"]["A1"] == stats.NOT_EQUIVALENT
    assert count["differs_on"] == count["registered_passed_where_it_did_not"] == ["A1", "E1"]


def test_an_equivalences_point_by_point_line_names_its_p_as_tosts():
    """An equivalence's p at each point is TOST's, and its `significant disagree` the two-sided test's refutation:
    the line says `TOST Holm p`, so a `significant disagree (Holm p 0.83)` does not read as a contradiction; a
    difference test's line keeps `Holm p`."""
    points = (
        verdicts.Point(0.75, 0.01, 0.38, stats.INCONCLUSIVE, 8, 8),
        verdicts.Point(0.875, 0.02, 0.83, stats.SIGNIFICANT_DISAGREE, 8, 8),
        verdicts.Point(1.0, 0.022, 0.96, stats.NOT_EQUIVALENT, 8, 8),
    )
    v = verdicts.Verdict("E1", "ppl", "equivalent", 0.022, 0.96, 0.96, stats.NOT_EQUIVALENT, 8, 8, points=points)
    assert "87.5%: significant disagree (TOST Holm p 0.83)" in v.why and "(Holm p" not in v.why
    worse = verdicts.Verdict("C1", "ppl", "worse", 0.2, 0.001, 0.002, stats.SIGNIFICANT_AGREE, 3, 8, points=points)
    assert "(Holm p 0.83)" in worse.why and "TOST" not in worse.why
