#!/usr/bin/env bash
# Issue 32 item 9: aiayn's beam search against CTranslate2 fp32 and int8 at the small and paper widths, on a quiet
# machine (nothing else running), from /work/main at the commit printed first. Output: ct2-small.json, ct2-paper.json.
set -euo pipefail
cd /work/main
export AIAYN_CACHE=/work/results/cache
git log --oneline -1
lscpu | grep "Model name"
zcat ../shared/data/multi30k/val.en.gz > /tmp/val.en
zcat ../shared/data/multi30k/val.de.gz > /tmp/val.de
R=/work/results/ct2
start=$(date +%s)
python scripts/bench_ct2.py --run $R/runs/small/multi30k/base/seed0 --src /tmp/val.en --ref /tmp/val.de \
    --threads 2 --batching same-length --batching sorted --json $R/ct2-small.json
echo "== small: $(( $(date +%s) - start )) s"
start=$(date +%s)
python scripts/bench_ct2.py --run $R/runs-paperwidth/laptop/multi30k/base/seed0 --src /tmp/val.en --ref /tmp/val.de \
    --sentences 300 --threads 2 --batching same-length --batching sorted --json $R/ct2-paper.json
echo "== paper width: $(( $(date +%s) - start )) s"
