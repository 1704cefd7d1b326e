"""The last-quarter drop each row of a pilot sweep would have at shorter step budgets: choose a preset's budget by
the convergence rule (reports/verdicts.py) before the runs that are scored; and, with `--effects-at T`, each row's
dev-PPL difference from base at T, for a scored set chosen by a power rule that does not look at signs.

    aiayn table3 --max-steps 2000 --first-seed 100 --out pilot --report ''     # pilot seeds, used for nothing else
    python scripts/budget_from_pilot.py pilot --budgets 1000:2000:100 --margin 0.035
    python scripts/budget_from_pilot.py pilot pilot3 --rule line --budgets 1200:1200:100 --effects-at 1200

The learning rate schedule (module.noam_lr) does not depend on the budget, nor does the data order, so the first
T steps of a longer run are the T-step run: its validation curve cut at T gives the T-step run's last-quarter drop
through the report's own function (`verdicts.convergence_drop`, by `--rule`). Prints, per run, the drop in percent
at each budget, and the budgets at which every run falls by at most `--margin` (below the 5% rule, so that a seed set
that was not in the pilot still converges). The budget has to be a multiple of the preset's val_every for the
cut to be exact. `--effects-at T`: per row, the mean over the pilot seeds of its dev PPL at T against base's, in
percent, and whether its size (sign ignored) reaches `--min-effect`. Not run by the tests.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from aiayn.reports.runs import read_curve
from aiayn.reports.verdicts import CONVERGENCE_RULES, convergence_drop


def _curves(pilots: list[Path]) -> dict[tuple[str, int], pd.DataFrame]:
    """(row, seed) -> dev PPL curve of every run under the pilot dirs (the first dir wins a repeated run)."""
    out = {}
    for pilot in pilots:
        for run in sorted(p.parent for p in pilot.glob("*/*/*/seed*/metrics.json")):
            curve = read_curve(run, "val/ppl")
            if not curve.empty:
                out.setdefault((run.parent.name, int(run.name[4:])), curve)
    return out


def drops(curves: dict[tuple[str, int], pd.DataFrame], budgets: list[int], rule: str = "endpoints") -> pd.DataFrame:
    """One line per run (row, seed) of `curves` (`_curves`), one column per budget: the last-quarter drop of dev
    PPL by `rule` (NaN past the run's own length)."""
    lines = {}
    for key, curve in curves.items():
        # Lightning logs a validation after optimizer step s as step s - 1; a T-step run's last is T - 1
        lines[key] = {
            t: convergence_drop(curve[curve["step"] <= t - 1], rule) if curve["step"].max() >= t - 1 else math.nan
            for t in budgets
        }
    return pd.DataFrame(lines).T.rename_axis(["row", "seed"])


def effects(curves: dict[tuple[str, int], pd.DataFrame], at: int) -> pd.Series:
    """Row -> 100 * (mean dev PPL at step `at` over the row's pilot seeds / base's - 1)."""
    ppl = {key: c.loc[c["step"] == at - 1, "val/ppl"] for key, c in curves.items()}
    ppl = pd.Series({k: float(v.iloc[0]) for k, v in ppl.items() if len(v)}).rename_axis(["row", "seed"])
    means = ppl.groupby(level="row").mean()
    return (100 * (means / means["base"] - 1)).drop("base")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pilot", type=Path, nargs="+", help="the pilot sweeps' --out (one or more)")
    ap.add_argument("--rule", default="endpoints", choices=CONVERGENCE_RULES, help="the convergence rule")
    ap.add_argument("--effects-at", type=int, help="print each row's dev-PPL difference from base at this step")
    ap.add_argument("--min-effect", type=float, default=0.02, help="with --effects-at: the size a row must reach")
    ap.add_argument("--budgets", default="1000:2000:100", help="FIRST:LAST:STEP, optimizer steps")
    ap.add_argument("--margin", type=float, default=0.035, help="the largest drop a budget may leave (fraction)")
    args = ap.parse_args()
    first, last, step = (int(x) for x in args.budgets.split(":"))
    curves = _curves(args.pilot)  # read once, for the drops and the effects
    table = drops(curves, list(range(first, last + 1, step)), args.rule)
    print(f"last-quarter fall of dev PPL in %, rule {args.rule}:")
    print((100 * table).round(1).to_string())
    ok = [t for t in table.columns if (table[t] <= args.margin).all()]
    print(f"budgets at which every run falls by at most {args.margin:.1%}: {ok or 'none'}")
    if args.effects_at:
        fell = table[args.effects_at].groupby(level="row").max() if args.effects_at in table else None
        print(f"dev PPL against base at step {args.effects_at}, mean over pilot seeds, %:")
        for row, d in effects(curves, args.effects_at).items():
            big = abs(d) >= 100 * args.min_effect
            conv = fell is not None and row in fell and fell[row] <= args.margin
            verdict = "scored" if big and conv else "not scored"
            print(
                f"  {row}: {d:+.2f}  size {'>=' if big else '<'} {args.min_effect:.0%}; "
                f"{'converged' if conv else 'NOT converged'} within the margin -> {verdict}"
            )


if __name__ == "__main__":
    main()
