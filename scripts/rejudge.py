"""A table judged again from its committed files alone: the per-run CSV (`table3-PRESET-runs.csv`) and every run's
validation curve (`table3-PRESET-curves.csv`), by any stability reading (verdicts.READINGS) and any registration
(an earlier attempt's predictions.csv, as committed before its runs).

What a reader re-derives without the run directories: the verdicts (`cell`, then `verdicts.judge_cells`), each
baseline's, and how often a rule calls a row different from itself (`halves_false_positive_rate`: the row's seeds
split into two halves every way, each split tested at every point of the stability rule as the report tests a row
against base).
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from aiayn.reports import stats, verdicts

METRICS = {"ppl": "val_ppl", "bleu": "val_bleu"}


def run_curves(curves: pd.DataFrame) -> dict[tuple[str, int], dict[str, dict[int, float]]]:
    """(row, seed) -> metric -> {logged step: value}, from a -curves.csv."""
    out: dict = {}
    for (row, seed), g in curves.groupby(["row", "seed"], sort=False):
        out[(str(row), int(seed))] = {
            m: dict(zip(g["step"].astype(int), g[col].astype(float))) for m, col in METRICS.items() if col in g
        }
    return out


def points_of(values: dict[int, float], budget: int, reading: str) -> dict[float, float]:
    """fraction -> the run's number at each point of the stability rule that the curve gives (verdicts.point_value;
    100% too: the last validation is the final evaluation, which is what "nearest" reads there)."""
    out = {}
    for fraction in verdicts.STABILITY:
        value = verdicts.point_value(values, budget, fraction, reading)
        if value is not None:
            out[fraction] = value
    return out


def cell(
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    preset: str,
    reading: str | None = None,
    registration: str | None = None,
    params: dict | None = None,
    floors: dict | None = None,
) -> verdicts.Cell:
    """The preset's Cell from its committed CSVs: every completed run's numbers at each point by `reading` (the
    preset's own where None), judged by `registration` (a predictions.csv text; None: today's)."""
    from aiayn.ablations.presets import PRESETS

    reading = reading or PRESETS[preset].stability
    logged = run_curves(curves)
    done = runs[runs["status"] == "completed"]
    at: dict[float, dict] = {f: {} for f in verdicts.STABILITY}
    for _, run in done.iterrows():
        key = (str(run["row"]), int(run["seed"]))
        for metric, values in logged.get(key, {}).items():
            if not values:
                continue
            for fraction, value in points_of(values, int(run["steps"]), reading).items():
                at[fraction].setdefault(key[0], {}).setdefault(metric, []).append(value)
    final = at.pop(verdicts.STABILITY[-1])
    points = dict(at)
    if reading == "median3":  # 100% read as a window; "nearest" reads the final evaluation, as recorded
        points[verdicts.STABILITY[-1]] = final
    values = {row: {"ppl": list(g["dev_ppl"]), "bleu": list(g["dev_bleu"])} for row, g in done.groupby("row")}
    return verdicts.Cell(preset, values, points, floors or {}, params or {}, registration)


def _welch_sign(a: list[float], b: list[float]) -> int:
    """+1 / -1 where Welch's two-sided test of mean(log a) = mean(log b) is significant at ALPHA (the sign of the
    difference), 0 where not."""
    p = stats.welch_p(np.log(a), np.log(b))
    if np.isnan(p) or p >= stats.ALPHA:
        return 0
    return 1 if np.mean(np.log(a)) > np.mean(np.log(b)) else -1


def halves_false_positive_rate(
    runs: pd.DataFrame, curves: pd.DataFrame, reading: str, min_seeds: int = 6
) -> dict[str, dict]:
    """row -> {"splits", "false_positives", "rate", "rate_any_point"} for every row with at least `min_seeds`
    completed seeds: its seeds split into two halves every way (each split once), each split tested as the report
    tests a row against base (Welch, two-sided, α 0.05, unadjusted: one test alone) at every point of the stability
    rule read by `reading`. A false positive: significant at all three points with the same sign (what the rule would
    call a difference). `rate_any_point`: significant at the end alone, without the rule."""
    logged = run_curves(curves)
    done = runs[runs["status"] == "completed"]
    out = {}
    for row, g in done.groupby("row", sort=False):
        seeds = sorted(int(s) for s in g["seed"])
        if len(seeds) < min_seeds:
            continue
        budget = int(g["steps"].iloc[0])
        at = {s: points_of(logged[(str(row), s)]["ppl"], budget, reading) for s in seeds}
        half = len(seeds) // 2
        splits = [c for c in combinations(seeds, half) if seeds[0] in c]  # each split once
        positives = ends = 0
        for first in splits:
            second = [s for s in seeds if s not in first]
            signs = [_welch_sign([at[s][f] for s in first], [at[s][f] for s in second]) for f in verdicts.STABILITY]
            positives += signs[0] != 0 and len(set(signs)) == 1
            ends += signs[-1] != 0
        out[str(row)] = {
            "seeds": len(seeds),
            "splits": len(splits),
            "false_positives": positives,
            "rate": positives / len(splits),
            "rate_at_the_end": ends / len(splits),
        }
    return out
