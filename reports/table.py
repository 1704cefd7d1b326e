"""Table 3 of one (preset, corpus) from its runs: one line per row, in the paper's order, with the paper beside us."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from aiayn.ablations import stability
from aiayn.ablations.knobs import KNOBS, MODEL_KEYS, PAPER_BASE
from aiayn.ablations.predictions import scored_rows
from aiayn.ablations.table import SERIES, load_rows
from aiayn.lightning_modules.run.spec import resolve
from aiayn.reports import significance, stats, verdicts
from aiayn.reports.runs import Run, read_curve, read_text_lines

log = logging.getLogger(__name__)

SETTINGS = MODEL_KEYS
COLUMNS = [
    "group",
    "row",
    *SETTINGS,
    "steps",
    "n",
    "ppl",
    "ppl_std",
    "bleu",
    "bleu_std",
    "params_m",
    "paper_ppl",
    "paper_bleu",
    "paper_params_m",
    "delta_ppl_pct",
    "paper_delta_ppl_pct",
    "delta_bleu",
    "paper_delta_bleu",
    "delta_ppl_ci_low",
    "delta_ppl_ci_high",
    "delta_bleu_ci_low",
    "delta_bleu_ci_high",
    "metric",
    "predicted",
    "margin_pct",
    "center_pct",
    "p",
    "p_holm",
    "verdict",
    "verdict_75",
    "verdict_87.5",
    "p_holm_75",
    "p_holm_87.5",
    "last_drop",
    "bootstrap_seed",
    "bootstrap_p",
    "sig",
]
# One line per run: what the table's means and tests are made of.
# ppl_100: what the test at 100% reads (the final evaluation, or the preset's window there: verdicts.READINGS)
RUN_COLUMNS = [
    "row",
    "seed",
    "status",
    "steps",
    "dev_ppl",
    "dev_bleu",
    "dev_tok_bleu",
    "ppl_75",
    "ppl_87.5",
    "ppl_100",
    "bleu_75",
    "bleu_87.5",
    "params",
    "train_time_s",
    "last_drop",
    "commit",
    "dirty",
    "predictions_sha256",
    "experiment_sha256",
]
# The stability rule's earlier points (verdicts.STABILITY without 100%) as column suffixes: 75, 87.5
EARLY = {f: f"{100 * f:g}" for f in verdicts.STABILITY[:-1]}
# what each scored metric's curve is logged as during training
CURVE_OF = {"ppl": "val/ppl", "bleu": "val/bleu"}
SLOPE_COLUMNS = ["series", "knob", "rows", "values", "n", "slope_pct", "ci_low_pct", "ci_high_pct"]


def row_order(names: set[str]) -> list[str]:
    """The paper's rows (then the extended ones) in table order, then rows unknown to ablations/, sorted."""
    known = [r for r in load_rows() if r in names]
    return known + sorted(names - set(known))


def _settings(runs: list[Run]) -> dict:
    """The row's settings as run (metrics.json's config; a completed run's first; a knob added since it ran: the
    paper's value, as its recorded spec reads back)."""
    for run in sorted(runs, key=lambda r: (not r.completed, r.seed)):
        config = run.metrics.config
        if isinstance(config, dict) and config:
            return {k: config.get(k, PAPER_BASE.get(k)) for k in SETTINGS}
    return dict.fromkeys(SETTINGS)


def _steps(runs: list[Run], done: list[Run]):
    """Optimizer steps the completed runs trained (a/b when they differ); the planned steps when none completed."""
    steps = sorted({int(r.metrics.steps) for r in done if r.metrics.steps is not None})
    if len(steps) == 1:
        return steps[0]
    if steps:
        return "/".join(map(str, steps))
    planned = sorted({int(r.metrics.planned_steps) for r in runs if r.metrics.planned_steps is not None})
    return "/".join(map(str, planned)) if len(planned) > 1 else (planned[0] if planned else None)


def _paper_of(row: str) -> tuple:
    r = load_rows()[row]
    return r.paper_ppl, r.paper_bleu, r.paper_params_m


def _planned_settings(row: str, preset: str) -> dict:
    """A row with no run yet: its settings as the preset resolves it now."""
    model = resolve(row, preset).model
    return {k: getattr(model, k) for k in SETTINGS}


def _mean_std(values: list) -> tuple[float, float]:
    s = pd.Series([v for v in values if v is not None], dtype="float64").dropna()
    if s.empty:
        return np.nan, np.nan
    return float(s.mean()), float(s.std(ddof=1)) if len(s) > 1 else np.nan


def _paper(runs: list[Run]) -> tuple:
    """The paper's dev PPL, BLEU and params of the row, as its runs recorded them."""
    m = runs[0].metrics
    return m.paper_ppl, m.paper_bleu, m.paper_params_m


def _num(x) -> float:
    return np.nan if x is None else float(x)


class _Files:
    """dev.hyp / dev.ref of runs, each read once."""

    def __init__(self):
        self._cache = {}

    def lines(self, run: Run, name: str) -> list[str] | None:
        key = (run.dir, name)
        if key not in self._cache:
            self._cache[key] = read_text_lines(getattr(run.files, name))  # name: dev_hyp | dev_ref
        return self._cache[key]


def _pairing(row_runs: dict[int, Run], base_runs: dict[int, Run], files: _Files):
    """(seed, row hypotheses, base run) for the paired bootstrap: seed 0 or the first seed both have dev.hyp for."""
    seeds = sorted(
        s
        for s in set(row_runs) & set(base_runs)
        if files.lines(row_runs[s], "dev_hyp") is not None and files.lines(base_runs[s], "dev_hyp") is not None
    )
    if not seeds:
        return None
    seed = 0 if 0 in seeds else seeds[0]
    row_run, base_run = row_runs[seed], base_runs[seed]
    refs, base_refs = files.lines(row_run, "dev_ref"), files.lines(base_run, "dev_ref")
    if base_refs is None or (refs is not None and refs != base_refs):
        log.warning("no paired bootstrap for %s: base's dev.ref is missing or differs from the row's", row_run.dir)
        return None
    return seed, files.lines(row_run, "dev_hyp"), base_run


def _bootstrap(completed: dict[str, dict[int, Run]], files: _Files) -> dict[str, tuple[int, float]]:
    """row -> (seed, p) of its paired bootstrap against base; one PairedTest per base seed used."""
    base_runs = completed.get("base", {})
    by_seed: dict[int, dict[str, list[str]]] = {}
    for row, runs in completed.items():
        pairing = None if row == "base" else _pairing(runs, base_runs, files)
        if pairing is not None:
            by_seed.setdefault(pairing[0], {})[row] = pairing[1]
    out = {}
    for seed, systems in sorted(by_seed.items()):
        base_run = base_runs[seed]
        base_hyps, refs = files.lines(base_run, "dev_hyp"), files.lines(base_run, "dev_ref")
        usable = {row: hyps for row, hyps in systems.items() if len(hyps) == len(refs)}
        for row in systems.keys() - usable.keys():
            log.warning("no paired bootstrap for %s seed %d: dev.hyp and base's dev.ref differ in length", row, seed)
        try:
            ps = significance.paired_bootstrap_many(base_hyps, usable, refs) if usable else {}
        except ValueError as e:
            log.warning("no paired bootstrap against base seed %d: %s", seed, e)
            continue
        out.update({row: (seed, p) for row, p in ps.items()})
    return out


def run_convergence(run: Run, rule: str = "endpoints") -> float:
    """The run's last-quarter fall in dev perplexity by the rule `rule` (`verdicts.convergence_drop`); NaN without a
    curve."""
    return verdicts.convergence_drop(read_curve(run.dir, "val/ppl"), rule)


def read_points(reading: str) -> tuple[float, ...]:
    """The stability rule's points a reading takes from the curves (ablations/stability.py)."""
    return stability.read_points(reading)


def run_points(run: Run, reading: str = "nearest") -> dict[tuple[str, float], float]:
    """(metric, fraction) -> the run's dev number at each point of the stability rule (verdicts.STABILITY) that
    `reading` takes from the curve logged during training (`read_points`; `verdicts.point_value`), for each metric
    logged (ppl, bleu). A point without its validations (a run that logged too few) is left out."""
    out = {}
    budget = run.metrics.steps
    for metric, name in CURVE_OF.items():
        curve = read_curve(run.dir, name)
        if budget is None or curve.empty:
            continue
        values = dict(zip(curve["step"], curve[name]))
        for fraction in read_points(reading):
            value = verdicts.point_value(values, int(budget), fraction, reading)
            if value is not None:
                out[(metric, fraction)] = value
    return out


def _floor(runs: list[Run]) -> float | None:
    """Label smoothing's perplexity floor for the row's ε and vocabulary, as its runs recorded them."""
    for run in runs:
        eps = (run.metrics.config or {}).get("eps_ls")
        vocab = run.config.spec.model.vocab_size if run.config is not None else None
        if eps is not None and vocab:
            return verdicts.smoothing_floor(float(eps), int(vocab))
    return None


def _ci(values: list[float], base: list[float]) -> tuple[float, float]:
    """Welch's 95% interval of the row's mean minus base's (BLEU points)."""
    if len(values) < 2 or len(base) < 2:
        return np.nan, np.nan
    _, low, high = stats.welch_ci(values, base)
    return low, high


def _ci_pct(ppls: list[float], base: list[float]) -> tuple[float, float]:
    """Welch's 95% interval of the row's mean dev log-PPL minus base's, as percent of PPL."""
    if len(ppls) < 2 or len(base) < 2:
        return np.nan, np.nan
    _, low, high = stats.welch_ci(np.log(ppls), np.log(base))
    return 100 * (np.exp(low) - 1), 100 * (np.exp(high) - 1)


def series_slopes(runs: list[Run], left_out: frozenset = frozenset()) -> pd.DataFrame:
    """One line per Table 3 series (ablations.table.SERIES) with runs at two knob values or more: the slope of dev
    log-PPL against log2 of the knob, fitted through every completed run of base and the series' rows, as percent of
    dev PPL per doubling, with its 95% interval (stats.slope: the seeds' spread is the residual's). `left_out`: rows
    not comparable with base (trained to another share of their budget), in no slope."""
    lines = []
    for name, knob, members in SERIES:
        points = [
            (float(r.metrics.config[knob]), float(r.metrics.dev_ppl), r.row)
            for r in runs
            if r.completed
            and r.row in ("base", *members)
            and r.row not in left_out
            and r.metrics.dev_ppl
            and (r.metrics.config or {}).get(knob)
        ]
        xs = sorted({x for x, _, _ in points})
        if len(xs) < 2:
            continue
        b, low, high = stats.slope([np.log2(x) for x, _, _ in points], [np.log(y) for _, y, _ in points])
        pct = lambda v: 100 * (np.exp(v) - 1)
        rows = " ".join(row_order({r for _, _, r in points}))
        lines.append(
            {
                "series": name,
                "knob": knob,
                "rows": rows,
                "values": " ".join(f"{x:g}" for x in xs),
                "n": len(points),
                "slope_pct": pct(b),
                "ci_low_pct": pct(low),
                "ci_high_pct": pct(high),
            }
        )
    return pd.DataFrame(lines, columns=SLOPE_COLUMNS)


def budget_mismatch(runs: list[Run]) -> dict[str, str]:
    """row -> why it cannot be compared with base: its completed runs trained another share of their budget than
    base's ("40 of 1200 steps against base's 30 of 1200"): a capped look that mixes `--max-steps`. Rows trained to
    their full budgets compare, `big` at 3x included where its preset trains it so."""

    def share(rs: list[Run]) -> set:
        return {(r.metrics.steps, r.budget) for r in rs if r.completed and r.budget and r.metrics.steps is not None}

    def text(pairs: set) -> str:
        return "/".join(f"{s} of {b} steps" for s, b in sorted(pairs))

    by_row: dict[str, list[Run]] = {}
    for r in runs:
        by_row.setdefault(r.row, []).append(r)
    base = share(by_row.get("base", []))
    fractions = {round(s / b, 6) for s, b in base}
    out = {}
    for row, rs in by_row.items():
        mine = share(rs)
        if row != "base" and base and mine and {round(s / b, 6) for s, b in mine} != fractions:
            out[row] = f"{text(mine)} against base's {text(base)}"
    return out


def dev_mismatch(runs: list[Run]) -> dict[str, str]:
    """row -> why it cannot be compared with base: its completed runs were evaluated on another number of dev
    sentences than base's ("50 dev sentences against base's 1014": a sweep resumed with another --eval-subset)."""

    def counts(rs: list[Run]) -> set:
        return {int(r.metrics.dev_sentences) for r in rs if r.completed and r.metrics.dev_sentences}

    by_row: dict[str, list[Run]] = {}
    for r in runs:
        by_row.setdefault(r.row, []).append(r)
    base = counts(by_row.get("base", []))
    text = lambda c: "/".join(map(str, sorted(c)))
    out = {}
    for row, rs in by_row.items():
        mine = counts(rs)
        if row != "base" and base and mine and mine != base:
            out[row] = f"evaluated on {text(mine)} dev sentences against base's {text(base)}"
    return out


@dataclass(frozen=True)
class Table3:
    rows: pd.DataFrame  # one line per row that has any run (completed or not), COLUMNS, numbers unrounded
    runs: pd.DataFrame  # one line per run, RUN_COLUMNS
    verdicts: dict  # row -> verdicts.Verdict, for the rows the preset's pre-registration names
    cell: verdicts.Cell | None = None  # what the verdicts were judged from (a suite judges its cells together)
    slopes: pd.DataFrame | None = None  # series_slopes
    mismatched: dict = field(default_factory=dict)  # budget_mismatch: rows whose Δ is left blank


def _params(rows, preset: str) -> dict[str, int]:
    """row -> its parameter count as the preset resolves it (before any run: what "more parameters help" reads)."""
    from aiayn.common.errors import UserError

    out = {}
    for row in rows:
        try:
            out[row] = resolve(row, preset).model.params()
        except (UserError, KeyError):  # a row of a user's table that ablations/ does not know
            continue
    return out


def stage_tests(stage) -> dict:
    """A later stage's tests as the verdicts judge them (row -> Prediction): the registered prediction, with the
    stage's equivalence arm where it registers one (ablations/stages.py)."""
    from aiayn.ablations.predictions import Prediction

    return {row: Prediction(row, t.metric, t.predicted, t.reason, margin=t.margin) for row, t in stage.tests.items()}


def build_table(
    runs: list[Run],
    preset: str | None = None,
    convergence: str = "endpoints",
    stability: str = "nearest",
    stage=None,
) -> Table3:
    """Table 3 of `runs` (one preset, one corpus). With `preset`, the rows its pre-registration names
    (ablations/predictions.csv) get their verdicts, at the level of its table's stages (ablations/stages.py);
    `convergence`: the rule that judges every run's curve (verdicts.CONVERGENCE_RULES), `stability`: how each seed's
    number at the stability rule's points is read (verdicts.READINGS); both the preset's own. `stage`: the runs are a
    later stage's, judged on its tests alone."""
    from aiayn.ablations.stages import level

    by_row: dict[str, list[Run]] = {}
    for run in runs:
        by_row.setdefault(run.row, []).append(run)
    tests = stage_tests(stage) if stage is not None else None
    scored = list(tests) if tests is not None else scored_rows(preset) if preset else ()
    absent = frozenset(row for row in scored if row not in by_row)
    for row in absent:
        by_row.setdefault(row, [])  # a scored row without runs is a line too: its verdict says so (`not run`)
    completed = {row: {r.seed: r for r in rs if r.completed} for row, rs in by_row.items()}
    drops = {(r.row, r.seed): run_convergence(r, convergence) for r in runs if r.completed}
    early = {(r.row, r.seed): run_points(r, stability) for r in runs if r.completed}
    taken = read_points(stability)
    tested = _bootstrap(completed, _Files())
    records, values, floors = [], {}, {}
    points: dict[float, dict] = {f: {} for f in taken}
    for row in row_order(set(by_row)):
        done = sorted(completed[row].values(), key=lambda r: r.seed)
        values[row], at = _seed_values(done, early, taken)
        for f in taken:
            points[f][row] = at[f]
        row_drops = [drops[(row, r.seed)] for r in done]
        drop = np.nan if not row_drops or any(pd.isna(d) for d in row_drops) else max(row_drops)
        floors[row] = _floor(done)
        records.append(_row_record(row, by_row[row], done, preset, tested.get(row, (None, None)), drop))
    df = pd.DataFrame.from_records(records)
    df["steps"] = pd.Series([r["steps"] for r in records], dtype=object)  # ints, "a/b" or blank: never floats
    # trained to another share of its budget than base, or evaluated on other dev sentences: no Δ, no test
    mismatched = {**dev_mismatch(runs), **budget_mismatch(runs)}
    _deltas(df, values, mismatched)
    for row in mismatched:
        values.pop(row, None)
        for f in points:
            points[f].pop(row, None)
    cell = None
    if preset:
        params = _params(values, preset)
        cell = verdicts.Cell(preset, values, points, floors, params, absent=absent, alpha=level(preset), tests=tests)
    judged = {row: v for (_, row), v in verdicts.judge_cells([cell]).items()} if preset else {}
    set_verdicts(df, judged)
    df["sig"] = [significance.mark(None if pd.isna(p) else p) for p in df["bootstrap_p"]]
    for k in ("bootstrap_seed", "n", *(k for k in MODEL_KEYS if KNOBS[k].type is int)):
        df[k] = df[k].astype("Int64")
    runs_df = _runs_frame(
        [r for row in row_order(set(by_row)) for r in sorted(by_row[row], key=lambda r: r.seed)], early, drops
    )
    return Table3(df[COLUMNS], runs_df, judged, cell, series_slopes(runs, frozenset(mismatched)), mismatched)


def _seed_values(done: list[Run], early: dict, taken) -> tuple[dict, dict]:
    """A row's completed seeds' final dev PPL and BLEU, and their numbers at each of the stability rule's points
    (the seeds with validations at the point: a run without them is left out there)."""
    ppls = [float(r.metrics.dev_ppl) for r in done if r.metrics.dev_ppl is not None]
    bleus = [float(r.metrics.dev_bleu) for r in done if r.metrics.dev_bleu is not None]
    at = {
        f: {m: [early[(r.row, r.seed)][(m, f)] for r in done if (m, f) in early[(r.row, r.seed)]] for m in CURVE_OF}
        for f in taken
    }
    return {"ppl": ppls, "bleu": bleus}, at


def _row_record(row: str, rs: list[Run], done: list[Run], preset: str | None, tested: tuple, drop: float) -> dict:
    """One line of the table: the row's settings, its completed seeds' means and spreads, the paper's numbers."""
    ppl, ppl_std = _mean_std([float(r.metrics.dev_ppl) for r in done if r.metrics.dev_ppl is not None])
    bleu, bleu_std = _mean_std([float(r.metrics.dev_bleu) for r in done if r.metrics.dev_bleu is not None])
    params, _ = _mean_std([r.metrics.params for r in done])
    paper_ppl, paper_bleu, paper_params = _paper(rs) if rs else _paper_of(row)
    seed, p = tested
    return {
        "group": str(rs[0].metrics.group or "other") if rs else load_rows()[row].group,
        "row": row,
        **(_settings(rs) if rs else _planned_settings(row, preset)),
        "steps": _steps(rs, done),
        "n": len(done),
        "ppl": ppl,
        "ppl_std": ppl_std,
        "bleu": bleu,
        "bleu_std": bleu_std,
        "params_m": params / 1e6,
        "paper_ppl": _num(paper_ppl),
        "paper_bleu": _num(paper_bleu),
        "paper_params_m": _num(paper_params),
        "bootstrap_seed": seed,
        "bootstrap_p": _num(p),
        "last_drop": drop,
    }


def _deltas(df: pd.DataFrame, values: dict, mismatched: dict) -> None:
    """Each row's Δ against base, ours and the paper's, and our Δ PPL's interval; blank for a row `mismatched`."""
    base = df[df["row"] == "base"]
    first = lambda col: base[col].iloc[0] if len(base) else np.nan
    not_base = df["row"] != "base"
    df["delta_bleu"] = (df["bleu"] - first("bleu")).where(not_base)
    df["delta_ppl_pct"] = (100 * (df["ppl"] / first("ppl") - 1)).where(not_base)
    # the paper's BLEUs have one decimal: round away float noise (25.5 - 25.8 = -0.3000000000000007)
    df["paper_delta_bleu"] = (df["paper_bleu"] - first("paper_bleu")).round(6).where(not_base)
    df["paper_delta_ppl_pct"] = (100 * (df["paper_ppl"] / first("paper_ppl") - 1)).where(not_base)
    base_ppls = values.get("base", {}).get("ppl", [])
    cis = [_ci_pct(values[r]["ppl"], base_ppls) if r != "base" else (np.nan, np.nan) for r in df["row"]]
    df["delta_ppl_ci_low"] = [c[0] for c in cis]
    df["delta_ppl_ci_high"] = [c[1] for c in cis]
    base_bleus = values.get("base", {}).get("bleu", [])
    bleu_cis = [_ci(values[r]["bleu"], base_bleus) if r != "base" else (np.nan, np.nan) for r in df["row"]]
    df["delta_bleu_ci_low"] = [c[0] for c in bleu_cis]
    df["delta_bleu_ci_high"] = [c[1] for c in bleu_cis]
    blank = df["row"].isin(list(mismatched))
    for col in (
        "delta_bleu",
        "delta_ppl_pct",
        "delta_ppl_ci_low",
        "delta_ppl_ci_high",
        "delta_bleu_ci_low",
        "delta_bleu_ci_high",
    ):
        df[col] = df[col].where(~blank)


def _runs_frame(runs: list[Run], early: dict, drops: dict) -> pd.DataFrame:
    """One line per run (RUN_COLUMNS): its final numbers, its numbers at the stability rule's points, its fall and
    its provenance."""
    frame = pd.DataFrame.from_records(
        [_run_record(r, early.get((r.row, r.seed), {}), drops) for r in runs], columns=RUN_COLUMNS
    )
    for k in (
        "dev_ppl",
        "dev_bleu",
        "dev_tok_bleu",
        "train_time_s",
        "last_drop",
        "ppl_75",
        "ppl_87.5",
        "ppl_100",
        "bleu_75",
        "bleu_87.5",
    ):
        frame[k] = pd.to_numeric(frame[k]).astype("float64")
    frame["steps"] = pd.to_numeric(frame["steps"]).astype("Int64")
    frame["params"] = pd.to_numeric(frame["params"]).astype("Int64")
    return frame


def _run_record(r: Run, early: dict, drops: dict) -> dict:
    return {
        "row": r.row,
        "seed": r.seed,
        "status": r.metrics.status,
        "steps": r.metrics.steps,
        "dev_ppl": r.metrics.dev_ppl,
        "dev_bleu": r.metrics.dev_bleu,
        "dev_tok_bleu": r.metrics.dev_tok_bleu,
        **{f"{m}_{suffix}": early.get((m, f), np.nan) for m in CURVE_OF for f, suffix in EARLY.items()},
        "ppl_100": early.get(("ppl", 1.0), r.metrics.dev_ppl if r.completed else np.nan),
        "params": r.metrics.params,
        "train_time_s": r.metrics.train_time_s,
        "last_drop": drops.get((r.row, r.seed), np.nan),
        "commit": r.metrics.commit,
        "dirty": r.metrics.dirty,
        "predictions_sha256": r.metrics.predictions_sha256,
        "experiment_sha256": r.config.experiment_sha256() if r.config is not None else None,
    }


def set_verdicts(df: pd.DataFrame, judged: dict) -> None:
    """The verdict columns of a table (in place), from row -> verdicts.Verdict."""
    for col, attr in (("metric", "metric"), ("predicted", "predicted"), ("verdict", "verdict")):
        df[col] = [getattr(judged[r], attr) or "" if r in judged else "" for r in df["row"]]
    df["p"] = [judged[r].p if r in judged else np.nan for r in df["row"]]
    df["p_holm"] = [judged[r].p_holm if r in judged else np.nan for r in df["row"]]
    for i, suffix in enumerate(EARLY.values()):  # the test at the stability rule's earlier points
        df[f"verdict_{suffix}"] = [
            judged[r].points[i].verdict if r in judged and judged[r].points else "" for r in df["row"]
        ]
        df[f"p_holm_{suffix}"] = [
            judged[r].points[i].p_holm if r in judged and judged[r].points else np.nan for r in df["row"]
        ]
    on_ppl = {r for r, v in judged.items() if v.metric == "ppl"}  # a BLEU margin is in BLEU points, not a percent
    df["margin_pct"] = [
        100 * (np.exp(judged[r].margin) - 1) if r in on_ppl and judged[r].margin else np.nan for r in df["row"]
    ]
    df["center_pct"] = [
        100 * (np.exp(judged[r].center) - 1) if r in on_ppl and judged[r].center else np.nan for r in df["row"]
    ]


def rounded(df: pd.DataFrame) -> pd.DataFrame:
    """The CSV's numbers: BLEU, PPL, params and deltas to 2 decimals, p to 4 significant digits' worth."""
    out = df.copy()
    for k in (
        "ppl",
        "ppl_std",
        "bleu",
        "bleu_std",
        "params_m",
        "delta_bleu",
        "paper_delta_bleu",
        "delta_ppl_pct",
        "paper_delta_ppl_pct",
        "delta_ppl_ci_low",
        "delta_ppl_ci_high",
        "delta_bleu_ci_low",
        "delta_bleu_ci_high",
        "margin_pct",
        "center_pct",
        "slope_pct",
        "ci_low_pct",
        "ci_high_pct",
    ):
        if k in out:
            out[k] = pd.to_numeric(out[k]).astype("float64").round(2) + 0.0  # + 0.0: no "-0.0" where it rounds to 0
    for k in ("bootstrap_p", "last_drop", "dev_ppl", "ppl_75", "ppl_87.5", "ppl_100"):
        if k in out:
            out[k] = out[k].round(4)
    for k in ("p", "p_holm", "p_holm_75", "p_holm_87.5"):
        if k in out:
            out[k] = out[k].map(lambda x: x if pd.isna(x) else float(f"{x:.4g}"))
    return out
