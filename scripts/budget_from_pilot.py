"""The last-quarter drop each row of a pilot sweep would have at shorter step budgets: choose a preset's budget by
the convergence rule (reports/verdicts.py) before the runs that are scored.

    aiayn table3 --max-steps 2000 --first-seed 100 --out pilot --report ''     # pilot seeds, used for nothing else
    python scripts/budget_from_pilot.py pilot --budgets 1000:2000:100 --margin 0.035

The learning rate schedule (module.noam_lr) does not depend on the budget, nor does the data order, so the first
T steps of a longer run are the T-step run: its validation curve cut at T gives the T-step run's last-quarter drop
through the report's own function (`verdicts.last_quarter_drop`). Prints, per run, the drop in percent at each
budget, and the budgets at which every run falls by at most `--margin` (below the 5% rule, so that a seed set
that was not in the pilot still converges). The budget has to be a multiple of the preset's val_every for the
cut to be exact. Not run by the tests.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from aiayn.reports.runs import read_curve
from aiayn.reports.verdicts import last_quarter_drop


def drops(pilot: Path, budgets: list[int]) -> pd.DataFrame:
    """One line per finished run (row, seed) under `pilot`, one column per budget: the last-quarter drop of dev
    PPL (NaN past the run's own length)."""
    lines = {}
    for run in sorted(p.parent for p in pilot.glob("*/*/*/seed*/metrics.json")):
        curve = read_curve(run, "val/ppl")
        if curve.empty:
            continue
        # Lightning logs a validation after optimizer step s as step s - 1; a T-step run's last is T - 1
        lines[(run.parent.name, int(run.name[4:]))] = {
            t: last_quarter_drop(curve[curve["step"] <= t - 1]) if curve["step"].max() >= t - 1 else float("nan")
            for t in budgets
        }
    return pd.DataFrame(lines).T.rename_axis(["row", "seed"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pilot", type=Path, help="the pilot sweep's --out")
    ap.add_argument("--budgets", default="1000:2000:100", help="FIRST:LAST:STEP, optimizer steps")
    ap.add_argument("--margin", type=float, default=0.035, help="the largest drop a budget may leave (fraction)")
    args = ap.parse_args()
    first, last, step = (int(x) for x in args.budgets.split(":"))
    table = drops(args.pilot, list(range(first, last + 1, step)))
    print((100 * table).round(1).to_string())
    ok = [t for t in table.columns if (table[t] <= args.margin).all()]
    print(f"budgets at which every run falls by at most {args.margin:.1%}: {ok or 'none'}")


if __name__ == "__main__":
    main()
