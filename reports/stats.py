"""Seed-level statistics for a pre-registered Table 3: Welch's t-test per scored row against base, Holm's
correction over the scored set, one verdict per row, and what trivial predictors would score on the same set.

A difference between two rows is a result only when the seeds say so: each scored row's per-seed values of
its metric (dev BLEU, or dev log-perplexity: the mean NLL per target token, whose seed-to-seed spread is
closer to normal than the perplexity's) are tested against base's per-seed values with Welch's unequal-
variance t-test (scipy), two-sided, and the p-values of the scored set are adjusted together by Holm's
step-down method, which holds the family-wise error rate at α without assuming independent tests.
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
DISAGREE = "disagree"
SIGNIFICANT_DISAGREE = "significant disagree"
NOT_CONVERGED = "not converged"
NOT_TESTABLE = "not testable"
NOT_SCORED = "not scored"  # testable, but the preset does not score it (e.g. one seed cannot resolve its effect)
VERDICTS = (SIGNIFICANT_AGREE, AGREE, INCONCLUSIVE, DISAGREE, SIGNIFICANT_DISAGREE, NOT_CONVERGED, NOT_TESTABLE)


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


def verdict(delta_worse: float, predicted_worse: bool, p_adjusted: float, n_row: int, n_base: int) -> str:
    """The verdict on one scored row whose runs (and base's) converged: `delta_worse` is how much worse the row
    is than base in its metric (positive: worse), `predicted_worse` the pre-registered prediction.

    - significant agree / significant disagree: Holm-adjusted p < ALPHA, the sign as predicted / opposite;
    - agree / disagree: the sign as predicted / opposite, without significance (or, with one seed on a side,
      without a test: a single run is an anecdote);
    - inconclusive: no completed run on a side, or no difference at all.
    """
    if n_row < 1 or n_base < 1 or math.isnan(delta_worse) or delta_worse == 0:
        return INCONCLUSIVE
    agrees = (delta_worse > 0) == predicted_worse
    if not math.isnan(p_adjusted) and p_adjusted < ALPHA:
        return SIGNIFICANT_AGREE if agrees else SIGNIFICANT_DISAGREE
    return AGREE if agrees else DISAGREE


def binomial_tail(k: int, n: int) -> float:
    """P(X ≥ k) for X ~ Binomial(n, 1/2): how often random signs agree on at least k of n rows."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n else 1.0


def trivial_scores(predicted_worse: Sequence[bool], agreeing: int) -> dict:
    """What predictors that know nothing would score on the same scored set, against the same predictions:
    "every change hurts" agrees wherever the prediction is "worse"; random signs agree on n/2 on average, and
    reach `agreeing` or more with probability `random_p`."""
    n = len(predicted_worse)
    return {
        "n": n,
        "every_change_hurts": sum(bool(w) for w in predicted_worse),
        "random_expected": n / 2,
        "random_p": binomial_tail(agreeing, n),
    }
