#!/usr/bin/env bash
# scripts/gpu-check.sh: aiayn's GPU paths on ONE GPU in one call of at most 8 minutes, with no network.
#
#   OUT=/tmp/gpu-check bash scripts/gpu-check.sh              # on the GPU machine, from the repository's root
#   GPU_CHECK_SMOKE=1 OUT=/tmp/gpu-check bash scripts/gpu-check.sh   # the same stages on a CPU, small (minutes)
#
# It runs the project as it stands in this checkout (python -m aiayn from the root; no install needed beyond the
# packages of pyproject.toml) and writes only under $OUT: summary.md (each stage's result and time) and each
# stage's JSON and log. Stages, each bounded by `timeout` so that the whole call stays within 480 s:
#   1 doctor     `aiayn doctor` (cuda, bf16, sdpa, bf16_loss, syncs with the progress bar on, throughput, translate;
#                ddp and resume need two GPUs and say so)                                        <= 150 s
#   2 bench      `aiayn bench --config paper` eager, then --compile model: tokens/s and MFU       <= 150 s
#   3 trainer    `aiayn bench --trainer`: Lightning's Trainer beside the bare step (tiny, paper)  <= 90 s
#   4 table      `aiayn table3 --preset tiny --rows base,A1 --max-steps 300` on the GPU: a few hundred steps of a
#                small table, its report and verdict                                             <= 90 s
# docs/training.md ("Checking a GPU node") says how to read the results; BENCHMARKS.md carries them.
set -u
OUT=${OUT:?OUT must be set: the folder for the results}
SMOKE=${GPU_CHECK_SMOKE:-0}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
SUM="$OUT/summary.md"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
export AIAYN_CACHE=${AIAYN_CACHE:-$OUT/cache}
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
note() { echo "$*" | tee -a "$SUM"; }
stage() {  # stage NAME LIMIT_S COMMAND...: run it under its limit, log it, note its status and time
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  note "| $name | $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") | $(( $(date +%s) - t0 )) s | $name.log |"
}

if [ "$SMOKE" = 1 ]; then
  DEVICE=cpu; BENCH=(--config tiny --steps 1 --trials 1 --warmup 1 --decode-sentences 4); STEPS=20
  TRAINER=(--trainer-config tiny); DOCTOR=(--check bf16 --check throughput --check translate --steps 1)
else
  DEVICE=cuda; BENCH=(--config paper --steps 3 --trials 3); STEPS=300
  TRAINER=(--trainer-config tiny --trainer-config paper); DOCTOR=()
fi

: > "$SUM"
note "# aiayn GPU check ($(date -u +%FT%TZ), smoke=$SMOKE)"
note ""
note "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' 2>&1)"
note ""
note "| stage | result | time | log |"
note "| --- | --- | --- | --- |"
stage doctor 150 "$PY" -m aiayn doctor "${DOCTOR[@]}" --json "$OUT/doctor.json" --out "$OUT/doctor-runs"
stage bench-eager 75 "$PY" -m aiayn bench --device "$DEVICE" "${BENCH[@]}" --json "$OUT/bench-eager.json"
stage bench-compiled 75 "$PY" -m aiayn bench --device "$DEVICE" "${BENCH[@]}" --compile model \
    --json "$OUT/bench-compiled.json"
stage trainer 90 "$PY" -m aiayn bench --trainer --device "$DEVICE" "${TRAINER[@]}" --json "$OUT/bench-trainer.json"
stage table 90 "$PY" -m aiayn table3 --preset tiny --rows base,A1 --max-steps "$STEPS" --val-every 100 \
    --accelerator "$([ "$DEVICE" = cuda ] && echo gpu || echo cpu)" --out "$OUT/table" --report "$OUT/table/reports"
note ""
"$PY" - "$OUT" <<'EOF' | tee -a "$SUM"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def read(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
for name in ("bench-eager.json", "bench-compiled.json"):
    r = read(name)
    if r:
        a = r[0]
        mfu = f", MFU {100 * a['mfu']:.1f}%" if a.get("mfu") else ""
        print(f"- {name}: {a['train_tokens_per_s']:,.0f} tokens/s, {a['train_step_s'] * 1e3:.1f} ms/step{mfu}")
d = read("doctor.json")
if d:
    print("- doctor: " + ", ".join(f"{c['name']} {c['status']} ({c['value']})" for c in d["checks"]))
t = read("bench-trainer.json")
if t:
    print("- trainer vs bare step: " + ", ".join(f"{r.get('config')} {r.get('ratio', 0):.2f}x" for r in t))
EOF
note ""
note "total $(( $(date +%s) - START )) s"
