"""The power of a preset's registered tests, resampled from committed validation curves (issue 43: evidence v6).

Evidence v5's power (scripts/power.py) drew each row's endpoint from a normal distribution; the stability rule then
met validation noise the model did not have (v5's C7 failed at 87.5% on one validation 6.5% above its neighbours).
Here every number comes from the characterization's own curves (default: evidence v5's, committed under
reports/reference/history/evidence-v5/):

- **a seed's trend**: each characterization run's log dev PPL over the scored window (every validation from 60% of
  its budget on) fitted by a quadratic in the fraction of the budget; a simulated seed of a row is one of that row's
  runs, drawn with replacement, its deviation from the row's mean trend inflated by sqrt(n / (n - 1)) (a bootstrap of
  n seeds under-spreads by that);
- **validation noise**: the residuals of one of the row's runs (the whole window in order, so heavy tails and
  neighbours' correlation come with it), circularly shifted by a random offset;
- the points read by the preset's rule (`reports.verdicts.point_value`: nearest, or the median of three), and the
  whole family judged by the report's own code (Welch, TOST, Holm, assay sensitivity, the stability rule), the naive
  baselines too (`verdicts.BASELINES`).

A row the characterization never ran takes another's curves (`--as big=C5`, said in the registration). Prints, per
test, P(pass) and P(decided): a pass, or a significant miss (`significant disagree`), the test's verdict either way;
then the expected score of the registration and of each baseline, and P(registration ahead of each by 2 or more).
`--search` picks seeds per row by the rule registered for v6: every scored row starts at 3 seeds (base: the
preset's), and each row whose P(decided) is under 0.9 gets one more, round after round, up to 12.

    python scripts/power_curves.py --preset evidence --as big=C5 --sims 1000 --search
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from aiayn.ablations.predictions import SCORED, predictions
from aiayn.ablations.presets import PRESETS
from aiayn.ablations.selection import Selection
from aiayn.lightning_modules.run.spec import resolve
from aiayn.reports import stats, verdicts

HISTORY = Path(__file__).resolve().parents[1] / "reports" / "reference" / "history" / "evidence-v5"
WINDOW_FROM = 0.6  # the scored window: validations from this fraction of the budget on
DECIDED = (*stats.PASSING, stats.SIGNIFICANT_DISAGREE)


class Characterization:
    """One preset's committed runs and curves, as trends and residuals per run."""

    def __init__(self, runs: pd.DataFrame, curves: pd.DataFrame):
        done = runs[runs["status"] == "completed"]
        self.trends: dict[str, np.ndarray] = {}  # row -> (runs, 3) quadratic coefficients in the fraction
        self.residuals: dict[str, list[np.ndarray]] = {}  # row -> each run's residuals over its window, in order
        for row, g in done.groupby("row", sort=False):
            coefs, self.residuals[str(row)] = [], []
            for _, run in g.iterrows():
                c = curves[(curves["row"] == row) & (curves["seed"] == run["seed"])]
                frac = (c["step"].to_numpy(dtype=float) + 1) / float(run["steps"])
                y = np.log(c["val_ppl"].to_numpy(dtype=float))
                keep = frac >= WINDOW_FROM
                fit = np.polyfit(frac[keep], y[keep], 2)
                coefs.append(fit)
                self.residuals[str(row)].append(y[keep] - np.polyval(fit, frac[keep]))
            self.trends[str(row)] = np.array(coefs)

    def draw(self, rng, row: str, budget: int, every: int) -> dict[int, float]:
        """One simulated seed of `row`: logged step -> dev PPL over the scored window of a `budget`-step run that
        validates every `every` steps."""
        coefs = self.trends[row]
        n = len(coefs)
        mean = coefs.mean(axis=0)
        pick = coefs[rng.integers(n)]
        trend = mean + (pick - mean) * (np.sqrt(n / (n - 1)) if n > 1 else 1.0)
        steps = np.arange(every, budget + 1, every)
        frac = steps / budget
        steps, frac = steps[frac >= WINDOW_FROM], frac[frac >= WINDOW_FROM]
        noise = np.empty(0)
        while len(noise) < len(frac):  # a longer run than the characterization's: one run's residuals after another
            pool = self.residuals[row]
            one = pool[rng.integers(len(pool))]
            noise = np.concatenate([noise, np.roll(one, rng.integers(len(one)))])
        logs = np.polyval(trend, frac) + noise[: len(frac)]
        return dict(zip((steps - 1).tolist(), np.exp(logs).tolist()))


def design(preset: str, seeds: dict[str, int]) -> dict[str, int]:
    """row -> seeds in a sweep of the preset (ablations/selection.py), `seeds` overriding the registered ones."""
    counts: dict[str, int] = {}
    for row, _ in Selection().pairs(PRESETS[preset]):
        counts[row] = counts.get(row, 0) + 1
    scored = {r for r, p in predictions(preset).items() if p.predicted in SCORED}
    out = {r: n for r, n in counts.items() if r == "base" or r in scored}
    out.update({r: n for r, n in seeds.items() if r in out})
    return out


WORKERS = 2  # processes the simulated tables are shared among (each its own stream, seed + i)


def simulate(
    cells: dict[str, tuple[Characterization, dict[str, str]]], designs: dict[str, dict[str, int]], sims: int, seed: int
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Per test P(pass) and P(decided); per predictor (the registration, each baseline) its score in every table:
    `sims` tables in WORKERS processes, worker i drawing sims / WORKERS of them from seed + i."""
    from concurrent.futures import ProcessPoolExecutor

    shares = [sims // WORKERS + (i < sims % WORKERS) for i in range(WORKERS)]
    with ProcessPoolExecutor(WORKERS) as pool:
        parts = list(
            pool.map(_simulate, [cells] * WORKERS, [designs] * WORKERS, shares, [seed + i for i in range(WORKERS)])
        )
    passes: dict = {}
    decided: dict = {}
    scores: dict = {}
    for p, d, sc in parts:
        for k, v in p.items():
            passes.setdefault(k, []).extend(v)
        for k, v in d.items():
            decided.setdefault(k, []).extend(v)
        for k, v in sc.items():
            scores.setdefault(k, []).extend(v)
    table = pd.DataFrame(
        [
            {
                "cell": k[0],
                "row": k[1],
                "seeds": designs[k[0]].get(k[1], 0),
                "base": designs[k[0]].get("base", 0),
                "pass": float(np.mean(passes[k])),
                "decided": float(np.mean(decided[k])),
            }
            for k in passes
        ]
    )
    return table, {k: np.array(v) for k, v in scores.items()}


def _simulate(cells, designs, sims: int, seed: int) -> tuple[dict, dict, dict]:
    """One worker's share: per test its passes and decisions, per predictor its scores, table by table."""
    rng = np.random.default_rng(seed)
    passes: dict[tuple[str, str], list[bool]] = {}
    decided: dict[tuple[str, str], list[bool]] = {}
    scores: dict[str, list[int]] = {"registered": [], **{name: [] for name in verdicts.BASELINES}}
    params = {name: {row: resolve(row, name).model.params() for row in designs[name]} for name in designs}
    for _ in range(sims):
        family_cells = []
        for name, (char, stand_in) in cells.items():
            p = PRESETS[name]
            at: dict[float, dict] = {f: {} for f in verdicts.STABILITY}
            for row, n in designs[name].items():
                budget = resolve(row, name).train_steps
                for _ in range(n):
                    curve = char.draw(rng, stand_in.get(row, row), budget, p.val_every)
                    for f in verdicts.STABILITY:
                        value = verdicts.point_value(curve, budget, f, p.stability)
                        at[f].setdefault(row, {"ppl": [], "bleu": []})["ppl"].append(value)
            final = at.pop(verdicts.STABILITY[-1])
            points = {**at, verdicts.STABILITY[-1]: final} if p.stability == "median3" else at
            family_cells.append(verdicts.Cell(name, final, points, params=params[name]))
        family = verdicts.judge_cells(family_cells)
        baselines = verdicts.judge_baselines(family_cells)
        s = verdicts.score(family, baselines)
        scores["registered"].append(s["passed"])
        for name, b in s["baselines"].items():
            scores[name].append(b["passed"])
        for key, v in family.items():
            if v.predicted in SCORED:
                passes.setdefault(key, []).append(v.passed)
                decided.setdefault(key, []).append(v.verdict in DECIDED)
    return passes, decided, scores


def search(cells, designs, sims: int, seed: int, start: int = 3, most: int = 12, least: float = 0.9):
    """The registered seed rule: every scored row at `start` seeds (base as designed), then one more seed for each
    row whose P(decided) is under `least`, round after round, until none is or it has `most`."""
    designs = {name: {r: (n if r == "base" else start) for r, n in d.items()} for name, d in designs.items()}
    while True:
        table, scores = simulate(cells, designs, sims, seed)
        short = table[(table["decided"] < least) & (table["seeds"] < most)]
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"), flush=True)
        if short.empty:
            return designs, table, scores
        for _, line in short.iterrows():
            designs[line["cell"]][line["row"]] += 1
        print("more seeds: " + ", ".join(f"{r.row} [{r.cell}]" for r in short.itertuples()), flush=True)


def _report(table: pd.DataFrame, scores: dict[str, np.ndarray]) -> None:
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    mine = scores["registered"]
    print(f"registered: expected {mine.mean():.2f} of {len(table)} (P(all pass) {np.mean(mine == len(table)):.3f})")
    for name in verdicts.BASELINES:
        theirs = scores[name]
        print(
            f"{verdicts.BASELINES[name][0]}: expected {theirs.mean():.2f}; registered - baseline: mean "
            f"{(mine - theirs).mean():+.2f}, P(>= 2) {np.mean(mine - theirs >= 2):.3f}, P(>= 1) "
            f"{np.mean(mine - theirs >= 1):.3f}, P(<= -1) {np.mean(mine - theirs <= -1):.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="evidence")
    ap.add_argument("--curves", default=str(HISTORY), help="the folder of the characterization's committed CSVs")
    ap.add_argument(
        "--as",
        dest="stand_ins",
        action="append",
        default=[],
        metavar="ROW=OTHER",
        help="a row the characterization did not run, simulated from OTHER's curves",
    )
    ap.add_argument(
        "--seeds",
        action="append",
        default=[],
        metavar="ROW=N",
        help="seeds of ROW instead of the registered (cells: ROW@PRESET=N)",
    )
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search", action="store_true", help="pick seeds per row by the registered rule")
    args = ap.parse_args()
    folder = Path(args.curves)
    stand_in = dict(x.split("=", 1) for x in args.stand_ins)
    overrides: dict[str, dict[str, int]] = {}
    for x in args.seeds:
        key, n = x.split("=", 1)
        row, _, cell = key.partition("@")
        overrides.setdefault(cell or args.preset, {})[row] = int(n)
    cells, designs = {}, {}
    for name in (args.preset, *PRESETS[args.preset].cells):
        runs = pd.read_csv(folder / f"table3-{name}-runs.csv")
        curves = pd.read_csv(folder / f"table3-{name}-curves.csv")
        cells[name] = (Characterization(runs, curves), stand_in)
        designs[name] = design(name, overrides.get(name, {}))
    if args.search:
        designs, table, scores = search(cells, designs, args.sims, args.seed)
        print(
            "\nchosen: "
            + "; ".join(f"{name}: " + ", ".join(f"{r} {n}" for r, n in d.items()) for name, d in designs.items())
        )
    else:
        table, scores = simulate(cells, designs, args.sims, args.seed)
    _report(table, scores)


if __name__ == "__main__":
    main()
