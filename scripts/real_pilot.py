"""The `real` preset's pilot rule, committed before the pilot it reads: the seeds of each registered test and the
slices of the table that fit its budget, from the seed-to-seed noise of 4 base runs on pilot seeds (100-103, used
for nothing else) at the preset's budget. Nothing here looks at any row other than base.

    aiayn table3 --preset real --rows base --base-seeds 4 --first-seed 100 --data-dir DIR --out PILOT --report ''
    python scripts/real_pilot.py PILOT            # the rule's result as Markdown (--json: as JSON)

The rule:

1. **Noise.** Over the pilot seeds, the sample SD of log dev PPL and of dev BLEU at the final evaluation (the whole
   dev set, beam search), and each SD's upper 80% bound (chi-square, k - 1 degrees of freedom).
2. **Truth.** Each test is powered for the paper's own difference: log(paper row PPL / paper base PPL) for a `ppl`
   test, the paper's BLEU points for a `bleu` test; 0 for an equivalence (the paper's claim).
3. **Power** (normal approximation, one point): Welch two-sided at ALPHA / m (Bonferroni over the m registered tests:
   a lower bound on Holm's power) for `worse`/`better`; TOST at ALPHA / m for `equivalent`; n seeds against base's
   BASE_SEEDS, at the upper SD bound.
4. **Seeds.** The smallest n in MIN_SEEDS..MAX_SEEDS with power >= POWER; where none reaches it, MAX_SEEDS, and the
   test is stated as underpowered with its power (run, not dropped: its reason says what it tests).
5. **Budget.** A run's machine time is the median `wall_time_s` of the pilot's runs (two at once, as the table runs
   them), every row at base's cost (C1 and B1 cost less: the projection is an upper bound); the table's wall is the
   sum over its runs halved (two at once). Slices are taken whole in the registered order (SLICES) while the
   projected wall stays within MAX_HOURS; the first slice that does not fit, and every slice after it, is not run,
   said as such.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

from aiayn.ablations.predictions import predictions
from aiayn.ablations.table import load_rows

PRESET = "real"
PILOT_SEEDS = (100, 101, 102, 103)
BASE_SEEDS = 8
MIN_SEEDS, MAX_SEEDS = 3, 8
ALPHA = 0.05
POWER = 0.8
MAX_HOURS = 8.0
# the registered order (ablations/predictions.csv, each reason's "Slice N"): the tests that separate the paper from
# the naive predictors first, so that a table cut short still reports whole slices
SLICES = (("base", "E1"), ("D1", "D3"), ("A1", "B1", "C1"), ("A3",))


def pilot_runs(out: Path) -> list[dict]:
    """The pilot's completed base runs (metrics.json), seed by seed."""
    runs = []
    for seed in PILOT_SEEDS:
        path = out / PRESET / "multi30k" / "base" / f"seed{seed}" / "metrics.json"
        if path.is_file():
            metrics = json.loads(path.read_text())
            if metrics.get("status") == "completed":
                runs.append(metrics)
    return runs


def upper_sd(sd: float, k: int) -> float:
    """The upper 80% confidence bound of a normal SD estimated from k values (chi-square, k - 1 df)."""
    return sd * math.sqrt((k - 1) / stats.chi2.ppf(0.2, k - 1))


def truth(row: str, metric: str) -> float:
    """The paper's own difference of the row from base, oriented positive = worse: log PPL ratio, or BLEU points."""
    rows = load_rows()
    r, base = rows[row], rows["base"]
    if metric == "ppl":
        return math.log(r.paper_ppl / base.paper_ppl)
    return base.paper_bleu - r.paper_bleu


def power(pred, n: int, sd: float, m: int) -> float:
    """P(the registered test passes at one point), n seeds against BASE_SEEDS, seed SD `sd` in the test's scale."""
    se = sd * math.sqrt(1 / n + 1 / BASE_SEEDS)
    if pred.equivalence:
        margin = math.log1p(pred.margin) if pred.metric == "ppl" else pred.margin
        z = stats.norm.ppf(1 - ALPHA / m)
        return max(0.0, 2 * float(stats.norm.cdf(margin / se - z)) - 1)
    delta = truth(pred.row, pred.metric) * (1 if pred.worse else -1)
    return float(stats.norm.sf(stats.norm.ppf(1 - ALPHA / (2 * m)) - delta / se))


def rule(out: Path) -> dict:
    runs = pilot_runs(out)
    if len(runs) < 3:
        raise SystemExit(f"{out}: {len(runs)} completed pilot run(s) of seeds {PILOT_SEEDS}; the rule needs 3 or more")
    k = len(runs)
    sd = {
        "ppl": statistics.stdev(math.log(r["dev_ppl"]) for r in runs),
        "bleu": statistics.stdev(r["dev_bleu"] for r in runs),
    }
    sd_hi = {metric: upper_sd(v, k) for metric, v in sd.items()}
    registered = {row: p for row, p in predictions(PRESET).items() if p.scored}
    m = len(registered)
    tests = {}
    for row, pred in registered.items():
        n = next((n for n in range(MIN_SEEDS, MAX_SEEDS + 1) if power(pred, n, sd_hi[pred.metric], m) >= POWER), None)
        chosen = n or MAX_SEEDS
        tests[row] = {
            "metric": pred.metric,
            "predicted": pred.predicted,
            "truth": truth(row, pred.metric) if not pred.equivalence else 0.0,
            "seeds": chosen,
            "power": power(pred, chosen, sd_hi[pred.metric], m),
            "power_at_sd": power(pred, chosen, sd[pred.metric], m),
            "underpowered": n is None,
        }
    run_s = statistics.median(r["wall_time_s"] for r in runs)
    kept, hours, cut = [], 0.0, []
    for rows in SLICES:
        n_runs = sum(BASE_SEEDS if row == "base" else tests[row]["seeds"] for row in rows)
        more = n_runs * run_s / 2 / 3600
        if cut or hours + more > MAX_HOURS:
            cut.append({"rows": list(rows), "runs": n_runs, "hours": more})
            continue
        hours += more
        kept.append({"rows": list(rows), "runs": n_runs, "hours": more})
    return {
        "pilot_seeds": [r["seed"] for r in runs],
        "dev_ppl": [r["dev_ppl"] for r in runs],
        "dev_bleu": [r["dev_bleu"] for r in runs],
        "sd": sd,
        "sd_upper80": sd_hi,
        "tests": tests,
        "run_wall_s": run_s,
        "slices": kept,
        "cut": cut,
        "projected_hours": hours,
    }


def markdown(r: dict) -> str:
    lines = [
        f"# The `{PRESET}` pilot rule (scripts/real_pilot.py), on pilot seeds {', '.join(map(str, r['pilot_seeds']))}",
        "",
        f"- dev PPL {', '.join(f'{v:.3f}' for v in r['dev_ppl'])}; "
        f"dev BLEU {', '.join(f'{v:.2f}' for v in r['dev_bleu'])}",
        f"- SD of log dev PPL {r['sd']['ppl']:.4f} (upper 80%: {r['sd_upper80']['ppl']:.4f}); SD of dev BLEU "
        f"{r['sd']['bleu']:.3f} (upper 80%: {r['sd_upper80']['bleu']:.3f})",
        f"- a run's machine time (median wall, two at once): {r['run_wall_s']:.0f} s",
        "",
        "| test | metric | predicted | truth (paper) | seeds | power (upper SD) | power (SD) | |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row, t in r["tests"].items():
        lines.append(
            f"| {row} | {t['metric']} | {t['predicted']} | {t['truth']:+.4f} | {t['seeds']} | {t['power']:.2f} | "
            f"{t['power_at_sd']:.2f} | {'underpowered' if t['underpowered'] else ''} |"
        )
    lines += ["", f"Slices run ({r['projected_hours']:.2f} h projected of {MAX_HOURS:g}):"]
    lines += [f"- {', '.join(s['rows'])}: {s['runs']} runs, {s['hours']:.2f} h" for s in r["slices"]]
    lines += [f"- not run, over the budget: {', '.join(s['rows'])} ({s['runs']} runs)" for s in r["cut"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pilot", type=Path, help="the pilot's --out")
    parser.add_argument("--json", action="store_true", help="the result as JSON")
    args = parser.parse_args(argv)
    result = rule(args.pilot)
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
