"""What a table found, first: one line per family of Table 3 (ablations.table.FAMILIES) in plain words, the verdict
each test was decided by, and beside every miss what decides how to read it (the power it had, how the gap moved
over the last quarter, the regime); then, from the registration alone, where the paper and each naive predictor
could differ at all ("level by design") and where the data decided ("level by data"). Built by reports/build.py,
rendered first by reports/render.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from aiayn.ablations.predictions import SCORED, predictions
from aiayn.ablations.table import FAMILIES
from aiayn.reports import stats, verdicts
from aiayn.reports.runs import Run, read_curve

POWER_TARGET = 0.8


@dataclass(frozen=True)
class Findings:
    """A report's first screen: one line per family, the predictors' line, and each miss's figures as data."""

    families: list[str]
    predictors: str
    misses: dict = field(default_factory=dict)  # row -> {"power_registered": [...], "power_observed": [...], ...}


def _welch_power(effect: float, a: list[float], b: list[float], alpha: float, side: int) -> float:
    """The chance that Welch's test on seeds spread as `a` and `b`, as many of them, is significant at `alpha`
    (two-sided) in the direction `side` (+1: worse, -1: better) when the true difference is `effect` (noncentral t)."""
    parts = stats._welch_parts(a, b)
    if parts is None or math.isnan(effect):
        return math.nan
    _, se, df = parts
    return _power(effect, se, df, alpha, side)


def _power(effect: float, se: float, df: float, alpha: float, side: int) -> float:
    """`_welch_power` of a difference estimated with standard error `se` on `df` degrees of freedom."""
    from scipy import stats as ss

    t = ss.t.ppf(1 - alpha / 2, df)
    ncp = effect / se
    return float(ss.nct.sf(t, df, ncp) if side > 0 else ss.nct.cdf(-t, df, ncp))


def _tost_power(center: float, margin: float, a: list[float], b: list[float], alpha: float) -> float:
    """The chance that TOST within ±`margin` passes at `alpha` when the true difference is `center`, the difference
    estimated with the spread of `a` and `b` (its estimate read as a shifted t)."""
    from scipy import stats as ss

    parts = stats._welch_parts(a, b)
    if parts is None or math.isnan(center):
        return math.nan
    _, se, df = parts
    t = ss.t.ppf(1 - alpha, df)
    return float(
        max(0.0, ss.t.cdf((margin - t * se - center) / se, df) - ss.t.cdf((-margin + t * se - center) / se, df))
    )


def _seeds_for(effect: float, a: list[float], b: list[float], alpha: float, side: int) -> int | None:
    """Seeds a side (as many on each) that would give Welch's test POWER_TARGET at `effect`, with the spreads seen
    (their pooled SD: with n a side, the difference's standard error is sd·√(2/n) on 2(n-1) degrees of freedom);
    None beyond 10,000."""
    sd = math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2) if len(a) > 1 and len(b) > 1 else math.nan
    if math.isnan(sd) or sd == 0 or math.isnan(effect) or effect == 0:
        return None
    for n in [*range(2, 40), *range(40, 200, 5), *range(200, 2000, 50), *range(2000, 10001, 500)]:
        if _power(effect, sd * math.sqrt(2 / n), 2 * (n - 1), alpha, side) >= POWER_TARGET:
            return n
    return None


@dataclass(frozen=True)
class Evidence:
    """What a test's power and trend are computed from: the cell its verdict was judged in, and its runs."""

    cell: verdicts.Cell
    runs: dict  # row -> its completed runs in that cell


def _values(cell: verdicts.Cell, fraction: float, row: str, metric: str) -> list[float]:
    got = cell.at(fraction).get(row, {}).get(metric) or []
    return verdicts._sample(metric, list(got))


def _registered_effect(v: verdicts.Verdict, table: pd.DataFrame) -> float:
    """The paper's own difference for a test, oriented as the tests are (positive: worse): log of its PPL ratio, or
    its BLEU points; an equivalence's registered center."""
    if v.predicted == "equivalent":
        return v.center
    line = table[table["row"] == v.row]
    if line.empty:
        return math.nan
    if v.metric == "ppl":
        pct = line["paper_delta_ppl_pct"].iloc[0]
        return math.log1p(pct / 100) if pd.notna(pct) else math.nan
    d = line["paper_delta_bleu"].iloc[0]
    return -float(d) if pd.notna(d) else math.nan


def powers(v: verdicts.Verdict, ev: Evidence, effect: float) -> list[float]:
    """The test's power at each point of the stability rule if the true difference were `effect`, with the seeds and
    spreads it had there and the level it faced (Holm's divisor of α at that point)."""
    out = []
    for p in v.points:
        a, b = _values(ev.cell, p.fraction, v.row, v.metric), _values(ev.cell, p.fraction, "base", v.metric)
        level = ev.cell.alpha / max(p.holm_divisor, 1)
        if v.predicted == "equivalent":
            out.append(_tost_power(effect, v.margin or 0.0, a, b, level))
        else:
            out.append(_welch_power(effect, a, b, level, 1 if v.predicted == "worse" else -1))
    return out


def trend(row: str, runs: dict, metric: str = "val/ppl") -> tuple[float, float]:
    """How the row's gap to base moved over the last quarter: the mean over its seeds of the least-squares slope of
    log dev PPL from the validation nearest 75% of the steps to the last, less base's, in percent of dev PPL per 1000
    steps (positive: the row falls behind base), and Welch's p of the two sets of slopes."""

    def slopes(rs: list[Run]) -> list[float]:
        out = []
        for r in rs:
            curve = read_curve(r.dir, metric)
            if len(curve) < 3:
                continue
            steps, values = curve["step"].to_numpy(float), np.log(curve[metric].to_numpy(float))
            start = int(np.argmin(np.abs(steps - 0.75 * steps[-1])))
            if len(steps) - start >= 2:
                out.append(float(np.polyfit(steps[start:], values[start:], 1)[0]) * 1000 * 100)
        return out

    mine, base = slopes(runs.get(row, [])), slopes(runs.get("base", []))
    if len(mine) < 2 or len(base) < 2:
        return math.nan, math.nan
    return float(np.mean(mine) - np.mean(base)), stats.welch_p(mine, base)


def regime(runs: dict) -> str:
    """The regime a table's runs end in: how many epochs base trained, and how much its dev PPL still fell over the
    last quarter (the median over its seeds, by the `line` rule)."""
    base = runs.get("base", [])
    if not base:
        return ""
    epochs = []
    for r in base:
        epoch = read_curve(r.dir, "epoch")
        turned = epoch[epoch["epoch"] >= 1]
        if len(turned) and r.metrics.steps:
            epochs.append(r.metrics.steps / (int(turned["step"].iloc[0]) + 1))
    falls = [verdicts.last_quarter_fit(read_curve(r.dir, "val/ppl")) for r in base]
    falls = [f for f in falls if not math.isnan(f)]
    parts = []
    if epochs:
        parts.append(f"about {np.median(epochs):.0f} epochs")
    if falls:
        parts.append(f"base's dev PPL still falling {100 * np.median(falls):.1f}% over its last quarter")
    return ", ".join(parts)


def _delta(v: verdicts.Verdict) -> str:
    """The difference a test read at the end, in its metric, with its interval."""
    if math.isnan(v.delta_worse):
        return "no difference measured"
    if v.predicted == "equivalent":
        low, high = v.tost_low, v.tost_high
        level = f"({stats.tost_level(v.alpha)} interval)"
        if v.metric == "ppl":
            return (
                f"{_pct(v.delta_worse)} dev PPL [{_pct(low)}, {_pct(high)}] {level}, margin "
                f"±{100 * math.expm1(v.margin):.2f}%"
                if not math.isnan(low)
                else f"{_pct(v.delta_worse)} dev PPL"
            )
        return f"{-v.delta_worse:+.2f} BLEU [{-high:+.2f}, {-low:+.2f}] {level}, margin ±{v.margin:g}"
    if v.metric == "ppl":
        interval = f" [{_pct(v.ci_low)}, {_pct(v.ci_high)}]" if not math.isnan(v.ci_low) else ""
        return f"{_pct(v.delta_worse)} dev PPL{interval}"
    interval = f" [{-v.ci_high:+.2f}, {-v.ci_low:+.2f}]" if not math.isnan(v.ci_low) else ""
    return f"{-v.delta_worse:+.2f} BLEU{interval}"


def _pct(log_diff: float) -> str:
    return "" if math.isnan(log_diff) else f"{100 * math.expm1(log_diff):+.1f}%"


def _paper(v: verdicts.Verdict, table: pd.DataFrame) -> str:
    line = table[table["row"] == v.row]
    if line.empty:
        return ""
    if v.metric == "ppl":
        pct = line["paper_delta_ppl_pct"].iloc[0]
        return f"the paper {pct:+.1f}%" if pd.notna(pct) else ""
    d = line["paper_delta_bleu"].iloc[0]
    return f"the paper {d:+.1f}" if pd.notna(d) else ""


def _powers_text(values: list[float]) -> str:
    return "/".join("n/a" if math.isnan(x) else f"{x:.2f}" for x in values)


def miss_facts(v: verdicts.Verdict, ev: Evidence, table: pd.DataFrame) -> dict:
    """A miss's figures: its power at the paper's difference and at the one it measured (each point), the seeds a
    side 0.8 would need at the measured one, and how the gap moved over the last quarter."""
    registered = _registered_effect(v, table)
    observed = v.delta_worse if v.predicted != "equivalent" else v.center
    side = 1 if v.predicted == "worse" else -1
    last = v.points[-1] if v.points else None
    need = None
    if last is not None and v.predicted != "equivalent":
        a, b = _values(ev.cell, last.fraction, v.row, v.metric), _values(ev.cell, last.fraction, "base", v.metric)
        need = _seeds_for(v.delta_worse, a, b, ev.cell.alpha / max(last.holm_divisor, 1), side)
    slope, p = trend(v.row, ev.runs)
    return {
        "power_registered": powers(v, ev, registered),
        "power_observed": powers(v, ev, observed) if v.predicted != "equivalent" else [],
        "seeds_for_observed": need,
        "trend_pct_per_1000_steps": slope,
        "trend_p": p,
    }


def _miss_text(v: verdicts.Verdict, facts: dict) -> str:
    parts = []
    effect = "the paper's difference" if v.predicted != "equivalent" else "no difference"
    parts.append(f"power at {effect} {_powers_text(facts['power_registered'])} (75/87.5/100%)")
    if facts["power_observed"]:
        parts.append(f"at the one measured {_powers_text(facts['power_observed'])}")
        if facts["seeds_for_observed"] and facts["power_observed"][-1] < POWER_TARGET:
            parts.append(f"0.8 there needs about {facts['seeds_for_observed']} seeds a side")
    if not math.isnan(facts["trend_pct_per_1000_steps"]):
        parts.append(
            f"the dev PPL gap moved {facts['trend_pct_per_1000_steps']:+.2f}% per 1000 steps over the last quarter "
            f"(p {stats_p(facts['trend_p'])})"
        )
    return "; ".join(parts)


def stats_p(p: float) -> str:
    return "n/a" if math.isnan(p) else f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def _family_line(name: str, rows, decided: dict, first: dict, stage_of: dict, table, ev: dict, misses):
    tested = [
        decided[r]
        for r in rows
        if r in decided and decided[r].predicted in SCORED and decided[r].verdict != stats.NOT_RUN
    ]
    head = f"**{name}**"
    unscored = [r for r in rows if r in decided and decided[r].predicted in ("not scored", "not testable")]
    rest = f" (not scored here, as registered: {', '.join(unscored)})" if unscored and tested else ""
    if not tested:
        return f"{head}: not tested in this table" + (f" ({', '.join(unscored)}: as registered)" if unscored else "")
    parts = []
    for v in tested:
        changes = _changes(table, v.row)
        text = f"{v.row}{f' ({changes})' if changes else ''}: {_delta(v)}"
        text += f", {_paper(v, table)}" if _paper(v, table) else ""
        text += f": **{v.verdict}**"
        where = stage_of.get(v.row)
        seeds = f"{v.n_row} v {v.n_base} seeds"
        if where:
            earlier = first.get(v.row)
            text += (
                f" (stage {where}, {seeds}; stage 1: `{earlier.verdict}`)" if earlier else f" (stage {where}, {seeds})"
            )
        else:
            text += f" ({seeds})"
        text += _points_text(v)
        if not v.passed and v.row in ev and min(v.n_row, v.n_base) >= 2:
            facts = miss_facts(v, ev[v.row], table)
            misses[v.row] = facts
            text += f"; {_miss_text(v, facts)}"
        parts.append(text)
    return f"{head}{rest}: " + "; ".join(parts)


def _points_text(v: verdicts.Verdict) -> str:
    """What a miss of the stability rule was at each point: where a `not stable` test passed and where not (each
    miss with its verdict and Holm p there); an `inconclusive` one's difference at each point, its sign changing."""
    if v.verdict == stats.INCONCLUSIVE and v.points:
        fractions = "/".join(f"{100 * pt.fraction:g}" for pt in v.points)
        if v.metric == "ppl":
            deltas = "/".join(_pct(pt.delta_worse) or "n/a" for pt in v.points) + " dev PPL"
        else:
            deltas = "/".join("n/a" if math.isnan(pt.delta_worse) else f"{-pt.delta_worse:+.2f}" for pt in v.points)
            deltas += " BLEU"
        return f": {deltas} at {fractions}%"
    if v.verdict != stats.NOT_STABLE or not v.points:
        return ""
    at = [(f"{100 * pt.fraction:g}%", pt, replace(v, verdict=pt.verdict).passed) for pt in v.points]  # the rule
    good = [name for name, _, ok in at if ok]
    bad = [f"{name} ({pt.verdict}, Holm p {stats_p(pt.p_holm)})" for name, pt, ok in at if not ok]
    return f": passed at {' and '.join(good)}, not at {' and '.join(bad)}"


def _changes(table: pd.DataFrame, row: str) -> str:
    """What the row changes against base, in the paper's symbols (the table's "differs from base")."""
    from aiayn.reports.render import _differs

    base, line = table[table["row"] == "base"], table[table["row"] == row]
    if base.empty or line.empty:
        return ""
    return _differs(line.iloc[0], base.iloc[0])


def separable(decided: dict, baselines: dict, cells: list[str]) -> dict:
    """Per naive predictor, from the registration alone: the tests run where it predicts otherwise than the paper and
    at least one of the two could pass (an equivalence can pass only beside a registered row of its own knob in the
    same table), and the passes of each there."""
    out = {}
    registered = {row: p for cell in cells for row, p in predictions(cell).items()}
    for name, (label, _) in verdicts.BASELINES.items():
        theirs = baselines.get(name, {})
        tests = []
        for key, v in decided.items():
            if v.predicted not in SCORED or v.verdict == stats.NOT_RUN or key not in theirs:
                continue
            other = theirs[key]
            if other.predicted == v.predicted:
                continue
            paper_can, other_can = _can_pass(v, registered), _can_pass(other, registered)
            if paper_can or other_can:
                tests.append((key[1], v.passed, other.passed, paper_can, other_can))
        out[name] = {"label": label, "tests": tests}
    return out


def decided_prediction(decided: dict, row: str) -> str | None:
    return next((v.predicted for (_, r), v in decided.items() if r == row), None)


def _by_design(tests: list) -> str:
    """Where one side's equivalence could not count, by the registration alone (no other scored row of its knob)."""
    said = []
    for side, index in (("the paper's", 3), ("the predictor's", 4)):
        rows = [t[0] for t in tests if not t[index]]
        if rows:
            said.append(f"{side} equivalence could not count on {', '.join(rows)} (no other scored row of the knob)")
    return "; " + "; ".join(said) if said else ""


def _can_pass(v: verdicts.Verdict, registered: dict) -> bool:
    if v.predicted != "equivalent":
        return True
    return any(
        p.predicted in ("worse", "better", "control") and verdicts._same_knob(row, v.row)
        for row, p in registered.items()
        if row != v.row
    )


def predictors_line(decided: dict, baselines: dict, cells: list[str]) -> str:
    """The paper against each naive predictor: level by design where the registration leaves no test run on which
    they could differ, else what the data decided there. With one seed a side there are no tests: the signs are
    counted instead."""
    s = verdicts.score(decided, baselines)
    scored = [v for v in decided.values() if v.predicted in SCORED and v.verdict != stats.NOT_RUN]
    if scored and all(min(v.n_row, v.n_base) <= 1 for v in scored):
        text = (
            f"One seed a side: signs, not tests. The paper's sign holds at every point on {s['agree']} of {s['scored']}"
        )
        for b in s["baselines"].values():
            wrong = [row for row, p in b["predictions"].items() if p != decided_prediction(decided, row)]
            differs = f" (it predicts {', '.join(wrong)} otherwise)" if wrong else ""
            text += f'; "{b["label"]}" {b["agree"]}{differs}'
        return text + "."
    parts = []
    for name, sep in separable(decided, baselines, cells).items():
        label = sep["label"]
        total = s["baselines"].get(name, {}).get("passed")
        if not sep["tests"]:
            parts.append(f'"{label}" passes {total}: level by design (no test run where they predict differently).')
            continue
        mine = sum(t[1] for t in sep["tests"])
        theirs = sum(t[2] for t in sep["tests"])
        rows = ", ".join(t[0] for t in sep["tests"])
        standing = "level by data" if mine == theirs else "the paper ahead" if mine > theirs else "the paper behind"
        parts.append(
            f'"{label}" passes {total}: {standing}. Where they predict differently ({rows}), the paper passes '
            f"{mine}, the predictor {theirs}{_by_design(sep['tests'])}."
        )
    return f"The paper passes {s['passed']} of its {s['scored']} tests. " + " ".join(parts)


def build(table, decided, first, stage_of, ev, baselines, cells, runs_regime: dict) -> Findings:
    """The first screen of a judged report."""
    decided_rows = {k[1]: v for k, v in decided.items()}
    first_rows = {k[1]: v for k, v in first.items()}
    misses: dict = {}
    lines = [_family_line(name, rows, decided_rows, first_rows, stage_of, table, ev, misses) for name, rows in FAMILIES]
    where = regime(runs_regime)
    line = predictors_line(decided, baselines, cells)
    if where:
        line += f" Regime: {where}."
    return Findings(lines, line, misses)
