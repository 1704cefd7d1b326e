#!/usr/bin/env bash
# scripts/gpu-wide.sh: the wide table (BENCHMARKS.md, "The wide table") on ONE GPU, in one call of
# at most 8 minutes, on a machine with no network.
#
#   bash scripts/gpu-wide.sh prep                          # 1. beside ../shared: stage Multi30k and the wheels
#   OUT=/tmp/gpu-wide bash scripts/gpu-wide.sh             # 2. on the GPU machine, from the repository's root
#   GPU_WIDE_SMOKE=1 OUT=/tmp/gw bash scripts/gpu-wide.sh  # the same stages on a CPU, small (about 3 minutes)
#   BUDGET=B FIRST_SLICE=K OUT=/tmp/gpu-wide bash scripts/gpu-wide.sh  # a later call: no pilot, slices K on
#
# `prep` copies Multi30k (../shared/data/multi30k, or $MULTI30K) into .gpucheck/multi30k/ and stages the wheels the
# GPU image lacks (scripts/gpu-check.sh prep); carry .gpucheck to the GPU machine with the checkout. The call runs the
# registered rules of scripts/wide_pilot.py and nothing else, within DEADLINE_S (470 s) in all:
#   pilot   base on pilot seeds 100-103, at most the preset's 1600 steps, 4 at once, stopped (SIGTERM) as soon as
#           rule 2's budget is settled (`wide_pilot.py watch` reads its curves as they are written); then rule 2
#           chooses the budget B and states the noise and each test's power (rule.md, rule.json) before any scored run
#   slices  the registered slices in order (`wide_pilot.py slices`), each `aiayn table3 --preset wide` over base and
#           every slice so far, fresh seeds from 200, --max-steps B, 8 runs at once; the sweep is stopped by SIGTERM
#           at the deadline (it stops cleanly; its finished runs stay), and a slice cut there is named as not run
#   report  the report of the last slice that finished whole: wide.md, wide.json, wide-curves.csv, and verdicts.md,
#           the registered verdicts at the pilot's budget (the report calls runs under 1600 steps a look)
# It writes at most 8 files under $OUT: summary.md, rule.md, rule.json, wide.md, wide.json, wide-curves.csv,
# verdicts.md, logs.tar.gz (every stage's log and the runs' metrics.json files; the runs themselves stay in a scratch folder).
set -u
if [ "${1:-}" = prep ]; then
  set -e
  [ -d .git ] || { echo "run this in the repository's root"; exit 2; }
  SRC=${MULTI30K:-../shared/data/multi30k}
  [ -f "$SRC/train.en.gz" ] || { echo "no Multi30k at $SRC; set MULTI30K to a folder of train/val .en/.de .gz"; exit 2; }
  mkdir -p .gpucheck/multi30k
  grep -qxF '/.gpucheck/' .git/info/exclude 2>/dev/null || echo '/.gpucheck/' >> .git/info/exclude
  cp "$SRC"/train.en.gz "$SRC"/train.de.gz "$SRC"/val.en.gz "$SRC"/val.de.gz .gpucheck/multi30k/
  bash scripts/gpu-check.sh prep
  echo "staged Multi30k in .gpucheck/multi30k; next, on the GPU machine: OUT=<dir> bash scripts/gpu-wide.sh"
  exit 0
fi

source "$(dirname "$0")/gpu-env.sh"  # whole, flag, scratch, named_source
OUT=${OUT:?OUT must be set: the folder for the results}
SMOKE=${GPU_WIDE_SMOKE:-0}
flag GPU_WIDE_SMOKE "$SMOKE"
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE_S:-470}
whole DEADLINE_S "$DEADLINE"
FIRST_SLICE=${FIRST_SLICE:-1}
whole FIRST_SLICE "$FIRST_SLICE"
[ -z "${BUDGET:-}" ] || whole BUDGET "$BUDGET"
DATA=${MULTI30K:-.gpucheck/multi30k}
[ -d "$DATA" ] || DATA=../shared/data/multi30k
WORK=$(scratch aiayn-gpu-wide) || exit 2
mkdir -p "$OUT" "$WORK/logs"
SUM="$OUT/summary.md"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
export AIAYN_CACHE=${AIAYN_CACHE:-$WORK/cache}
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
# 4-8 trainers compiling cold at once: inductor's worker pool is as many processes as cores in each; two each share
# the cores instead, as scripts/gpu-check.sh's table does
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}
START=$(date +%s)
note() { echo "$*" | tee -a "$SUM"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }

if [ "$SMOKE" = 1 ]; then  # the paths, not the numbers: a narrow one-layer model, a few steps, one seed, the first slice
  COMMON=(--accelerator cpu --set N=1 --set d_model=32 --set d_ff=64 --set h=4 --vocab-size 1000 --max-tokens 1024
    --val-every 1 --eval-subset 8 --jobs 2)
  # the pilot's 400 steps are stopped soon after 32, the budget a margin of 1000% admits at once (the stop's path)
  PILOT=(--max-steps 400 --jobs 4); RULE=(--budgets 32:400:8 --margin 10); WATCH=(--every 1)
  SEEDS=(--seeds 1 --base-seeds 1); SLICES=1
else
  COMMON=(--accelerator gpu --precision bf16-mixed --eval-subset 64 --num-workers 1)
  PILOT=(--jobs 4); RULE=(); WATCH=(--every 5); SEEDS=(--jobs 8); SLICES=99
fi

: > "$SUM"
note "# aiayn's wide table on one GPU ($(date -u +%FT%TZ), smoke=$SMOKE, deadline ${DEADLINE} s)"
note ""
if ! "$PY" -c "import optuna, sacremoses, shtab" 2>/dev/null; then
  if [ -d .gpucheck/whl ]; then
    STAGED=$(sed -n 's/^STAGED="\(.*\)"$/\1/p' scripts/gpu-check.sh)  # the pinned wheels gpu-check.sh prep staged
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --find-links .gpucheck/whl $STAGED > "$WORK/logs/install.log" 2>&1 \
      && note "installed from .gpucheck/whl" \
      || note "install from .gpucheck/whl FAILED (logs/install.log)"
  else
    note "optuna, sacremoses or shtab missing and no .gpucheck/whl: run \`bash scripts/gpu-wide.sh prep\` first"
  fi
fi
named_source
note "machine: $("$PY" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")' 2>&1 | tail -1); $(git rev-parse --short HEAD 2>/dev/null || echo "${AIAYN_SOURCE:-no git commit} (no .git)"); data $DATA"
note ""
note "| stage | result | wall |"
note "| --- | --- | --- |"

if [ -n "${BUDGET:-}" ]; then  # a later call: the budget an earlier call's pilot chose (its rule.md), no pilot
  VAL=$("$PY" -c "import sys; sys.path.insert(0, 'scripts'); import wide_pilot; print(wide_pilot.val_every(int(sys.argv[1])))" "$BUDGET")
  note "| pilot | not run: BUDGET=$BUDGET given (an earlier call's rule 2; its rule.md states the power) | |"
else
  t0=$(date +%s)
  timeout --kill-after=20 "$(left)" "$PY" -m aiayn table3 --preset wide --rows base --seeds 4 --base-seeds 4 \
    --first-seed 100 --out "$WORK/pilot" --report '' --data-dir "$DATA" "${COMMON[@]}" "${PILOT[@]}" \
    > "$WORK/logs/pilot.log" 2>&1 &
  PILOT_PID=$!
  # rule 2 while the pilot trains: its sweep is stopped once the budget is settled (wide_pilot.py, rule 2)
  "$PY" scripts/wide_pilot.py watch "$WORK/pilot" --pid "$PILOT_PID" "${WATCH[@]}" "${RULE[@]}" \
    > "$WORK/logs/watch.log" 2>&1 &
  WATCH_PID=$!
  wait "$PILOT_PID"
  rc=$?
  wait "$WATCH_PID"
  watched=$?
  SETTLED=$(grep -m1 '^settled: ' "$WORK/logs/watch.log")
  if [ -n "$SETTLED" ]; then
    PILOT_RESULT="stopped once rule 2's budget was settled (${SETTLED#settled: })"
  elif [ $rc -eq 0 ]; then
    PILOT_RESULT=ok
  else
    PILOT_RESULT="FAILED (exit $rc)"
  fi
  [ $watched -eq 0 ] || PILOT_RESULT="$PILOT_RESULT; its watcher FAILED (exit $watched, logs/watch.log): not stopped early"
  note "| pilot (base, seeds 100-103) | $PILOT_RESULT | $(( $(date +%s) - t0 )) s |"
  "$PY" scripts/wide_pilot.py budget "$WORK/pilot" --json "$OUT/rule.json" "${RULE[@]}" > "$OUT/rule.md" 2>&1
  BUDGET=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['budget'])" "$OUT/rule.json" 2>/dev/null)
  VAL=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['val_every'])" "$OUT/rule.json" 2>/dev/null)
fi
if [ -z "$BUDGET" ]; then
  note "| rule 2 | FAILED: no budget (rule.md) | |"
else
  note "| rule 2 | budget $BUDGET steps, a validation every $VAL$([ -f "$OUT/rule.md" ] && echo ' (rule.md)') | |"
  ROWS=base; K=0; DONE=0  # slices FIRST_SLICE on, each with base and the slices before it in this call
  while IFS=$'\t' read -r NAME SLICE; do
    K=$((K + 1)); [ "$K" -lt "$FIRST_SLICE" ] && continue; [ "$K" -ge $((FIRST_SLICE + SLICES)) ] && break
    ROWS="$ROWS,$SLICE"
    T=$(left)
    if [ "$T" -lt 30 ]; then note "| slice $K ($NAME: $SLICE) | not run: the deadline | |"; continue; fi
    t0=$(date +%s)
    timeout --kill-after=30 "$T" "$PY" -m aiayn table3 --preset wide --rows "$ROWS" --first-seed 200 \
      --max-steps "$BUDGET" --out "$WORK/wide" --report "$WORK/report-$K" --data-dir "$DATA" "${COMMON[@]}" \
      "${SEEDS[@]}" --val-every "$VAL" > "$WORK/logs/slice-$K.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      DONE=$K; note "| slice $K ($NAME: $SLICE) | ok | $(( $(date +%s) - t0 )) s |"
    else
      note "| slice $K ($NAME: $SLICE) | not run whole: exit $rc (124/143: the deadline) | $(( $(date +%s) - t0 )) s |"
      break
    fi
  done < <("$PY" scripts/wide_pilot.py slices)
  if [ "$DONE" -gt 0 ]; then
    for ext in md json; do cp "$WORK/report-$DONE"/table3-wide.$ext "$OUT/wide.$ext" 2>/dev/null; done
    cp "$WORK/report-$DONE"/table3-wide-curves.csv "$OUT/wide-curves.csv" 2>/dev/null
    # the report calls runs under the preset's 1600 steps a look: the registered verdicts at the pilot's budget
    "$PY" scripts/wide_pilot.py judge "$WORK/report-$DONE" > "$OUT/verdicts.md" 2>&1
    note ""
    note "The report covers slices $FIRST_SLICE-$DONE, whole: wide.md (the runs, which it calls a look: their budget"
    note "is the pilot's, under the preset's 1600) and verdicts.md (the registered verdicts at that budget, both"
    note "baselines beside them, by scripts/wide_pilot.py judge)."
  fi
fi
note ""
note "wall $(( $(date +%s) - START )) s$([ -f "$OUT/rule.md" ] && echo "; the pilot's budget rule and each test's power: rule.md")"
find "$WORK" -name metrics.json -path '*seed*' | tar -czf "$OUT/logs.tar.gz" -C / -T - "$WORK/logs" 2>/dev/null \
  || tar -czf "$OUT/logs.tar.gz" "$WORK/logs" 2>/dev/null
rm -rf "$WORK"
