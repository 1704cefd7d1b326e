"""Project a sweep's wall time at candidate budgets from a timing probe, and pick the budget by a rule fixed before
the probe is read (issue 36: evidence v5 and the main job; BENCHMARKS.md "Evidence v5, registered").

The probe (`reports/reference/pilots/evidence-v5-probe-times.csv`) trained every row of the preset's suite for 600
steps, two at a time as the sweep runs them, and was read for its times only. Each row's time per step is its mean
`train_time_s / steps` over the probe's runs of that (preset, row); each run also costs its probe's `wall_time_s -
train_time_s` (the final evaluation) plus `--start` seconds (a process starting). The sweep is simulated as it runs:
the pairs in the queue's order (ablations/selection.py), `--jobs` at a time, each started when a slot frees; the
preset's cells (`Preset.cells`) after it, the same way; plus `--fixed` seconds (corpus, tokenizer, report).

    python scripts/project_budget.py --preset evidence --budgets 4000 4500 5000 5500 6000 --limit-min 165
    python scripts/project_budget.py --preset quick --timed-as evidence --budgets 2000 2500 3000 3500 4000 --limit-min 7
    python scripts/project_budget.py --probe reports/reference/pilots/evidence-v6-probe-times.csv --preset evidence \
        --budgets 4500 --limit-min 165 --drop-agreeing     # evidence v6's time rule

Prints each budget's projection and the largest budget within the limit.
"""

from __future__ import annotations

import argparse
import heapq
from pathlib import Path

import pandas as pd

from aiayn.ablations.predictions import predictions
from aiayn.ablations.presets import PRESETS
from aiayn.ablations.selection import Selection
from aiayn.lightning_modules.run.spec import resolve

PROBE = Path(__file__).resolve().parents[1] / "reports" / "reference" / "pilots" / "evidence-v5-probe-times.csv"


def makespan(costs: list[float], jobs: int) -> float:
    """Wall time of running `costs` in order, `jobs` at a time, each started when a slot frees."""
    slots = [0.0] * jobs
    heapq.heapify(slots)
    for c in costs:
        heapq.heappush(slots, heapq.heappop(slots) + c)
    return max(slots)


def _costs(
    probe: pd.DataFrame,
    preset: str,
    budget: int,
    start: float,
    timed_as: str | None = None,
    dropped: frozenset = frozenset(),
) -> dict[str, list[tuple[str, float]]]:
    """cell -> (row, seconds) of every run of the preset's sweep in the queue's order, the rows of `dropped` ((cell,
    row) tests registered away) left out, and a cell none of whose tests is left, whole."""
    per = (
        probe.assign(
            per_step=probe["train_time_s"] / probe["steps"], extra=probe["wall_time_s"] - probe["train_time_s"]
        )
        .groupby(["preset", "row"])[["per_step", "extra"]]
        .mean()
    )
    out = {}
    for name in (preset, *PRESETS[preset].cells):
        p = PRESETS[name]
        tests = {r for r, pred in predictions(name).items() if pred.scored}
        if tests and tests <= {row for cell, row in dropped if cell == name}:
            continue
        costs = []
        for row, _ in Selection().pairs(p):
            if (name, row) in dropped:
                continue
            steps = (
                resolve(row, name).train_steps
                if name != preset
                else round(budget * resolve(row, name).train_steps / p.train_steps)
            )
            probed = timed_as if name == preset and timed_as else name
            key = (probed, row) if (probed, row) in per.index else (probed, "base")  # a row not timed: base's
            costs.append((row, per.loc[key, "per_step"] * steps + per.loc[key, "extra"] + start))
        out[name] = costs
    return out


def project(
    probe: pd.DataFrame,
    preset: str,
    budget: int,
    start: float,
    timed_as: str | None = None,
    dropped: frozenset = frozenset(),
) -> float:
    """Seconds for the preset's sweep at `budget` steps (its cells at their own budgets), `sweep_jobs` at a time;
    `timed_as`: the preset whose probe runs time this one's rows (the same model and corpus); `dropped`: (cell, row)
    tests left out."""
    costs = _costs(probe, preset, budget, start, timed_as, dropped)
    return sum(makespan([c for _, c in runs], PRESETS[name].sweep_jobs) for name, runs in costs.items())


def agreeing(preset: str) -> list[tuple[str, str]]:
    """(cell, row) of every scored test on which the registration, "every change hurts" and "more parameters help,
    every other change hurts" predict the same direction: a test that separates none of them."""
    out = []
    for name in (preset, *PRESETS[preset].cells):
        base = resolve("base", name).model.params()
        for row, pred in predictions(name).items():
            if pred.predicted in ("worse", "better"):
                more = "better" if resolve(row, name).model.params() > base else "worse"
                if pred.predicted == "worse" == more:
                    out.append((name, row))
    return out


def drop_until_within(
    probe: pd.DataFrame,
    preset: str,
    budget: int,
    start: float,
    fixed: float,
    limit_s: float,
    timed_as: str | None = None,
) -> tuple[frozenset, float]:
    """The registered time rule (evidence v6): while the projection is over `limit_s`, leave out the agreeing test
    (`agreeing`) whose own runs cost most (a cell's only test: the whole cell), one at a time. The tests left out,
    and the projection then."""
    dropped: frozenset = frozenset()
    while True:
        seconds = project(probe, preset, budget, start, timed_as, dropped) + fixed
        left = [t for t in agreeing(preset) if t not in dropped]
        if seconds <= limit_s or not left:
            return dropped, seconds
        costs = _costs(probe, preset, budget, start, timed_as, dropped)
        priced = {test: _test_cost(test, costs, dropped) for test in left}
        worst = max(left, key=priced.get)
        print(
            f"over {limit_s / 60:g} min ({seconds / 60:.1f}): leaving out {worst[1]} [{worst[0]}] "
            f"({priced[worst] / 60:.1f} min of runs)"
        )
        dropped = dropped | {worst}


def _test_cost(test: tuple[str, str], costs: dict, dropped: frozenset) -> float:
    """Seconds of runs a test alone costs: its row's runs, or its whole cell where it is the cell's last test."""
    cell, row = test
    own = sum(c for r, c in costs.get(cell, []) if r == row)
    others = {r for r, pred in predictions(cell).items() if pred.scored} - {x for c, x in dropped if c == cell}
    whole = sum(c for _, c in costs.get(cell, [])) if others == {row} else 0.0
    return max(own, whole)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", default=str(PROBE))
    ap.add_argument("--preset", required=True)
    ap.add_argument("--timed-as", help="the preset whose probe runs time this one's rows (default: its own)")
    ap.add_argument("--budgets", type=int, nargs="+", required=True)
    ap.add_argument("--limit-min", type=float, required=True, help="the largest projected wall allowed, minutes")
    ap.add_argument("--start", type=float, default=4.0, help="seconds a run's process takes to start")
    ap.add_argument("--fixed", type=float, default=40.0, help="seconds of the command outside its runs")
    ap.add_argument(
        "--drop-agreeing",
        action="store_true",
        help="evidence v6's rule: at the one budget given, leave "
        "out the tests that separate no predictor, costliest first, until within the limit",
    )
    args = ap.parse_args()
    probe = pd.read_csv(args.probe)
    if args.drop_agreeing:
        dropped, seconds = drop_until_within(
            probe, args.preset, args.budgets[0], args.start, args.fixed, 60 * args.limit_min, args.timed_as
        )
        print(
            f"{args.preset} at {args.budgets[0]} steps: {seconds / 60:.1f} min projected; left out: "
            + (", ".join(f"{r} [{c}]" for c, r in sorted(dropped)) or "none")
        )
        return
    best = None
    for b in sorted(args.budgets):
        minutes = (project(probe, args.preset, b, args.start, args.timed_as) + args.fixed) / 60
        ok = minutes <= args.limit_min
        print(
            f"{args.preset} at {b} steps: {minutes:.1f} min projected ({'within' if ok else 'over'} {args.limit_min:g})"
        )
        best = b if ok else best
    print(f"chosen: {best} steps" if best else "no budget within the limit")


if __name__ == "__main__":
    main()
