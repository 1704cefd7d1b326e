#!/usr/bin/env bash
# scripts/gpu-check.sh: aiayn's GPU paths on ONE GPU in one call of at most 8 minutes, on a machine with no network.
#
#   bash scripts/gpu-check.sh prep                        # 1. where PyPI is reachable: stage what the GPU image lacks
#   OUT=/tmp/gpu-check bash scripts/gpu-check.sh          # 2. on the GPU machine, from the repository's root
#   GPU_CHECK_SMOKE=1 OUT=/tmp/gc bash scripts/gpu-check.sh   # the same stages on a CPU, small (a few minutes)
#   OUT=/tmp/gpu-table bash scripts/gpu-check.sh table    # one call for the whole table: the table and its report
#   OUT=/tmp/gpu-first bash scripts/gpu-check.sh first    # a new machine's first call: what a GPU decides, in 6 min
#
# Every mode starts with a gate of GATE_S (5) seconds: torch imports, sees CUDA and its driver (nvidia-smi). A gate
# that answers "no CUDA" (or fails to import torch) stops the call there; one that does not answer in time (a cold
# disk) is noted and the call goes on, since a stage would then tell.
# `first` learns the most per second on a machine the project has not run on, in three stages, each stage's JSON
# written before anything optional in it: sdpa (`aiayn doctor --check sdpa`: the kernel each of the table's head
# shapes gets) <= 40 s; the paper's base step as `aiayn train` builds it by default (`aiayn bench --size paper
# --profile`: compiled for symbolic shapes, bf16 residual stream, the loss in chunks: MFU, launches, idle time, top
# kernels) <= 100 s (the first H200: eager 28 s, compiled over 70 s, cold); the evidence table, --jobs JOBS at once
# (GPU_CHECK_JOBS, default 8: the first H200 ran 8 evidence-size runs at about 80 steps/s together), stopped at its
# limit with its pace measured <= 125 s. At most 5 minutes with the gate and kill margins, a minute to spare of the 6
# for the install and the summary.
#
# `table` gives the evidence table 420 s (of the 8 minutes), the runs compiled as `aiayn train` compiles by default;
# the check's table runs eager (--compile none) for 160 s, so that a first call on a new GPU measures eager and
# compiled runs apart. GPU_CHECK_TABLE_S=N overrides the table's limit, GPU_CHECK_TABLE_COMPILE="FLAGS" its compile
# flags (one line); with the smoke, GPU_CHECK_TABLE_STEPS its steps (40).
#
# `prep` downloads into .gpucheck/whl/ (git-ignored; carry it to the GPU machine with the checkout) the wheels of the
# packages aiayn imports at start that the GPU image lacks (STAGED below, pinned, for CPython 3.11-3.13 on x86-64); the check
# installs them from there, with no index, when they are missing. It also records the checkout's commit in
# .gpucheck/source, which every run of a copy made without .git records as its commit. It runs the project as it stands in this checkout
# (python -m aiayn from the root) and writes at most 8 files under $OUT, whatever the stages do:
#   summary.md         each stage's result and time, and the figures that go into BENCHMARKS.md
#   results.json       every figure, by stage
#   evidence.md        the report of the evidence table trained on the GPU (what finished by the stage's limit)
#   evidence-against.md  that report against reports/reference/evidence (two CPU cores), verdict by verdict
#   evidence-report.tar.gz  every file of that report (CSVs, the runs' curves, JSON, plots): what a commit keeps
#   logs.tar.gz        every stage's log and JSON (its runs stay in a scratch folder outside $OUT)
# Stages of `check`, each bounded by `timeout` (SIGTERM at its limit, SIGKILL 10 s later), their limits 400 s together:
#   paths      the grad_w path the fused loss takes on this torch, the empty-source beam on the fused attention
#              kernels, static-shape training compiled without hitting the recompile limit (dynamo's tracing) <= 40 s
#   bench      `aiayn bench --size paper --profile` eager (--compile none) and as training builds it by default:
#              tokens/s, MFU, graphs, launches a step, device idle, top kernels                   <= 45 + 70 s
#   table      the whole evidence table, `aiayn table3 --preset evidence --jobs JOBS --compile none` (every scored
#              row, its seeds, 4500 steps), stopped at the limit if it has not finished: runs finished, seed-steps
#              trained (from the runs' logs) and the whole table's wall projected from them; training steps/s, final
#              evaluation and setup apart from the runs' metrics.json                                      <= 160 s
#   report     its report, and the report read against reports/reference/evidence verdict by verdict
#              (`aiayn report --against`)                                                                    <= 20 s
# docs/training.md ("Checking a GPU node") says how to read the results; BENCHMARKS.md carries them.
set -u
# pinned: the versions this project's tests ran with (SQLAlchemy 2.1 needs no greenlet)
STAGED="optuna==5.0.0 alembic==1.20.1 SQLAlchemy==2.1.9 Mako==1.4.3 colorlog==6.12.0 sacremoses==0.2.0 shtab==1.13.0"
if [ "${1:-}" = prep ]; then
  set -e
  [ -d .git ] || { echo "run this in the repository's root"; exit 2; }
  mkdir -p .gpucheck/whl
  grep -qxF '/.gpucheck/' .git/info/exclude 2>/dev/null || echo '/.gpucheck/' >> .git/info/exclude
  rm -f .gpucheck/whl/*.whl
  # the commit a copy without .git records (AIAYN_SOURCE, aiayn/common/provenance.py): prep again after a commit
  echo "$(git rev-parse HEAD)$([ -n "$(git status --porcelain --untracked-files=no)" ] && echo +dirty)" \
    > .gpucheck/source
  for version in 3.11 3.12 3.13; do  # the GPU image's Python (3.12 so far), and its neighbours
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .gpucheck/whl $STAGED
  done
  ls .gpucheck/whl
  echo "staged $(ls .gpucheck/whl | wc -l) wheels; next, on the GPU machine: OUT=<dir> bash scripts/gpu-check.sh"
  exit 0
fi

source "$(dirname "$0")/gpu-env.sh"  # whole, flag, scratch, named_source
MODE=${1:-check}
case "$MODE" in check|table|first) ;; *) echo "usage: bash scripts/gpu-check.sh [prep|check|table|first]"; exit 2 ;; esac
GATE_S=${GATE_S:-5}
whole GATE_S "$GATE_S"
OUT=${OUT:?OUT must be set: the folder for the results}
if [ "$MODE" = table ]; then  # the whole table alone: most of the 8 minutes, compiled as training compiles
  TABLE_S=${GPU_CHECK_TABLE_S:-420}; TABLE_COMPILE=${GPU_CHECK_TABLE_COMPILE---compile auto}
elif [ "$MODE" = first ]; then
  TABLE_S=${GPU_CHECK_TABLE_S:-125}; TABLE_COMPILE=${GPU_CHECK_TABLE_COMPILE---compile auto}
else
  TABLE_S=${GPU_CHECK_TABLE_S:-160}; TABLE_COMPILE=${GPU_CHECK_TABLE_COMPILE---compile none}
fi
oneline GPU_CHECK_TABLE_COMPILE "$TABLE_COMPILE"
whole GPU_CHECK_TABLE_S "$TABLE_S"
whole GPU_CHECK_TABLE_STEPS "${GPU_CHECK_TABLE_STEPS:-40}"
JOBS=${GPU_CHECK_JOBS:-8}
whole GPU_CHECK_JOBS "$JOBS"
SMOKE=${GPU_CHECK_SMOKE:-0}
flag GPU_CHECK_SMOKE "$SMOKE"
set -f  # the compile flags split into words, never globbed
read -r -a COMPILE_FLAGS <<< "$TABLE_COMPILE"
set +f
PY=${PYTHON:-python3}
WORK=$(scratch aiayn-gpu-check) || exit 2
mkdir -p "$OUT" "$WORK/logs"
SUM="$OUT/summary.md"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
export AIAYN_CACHE=${AIAYN_CACHE:-$WORK/cache}
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
note() { echo "$*" | tee -a "$SUM"; }
stage() {  # stage NAME LIMIT_S COMMAND...: run it under its limit, log it, note its status and time (stages.jsonl too)
  local name=$1 limit=$2; shift 2
  # the smoke's CPU traces and steps what a GPU does many times slower: its fixed limits x4 (a busy CPU took
  # over 40 s on `paths`); the table's limit is TABLE_S as the caller set it (a test stops the table at it)
  [ "$SMOKE" = 1 ] && [ "$name" != table ] && limit=$((limit * 4))
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1  # SIGTERM at the limit; SIGKILL 10 s on
  local rc=$?
  note "| $name | $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") | $(( $(date +%s) - t0 )) s |"
  echo "{\"stage\": \"$name\", \"exit\": $rc, \"wall_s\": $(( $(date +%s) - t0 ))}" >> "$WORK/stages.jsonl"
}

if [ "$SMOKE" = 1 ]; then
  export AIAYN_COMPILE_BACKEND=eager  # dynamo's tracing, without inductor's code generation: minutes on a CPU
  DEVICE=cpu; ACCEL=cpu; BENCH=(--size tiny --steps 1 --trials 1 --warmup 1 --decode-sentences 4)
  TABLE=(--rows base,C1,C5 --seeds 1 --base-seeds 2 --max-steps "${GPU_CHECK_TABLE_STEPS:-40}" --val-every 10 --jobs 2)
else
  DEVICE=cuda; ACCEL=gpu; BENCH=(--size paper --steps 3 --trials 3)
  TABLE=(--jobs "$JOBS")  # the preset's rows, seeds and budget (the table reports/reference/evidence holds)
fi

: > "$SUM"
note "# aiayn GPU check: $MODE ($(date -u +%FT%TZ), smoke=$SMOKE; the table: ${TABLE_COMPILE:-eager}, limit $TABLE_S s)"
note ""
# the gate, before anything else: torch, CUDA and the driver (the smoke on a CPU needs torch alone)
timeout --kill-after=2 "$GATE_S" "$PY" - "$SMOKE" "$WORK/gate.json" > "$WORK/logs/gate.log" 2>&1 <<'EOF'
import json, subprocess, sys
import torch
g = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
if g["available"]:
    g["device"] = torch.cuda.get_device_name(0)
    try:
        smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        g["driver"] = subprocess.run(smi, capture_output=True, text=True, timeout=3).stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        g["driver"] = None
json.dump(g, open(sys.argv[2], "w"))
sys.exit(0 if g["available"] or sys.argv[1] == "1" else 3)
EOF
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  note "gate: torch did not answer in $GATE_S s (a cold start?); going on"
elif [ $rc -ne 0 ]; then
  note "gate FAILED (exit $rc: $([ $rc -eq 3 ] && echo 'torch sees no CUDA device' || echo 'torch did not import')):" \
    "$(tail -1 "$WORK/logs/gate.log")"
  tar czf "$OUT/logs.tar.gz" -C "$WORK" logs
  rm -rf "$WORK"
  exit 1
fi
# the packages the image lacks, from the staged wheels (no index: this machine may have no network)
if ! "$PY" -c "import optuna, sacremoses, shtab" 2>/dev/null; then
  if [ -d .gpucheck/whl ]; then
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --find-links .gpucheck/whl $STAGED > "$WORK/logs/install.log" 2>&1 \
      && note "installed from .gpucheck/whl: $STAGED" || note "install from .gpucheck/whl FAILED (logs/install.log)"
  else
    note "optuna, sacremoses or shtab missing and no .gpucheck/whl: run \`bash scripts/gpu-check.sh prep\` first"
  fi
fi
named_source
note "commit $(git rev-parse --short HEAD 2>/dev/null || echo "${AIAYN_SOURCE:-unknown} (no .git; from .gpucheck/source)"); $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' 2>&1)"
note ""
note "| stage | result | time |"
note "| --- | --- | --- |"

if [ "$MODE" = first ]; then  # a new machine's first call: what only a GPU decides, most per second first
  stage sdpa 40 "$PY" -m aiayn doctor --check sdpa --json "$WORK/sdpa.json"
  # the step `aiayn train` trains by default (compile auto, its symbolic shapes, the bf16 stream), profiled
  stage bench-auto 100 "$PY" -m aiayn bench --device "$DEVICE" "${BENCH[@]}" --profile --json "$WORK/bench-auto.json"
fi
if [ "$MODE" = check ]; then  # `table` runs the last two stages alone
stage paths 40 "$PY" - "$DEVICE" "$WORK/paths.json" <<'EOF'
# The three GPU-only defects that only a GPU decides: which grad_w path ran, whether beam search keeps an
# empty source finite on this GPU's fused attention kernels, and whether an epoch of static shapes compiles
# without hitting dynamo's recompile limit (and evaluation compiles nothing).
import json, sys, time
import torch
from aiayn.lightning_modules.transformer import loss as L
from aiayn.lightning_modules.transformer import model as M
from aiayn.lightning_modules.transformer.compiled import compile_model
from aiayn.lightning_modules.transformer.decoding import beam_search

device, out = torch.device(sys.argv[1]), {}
g, h = torch.randn(512, 64, device=device), torch.randn(512, 32, device=device)
acc = torch.zeros(64, 32, device=device)
L.accumulate_outer(acc, g.bfloat16(), h.bfloat16())
out["grad_w_path"] = L.grad_w_path(device.type)
M.CPU_FAST_PATHS = False  # the fused kernels, as a GPU runs them
torch.manual_seed(0)
model = M.Transformer(M.TransformerConfig(N=2, d_model=64, d_ff=128, h=4, vocab_size=50, max_len=128)).to(device).eval()
src = torch.tensor([[5, 6, 7, 8], [0, 0, 0, 0], [9, 4, 0, 0]], device=device)
with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
    hyps = beam_search(model, src, 2, 3, beam=4, alpha=0.6, extra_len=50)
out["empty_source_beam"] = {"lengths": [len(x) for x in hyps], "to_the_limit": len(hyps[1]) >= 54}
import torch._dynamo
from torch._dynamo.utils import counters
shapes = [(max(1, 2048 // n), n) for n in range(8, 96, 8)]
out["static_shapes_compiled"] = {}
for how in ("layers", "model"):  # `model` hit the recompile limit on the H200 (a graph break per block)
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = M.Transformer(M.TransformerConfig(N=2, d_model=64, d_ff=128, h=4, vocab_size=50, max_len=128)).to(device)
    model.train()
    # dynamo's graphs, breaks and recompiles, counted with the eager backend (tracing without inductor's codegen):
    # inductor, cold, took the H200 over this stage's limit for one `how`; the bench stages time inductor
    compile_model(model, how, dynamic=False, shapes=len(shapes), backend="eager")
    t0 = time.perf_counter()
    for b, n in shapes:
        x, y = torch.randint(4, 50, (b, n), device=device), torch.randint(4, 50, (b, n), device=device)
        memory, mask = model.encode(x)
        loss, _, _ = L.projected_label_smoothed_loss(model.decode(y, memory, mask), model.embed.weight, y, 0.1)
        loss.backward()
    graphs = int(counters["stats"]["unique_graphs"])
    with torch.no_grad():
        model.eval()
        beam_search(model, src, 2, 3, beam=4, alpha=0.6, extra_len=10)
    out["static_shapes_compiled"][how] = {
        "shapes": len(shapes), "graphs": graphs, "seconds": round(time.perf_counter() - t0, 1),
        "recompile_limit_hit": sum(v for k, v in counters["unimplemented"].items() if "recompile limit" in k),
        "graph_breaks": sum(counters["graph_break"].values()),
        "graph_break_reasons": sorted(counters["graph_break"])[:5],
        "graphs_added_by_decoding": int(counters["stats"]["unique_graphs"]) - graphs,
    }
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps(out))
EOF
for how in none auto; do  # eager, and as `aiayn train` builds the step by default (compiled on a GPU)
  limit=70; [ "$how" = none ] && limit=45  # eager took 28 s on the first H200
  stage "bench-$how" "$limit" "$PY" -m aiayn bench --device "$DEVICE" "${BENCH[@]}" --compile "$how" --profile \
      --json "$WORK/bench-$how.json"
done
fi
# the evidence table and its report, every mode. JOBS trainers compiling at once: inductor's worker pool is as many
# processes as cores in each (8 x 16 on the H200's machine); two each share the cores instead (the benches above
# compile alone, with the whole pool)
{
  export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}
  stage table "$TABLE_S" "$PY" -m aiayn table3 --preset evidence "${TABLE[@]}" "${COMPILE_FLAGS[@]}" \
      --accelerator "$ACCEL" --out "$WORK/table" --report ""
  "$PY" -m aiayn status --json "$WORK/table" > "$WORK/table-status.json" 2> "$WORK/logs/table-status.log"
  if [ "$MODE" = first ]; then
    :  # the first call's table is a measure of speed; its report waits for a whole table
  elif find "$WORK/table" -name metrics.json 2>/dev/null | grep -q .; then
    stage report 20 "$PY" -m aiayn report --runs "$WORK/table" --out "$WORK/reports" --preset evidence \
        --against reports/reference/evidence
    cp "$WORK/reports/table3-evidence.md" "$OUT/evidence.md" 2>/dev/null || note "no evidence report"
    cp "$WORK/reports/table3-evidence-against.md" "$OUT/evidence-against.md" 2>/dev/null || note "no comparison"
    # every file of the report (its runs' curves among them), to commit beside reports/reference/evidence
    [ -d "$WORK/reports" ] && tar czf "$OUT/evidence-report.tar.gz" -C "$WORK" reports
  else
    note "| report | not run: no run of the table finished | |"
  fi
}

note ""
"$PY" - "$WORK" "$OUT/results.json" <<'EOF' | tee -a "$SUM"
import csv, json, sys
from pathlib import Path
work, results = Path(sys.argv[1]), {}
def read(name):
    try:
        return json.loads((work / name).read_text())
    except (OSError, ValueError):
        return None
results["gate"] = g = read("gate.json")
if g:
    print(f"- gate: torch {g['torch']} (CUDA {g['cuda']}), {g.get('device', 'no GPU')}, driver {g.get('driver')}")
results["sdpa"] = d = read("sdpa.json")
for c in (d or {}).get("checks", []):  # aiayn doctor --check sdpa: each attention call's kernel
    print(f"- sdpa: {c['status']}, {c['value']}: {c['detail']}")
results["paths"] = read("paths.json")
if results["paths"]:
    p = results["paths"]
    print(f"- grad_w: {p['grad_w_path']}")
    print(f"- empty source, beam search on the fused kernels: output lengths {p['empty_source_beam']['lengths']}"
          f"{' (the empty one ran to the limit: NOT guarded)' if p['empty_source_beam']['to_the_limit'] else ''}")
    for how, c in p["static_shapes_compiled"].items():
        print(f"- static shapes, --compile {how}: {c['shapes']} shapes, {c['graphs']} graphs in {c['seconds']} s, "
              f"recompile limit hit {c['recompile_limit_hit']} time(s), graph breaks {c['graph_breaks']} "
              f"{c['graph_break_reasons']}, graphs added by decoding {c['graphs_added_by_decoding']}")
for how in ("none", "auto"):
    r = read(f"bench-{how}.json")
    results[f"bench-{how}"] = r
    if r:
        a = r[0]
        mfu = f", MFU {100 * a['mfu']:.1f}%" if a.get("mfu") else ""
        graphs = f", {a['graphs_compiled']} graphs" if "graphs_compiled" in a else ""
        print(f"- bench --compile {how} ({a['compile']}, {a.get('compile_shapes') or 'eager'}, residual stream "
              f"{a['residual_dtype']}): {a['train_tokens_per_s']:,.0f} tokens/s, {a['train_step_s'] * 1e3:.1f} "
              f"ms/step{mfu}{graphs}")
        if a.get("profile"):  # aiayn bench --profile (aiayn/bench/profile.py)
            q = a["profile"]
            idle = f", device idle {100 * q['device_idle_fraction']:.1f}%" if "device_idle_fraction" in q else ""
            top = "; ".join(f"{t['name'][:60]} {100 * t['share']:.0f}%" for t in q["top"][:3])
            print(f"  profile: {q['launches_per_step']:.0f} {q['what']} a step{idle}; top: {top}")
lines = (work / "stages.jsonl").read_text().splitlines() if (work / "stages.jsonl").is_file() else []
results["stages"] = stages = {s["stage"]: s for s in map(json.loads, lines)}
# the whole table (item 4a): the runs finished by the stage's limit, the seed-steps trained (a finished run's from
# its metrics.json, an unfinished one's from its logs' last step) and the whole table's wall at that rate
try:
    pairs = [p for sweep in json.loads((work / "table-status.json").read_text()) for p in sweep["pairs"]]
except (OSError, ValueError):
    pairs = []
if pairs and "table" in stages:
    from aiayn.reports.runs import read_curve  # every attempt's logged curve of a run, as the report reads it
    known = [p["steps"] for p in pairs if p["steps"]]  # a pending pair plans as its sweep's others
    planned = sum(p["steps"] or max(known) for p in pairs) if known else None
    trained = 0
    for p in pairs:
        if p["state"] == "completed":
            trained += p["steps"] or 0
        elif p["run_dir"]:
            steps = read_curve(Path(p["run_dir"]), "train/loss")["step"]
            trained += int(steps.max()) + 1 if len(steps) else 0
    wall = stages["table"]["wall_s"]
    done = sum(p["state"] == "completed" for p in pairs)
    t = results["table"] = {"runs": len(pairs), "completed": done, "wall_s": wall, "seed_steps": trained,
                            "seed_steps_planned": planned, "seed_steps_per_s": trained / wall if wall else None}
    t["projected_wall_s"] = planned / t["seed_steps_per_s"] if planned and t["seed_steps_per_s"] else None
    whole = "the whole table" if done == len(pairs) else f"{done} of {len(pairs)} runs (stopped at the limit)"
    projected = f"; the whole table at that rate: {t['projected_wall_s'] / 60:.1f} min" if t["projected_wall_s"] else ""
    print(f"- the evidence table: {whole} in {wall} s; {trained:,} of {planned or 0:,} seed-steps, "
          f"{t['seed_steps_per_s'] or 0:.0f} seed-steps/s with setup and evaluation{projected} (target: 8 min)")
against = work / "reports" / "table3-evidence-against.csv"
if against.is_file():  # aiayn report --against (reports/against.py)
    with open(against, newline="") as f:
        rows = list(csv.DictReader(f))
    compared = [r for r in rows if r["compared"] == "True"]
    moved = [f"{r['row']} ({r['verdict_reference']} -> {r['verdict']})" for r in compared if r["same"] != "True"]
    results["against"] = {"compared": len(compared), "same": len(compared) - len(moved), "moved": moved}
    print(f"- against reports/reference/evidence: {len(compared) - len(moved)} of {len(compared)} scored verdicts "
          f"the same{'; moved: ' + ', '.join(moved) if moved else ''}")
# steps/s from the runs' own records (item 4c): training apart from setup and the final evaluation
from statistics import median
results["runs"] = {}
ms = []
for path in sorted((work / "table").glob("**/metrics.json")):
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError):
        continue
    if m.get("status") == "completed" and m.get("train_time_s"):
        ms.append(m)
if ms:
    rates = [m["steps"] / m["train_time_s"] for m in ms]
    evals = [m.get("eval_time_s") or 0.0 for m in ms]
    rest = [m["wall_time_s"] - m["train_time_s"] - e for m, e in zip(ms, evals) if m.get("wall_time_s")]
    r = results["runs"]["table"] = {"runs": len(ms), "train_steps_per_s": median(rates),
                                    "seed_steps_per_s": sum(rates), "eval_s": median(evals),
                                    "rest_s": median(rest) if rest else None}
    rest_text = f", setup, checkpoints and waiting {r['rest_s']:.1f} s" if rest else ""
    print(f"- the table, from its runs' metrics.json: {r['runs']} runs, training {r['train_steps_per_s']:.1f} steps/s "
          f"a run (median), {r['seed_steps_per_s']:.1f} seed-steps/s summed; final evaluation {r['eval_s']:.1f} s a "
          f"run{rest_text}")
Path(sys.argv[2]).write_text(json.dumps(results, indent=1) + "\n")
EOF
cp "$WORK"/*.json "$WORK/logs/" 2>/dev/null
tar czf "$OUT/logs.tar.gz" -C "$WORK" logs
note ""
note "total $(( $(date +%s) - START )) s; files: $(ls "$OUT" | tr '\n' ' ')"
rm -rf "$WORK"
