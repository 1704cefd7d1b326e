"""Attempt 4's pilot rule: which regime and step budget the `evidence` preset takes, read from a pilot by a rule
fixed before the pilot was read (docs/history/benchmarks.md, "Attempt 4"), which never looks at a row's sign.

    aiayn table3 --preset evidence --data synthetic-20 --rows base,A1,A3,A4,B1,B2,C1,C4,C5,C6,C7,E1 \\
        --seeds 1 --base-seeds 2 --first-seed 100 --out pilot4-s20 --report ''
    python scripts/pilot_admission.py pilot4-s20 --export reports/reference/pilots/evidence-v4-synthetic-20
    python scripts/pilot_admission.py reports/reference/pilots/evidence-v4-synthetic-20   # the same, from git
    python scripts/pilot_admission.py --choose R1=PREFIX1 R2=PREFIX2 R3=PREFIX3   # the rule over the candidates

A budget B (a multiple of the preset's validation interval, at most the pilot's length) is admitted when

  (a) headroom: base's dev PPL at B, geometric mean over its pilot seeds, is at least MIN_BASE_PPL (1.25: at least
      half of base's dev loss is error, not the calibration label smoothing 0.1 leaves, 1.11);
  (b) converged: every pilot run (base's seeds and each row's) falls by at most MARGIN (3.5%) over the last quarter
      of B steps by the `line` rule (reports/verdicts.py), below the 5% that judges the scored runs, so that fresh
      seeds converge too;
  (c) sensitive: the median over CAPACITY_ROWS of |dev PPL at B / base's - 1| is at least MIN_SENSITIVITY (2%),
      whatever the signs: the regime moves when capacity moves;
  (d) affordable: the evidence table projected from the pilot's own timings (SEEDS per row, two runs at a time,
      plus the data-limited cell's measured CELL_MINUTES) fits in MAX_MINUTES.

The smallest admitted budget is the preset's. The curves cut at B are the B-step runs: the schedule (module.noam_lr)
and the data order do not depend on the budget. `--export PREFIX` writes the pilot in compact form (PREFIX-curves.csv:
row, seed, step, dev PPL at every validation; PREFIX-runs.csv: each run's times and commit), which this script reads
back as it reads run directories, so that the choice can be re-derived from the repository. Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from aiayn.reports.runs import read_curve
from aiayn.reports.verdicts import convergence_drop

BUDGETS = tuple(range(1500, 6001, 500))  # R1, R3: up to their pilots' 4000 steps; R2: 6000 (docs/history/benchmarks.md)
MIN_BASE_PPL = 1.25
MARGIN = 0.035
RULE = "line"
CAPACITY_ROWS = ("A1", "A4", "B1", "B2", "C1", "C4", "C5", "C6", "C7")
MIN_SENSITIVITY = 0.02
SEEDS = {"base": 8, "A3": 8, "E1": 8}  # the equivalence tests' rows and base; every other scored row: 4
OTHER_SEEDS = 4
JOBS = 2
CELL_MINUTES = 22.2  # tiny-2k v3, the data-limited cell: 1331 s measured (docs/history/benchmarks.md)
MAX_MINUTES = 160


def read_pilot(source: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(curves: row, seed, step, ppl; runs: row, seed, steps, train_time_s, eval_time_s, wall_time_s, commit) from a
    pilot's --out directory or from the PREFIX of an export."""
    exported = Path(f"{source}-curves.csv")
    if exported.is_file():
        return pd.read_csv(exported), pd.read_csv(f"{source}-runs.csv")
    curves, runs = [], []
    for metrics in sorted(source.glob("*/*/*/seed*/metrics.json")):
        m = json.loads(metrics.read_text(encoding="utf-8"))
        if m.get("status") != "completed":
            continue
        c = read_curve(metrics.parent, "val/ppl")
        curves.append(pd.DataFrame({"row": m["row"], "seed": m["seed"], "step": c["step"], "ppl": c["val/ppl"]}))
        runs.append(
            {
                k: m.get(k)
                for k in ("row", "seed", "steps", "train_time_s", "eval_time_s", "wall_time_s", "commit", "dirty")
            }
        )
    if not runs:
        raise SystemExit(f"no completed pilot run under {source}")
    return pd.concat(curves, ignore_index=True), pd.DataFrame(runs)


def cut(curve: pd.DataFrame, budget: int) -> pd.DataFrame | None:
    """The curve of a `budget`-step run (Lightning logs the validation after optimizer step s as step s - 1)."""
    if curve["step"].max() < budget - 1:
        return None
    return curve[curve["step"] <= budget - 1].rename(columns={"ppl": "val/ppl"})


def run_minutes(runs: pd.DataFrame, budget: int) -> dict[str, float]:
    """Row -> projected minutes of one `budget`-step run: training scaled by steps, the final evaluation and the
    setup as measured (mean over the row's pilot seeds)."""
    t = runs.assign(
        projected=runs.train_time_s / runs.steps * budget + runs.wall_time_s - runs.train_time_s
    )  # wall - train = setup + final evaluation
    return (t.groupby("row").projected.mean() / 60).to_dict()


def judge(curves: pd.DataFrame, runs: pd.DataFrame, budget: int) -> dict:
    cuts = {key: cut(c, budget) for key, c in curves.groupby(["row", "seed"])}
    if any(c is None for c in cuts.values()):
        return {"budget": budget, "admitted": False, "why": "past the pilot's length"}
    final = {key: float(c["val/ppl"].iloc[-1]) for key, c in cuts.items()}
    base = [v for (row, _), v in final.items() if row == "base"]
    base_ppl = math.exp(sum(map(math.log, base)) / len(base))
    falls = {key: convergence_drop(c, RULE) for key, c in cuts.items()}
    row_ppl = pd.Series(final).groupby(level=0).apply(lambda s: math.exp(s.map(math.log).mean()))
    sizes = {r: abs(row_ppl[r] / base_ppl - 1) for r in CAPACITY_ROWS if r in row_ppl}
    sensitivity = float(pd.Series(sizes).median()) if sizes else math.nan
    minutes = run_minutes(runs, budget)
    table = sum(SEEDS.get(r, OTHER_SEEDS) * m for r, m in minutes.items()) / JOBS + CELL_MINUTES
    checks = {
        "a_headroom": base_ppl >= MIN_BASE_PPL,
        "b_converged": all(f <= MARGIN for f in falls.values()),
        "c_sensitive": sensitivity >= MIN_SENSITIVITY,
        "d_affordable": table <= MAX_MINUTES,
    }
    return {
        "budget": budget,
        "admitted": all(checks.values()),
        **checks,
        "base_ppl": base_ppl,
        "converged_runs": sum(f <= MARGIN for f in falls.values()),
        "runs": len(falls),
        "sensitivity": sensitivity,
        "table_minutes": table,
        "falls": falls,
        "sizes": sizes,
    }


def export(curves: pd.DataFrame, runs: pd.DataFrame, prefix: Path) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    curves.assign(ppl=curves.ppl.round(5)).to_csv(f"{prefix}-curves.csv", index=False, lineterminator="\n")
    runs.to_csv(f"{prefix}-runs.csv", index=False, lineterminator="\n")
    print(f"wrote {prefix}-curves.csv and {prefix}-runs.csv")


def choose(pilots: list[tuple[str, Path]]) -> tuple[str, int, str]:
    """The regime and budget of attempt 4 by its rule over the candidates in order: the smallest admitted budget of the
    first candidate that admits one; else the (candidate, budget) meeting (a) and (d) with the most pilot runs
    converged by (b), ties going to the earlier candidate, then the smaller budget. (name, budget, why)."""
    best = None
    for rank, (name, source) in enumerate(pilots):
        curves, runs = read_pilot(source)
        results = [r for r in (judge(curves, runs, b) for b in BUDGETS) if "falls" in r]
        admitted = [r["budget"] for r in results if r["admitted"]]
        if admitted:
            return name, admitted[0], "admitted"
        for r in results:
            if r["a_headroom"] and r["d_affordable"]:
                key = (-r["converged_runs"], rank, r["budget"])
                if best is None or key < best[0]:
                    best = (key, name, r["budget"], f"fallback: {r['converged_runs']} of {r['runs']} runs converged")
    if best is None:
        raise SystemExit("no candidate meets (a) and (d) at any budget")
    return best[1], best[2], best[3]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pilot", type=Path, nargs="?", help="a pilot's --out, or the PREFIX of its export")
    ap.add_argument("--export", type=Path, metavar="PREFIX", help="write the pilot in compact form")
    ap.add_argument(
        "--choose",
        nargs="+",
        metavar="NAME=PREFIX",
        help="the candidates in their registered order: print the regime and budget the rule chooses among them",
    )
    args = ap.parse_args()
    if args.choose:
        pilots = [(x.split("=", 1)[0], Path(x.split("=", 1)[1])) for x in args.choose]
        name, budget, why = choose(pilots)
        print(f"chosen: {name} at {budget} steps ({why})")
        return
    curves, runs = read_pilot(args.pilot)
    if args.export:
        export(curves, runs, args.export)
    commits = sorted({str(c)[:12] for c in runs.get("commit", pd.Series(dtype=str)).dropna()})
    print(f"pilot: {len(runs)} runs, commit(s) {', '.join(commits) or 'not recorded'}")
    results = [judge(curves, runs, b) for b in BUDGETS]
    print(f"\nlast-quarter fall of dev PPL by the {RULE} rule, % (admitted at most {MARGIN:.1%}):")
    falls = pd.DataFrame({r["budget"]: pd.Series(r["falls"]) for r in results if "falls" in r})
    print((100 * falls).round(1).to_string() if len(falls) else "  (no budget within the pilot's length)")
    print(
        "\nper budget: (a) base dev PPL >= 1.25, (b) every run converged, (c) median capacity |effect| >= 2%, "
        f"(d) table <= {MAX_MINUTES} min"
    )
    for r in results:
        if "falls" not in r:
            print(f"  {r['budget']}: {r['why']}")
            continue
        marks = " ".join(
            f"{k[0]}:{'yes' if r[k] else 'NO'}" for k in ("a_headroom", "b_converged", "c_sensitive", "d_affordable")
        )
        print(
            f"  {r['budget']}: base PPL {r['base_ppl']:.3f}, converged {r['converged_runs']}/{r['runs']}, "
            f"sensitivity {r['sensitivity']:.1%}, table {r['table_minutes']:.0f} min -> {marks}"
            f"{'  ADMITTED' if r['admitted'] else ''}"
        )
    admitted = [r["budget"] for r in results if r.get("admitted")]
    print(f"\nsmallest admitted budget: {admitted[0] if admitted else 'none'}")


if __name__ == "__main__":
    main()
