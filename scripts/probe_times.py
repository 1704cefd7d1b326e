"""A timing probe's per-run times, from the metrics.json of its runs, as the CSV scripts/project_budget.py reads.

    python scripts/probe_times.py PROBE_OUT > reports/reference/pilots/evidence-v6-probe-times.csv

One line per completed run: preset, row, seed, steps trained, training seconds, final evaluation's seconds, the
run's wall seconds, the commit and whether its tree was dirty. Read for times only (a probe's short runs say
nothing of the rows' results).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

COLUMNS = ("preset", "row", "seed", "steps", "train_time_s", "eval_time_s", "wall_time_s", "commit", "dirty")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the probe's --out folder")
    args = ap.parse_args()
    lines = []
    for path in sorted(Path(args.out).rglob("metrics.json")):
        m = json.loads(path.read_text(encoding="utf-8"))
        if m.get("status") == "completed" and m.get("kind", "table3") == "table3":
            lines.append([m.get(k) for k in COLUMNS])
    lines.sort(key=lambda x: (x[0], x[1], x[2]))
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(lines)


if __name__ == "__main__":
    main()
