#!/usr/bin/env bash
# Briefly trained models for the CTranslate2 speed comparison (issue 32 item 9): speed needs the shape, not quality.
set -euo pipefail
cd /work/frozen/ct2
export AIAYN_CACHE=/work/results/cache
D=/work/shared/data/multi30k
[ -d "$D" ] || D=$(cd /work/main/../shared/data/multi30k && pwd)
git rev-parse HEAD
# small: d_model 256, N 3 (the small preset as it is), 300 steps
python -m aiayn train --preset small --row base --data multi30k --data-dir "$D" --max-steps 300 --val-every 300 \
    --ckpt-every 300 --no-progress --accelerator cpu --out /work/results/ct2/runs
# paper width: d_model 512, d_ff 2048, h 8, N 6 (vocabulary 8000 of the small preset), 300 steps
python -m aiayn train --preset small --row base --data multi30k --data-dir "$D" --max-steps 300 --val-every 300 \
    --ckpt-every 300 --no-progress --accelerator cpu --set "d_model=512 d_ff=2048 h=8 N=6 d_k=64 d_v=64" \
    --out /work/results/ct2/runs-paperwidth
