"""The wide table's pilot rules (BENCHMARKS.md, "The wide table"), committed before any pilot they
read: what a pilot on pilot seeds may choose for the `wide` preset, and nothing else.

    python scripts/wide_pilot.py lr PILOT_RUN         # 1. the CPU pilot: keep the schedule's peak, or halve it
    python scripts/wide_pilot.py budget PILOT_OUT     # 2. the GPU pilot: the budget, and the power it leaves
    python scripts/wide_pilot.py watch PILOT_OUT --pid PID  # 2. stop the pilot (PID) once rule 2's budget is settled
    python scripts/wide_pilot.py slices               # 3. the order a GPU call runs the registered tests in

1. **The learning rate, on 2 CPU cores** (a 30-epoch run of this regime is about 8 s a step here, 3.6 hours, so a
   CPU pilot can check the schedule's peak and no more). PILOT_RUN is one run directory of base on pilot seed 100,
   trained through the warmup's peak and past it (`--max-steps 320`; the schedule and the data order do not depend
   on the budget, so these are the first 320 steps of the 1600-step run). The preset's learning rate (lr_factor
   0.25: the paper's peak, 7.0e-4, at warmup 250) is KEPT when (a) every logged training loss is finite, (b) dev PPL
   at the validation after step 300 is below its value after step 150, and (c) the mean training loss over the
   logged steps 271-320 is below its mean over steps 201-250 (still learning after the peak at 250). Otherwise the
   factor HALVES (0.125) and the pilot is run again at it.
2. **The budget, on the GPU** (`scripts/gpu-wide.sh`'s first stage). PILOT_OUT is the `--out` of `aiayn table3
   --preset wide --rows base --base-seeds 4 --first-seed 100` (4 pilot seeds, the preset's 1600 steps). The budget
   is the smallest B of BUDGETS at which every pilot run falls by at most MARGIN (3.5%) over its last quarter by the
   `line` rule (reports/verdicts.py; below the 5% that judges the scored runs, so fresh seeds converge too; a dev
   PPL that rises, as an overfitting run's does, passes); none: 1600, said as such. The scored runs validate every
   `val_every(B)` steps (at most B / 32, dividing B), so that every point of the stability rule is testable (at the
   preset's 50, a budget under 1600 leaves some point without three validations near it). The seeds are the
   registration's (ablations/predictions.csv); the rule then states, before any scored run, the seed-to-seed SD of
   log dev PPL at B over the pilot seeds (the median of the three validations nearest B, the preset's reading),
   its upper 80% bound (chi-square, 3 degrees of freedom), and each test's power at both, taking the paper's own
   difference as the truth (normal approximation, one point: Welch two-sided at 0.05 for `worse`/`better`, TOST at
   0.05 for `equivalent`; the report's three-point stability rule and Holm's correction make the real power lower),
   and the expected scores of the registration and of both naive baselines.
   **The pilot stops once the rule's answer is settled** (amended before any GPU pilot ran): B's fall reads only
   the validations up to step B - 1, and the budgets below B were refused on their own validations, so B is final
   once every pilot run has logged them; the noise at B reads the three validations nearest B, final once a run has
   logged a step farther past B than the farthest of them. `watch` reads the pilot's curves as they are written and
   stops its sweep (SIGTERM; the runs stop cleanly, curves kept) at that point: the rule then reads the same
   validations it would read from the whole 1600-step pilot, and gives the same budget, SD and power. Where no
   budget is admitted yet, nothing is settled and the pilot trains its 1600 steps.

3. **The slices** (SLICES): one GPU call of 8 minutes cannot train the whole table (17 tests and a control, 108
   runs), so it runs the registered tests slice by slice in a fixed order, the tests where the paper differs from
   both naive baselines first (in two slices of two, each equivalence with a row of its own knob, which it needs
   beside it: A1 and the control no-pe, 32 runs with base's 8; then C1 and D1), and reports the slices that finished
   whole; a slice the call's time cut is reported as not run. A later call given the budget (BUDGET=B,
   FIRST_SLICE=K) trains base again with the slices from K on.

Only these rules choose anything, and only the schedule's factor and the budget; the scored rows, their predictions,
margins and seeds are ablations/predictions.csv as committed before either pilot.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

from aiayn.ablations.predictions import predictions
from aiayn.ablations.presets import get_preset, scale
from aiayn.ablations.table import load_rows
from aiayn.lightning_modules.transformer.config import TransformerConfig
from aiayn.reports.runs import read_curve
from aiayn.reports.verdicts import convergence_drop, point_steps, point_value

PRESET = "wide"
ALPHA = 0.05
# 1. the learning rate
PEAK_STEPS, EARLY, LATE = (150, 300), (201, 250), (271, 320)
# 2. the budget
BUDGETS = tuple(range(400, 1601, 100))
MARGIN = 0.035
RULE = "line"
BASE_SEEDS = 8  # the preset's base_seeds, against which each row is tested
PILOT_SEEDS = (100, 101, 102, 103)
# 3. the order a GPU call runs the registered tests in (scripts/gpu-wide.sh), each slice whole or reported as not run:
# first the tests where the paper differs from both naive baselines, then those where it differs from "every change
# hurts", then those where all three predict the same; within a slice, the registration's order
SLICES = (
    # each equivalence with a row of its own knob: it counts only where that row is significantly different as
    # predicted in the same table (reports/verdicts.py, assay sensitivity), so a slice of equivalences alone cannot
    # pass; no-pe is a control (never scored), the only row beside E1 that varies the positional encoding
    ("paper v both baselines: heads, positions; A1 and no-pe for their sensitivity", ("A3", "E1", "A1", "no-pe")),
    ("paper v both baselines: depth, dropout; C1 and D1 for their sensitivity", ("C3", "D2", "C1", "D1")),
    ("paper v every change hurts", ("C5", "C7", "big")),
    ("all three agree", ("A2", "A4", "B1", "B2", "C2", "C4", "C6")),
)


def _logged(run: Path, metric: str):
    """`step` and `metric` wherever a line logged it, a logged NaN kept (read_curve drops it with the lines that did
    not log the metric)."""
    import pandas as pd

    frames = []
    for path in sorted((run / "logs").glob("version_*/metrics.csv")):
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
        if metric in df.columns:
            df = df[df[metric] != ""]
            frames.append(pd.DataFrame({"step": df["step"].astype(int), metric: df[metric].astype(float)}))
    if not frames:
        return pd.DataFrame({"step": pd.Series(dtype="int64"), metric: pd.Series(dtype="float64")})
    return pd.concat(frames).drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def lr_rule(run: Path) -> dict:
    """Rule 1 on one pilot run directory: {"keep": bool, "checks": {...}, the numbers it read}."""
    loss = _logged(run, "train/loss")
    ppl = read_curve(run, "val/ppl").set_index("step")["val/ppl"]
    # Lightning logs a validation after optimizer step s as step s - 1
    at = {s: float(ppl[s - 1]) if s - 1 in ppl.index else math.nan for s in PEAK_STEPS}
    early = loss[(loss.step + 1 >= EARLY[0]) & (loss.step + 1 <= EARLY[1])]["train/loss"]
    late = loss[(loss.step + 1 >= LATE[0]) & (loss.step + 1 <= LATE[1])]["train/loss"]
    finite = bool(len(loss)) and bool(np.isfinite(loss["train/loss"]).all())
    early, late = early.dropna(), late.dropna()
    checks = {
        "(a) every logged training loss finite": finite,
        f"(b) dev PPL after step {PEAK_STEPS[1]} below its value after step {PEAK_STEPS[0]}": at[PEAK_STEPS[1]]
        < at[PEAK_STEPS[0]],
        f"(c) mean training loss over steps {LATE[0]}-{LATE[1]} below its mean over {EARLY[0]}-{EARLY[1]}": len(late)
        > 0
        and len(early) > 0
        and float(late.mean()) < float(early.mean()),
    }
    return {
        "keep": all(checks.values()),
        "checks": checks,
        "dev_ppl": at,
        "train_loss_means": [float(early.mean()) if len(early) else None, float(late.mean()) if len(late) else None],
        "last_step": int(loss.step.max()) + 1 if len(loss) else 0,
    }


def _pilot_curves(out: Path) -> dict[int, dict[int, float]]:
    """Seed -> {logged step: dev PPL} for every base run under a pilot's --out, finished or stopped (a run stopped by
    `watch` has its curve and no metrics.json)."""
    curves = {}
    for logs in sorted(out.glob("*/*/base/seed*/logs")):
        curve = read_curve(logs.parent, "val/ppl")
        if not curve.empty:
            curves[int(logs.parent.name[4:])] = dict(zip(curve.step, curve["val/ppl"], strict=True))
    return curves


def choose_budget(curves: dict[int, dict[int, float]], budgets=BUDGETS, margin=MARGIN) -> tuple[int, bool, dict]:
    """(B, whether the rule admitted it, each budget's largest last-quarter fall) over the pilot's runs; a budget some
    run has not reached yet has no fall (NaN) and is not admitted."""
    import pandas as pd

    falls = {}
    for b in budgets:
        runs = [pd.DataFrame({"step": list(c), "val/ppl": list(c.values())}) for c in curves.values()]
        cut = [r[r.step <= b - 1] for r in runs if r.step.max() >= b - 1]
        falls[b] = max(convergence_drop(r, RULE) for r in cut) if len(cut) == len(runs) and cut else math.nan
    admitted = [b for b in budgets if falls[b] <= margin]
    return (admitted[0], True, falls) if admitted else (budgets[-1], False, falls)


def settled(curves: dict[int, dict[int, float]], seeds, budgets=BUDGETS, margin=MARGIN) -> int | None:
    """The budget rule 2 chooses from `curves` (the pilot's runs so far, `seeds` all of them) once no later validation
    can change it or the noise it reads there (the module's docstring, rule 2); None until then."""
    if set(curves) != set(seeds):
        return None
    budget, admitted, _ = choose_budget(curves, budgets, margin)
    if not admitted:
        return None
    reading = get_preset(PRESET).stability
    for c in curves.values():
        read = point_steps(c, budget, 1.0, reading)
        # a later step (past the last logged) is farther from B than every step read: none can displace them
        if point_value(c, budget, 1.0, reading) is None or max(c) + 1 - budget < max(abs(s + 1 - budget) for s in read):
            return None
    return budget


def watch(out: Path, pid: int, seeds, budgets=BUDGETS, margin=MARGIN, every: float = 5.0) -> tuple[int | None, dict]:
    """Read the pilot's curves under `out` every `every` seconds while process `pid` (its sweep) runs; once rule 2's
    budget is settled, SIGTERM `pid`. (The budget, None where the pilot ended first; the curves last read.)"""
    curves: dict = {}
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None, curves
        curves = _pilot_curves(out)
        budget = settled(curves, seeds, budgets, margin)
        if budget is not None:
            os.kill(pid, signal.SIGTERM)
            return budget, curves
        time.sleep(every)


def val_every(budget: int) -> int:
    """The scored runs' validation interval at `budget`: the largest of 50, 25, 20, 10, 5, 2, 1 steps that divides it
    (so that a validation falls on the last step) and is at most budget / 32, so that the median-of-three reading
    (reports/verdicts.py) finds three validations within a sixteenth of the budget at 75%, 87.5% and 100%."""
    return max(v for v in (50, 25, 20, 10, 5, 2, 1) if budget % v == 0 and v <= budget / 32)


def _paper_delta(row: str) -> float:
    """The paper's own relative difference in dev PPL from base, as a log ratio (the truth the power assumes)."""
    rows = load_rows()
    return math.log(rows[row].paper_ppl / rows["base"].paper_ppl)


def params(row: str) -> int:
    preset = get_preset(PRESET)
    knobs = scale(load_rows()[row], preset)
    model = {k: v for k, v in knobs.items() if k in TransformerConfig.__dataclass_fields__}
    return TransformerConfig(**model, vocab_size=preset.vocab_size, max_len=preset.positions).params()


def power(pred, sd: float) -> dict:
    """P(the registered test passes), P(significantly worse), P(significantly better) at one point, the paper's
    difference as the truth, `pred.seeds` against BASE_SEEDS, the seed SD `sd` of log dev PPL (normal
    approximation)."""
    delta = _paper_delta(pred.row)
    se = sd * math.sqrt(1 / pred.seeds + 1 / BASE_SEEDS)
    z2, z1 = stats.norm.ppf(1 - ALPHA / 2), stats.norm.ppf(1 - ALPHA)
    worse = float(stats.norm.sf(z2 - delta / se))
    better = float(stats.norm.cdf(-z2 - delta / se))
    if pred.equivalence:
        m = math.log1p(pred.margin)
        passes = max(0.0, float(stats.norm.cdf((m - delta) / se - z1) - stats.norm.cdf((-m - delta) / se + z1)))
    else:
        passes = worse if pred.worse else better
    return {"pass": passes, "worse": worse, "better": better}


def budget_rule(out: Path, budgets=BUDGETS, margin=MARGIN) -> dict:
    """Rule 2 on a GPU pilot's --out: the budget, the noise at it, each test's power and the expected scores
    (`budgets`, `margin`: the rule's; others only for the smoke run of scripts/gpu-wide.sh)."""
    curves = _pilot_curves(out)
    if len(curves) < 2:
        raise SystemExit(f"{out}: {len(curves)} pilot run(s) with validations; the rule needs the 4 pilot seeds")
    budget, admitted, falls = choose_budget(curves, budgets, margin)
    reading = get_preset(PRESET).stability
    at_b = [point_value(c, budget, 1.0, reading) for c in curves.values()]
    logs = np.log([v for v in at_b if v is not None])
    k = len(logs)
    if k < 2:
        raise SystemExit(f"{out}: {k} pilot run(s) with validations near step {budget}; the noise needs 2 or more")
    sd = float(np.std(logs, ddof=1))
    sd_hi = sd * math.sqrt((k - 1) / stats.chi2.ppf(0.2, k - 1))
    base_params = params("base")
    tests, expected = [], {"registration": 0.0, "every_change_hurts": 0.0, "more_parameters_help": 0.0}
    for row, pred in predictions(PRESET).items():
        if not pred.scored:
            continue
        p, p_hi = power(pred, sd), power(pred, sd_hi)
        mph = "better" if params(row) > base_params else "worse"
        expected["registration"] += p["pass"]
        expected["every_change_hurts"] += p["worse"]
        expected["more_parameters_help"] += p[mph]
        paper = math.expm1(_paper_delta(row))
        tests.append(
            {
                "row": row,
                "predicted": pred.predicted,
                "seeds": pred.seeds,
                "paper": paper,
                "power": p["pass"],
                "power_at_sd_upper": p_hi["pass"],
                "more_parameters_help": mph,
            }
        )
    return {
        "budget": budget,
        "val_every": val_every(budget),
        "admitted": admitted,
        "margin": margin,
        "falls": falls,
        "pilot_seeds": sorted(curves),
        "dev_ppl_at_budget": at_b,
        "sd_log_ppl": sd,
        "sd_log_ppl_upper80": sd_hi,
        "tests": tests,
        "expected": expected,
    }


def judge(report: Path) -> str:
    """The registered verdicts of a wide sweep run at the pilot's budget, from its report's per-run CSV and curves
    (scripts/rejudge.py, as a reader re-derives them): the report itself calls runs trained with --max-steps under
    the preset's 1600 a look, so the table at the budget rule 2 chose is judged here, by the same rules, each run's
    stability points at fractions of the steps it trained. Markdown: the score, both baselines, each test's line."""
    import importlib.util

    import pandas as pd

    from aiayn.reports import verdicts

    spec = importlib.util.spec_from_file_location("rejudge", Path(__file__).with_name("rejudge.py"))
    rejudge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rejudge)

    needed = [report / f"table3-{PRESET}-{kind}.csv" for kind in ("runs", "curves")]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise SystemExit(f"{missing[0]} does not exist: pass the report folder of a wide sweep (aiayn report --out)")
    runs, curves = (pd.read_csv(p) for p in needed)
    cells = [rejudge.cell(runs, curves, PRESET, params={row: params(row) for row in runs["row"].unique()})]
    done = runs[runs["status"] == "completed"]
    ran = set(done["row"]) - {"base"}

    def sliced(
        judged: dict,
    ) -> dict:  # the tests of the slices that ran (Holm's family: the registered 17, the control)
        return {key: v for key, v in judged.items() if key[1] in ran}

    family = sliced(verdicts.judge_cells(cells))
    s = verdicts.score(family, {n: sliced(j) for n, j in verdicts.judge_baselines(cells).items()})
    budgets = sorted({int(b) for b in done["steps"]})
    lines = [
        f"# The wide table at the pilot's budget ({', '.join(map(str, budgets))} steps), judged as registered",
        "",
        f"Scored {s['scored']} of the {len(scored_rows())} registered (the slices that ran; Holm's family is "
        "all 17 and the control no-pe, as registered): "
        f"**the registration passes {s['passed']}**, "
        + ", ".join(f'"{b["label"]}" {b["passed"]}' for b in s["baselines"].values())
        + ".",
        "",
        "| test | predicted | verdict | why |",
        "| --- | --- | --- | --- |",
    ]
    for (_, row), v in family.items():
        if v.predicted in ("worse", "better", "equivalent", "control") and v.verdict != "not run":
            lines.append(f"| {row} | {v.predicted} | {v.verdict} | {verdicts.why(v)} |")
    return "\n".join(lines) + "\n"


def scored_rows() -> list[str]:
    return [row for row, p in predictions(PRESET).items() if p.scored]


def _print_budget(r: dict) -> None:
    reached = {b: f for b, f in r["falls"].items() if not math.isnan(f)}
    falls = ", ".join(f"{b}: {100 * f:.1f}%" for b, f in reached.items())
    if len(reached) < len(r["falls"]):
        falls += f"; {len(r['falls']) - len(reached)} longer budgets not reached (the pilot stopped there)"
    print(f"largest last-quarter fall of dev PPL over the pilot runs ({RULE} rule), by budget: {falls}")
    how = "admitted" if r["admitted"] else f"NOT admitted: no budget converges within {r['margin']:.1%}; the longest"
    print(f"budget: {r['budget']} steps ({how}); the scored runs validate every {r['val_every']} steps")
    values = ", ".join("none" if v is None else f"{v:.3f}" for v in r["dev_ppl_at_budget"])
    print(f"pilot seeds {r['pilot_seeds']}: dev PPL at the budget {values}")
    print(f"seed SD of log dev PPL {100 * r['sd_log_ppl']:.2f}% (upper 80% bound {100 * r['sd_log_ppl_upper80']:.2f}%)")
    print("| test | predicted | seeds (base 8) | paper | power | power at the SD's upper bound | more params help |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for t in r["tests"]:
        print(
            f"| {t['row']} | {t['predicted']} | {t['seeds']} | {100 * t['paper']:+.1f}% | {t['power']:.2f} | "
            f"{t['power_at_sd_upper']:.2f} | {t['more_parameters_help']} |"
        )
    e = r["expected"]
    print(
        f"expected of {len(r['tests'])}, the paper's numbers taken as the truth: the registration "
        f"{e['registration']:.1f}, 'every change hurts' {e['every_change_hurts']:.1f}, 'more parameters help' "
        f"{e['more_parameters_help']:.1f}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="rule", required=True)
    lr = sub.add_parser("lr", help="rule 1, the CPU pilot: keep the schedule's peak or halve it")
    lr.add_argument("run", type=Path, help="the pilot's run directory (base, seed 100)")
    bud = sub.add_parser("budget", help="rule 2, the GPU pilot: the budget and the power it leaves")
    bud.add_argument("out", type=Path, help="the pilot sweep's --out")
    bud.add_argument("--json", type=Path, help="also write the result here")
    see = sub.add_parser("watch", help="rule 2 while the pilot trains: stop it (SIGTERM) once the budget is settled")
    see.add_argument("out", type=Path, help="the pilot sweep's --out")
    see.add_argument("--pid", type=int, required=True, help="the pilot sweep's process")
    see.add_argument("--every", type=float, default=5.0, help="seconds between reads of the curves")
    for p in (bud, see):
        p.add_argument("--budgets", help="FIRST:LAST:STEP instead of the rule's (the smoke run only)")
        p.add_argument("--margin", type=float, default=MARGIN, help="instead of the rule's (the smoke run only)")
    sub.add_parser("slices", help="the registered slices, one line each: NAME<TAB>ROW,ROW,...")
    jud = sub.add_parser("judge", help="the registered verdicts of a report's runs at the pilot's budget")
    jud.add_argument("report", type=Path, help="the report folder of a wide sweep (table3-wide-runs.csv, -curves.csv)")
    args = ap.parse_args(argv)
    if args.rule == "judge":
        print(judge(args.report), end="")
        return
    if args.rule == "slices":
        for name, rows in SLICES:
            print(f"{name}\t{','.join(rows)}")
        return
    if args.rule == "lr":
        r = lr_rule(args.run)
        for name, ok in r["checks"].items():
            print(f"{'yes' if ok else 'NO '} {name}")
        print(f"dev PPL {r['dev_ppl']}; training loss means {r['train_loss_means']}; pilot ran {r['last_step']} steps")
        print("KEEP lr_factor 0.25" if r["keep"] else "HALVE lr_factor to 0.125 and run the pilot again")
        return
    budgets = BUDGETS
    if args.budgets:
        first, last, step = (int(x) for x in args.budgets.split(":"))
        budgets = tuple(range(first, last + 1, step))
    if args.rule == "watch":
        budget, curves = watch(args.out, args.pid, PILOT_SEEDS, budgets, args.margin, args.every)
        steps = {seed: max(c) + 1 for seed, c in sorted(curves.items())}
        print(f"settled: budget {budget} at steps {steps}" if budget else "not settled before the pilot ended")
        return
    r = budget_rule(args.out, budgets, args.margin)
    _print_budget(r)
    if args.json:
        args.json.write_text(json.dumps(r, indent=1, default=float))


if __name__ == "__main__":
    sys.exit(main())
