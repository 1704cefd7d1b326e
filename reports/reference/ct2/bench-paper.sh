#!/usr/bin/env bash
# Issue 32 item 9 at the paper width: the 60-step model ended every output at once (0 words), so this times a model
# one step from its initialization, whose outputs run to the length limit (source + 50): the decoder's step at
# d_model 512, N 6, not a translation workload. Quiet machine, from /work/main at the commit printed first.
set -euo pipefail
cd /work/main
export AIAYN_CACHE=/work/results/cache
git log --oneline -1
lscpu | grep "Model name"
R=/work/results/ct2
start=$(date +%s)
python scripts/bench_ct2.py --run $R/runs-paperwidth-step1/laptop/multi30k/base/seed0 --src /tmp/val.en --ref /tmp/val.de \
    --sentences 100 --threads 2 --batching same-length --batching sorted --json $R/ct2-paper-step1.json
echo "== paper width (step 1): $(( $(date +%s) - start )) s"
