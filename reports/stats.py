"""Seed-level statistics for a pre-registered Table 3: Welch's t-test per scored row against base, the two one-sided
tests of an equivalence claim, Holm's correction over the scored set, one verdict per row, slopes of a series, and
what random signs would score on the same set.

A difference between two rows is a result only when the seeds say so: each scored row's per-seed values of
its metric (dev BLEU, or dev log-perplexity: the mean NLL per target token, whose seed-to-seed spread is
closer to normal than the perplexity's) are tested against base's per-seed values with Welch's unequal-
variance t-test (scipy), two-sided, and the p-values of the scored set are adjusted together by Holm's
step-down method, which holds the family-wise error rate at α without assuming independent tests.

"No difference" is a result only as equivalence within a margin fixed before the runs: Schuirmann's two one-sided
tests (TOST) on the same Welch statistic reject both "the row is worse by the margin or more" and "better by the
margin or more"; the TOST p is the larger of the two one-sided p-values (equivalently: the 1 − 2α confidence
interval of the difference lies inside ±margin). Its p joins the same Holm family as the difference tests.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

ALPHA = 0.05

# One verdict per row of a pre-registered scored set (see `verdict`), best to worst, then the rows no sign
# verdict is given to.
SIGNIFICANT_AGREE = "significant agree"
AGREE = "agree"
INCONCLUSIVE = "inconclusive"
EQUIVALENT = "equivalent"  # TOST significant, and the table shows it can see a difference (assay sensitivity)
EQUIVALENT_UNASSAYED = (
    "equivalent, assay not sensitive"  # TOST significant, but no row of its knob significant: not counted
)
DISAGREE = "disagree"
SIGNIFICANT_DISAGREE = "significant disagree"
NOT_EQUIVALENT = "not equivalent"  # an equivalence whose TOST interval lies wholly outside its margin: a sharp miss
# passed at the end (100% of the budget) but not at an earlier point of the stability rule (reports/verdicts.py): a miss
NOT_STABLE = "not stable"
NOT_TESTABLE = "not testable"
NOT_RUN = "not run"  # scored by the registration, but the runs reported hold no run of the row (a --rows selection)
NOT_SCORED = "not scored"  # testable, but the preset does not score it (e.g. one seed cannot resolve its effect)
CHECK_PASSED = "check passed"  # an implementation check (label smoothing's perplexity floor): reported, never scored
CHECK_FAILED = "check failed"
VERDICTS = (
    SIGNIFICANT_AGREE,
    EQUIVALENT,
    AGREE,
    INCONCLUSIVE,
    EQUIVALENT_UNASSAYED,
    NOT_STABLE,
    DISAGREE,
    SIGNIFICANT_DISAGREE,
    NOT_EQUIVALENT,
    NOT_TESTABLE,
)
PASSING = (SIGNIFICANT_AGREE, EQUIVALENT)  # what counts as a pre-registered test passed


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of Welch's t-test of mean(a) = mean(b); NaN with fewer than two values on a side or no
    spread on either (the test is undefined, not significant)."""
    from scipy import stats  # lazily: only reports with seeds need it

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2 or (a.std() == 0 and b.std() == 0):
        return math.nan
    with warnings.catch_warnings():  # one side without spread is a valid test; scipy warns of its precision
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def _welch_parts(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean(a) - mean(b), its standard error, Welch-Satterthwaite df); None where the test is undefined."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se2 = va + vb
    if se2 == 0:
        return None
    df = se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(a.mean() - b.mean()), math.sqrt(se2), float(df)


def welch_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(difference of means a - b, lower, upper): Welch's `level` confidence interval; NaN bounds where undefined
    (the difference alone with one value on a side)."""
    from scipy import stats

    parts = _welch_parts(a, b)
    if parts is None:
        d = float(np.mean(a) - np.mean(b)) if len(a) and len(b) else math.nan
        return d, math.nan, math.nan
    d, se, df = parts
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return d, d - half, d + half


def tost_p(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """Schuirmann's TOST of |mean(a) - mean(b)| < margin on Welch's statistic: the larger of the one-sided p of
    "difference <= -margin" and of "difference >= +margin"; below α, the two are equivalent within the margin.
    NaN where Welch's test is undefined."""
    from scipy import stats

    parts = _welch_parts(a, b)
    if parts is None or margin <= 0:
        return math.nan
    d, se, df = parts
    p_lower = float(stats.t.sf((d + margin) / se, df))  # H0: d <= -margin
    p_upper = float(stats.t.cdf((d - margin) / se, df))  # H0: d >= +margin
    return max(p_lower, p_upper)


def tost_level(alpha: float = ALPHA) -> str:
    """The confidence of TOST's interval at level `alpha`, 1 - 2α, as a report prints it: 90% at 0.05."""
    return f"{100 * (1 - 2 * alpha):.1f}%".replace(".0%", "%")


def slope(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(slope, lower, upper) of the least-squares line y = a + b·x through every point (one per run, so the seeds'
    spread is the residual's), with its `level` t-interval on n − 2 degrees of freedom; NaN bounds with fewer than
    three points or two distinct x."""
    from scipy import stats

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return math.nan, math.nan, math.nan
    xc = x - x.mean()
    b = float((xc * (y - y.mean())).sum() / (xc**2).sum())
    if len(x) < 3:
        return b, math.nan, math.nan
    resid = y - y.mean() - b * xc
    se = math.sqrt(float((resid**2).sum()) / (len(x) - 2) / float((xc**2).sum()))
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 2)) * se
    return b, b - half, b + half


def equivalence_verdict(
    p_tost_adjusted: float,
    p_diff_adjusted: float,
    delta_worse: float,
    assay: bool,
    outside: bool = False,
    alpha: float = ALPHA,
) -> str:
    """The verdict on a row predicted equivalent to base: `equivalent` when its Holm-adjusted TOST p < ALPHA and the
    table is assay-sensitive (`assay`: a row of the same knob is significantly different as predicted in the same
    table, so the seeds can see a difference that knob makes), `equivalent, assay not sensitive` (not counted)
    without that; `not equivalent` when its 1 - 2α interval (TOST's) lies wholly outside the margin (`outside`): the
    data show a difference larger than the margin; `significant disagree` when the two-sided difference test is
    significant instead; otherwise `inconclusive` (neither shown)."""
    if not math.isnan(p_tost_adjusted) and p_tost_adjusted < alpha:
        return EQUIVALENT if assay else EQUIVALENT_UNASSAYED
    if outside:
        return NOT_EQUIVALENT
    if not math.isnan(p_diff_adjusted) and p_diff_adjusted < alpha and not math.isnan(delta_worse):
        return SIGNIFICANT_DISAGREE
    return INCONCLUSIVE


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values: the i-th smallest of m p-values becomes max over j ≤ i of min(1, (m - j + 1)·p_(j)).
    A row's adjusted p < α rejects its null at family-wise level α. NaN p-values (no test) stay NaN and do
    not count in m."""
    tested = sorted(((p, k) for k, p in pvalues.items() if not math.isnan(p)), key=lambda x: x[0])
    m, out, running = len(tested), {k: math.nan for k in pvalues}, 0.0
    for i, (p, k) in enumerate(tested):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


def verdict(
    delta_worse: float, predicted_worse: bool, p_adjusted: float, n_row: int, n_base: int, alpha: float = ALPHA
) -> str:
    """The verdict on one scored row at one point: `delta_worse` is how much worse the row
    is than base in its metric (positive: worse), `predicted_worse` the pre-registered prediction.

    - significant agree / significant disagree: Holm-adjusted p < ALPHA, the sign as predicted / opposite;
    - agree / disagree: the sign as predicted / opposite, without significance (or, with one seed on a side,
      without a test: a single run is an anecdote);
    - inconclusive: no completed run on a side, or no difference at all.
    """
    if n_row < 1 or n_base < 1 or math.isnan(delta_worse) or delta_worse == 0:
        return INCONCLUSIVE
    agrees = (delta_worse > 0) == predicted_worse
    if not math.isnan(p_adjusted) and p_adjusted < alpha:
        return SIGNIFICANT_AGREE if agrees else SIGNIFICANT_DISAGREE
    return AGREE if agrees else DISAGREE


def binomial_tail(k: int, n: int) -> float:
    """P(X ≥ k) for X ~ Binomial(n, 1/2): how often random signs agree on at least k of n rows."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n else 1.0


def random_signs(directional: int, agreeing: int) -> dict:
    """What random signs would score on the same directional tests: they agree on n/2 on average, and on `agreeing`
    or more with probability `p_at_least_as_many`."""
    return {
        "directional_tests": directional,
        "expected_agree": directional / 2,
        "p_at_least_as_many": binomial_tail(agreeing, directional),
    }
