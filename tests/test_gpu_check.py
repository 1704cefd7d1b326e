"""scripts/gpu-check.sh, the one prepared call a lent GPU runs with no network: it stages what the
GPU image lacks (fast: the staged list covers every package `aiayn` imports at start beyond the image's), and it runs
end to end on a CPU in its smoke mode, writing at most 8 files (slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
# What the GPU machines' image has (../shared/gpu/prep.sh, which says so): the packages and, below, whatever they
# require in turn
GPU_IMAGE = (
    "torch",
    "lightning",
    "sentencepiece",
    "sacrebleu",
    "scipy",
    "pandas",
    "matplotlib",
    "PyYAML",
    "tabulate",
    "numpy",
    "tqdm",
    "click",
    "joblib",
    "regex",
    "MarkupSafe",
    "typing_extensions",
    "packaging",
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names) -> set[str]:
    """The distributions `names` install: themselves and what they require, transitively (extras left out)."""
    seen, todo = set(), [_norm(re.split(r"[ ;<>=!~\[(]", n, maxsplit=1)[0]) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_norm(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in requires if "extra ==" not in r]
    return seen


def test_the_prep_step_stages_every_package_aiayn_imports_at_start_that_the_gpu_image_lacks():
    """What `aiayn` imports at start (beyond what the interpreter had before it: .pth files import some), of its own
    requirements and theirs (optional imports such as pandas's pyarrow are not needed there), that the GPU image
    lacks: prep must stage each."""
    staged = re.search(r'^STAGED="([^"]+)"', SCRIPT.read_text(), re.M).group(1).split()
    code = (
        "import sys; before = set(sys.modules); import aiayn.cli; "
        "print('\\n'.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    owners = metadata.packages_distributions()
    imported = {_norm(d) for m in done.stdout.split() for d in owners.get(m, ())} - {"aiayn"}
    required = _closure([r.split(";")[0] for r in metadata.requires("aiayn") or [] if "extra ==" not in r])
    assert "optuna" in imported & required  # the test sees what it is about
    missing = (imported & required) - _closure(GPU_IMAGE) - _closure(staged)
    assert not missing, f"imported at start, missing from the GPU image and not staged by prep: {missing}"


@pytest.mark.parametrize(
    "script, env, says",
    [
        ("gpu-check.sh", {"GPU_CHECK_TABLE_S": "abc"}, "GPU_CHECK_TABLE_S=abc is not a whole number"),
        ("gpu-check.sh", {"GPU_CHECK_TABLE_STEPS": "-4"}, "GPU_CHECK_TABLE_STEPS=-4 is not a whole number"),
        ("gpu-check.sh", {"GPU_CHECK_SMOKE": "yes"}, "GPU_CHECK_SMOKE=yes is not 0 or 1"),
        ("gpu-check.sh", {"GPU_CHECK_TABLE_S": "08"}, "GPU_CHECK_TABLE_S=08 is not a whole number"),
        ("gpu-check.sh", {"GPU_CHECK_JOBS": "0"}, "GPU_CHECK_JOBS=0 is not a whole number"),
        ("gpu-check.sh", {"GPU_CHECK_TABLE_COMPILE": "--compile none\n--jobs 1"}, "GPU_CHECK_TABLE_COMPILE holds a"),
        ("gpu-check.sh", {"TMPDIR": "/nonexistent/x"}, "cannot make a scratch folder under /nonexistent/x"),
        ("gpu-wide.sh", {"BUDGET": '__import__("os").system("touch PWNED")'}, "BUDGET=__import__"),
        ("gpu-wide.sh", {"BUDGET": "abc"}, "BUDGET=abc is not a whole number"),
        ("gpu-wide.sh", {"DEADLINE_S": "18446744073709551616"}, "DEADLINE_S=18446744073709551616 is not a whole"),
        ("gpu-wide.sh", {"FIRST_SLICE": "0"}, "FIRST_SLICE=0 is not a whole number from 1"),
        ("gpu-wide.sh", {"TMPDIR": "/nonexistent/x"}, "cannot make a scratch folder under /nonexistent/x"),
    ],
)
def test_every_value_a_gpu_call_reads_from_its_environment_is_checked_before_it_writes(tmp_path, script, env, says):
    """A number is digits, passed on as data (a BUDGET of Python code is refused, never run), a flag 0 or 1, the
    scratch folder made: one line, exit 2, before anything is written (no OUT, no file made by the value)."""
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / script)],
        cwd=tmp_path,
        env={**os.environ, "OUT": str(out), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not out.exists() and not (tmp_path / "PWNED").exists()


def test_the_table_call_passes_its_flags_as_words_and_a_copy_without_git_the_commit_prep_recorded(tmp_path):
    """GPU_CHECK_TABLE_COMPILE is split into words with globbing off: a `*` reaches `aiayn table3` as a `*`, not as
    the names of the folder's files; and in a copy made without .git every run is told the commit `prep` recorded
    (.gpucheck/source, as $AIAYN_SOURCE), which the summary names (the Python the script runs stood in by one that
    records its arguments and that variable)."""
    stub = tmp_path / "python"
    stub.write_text('#!/bin/bash\nprintf "%s\\n" "$AIAYN_SOURCE" "$@" > "$(dirname "$0")/args-$$"\ncat > /dev/null\n')
    stub.chmod(0o755)
    work = tmp_path / "work"  # under the temporary folder: no git checkout
    (work / ".gpucheck").mkdir(parents=True)
    (work / ".gpucheck" / "source").write_text("3ad99c2" + "0" * 33 + "\n")
    (work / "a-file").write_text("")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": str(stub)}
    env["GPU_CHECK_TABLE_COMPILE"], env["GPU_CHECK_TABLE_S"] = "--compile  *", "5"
    env.pop("AIAYN_SOURCE", None)
    subprocess.run(["bash", str(SCRIPT), "table"], cwd=work, env=env, capture_output=True, timeout=60)
    calls = [p.read_text().splitlines() for p in tmp_path.glob("args-*")]
    (table,) = [c for c in calls if c[1:4] == ["-m", "aiayn", "table3"]]
    assert table[table.index("--compile") + 1] == "*" and "a-file" not in table
    assert table[0] == "3ad99c2" + "0" * 33
    assert "commit 3ad99c2" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.slow
def test_the_gpu_check_runs_end_to_end_on_a_cpu_in_its_smoke_mode_and_writes_at_most_8_files(cache, tmp_path):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "GPU_CHECK_SMOKE": "1",
        "OUT": str(out),
        "PYTHON": sys.executable,
        "AIAYN_CACHE": str(cache),
        "TMPDIR": str(tmp_path),
        "GATE_S": "60",  # a busy CPU imports slowly
        "GPU_CHECK_TABLE_S": "400",  # beside a neighbour: the table is to finish
    }
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "evidence-against.md",
        "evidence-report.tar.gz",
        "evidence.md",
        "logs.tar.gz",
        "results.json",
        "summary.md",
    ]
    with tarfile.open(out / "evidence-report.tar.gz") as tar:  # the report whole: its runs' curves to commit
        assert {"reports/table3-evidence-curves.csv", "reports/table3-evidence-against.csv"} <= set(tar.getnames())
    summary = (out / "summary.md").read_text()
    for stage in ("paths", "bench-none", "bench-auto", "table", "report"):
        assert f"| {stage} | ok |" in summary, summary
    results = json.loads((out / "results.json").read_text())
    paths = results["paths"]
    assert paths["grad_w_path"] and not paths["empty_source_beam"]["to_the_limit"]
    for how in ("layers", "model"):  # the paper's dropout on, as training runs it
        compiled = paths["static_shapes_compiled"][how]
        assert compiled["recompile_limit_hit"] == compiled["graph_breaks"] == 0, compiled
        assert compiled["graphs_added_by_decoding"] == 0
    # the table: base's 2 seeds, C1's and C5's one, 40 steps each, every seed-step counted
    table = results["table"]
    assert (table["runs"], table["completed"], table["seed_steps"], table["seed_steps_planned"]) == (4, 4, 160, 160)
    assert table["projected_wall_s"] > 0 and "- the evidence table: the whole table in " in summary
    runs = results["runs"]  # from the runs' own metrics.json: training apart from setup and the final evaluation
    assert runs["table"]["runs"] == 4 and runs["table"]["train_steps_per_s"] > 0
    assert "- the table, from its runs' metrics.json: 4 runs" in summary
    # capped runs (--max-steps 40) get no verdicts: every reference row is scored on its side only
    against = (out / "evidence-against.md").read_text()
    assert "**0 of 0 scored verdicts the same**; scored on one side only: A3, A4" in against
    assert results["against"] == {"compared": 0, "same": 0, "moved": []}
    # the check's table trains eager; the bench's second side is the step `aiayn train` builds (eager on a CPU)
    assert "the table: --compile none" in summary
    assert results["bench-auto"][0]["compile"] == "none" and results["bench-auto"][0]["residual_dtype"] == "fp32"
    assert results["bench-none"][0]["profile"]["launches_per_step"] > 0 and "  profile: " in summary  # --profile
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert {"logs/table.log", "logs/report.log"} <= set(tar.getnames())
    assert not list(tmp_path.glob("aiayn-gpu-check.*")), "the scratch folder was left behind"


@pytest.mark.slow
def test_the_first_call_gates_then_runs_sdpa_the_trained_step_and_the_table_on_a_cpu_in_its_smoke(cache, tmp_path):
    """`gpu-check.sh first` (smoke, on a CPU): the gate's figures, then each stage's JSON read into the summary: the
    kernel of every attention call, the step as training builds it with its profile, the table's pace; no report."""
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_SMOKE": "1", "OUT": str(out), "PYTHON": sys.executable}
    env.update({"AIAYN_CACHE": str(cache), "TMPDIR": str(tmp_path), "GATE_S": "60"})  # a busy CPU imports slowly
    env["GPU_CHECK_TABLE_S"] = "400"  # beside a neighbour: the table is to finish
    done = subprocess.run(
        ["bash", str(SCRIPT), "first"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "results.json", "summary.md"]
    summary = (out / "summary.md").read_text()
    for stage in ("sdpa", "bench-auto", "table"):
        assert f"| {stage} | ok |" in summary, summary
    assert "| report |" not in summary and "- gate: torch " in summary and "- sdpa: " in summary
    results = json.loads((out / "results.json").read_text())
    assert results["gate"]["torch"] and results["bench-auto"][0]["profile"]["launches_per_step"] > 0
    assert results["table"]["completed"] == 4 and "- the evidence table: the whole table in " in summary


def test_the_first_calls_stage_limits_and_gate_fit_in_six_minutes_with_a_minute_to_spare():
    """`first`'s stages run one after another, each under its limit (SIGKILL 10 s after it): sdpa, the step, and the
    table at the first call's TABLE_S; their limits, the kill margins and the gate are at most 5 minutes, leaving a
    minute of a 6-minute call for the install and the summary."""
    text = SCRIPT.read_text()
    block = text[text.index('if [ "$MODE" = first ]; then  # a new machine') :]
    block = block[: block.index("\nfi\n")]
    limits = [int(n) for n in re.findall(r"^\s*stage [\w-]+ (\d+) ", block, re.M)]
    limits.append(int(re.search(r'MODE" = first \]; then\n  TABLE_S=\$\{GPU_CHECK_TABLE_S:-(\d+)\}', text).group(1)))
    gate = int(re.search(r"^GATE_S=\$\{GATE_S:-(\d+)\}", text, re.M).group(1))
    assert len(limits) == 3 and gate == 5
    assert sum(limits) + 10 * len(limits) + gate <= 300, limits


def test_a_gate_that_finds_no_cuda_stops_the_call_before_any_stage(tmp_path):
    """Not in the smoke, on a machine whose torch sees no CUDA device: the gate stops the call in seconds, with its
    reason, before any stage, and leaves its log."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "TMPDIR": str(tmp_path), "GATE_S": "60"}
    env.pop("GPU_CHECK_SMOKE", None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # no device, on any machine
    done = subprocess.run(
        ["bash", str(SCRIPT), "first"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (out / "summary.md").read_text()
    assert "gate FAILED (exit 3: torch sees no CUDA device)" in summary and "| stage |" not in summary
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "summary.md"]
    assert not list(tmp_path.glob("aiayn-gpu-check.*")), "the scratch folder was left behind"


@pytest.mark.slow
def test_the_table_call_stopped_at_its_limit_counts_the_seed_steps_its_runs_trained(cache, tmp_path):
    """`gpu-check.sh table`, the whole table in one call: its two stages alone, the runs compiled as training compiles
    them by default, here cut by the stage's limit (as on a GPU where the whole table takes longer): the sweep stops
    cleanly (SIGTERM to its process group), no run finished, and the summary counts the seed-steps the unfinished
    runs trained from their curves and projects the whole table's wall from them."""
    out = tmp_path / "out"
    env = dict(os.environ, GPU_CHECK_SMOKE="1", OUT=str(out), PYTHON=sys.executable, AIAYN_CACHE=str(cache))
    env.update(TMPDIR=str(tmp_path), GPU_CHECK_TABLE_S="60", GPU_CHECK_TABLE_STEPS="2000")
    done = subprocess.run(
        ["bash", str(SCRIPT), "table"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "the table: --compile auto, limit 60 s" in summary
    assert "| table | FAILED (exit 124) |" in summary and "| paths |" not in summary
    assert "| report | not run: no run of the table finished |" in summary
    table = json.loads((out / "results.json").read_text())["table"]
    assert (table["runs"], table["completed"], table["seed_steps_planned"]) == (4, 0, 8000), table
    assert 0 < table["seed_steps"] < 8000 and table["projected_wall_s"] > 60
    assert "- the evidence table: 0 of 4 runs (stopped at the limit) in " in summary
