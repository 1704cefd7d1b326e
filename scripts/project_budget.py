"""Project a sweep's wall time at candidate budgets from a timing probe, and pick the budget by a rule fixed before
the probe is read (issue 36: evidence v5 and the main job; BENCHMARKS.md "Evidence v5, registered").

The probe (`reports/reference/pilots/evidence-v5-probe-times.csv`) trained every row of the preset's suite for 600
steps, two at a time as the sweep runs them, and was read for its times only. Each row's time per step is its mean
`train_time_s / steps` over the probe's runs of that (preset, row); each run also costs its probe's `wall_time_s -
train_time_s` (the final evaluation) plus `--start` seconds (a process starting). The sweep is simulated as it runs:
the pairs in the queue's order (ablations/selection.py), `--jobs` at a time, each started when a slot frees; the
preset's cells (`Preset.cells`) after it, the same way; plus `--fixed` seconds (corpus, tokenizer, report).

    python scripts/project_budget.py --preset evidence --budgets 4000 4500 5000 5500 6000 --limit-min 170
    python scripts/project_budget.py --preset quick --timed-as evidence --budgets 2000 2500 3000 3500 4000 --limit-min 7

Prints each budget's projection and the largest budget within the limit.
"""

from __future__ import annotations

import argparse
import heapq
from pathlib import Path

import pandas as pd

from aiayn.ablations.presets import PRESETS
from aiayn.ablations.selection import Selection

PROBE = Path(__file__).resolve().parents[1] / "reports" / "reference" / "pilots" / "evidence-v5-probe-times.csv"


def makespan(costs: list[float], jobs: int) -> float:
    """Wall time of running `costs` in order, `jobs` at a time, each started when a slot frees."""
    slots = [0.0] * jobs
    heapq.heapify(slots)
    for c in costs:
        heapq.heappush(slots, heapq.heappop(slots) + c)
    return max(slots)


def project(probe: pd.DataFrame, preset: str, budget: int, start: float, timed_as: str | None = None) -> float:
    """Seconds for the preset's sweep at `budget` steps (its cells at their own budgets), `sweep_jobs` at a time;
    `timed_as`: the preset whose probe runs time this one's rows (the same model and corpus)."""
    per = probe.assign(per_step=probe["train_time_s"] / probe["steps"], extra=probe["wall_time_s"] - probe[
        "train_time_s"]).groupby(["preset", "row"])[["per_step", "extra"]].mean()  # fmt: skip
    total = 0.0
    for name in (preset, *PRESETS[preset].cells):
        p = PRESETS[name]
        steps = budget if name == preset else p.train_steps
        costs = []
        for row, _ in Selection().pairs(p):
            probed = timed_as if name == preset and timed_as else name
            key = (probed, row) if (probed, row) in per.index else (probed, "base")  # a row not timed: base's
            costs.append(per.loc[key, "per_step"] * steps + per.loc[key, "extra"] + start)
        total += makespan(costs, p.sweep_jobs)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", default=str(PROBE))
    ap.add_argument("--preset", required=True)
    ap.add_argument("--timed-as", help="the preset whose probe runs time this one's rows (default: its own)")
    ap.add_argument("--budgets", type=int, nargs="+", required=True)
    ap.add_argument("--limit-min", type=float, required=True, help="the largest projected wall allowed, minutes")
    ap.add_argument("--start", type=float, default=4.0, help="seconds a run's process takes to start")
    ap.add_argument("--fixed", type=float, default=40.0, help="seconds of the command outside its runs")
    args = ap.parse_args()
    probe = pd.read_csv(args.probe)
    best = None
    for b in sorted(args.budgets):
        minutes = (project(probe, args.preset, b, args.start, args.timed_as) + args.fixed) / 60
        ok = minutes <= args.limit_min
        print(f"{args.preset} at {b} steps: {minutes:.1f} min projected ({'within' if ok else 'over'} "
              f"{args.limit_min:g})")
        best = b if ok else best
    print(f"chosen: {best} steps" if best else "no budget within the limit")


if __name__ == "__main__":
    main()
