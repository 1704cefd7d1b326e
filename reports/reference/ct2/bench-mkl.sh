#!/usr/bin/env bash
# The same measurements with CTranslate2 told to use Intel MKL and AVX512 on this AMD CPU (by default it picks
# oneDNN SGEMM, unpacked, and AVX2 on a non-Intel CPU: CT2_VERBOSE=1 prints its choice). Quiet machine.
set -euo pipefail
cd /work/main
export AIAYN_CACHE=/work/results/cache CT2_USE_MKL=1 CT2_FORCE_CPU_ISA=AVX512
git log --oneline -1
R=/work/results/ct2
start=$(date +%s)
python scripts/bench_ct2.py --run $R/runs/small/multi30k/base/seed0 --src /tmp/val.en --ref /tmp/val.de \
    --threads 2 --batching same-length --batching sorted --json $R/ct2-small-mkl.json
echo "== small, MKL: $(( $(date +%s) - start )) s"
start=$(date +%s)
python scripts/bench_ct2.py --run $R/runs-paperwidth-step1/laptop/multi30k/base/seed0 --src /tmp/val.en --ref /tmp/val.de \
    --sentences 100 --threads 2 --batching same-length --batching sorted --json $R/ct2-paper-step1-mkl.json
echo "== paper width (step 1), MKL: $(( $(date +%s) - start )) s"
