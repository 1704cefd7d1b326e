"""Table 3 of one (preset, corpus) from its runs: one line per row, in the paper's order, with the paper beside us."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from aiayn.ablations.table import MODEL_KEYS, load_rows
from aiayn.reports import significance
from aiayn.reports.runs import Run, read_curve, read_text_lines

log = logging.getLogger(__name__)

SETTINGS = MODEL_KEYS
SIGN_MIN_PAPER_DELTA = 0.3  # the paper's |Δ BLEU| below this is within its own noise: no sign to agree with
# A row is converged when its validation BLEU rose by less than this fraction of its last value over the last
# validation interval. The paper compares models trained to near convergence; a row still climbing when it
# stops is compared by how fast it starts learning.
CONVERGED_MAX_GAIN = 0.05
COLUMNS = [
    "group", "row", *SETTINGS, "steps", "n", "ppl", "ppl_std", "bleu", "bleu_std", "params_m",
    "paper_ppl", "paper_bleu", "paper_params_m", "delta_bleu", "paper_delta_bleu", "signs_agree",
    "bootstrap_seed", "bootstrap_p", "sig", "curve_seed", "last_gain", "converged",
]  # fmt: skip


def row_order(names: set[str]) -> list[str]:
    """The paper's rows (then the extended ones) in table order, then rows unknown to ablations/, sorted."""
    known = [r for r in load_rows() if r in names]
    return known + sorted(names - set(known))


def _settings(runs: list[Run]) -> dict:
    """The row's settings as run (metrics.json's config; a completed run's first)."""
    for run in sorted(runs, key=lambda r: (not r.completed, r.seed)):
        config = run.metrics.get("config")
        if isinstance(config, dict) and config:
            return {k: config.get(k) for k in SETTINGS}
    return dict.fromkeys(SETTINGS)


def _steps(runs: list[Run], done: list[Run]):
    """Optimizer steps the completed runs trained (a/b when they differ); the planned steps when none completed."""
    steps = sorted({int(r.metrics["steps"]) for r in done if r.metrics.get("steps") is not None})
    if len(steps) == 1:
        return steps[0]
    if steps:
        return "/".join(map(str, steps))
    planned = sorted({int(r.metrics["planned_steps"]) for r in runs if r.metrics.get("planned_steps") is not None})
    return "/".join(map(str, planned)) if len(planned) > 1 else (planned[0] if planned else None)


def _mean_std(values: list) -> tuple[float, float]:
    s = pd.Series([v for v in values if v is not None], dtype="float64").dropna()
    if s.empty:
        return np.nan, np.nan
    return float(s.mean()), float(s.std(ddof=1)) if len(s) > 1 else np.nan


def _paper(runs: list[Run]) -> tuple:
    """The paper's dev PPL, BLEU and params of the row, as its runs recorded them."""
    m = runs[0].metrics
    return m.get("paper_ppl"), m.get("paper_bleu"), m.get("paper_params_m")


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


def convergence(runs: list[Run]) -> tuple[int | None, float]:
    """(seed, gain) from the validation curve of the row's lowest completed seed that has one: gain is the last
    validation interval's rise in val/bleu relative to the last value (NaN with fewer than two points)."""
    for run in sorted((r for r in runs if r.completed), key=lambda r: r.seed):
        curve = read_curve(run.dir)["val/bleu"].tolist()
        if len(curve) >= 2:
            last, before = curve[-1], curve[-2]
            return run.seed, (last - before) / last if last > 0 else np.inf
    return None, np.nan


def build_table(runs: list[Run]) -> pd.DataFrame:
    """One line per row that has any run (completed or not), columns COLUMNS, numbers unrounded."""
    by_row: dict[str, list[Run]] = {}
    for run in runs:
        by_row.setdefault(run.row, []).append(run)
    completed = {row: {r.seed: r for r in rs if r.completed} for row, rs in by_row.items()}
    files = _Files()
    tested = _bootstrap(completed, files)
    records = []
    for row in row_order(set(by_row)):
        rs = by_row[row]
        done = sorted(completed[row].values(), key=lambda r: r.seed)
        ppl, ppl_std = _mean_std([r.metrics.get("dev_ppl") for r in done])
        bleu, bleu_std = _mean_std([r.metrics.get("dev_bleu") for r in done])
        params, _ = _mean_std([r.metrics.get("params") for r in done])
        paper_ppl, paper_bleu, paper_params = _paper(rs)
        group = str(rs[0].metrics.get("group") or "other")
        seed, p = tested.get(row, (None, None))
        curve_seed, gain = convergence(rs)
        records.append(
            {
                "group": group, "row": row, **_settings(rs), "steps": _steps(rs, done),
                "n": len(done), "ppl": ppl, "ppl_std": ppl_std, "bleu": bleu, "bleu_std": bleu_std,
                "params_m": params / 1e6, "paper_ppl": _num(paper_ppl), "paper_bleu": _num(paper_bleu),
                "paper_params_m": _num(paper_params), "bootstrap_seed": seed, "bootstrap_p": _num(p),
                "curve_seed": curve_seed, "last_gain": gain,
                "converged": "" if pd.isna(gain) else ("yes" if gain < CONVERGED_MAX_GAIN else "no"),
            }
        )  # fmt: skip
    df = pd.DataFrame.from_records(records)
    df["steps"] = pd.Series([r["steps"] for r in records], dtype=object)  # ints, "a/b" or blank: never floats
    base = df[df["row"] == "base"]
    our_base = base["bleu"].iloc[0] if len(base) else np.nan
    paper_base = base["paper_bleu"].iloc[0] if len(base) else np.nan
    not_base = df["row"] != "base"
    df["delta_bleu"] = (df["bleu"] - our_base).where(not_base)
    # the paper's BLEUs have one decimal: round away float noise (25.5 - 25.8 = -0.3000000000000007)
    df["paper_delta_bleu"] = (df["paper_bleu"] - paper_base).round(6).where(not_base)
    eligible = df["delta_bleu"].notna() & df["paper_delta_bleu"].notna()
    eligible &= df["paper_delta_bleu"].abs() >= SIGN_MIN_PAPER_DELTA
    agree = np.sign(df["delta_bleu"]) == np.sign(df["paper_delta_bleu"])
    df["signs_agree"] = np.where(eligible, np.where(agree, "yes", "no"), "")
    df["sig"] = [significance.mark(None if pd.isna(p) else p) for p in df["bootstrap_p"]]
    df["bootstrap_seed"] = df["bootstrap_seed"].astype("Int64")
    df["curve_seed"] = df["curve_seed"].astype("Int64")
    for k in ("N", "d_model", "d_ff", "h", "d_k", "d_v", "n"):
        df[k] = df[k].astype("Int64")
    return df[COLUMNS]


def rounded(df: pd.DataFrame) -> pd.DataFrame:
    """The CSV's numbers: BLEU, PPL, params and deltas to 2 decimals, p to 4."""
    out = df.copy()
    for k in ("ppl", "ppl_std", "bleu", "bleu_std", "params_m", "delta_bleu", "paper_delta_bleu"):
        out[k] = out[k].round(2)
    out["bootstrap_p"] = out["bootstrap_p"].round(4)
    out["last_gain"] = out["last_gain"].round(4)
    return out


def comparable_rows(df: pd.DataFrame) -> list[str]:
    """Rows with a sign verdict whose run and base's both converged: where the comparison with the paper is one
    of near-converged models, as the paper's is."""
    base = df.loc[df["row"] == "base", "converged"]
    if base.empty or base.iloc[0] != "yes":
        return []
    return list(df.loc[(df["signs_agree"] != "") & (df["converged"] == "yes"), "row"])


def convergence_score(df: pd.DataFrame) -> tuple[int, int, list[str]]:
    """(converged rows, rows with a curve to judge, the rows still climbing)."""
    marked = df[df["converged"] != ""]
    climbing = list(marked.loc[marked["converged"] == "no", "row"])
    return len(marked) - len(climbing), len(marked), climbing


def sign_score(df: pd.DataFrame) -> tuple[int, int, list[str]]:
    """(agreeing rows, rows with a sign to agree with, the rows that disagree)."""
    judged = df[df["signs_agree"] != ""]
    disagree = list(judged.loc[judged["signs_agree"] == "no", "row"])
    return int((judged["signs_agree"] == "yes").sum()), len(judged), disagree
