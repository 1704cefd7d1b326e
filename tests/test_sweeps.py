"""`aiayn table3` bookkeeping (Optuna), the W&B sweep export, and their bad input.

The bookkeeping tests use a stand-in runner that writes no model; the real runs are in the slow tier.
"""

import dataclasses
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import RunnerBackend, fake_popen

from aiayn.ablations.predictions import predictions, scored_rows
from aiayn.ablations.presets import PRESETS
from aiayn.ablations.selection import Selection
from aiayn.ablations.table import load_rows, select_rows
from aiayn.cli import main
from aiayn.common.errors import UserError
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.spec import experiment_name, resolve, sweep_key
from aiayn.sweeps.backends.local import LocalBackend
from aiayn.sweeps.backends.processes import PORTS, SubprocessBackend, child_environment
from aiayn.sweeps.export import SweepExportOptions, wandb_sweep, wandb_yaml
from aiayn.sweeps.folders import SweepOut, sweep_log
from aiayn.sweeps.table3 import SweepOptions, build_sweep, run_table3

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset


ROOT = Path(__file__).resolve().parents[1]
optuna.logging.set_verbosity(optuna.logging.WARNING)


class FakeRunner:
    """Records every (row, seed) it is asked to train; fails the rows in `fail`."""

    def __init__(self, fail=(), delay=0.0):
        self.calls, self.fail, self.delay, self.lock = [], set(fail), delay, threading.Lock()

    def __call__(self, opts, corpus, row, seed):
        with self.lock:
            self.calls.append((row, seed))
        time.sleep(self.delay)
        if row in self.fail:
            return {"row": row, "seed": seed, "status": "failed", "error": "RuntimeError: boom"}
        return {"row": row, "seed": seed, "status": "completed", "dev_bleu": 10.0 + seed}


def opts(tmp_path, rows=None, seeds=1, jobs=None, storage=None, gpus_per_job=None, **train):
    return SweepOptions(
        select=Selection(rows=rows, seeds=seeds),
        storage=storage,
        report="",
        jobs=jobs,
        gpus_per_job=gpus_per_job,
        train=TrainOptions(preset="tiny", out=str(tmp_path / "runs"), progress=False, **train),
    )


def grid(opts):
    return opts.select.pairs(PRESETS["tiny"])


def test_grid_is_the_presets_scored_rows_by_default_or_the_rows_asked_for_times_seeds(tmp_path):
    pairs = grid(opts(tmp_path, seeds=3))  # tiny: its pre-registered rows and base
    assert pairs == [(r, s) for r in ["base", *scored_rows("tiny")] for s in range(3)] and len(pairs) == 12
    everything = grid(opts(tmp_path, rows="all"))  # C2 is C1's config at tiny: trained once, as C1
    assert everything == [(r, 0) for r in select_rows(None) if r != "C2"] and len(everything) == 19
    assert grid(opts(tmp_path, rows="base,A")) == [("base", 0), ("A1", 0), ("A2", 0), ("A3", 0), ("A4", 0)]
    assert grid(opts(tmp_path, rows="C2")) == [("C1", 0)]
    more_base = Selection(rows="base,A1", seeds=2, base_seeds=3, first_seed=5).pairs(PRESETS["tiny"])
    assert more_base == [("base", 5), ("base", 6), ("base", 7), ("A1", 5), ("A1", 6)]
    # the preset's own seeds: its `seeds` per row, `base_seeds` for base and for the rows predicted equivalent to it,
    # and where the registration names a row's seeds (ablations/predictions.csv), those; read from the registry, so
    # that a registration changes the data, not this test
    preset = PRESETS["evidence"]
    evidence = Selection().pairs(preset)
    registered = predictions("evidence")
    rows = [r for r in select_rows("all", True) if r in set(scored_rows("evidence"))]  # table order

    def wanted(row):
        p = registered[row]
        return p.seeds or (preset.base_seeds if p.equivalence else preset.seeds)

    assert evidence == [("base", s) for s in range(preset.base_seeds)] + [
        (r, s) for r in rows for s in range(wanted(r))
    ]
    first = rows[0]
    n = preset.base_seeds
    assert Selection(seeds=2).pairs(preset)[n : n + 3] == [(first, 0), (first, 1), (rows[1], 0)]  # --seeds: each row


def test_sweep_runs_each_pair_once_and_a_rerun_runs_nothing(tmp_path):
    runner = FakeRunner()
    summary = run_table3(opts(tmp_path, rows="base,C", seeds=2), backend=RunnerBackend(runner))
    assert sorted(runner.calls) == sorted(grid(opts(tmp_path, rows="base,C", seeds=2)))
    assert summary.counts() == {
        "pairs": 14,
        "ran": 14,
        "completed": 14,
        "failed": 0,
        "diverged": 0,
    }  # C2 is C1 at tiny: 7 rows x 2 seeds
    again = FakeRunner()
    assert (
        run_table3(opts(tmp_path, rows="base,C", seeds=2), backend=RunnerBackend(again)).ran == 0 and again.calls == []
    )
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=f"sqlite:///{tmp_path / 'runs/optuna.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 14 and {t.user_attrs["row"] for t in done} == set(select_rows("base,C")) - {"C2"}
    assert (
        done[0]
        .user_attrs["run_dir"]
        .endswith(f"tiny/synthetic/{done[0].user_attrs['row']}/seed{done[0].user_attrs['seed']}")
    )


def test_a_second_seed_set_into_the_same_out_counts_its_own_pairs(tmp_path, caplog):
    """`--first-seed 1` into the --out of seed set {0}: its progress lines count its own pairs, [1/2] and [2/2],
    not the study's earlier ones too ([3/2], [4/2])."""
    first = opts(tmp_path, rows="base,A1")
    run_table3(first, backend=RunnerBackend(FakeRunner()))
    caplog.clear()
    second = dataclasses.replace(first, select=Selection(rows="base,A1", first_seed=1))
    with caplog.at_level(logging.INFO, logger="aiayn.sweeps.backends"):
        assert run_table3(second, backend=RunnerBackend(FakeRunner())).completed == 2
    counts = re.findall(r"^\[(\d+)/(\d+)\] ", "\n".join(r.getMessage() for r in caplog.records), re.M)
    assert counts == [("1", "2"), ("2", "2")]


def test_queue_runs_longest_first(tmp_path):
    runner = FakeRunner()
    run_table3(opts(tmp_path, rows="base,C,big", jobs=1), backend=RunnerBackend(runner))
    cost = {row: resolve(row, "tiny").cost() for row in select_rows("base,C,big") if row != "C2"}  # C2 is C1 at tiny
    assert [row for row, _ in runner.calls] == sorted(cost, key=lambda r: -cost[r])
    assert runner.calls[0] == ("big", 0) and runner.calls[-1] == ("C4", 0)  # 3x steps and widest; narrowest


class ConcurrencyRunner(FakeRunner):
    """Also records how many pairs ran at the same moment. Each pair waits (up to 30 s) until `expect` pairs have
    run at once, so that a loaded machine's slow workers still overlap: fewer workers than `expect` read as fewer
    (after the wait), more read as more."""

    def __init__(self, expect: int = 0, **kw):
        super().__init__(**kw)
        self.active = self.most = 0
        self.expect, self.changed = expect, threading.Condition(self.lock)

    def __call__(self, opts, corpus, row, seed):
        with self.changed:
            self.active += 1
            self.most = max(self.most, self.active)
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.most >= self.expect, timeout=30)
        try:
            return super().__call__(opts, corpus, row, seed)
        finally:
            with self.lock:
                self.active -= 1


@pytest.mark.parametrize("jobs", [2, 3])
def test_jobs_run_pairs_at_once_each_exactly_once(tmp_path, jobs):
    runner = ConcurrencyRunner(expect=jobs, delay=0.2)
    summary = run_table3(opts(tmp_path, rows="base,A", seeds=2, jobs=jobs), backend=RunnerBackend(runner))
    assert summary.counts() == {"pairs": 10, "ran": 10, "completed": 10, "failed": 0, "diverged": 0}
    assert set(Counter(runner.calls).values()) == {1} and len(runner.calls) == 10
    assert runner.most == jobs
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=f"sqlite:///{tmp_path / 'runs/optuna.db'}")
    assert len(study.trials) == 10  # no worker invented a trial when it found the queue empty


def test_jobs_share_the_cores_and_one_process_runs_are_forked_from_the_forkserver(tmp_path, monkeypatch):
    forked, spawned = [], []

    class FakeProcess:
        def __init__(self, target, args):
            forked.append(args)
            self.args, self.exitcode, self.pid = args, 1, 2**22 + 1  # a pid no process has (above pid_max's default)

        def start(self):  # the child would write its log
            Path(self.args[2]).write_text("RuntimeError: boom\n")

        def join(self):
            pass

    monkeypatch.setattr("aiayn.sweeps.backends.local._forkserver", lambda: type("Ctx", (), {"Process": FakeProcess}))
    monkeypatch.setattr("subprocess.Popen", fake_popen(spawned))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    for jobs in (1, 2, 3):
        assert LocalBackend().run_one(build_sweep(opts(tmp_path, jobs=jobs)), "base", 0, None).status == "failed"
    assert [threads for _, _, _, threads in forked] == [None, 4, 2]
    assert (forked[0][0].row, forked[0][0].seed, forked[0][0].progress) == ("base", 0, False)
    assert forked[0][1] == resolve("base", "tiny")  # the driver's spec, handed to the run
    SubprocessBackend().run_one(build_sweep(opts(tmp_path, jobs=2, devices=2)), "base", 0, None)  # DDP: a fresh one
    assert len(forked) == 3 and spawned[0][1]["OMP_NUM_THREADS"] == "4"
    cmd = spawned[0][0]
    assert cmd[1:4] == ["-m", "aiayn", "train"] and cmd[cmd.index("--devices") + 1] == "2"
    assert "--no-progress" in cmd and cmd[cmd.index("--row") + 1] == "base"


def test_a_run_whose_process_dies_before_its_log_exists_fails_with_a_line_not_a_traceback(tmp_path, monkeypatch):
    class DiesAtStart:  # a forkserver child that could not even import aiayn: no log was ever opened
        def __init__(self, target, args):
            self.exitcode, self.pid = 1, 2**22 + 1  # a pid no process has (above pid_max's default)

        def start(self):
            pass

        def join(self):
            pass

    monkeypatch.setattr("aiayn.sweeps.backends.local._forkserver", lambda: type("Ctx", (), {"Process": DiesAtStart}))
    result = LocalBackend().run_one(build_sweep(opts(tmp_path)), "base", 0, None)
    assert result.status == "failed" and "no log" in result.error and "exit 1" in result.error


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_the_package_imports_from_a_checkout_without_an_install_mapping_its_subpackages():
    """A sweep's forkserver (and `python -m aiayn`) started in a checkout finds the checkout's aiayn/ first on
    sys.path, ahead of any regular install; the subpackages beside it must still import (they crashed every pair
    of a sweep run from the checkout's root with a non-editable install)."""
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
        "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in repr(h).lower()]; "
        "sys.path_importer_cache.clear(); "
        "import aiayn.lightning_modules.run.train, aiayn.sweeps.backends, aiayn.ablations.presets, aiayn.reports; "
        "print(aiayn.__file__); print(aiayn.lightning_modules.run.train.__file__)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    package, train = done.stdout.split()
    assert Path(package) == ROOT / "aiayn" / "__init__.py"  # the checkout's, as the forkserver would import it
    assert Path(train) == ROOT / "lightning_modules" / "run" / "train.py"


def test_a_failing_row_does_not_stop_the_sweep_and_is_retried_on_rerun(tmp_path):
    runner = FakeRunner(fail={"A1"})
    summary = run_table3(opts(tmp_path, rows="base,A1,A2"), backend=RunnerBackend(runner))
    assert summary.completed == 2 and summary.failed == 1
    retry = FakeRunner()
    assert run_table3(opts(tmp_path, rows="base,A1,A2"), backend=RunnerBackend(retry)).completed == 1
    assert retry.calls == [("A1", 0)]


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_two_workers_on_one_storage_run_each_pair_once(tmp_path, storage):
    url = f"sqlite:///{tmp_path / 'runs/optuna.db'}" if storage == "sqlite" else f"journal:///{tmp_path}/j.log"
    (tmp_path / "runs").mkdir()
    runner = FakeRunner(delay=0.02)
    errors = []

    def worker():
        try:
            run_table3(opts(tmp_path, rows="base,A,B,C", storage=url), backend=RunnerBackend(runner))
        except Exception as e:  # a crashed worker must fail the test, not vanish in its thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    counts = Counter(runner.calls)
    assert set(counts) == set(grid(opts(tmp_path, rows="base,A,B,C"))) and max(counts.values()) == 1


def load_wandb_sweeps():
    """W&B's open-source sweep engine, PyPI `sweeps` (the `wandb[sweeps]` extra, a test dependency). It is
    a top-level `sweeps` package; ours installs as `aiayn.sweeps`, so the two live side by side. Only the
    repository root itself holds a directory named `sweeps/` (ours, as files): `python -m pytest` puts the
    working directory on sys.path, so it is left out while W&B's is imported."""
    import importlib

    root = Path(__file__).resolve().parents[1]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]
    try:
        if "sweeps" in sys.modules and Path(sys.modules["sweeps"].__file__).resolve().is_relative_to(root):
            del sys.modules["sweeps"]
        sweeps = importlib.import_module("sweeps")
    finally:
        sys.path[:] = saved

    assert hasattr(sweeps, "schema_violations_from_proposed_config"), f"not W&B's sweeps: {sweeps.__file__}"
    return sweeps


@pytest.mark.parametrize("preset", ["tiny", "small", "paper"])
def test_wandb_sweep_yaml_validates_and_its_grid_is_rows_times_seeds(preset):
    ws = load_wandb_sweeps()
    cfg = yaml.safe_load(wandb_yaml(preset, seeds=2))
    assert ws.schema_violations_from_proposed_config(cfg) == []
    runs = []
    while (run := ws.next_run(cfg, runs)) is not None:
        run.state = ws.RunState.finished
        runs.append(run)
    got = sorted((r.config["row"]["value"], r.config["seed"]["value"]) for r in runs)
    assert got == sorted((row, seed) for row in select_rows(None) for seed in range(2))


@pytest.mark.parametrize("preset", ["quick", "tiny", "small", "paper"])
def test_committed_sweep_definitions_are_up_to_date(preset):
    committed = (ROOT / "sweeps" / preset / "wandb.yaml").read_text()
    assert committed == wandb_yaml(preset), (
        f"regenerate: aiayn sweep export --wandb --preset {preset} --out sweeps/{preset}/wandb.yaml"
    )
    assert committed.startswith("# Generated by `aiayn sweep export") and "# Launch: wandb sweep" in committed


def test_sweep_export_defaults_to_the_main_jobs_preset():
    """`aiayn sweep export --wandb` exported the tiny preset's sweep where `aiayn table3` runs quick's."""
    assert SweepExportOptions().preset == SweepOptions().train.preset == "quick"


def test_wandb_command_runs_aiayn_train_with_row_and_seed():
    cfg = wandb_sweep("paper")
    assert cfg["command"] == ["aiayn", "train", "--preset", "paper", "--wandb", "${args}"]
    assert cfg["method"] == "grid" and cfg["project"] == "aiayn-paper-wmt14"  # the MLflow experiment's name too


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_wandb_sweeps_metric_is_one_its_preset_logs(preset):
    """The sweep file optimized val/bleu, which presets with val_bleu_sentences 0 (tiny, evidence) never
    log, so W&B's sweep had no metric to read."""
    p = PRESETS[preset]
    logged = {"val/ppl": "minimize", **({"val/bleu": "maximize"} if p.val_bleu_sentences else {})}
    metric = wandb_sweep(preset)["metric"]
    assert metric["name"] in logged and metric["goal"] == logged[metric["name"]]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["table3", "--rows", "base,Q"], "unknown row or group 'Q' in --rows"),
        (["table3", "--preset", "huge"], "unknown preset 'huge'"),
        (["table3", "--seeds", "0"], "argument --seeds: expected a positive integer, got 0"),
        (["table3", "--storage", "redis://localhost/0"], "has an unknown scheme"),
        (
            ["table3", "--storage", "postgresql://user:hunter2@127.0.0.1:9/db"],
            "postgresql://user:***@",  # the password masked, whether the driver or the server is missing
        ),
        (["sweep", "export", "--preset", "tiny"], "sweep export needs a target; pass --wandb"),
    ],
)
def test_bad_sweep_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
    assert (
        main(
            [
                *argv,
                "--out" if argv[0] == "table3" else "--rows",
                str(tmp_path / "runs") if argv[0] == "table3" else "base",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "hunter2" not in err
    assert not (tmp_path / "runs" / "tiny").exists()


def test_unknown_scheme_is_a_user_error_without_the_password():
    from aiayn.sweeps.storage import open_storage

    with pytest.raises(UserError) as e:
        open_storage("mongodb://admin:s3cret@db/x")
    assert "s3cret" not in str(e.value) and "***" in str(e.value)


@pytest.mark.slow
def test_hpo_runs_trials_and_saves_the_best(cache, tmp_path, capsys):
    """Three short in-process trials: TPE suggestions inside the search space, best params saved.
    (Three steps end before the first epoch-end validation, so pruning is not exercised here.)"""
    out = tmp_path / "runs"
    argv = [*"hpo --row C1 --preset tiny --trials 3 --out".split(), str(out), *"--max-steps 3 --eval-subset 4".split()]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    best = json.loads((out / "hpo/tiny/C1/best.json").read_text())
    assert best == result and result["trials"] == 3
    assert set(result["best_params"]) == {"lr_factor", "warmup", "P_drop"}  # label smoothing only by --space
    assert 0.25 <= result["best_params"]["lr_factor"] <= 4.0 and 0.0 <= result["best_params"]["P_drop"] <= 0.4
    assert result["best_dev_ppl"] > 1


# --- one multi-GPU machine without SLURM: --jobs N --gpus-per-job K (tested without GPUs)


class GpuRunner(ConcurrencyRunner):
    """Records the GPUs each pair was given, and the GPUs of the pairs running at the same moment."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.running, self.clashes, self.given = set(), [], []

    def __call__(self, opts, corpus, row, seed, gpus=None):
        with self.lock:
            mine = set(gpus.split(","))
            self.clashes += [(gpus, other) for other in self.running if mine & set(other.split(","))]
            self.running.add(gpus)
            self.given.append((row, gpus, opts.train.devices))
        try:
            return super().__call__(opts, corpus, row, seed)
        finally:
            with self.lock:
                self.running.discard(gpus)


def test_each_concurrent_run_gets_its_own_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr("aiayn.sweeps.backends.processes.visible_gpus", lambda: [str(i) for i in range(8)])
    runner = GpuRunner(delay=0.6)
    sweep = opts(tmp_path, rows="base,A,B", seeds=2, jobs=4, gpus_per_job=2)
    summary = run_table3(sweep, backend=RunnerBackend(runner, SubprocessBackend))
    # (most: how many ran at once, at least 3 of 4 on a busy machine, so the check of clashes had some to see)
    assert summary.completed == 14 and runner.most >= 3 and runner.clashes == []
    assert {gpus for _, gpus, _ in runner.given} == {"0,1", "2,3", "4,5", "6,7"}
    assert {devices for _, _, devices in runner.given} == {2}  # each run is DDP over its 2 GPUs


def test_the_gpus_handed_out_are_those_visible_to_the_sweep(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")

    def slots(jobs, k):
        sweep = build_sweep(SweepOptions(jobs=jobs, gpus_per_job=k))
        SubprocessBackend().check(sweep)
        return SubprocessBackend().slots(sweep), sweep.train.devices

    assert slots(4, 1) == (["4", "5", "6", "7"], 1)
    assert slots(2, 2) == (["4,5", "6,7"], 2)
    assert slots(4, None) == (["4", "5", "6", "7"], 1)  # without --gpus-per-job: one each, there are enough
    # More one-GPU runs than GPUs share them, round robin (small runs use a few percent of a GPU each);
    # before, nothing was handed out and every run landed on the first GPU
    assert slots(6, None) == (["4", "5", "6", "7", "4", "5"], 1)
    assert slots(8, 1) == (["4", "5", "6", "7"] * 2, 1)


def test_a_runs_own_process_inherits_no_launchers_variables(monkeypatch):
    """Inside an sbatch allocation (or a DDP rank) the sweep's child must not pick Lightning's SLURM environment or
    meet another run on one MASTER_PORT."""
    inherited = {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_ID": "77",
        "MASTER_PORT": "15077",
        "MASTER_ADDR": "node1",
        "NODE_RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }
    for name, value in inherited.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KEEP_ME", "yes")
    a, b = child_environment(PORTS.take(), "0", 4), child_environment(PORTS.take(), "1", None)
    assert not {k for k in a if k.startswith(("SLURM_", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR"))}
    assert a["KEEP_ME"] == "yes" and (a["CUDA_VISIBLE_DEVICES"], a["OMP_NUM_THREADS"]) == ("0", "4")
    assert a["MASTER_PORT"] != b["MASTER_PORT"] != "15077" and "OMP_NUM_THREADS" not in b


def test_a_run_on_its_gpus_is_a_fresh_process_with_its_cuda_visible_devices(tmp_path, monkeypatch):
    spawned = []
    monkeypatch.setattr("subprocess.Popen", fake_popen(spawned))
    monkeypatch.setattr("aiayn.sweeps.backends.local._forkserver", lambda: pytest.fail("a GPU run must not be forked"))
    monkeypatch.setattr("aiayn.sweeps.backends.processes.visible_gpus", lambda: ["0", "1", "2", "3"])
    for gpus, devices in (("3", 1), ("2,3", 2)):
        sweep = build_sweep(opts(tmp_path, jobs=2, gpus_per_job=devices, devices=devices))
        SubprocessBackend().run_one(sweep, "base", 0, gpus)
    (cmd1, env1), (cmd2, env2) = spawned
    assert (env1["CUDA_VISIBLE_DEVICES"], env2["CUDA_VISIBLE_DEVICES"]) == ("3", "2,3")
    assert "--devices" not in cmd1 and cmd2[cmd2.index("--devices") + 1] == "2"
    assert cmd2[1:4] == ["-m", "aiayn", "train"] and cmd2[cmd2.index("--row") + 1] == "base"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--jobs", "3", "--gpus-per-job", "2"],
            "--jobs 3 x --gpus-per-job 2 needs 6 GPUs but 4 are visible (0,1,2,3); lower --jobs or --gpus-per-job",
        ),
        (
            ["--gpus-per-job", "1", "--accelerator", "cpu"],
            "--gpus-per-job 1 hands out GPUs but --accelerator cpu trains on CPUs; drop one of them",
        ),
        (
            ["--gpus-per-job", "2", "--devices", "4"],
            "--devices 4 and --gpus-per-job 2 disagree: each run trains on its 2 "
            "GPUs of this machine; drop --devices/--num-nodes",
        ),
    ],
)
def test_bad_gpu_requests_are_one_line_and_write_nothing(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert main(["table3", "--out", str(tmp_path / "runs"), "--rows", "base", *argv]) == 2
    assert capsys.readouterr().err == f"aiayn: error: {message}\n"
    assert not (tmp_path / "runs").exists()


def test_concurrent_runs_get_a_gpu_each_by_default_when_the_sweep_sees_enough(tmp_path, monkeypatch):
    """`aiayn table3 --jobs 4` on a 4-GPU node put all four runs on cuda:0; `--jobs 16` there, all sixteen."""
    monkeypatch.setattr("aiayn.sweeps.table3.visible_gpus", lambda: ["0", "1", "2", "3"])
    assert build_sweep(opts(tmp_path, jobs=4)).gpus_per_job == 1
    assert build_sweep(opts(tmp_path, jobs=16)).gpus_per_job == 1  # more runs than GPUs: they share, 4 a GPU
    assert build_sweep(opts(tmp_path, jobs=2, accelerator="cpu")).gpus_per_job is None
    assert build_sweep(opts(tmp_path, jobs=2, gpus_per_job=2)).gpus_per_job == 2
    monkeypatch.setattr("aiayn.sweeps.table3.visible_gpus", lambda: [])
    assert build_sweep(opts(tmp_path, jobs=2)).gpus_per_job is None  # a CPU machine: as before


@pytest.fixture
def runner_backend(monkeypatch):
    """`--backend runner` on the command line: the queue back end with a stand-in for training (FakeRunner)."""
    from aiayn.sweeps import backends

    def install(runner):
        monkeypatch.setitem(backends.BACKENDS, "runner", type(RunnerBackend(runner)))

    return install


T3 = ["table3", "--preset", "tiny", "--report", "", "--backend", "runner"]


def test_table3_exits_1_when_a_pair_failed_0_when_all_completed_and_diverged_counts_if_asked(
    tmp_path, runner_backend, capsys
):
    out = ["--out", str(tmp_path / "runs")]
    runner_backend(FakeRunner(fail={"A1"}))
    assert main([*T3, *out, "--rows", "base,A1"]) == 1 and "1 completed, 1 failed" in capsys.readouterr().out
    runner_backend(FakeRunner())
    assert main([*T3, *out, "--rows", "base,A1"]) == 0  # the rerun retries A1, and everything is done

    def diverges(sweep, corpus, row, seed):
        return {"row": row, "seed": seed, "status": "diverged", "error": "loss is nan at step 3"}

    runner_backend(diverges)
    div = ["--out", str(tmp_path / "div"), "--rows", "B1"]
    assert main([*T3, *div]) == 0  # a diverged run is a result
    assert main([*T3, *div, "--fail-on-diverged"]) == 1


def test_status_lists_every_pair_completed_running_failed_and_pending(tmp_path, runner_backend, capsys):
    from aiayn.common.files import atomic_write_json
    from aiayn.lightning_modules.run.rundir import RunMetrics
    from aiayn.sweeps.books import LockClaims, pair_key

    fake = FakeRunner(fail={"A1"})

    def writes_metrics(sweep, corpus, row, seed):  # as a run does: its metrics.json in its run directory
        out = fake(None, corpus, row, seed)
        metrics = RunMetrics.from_dict({"preset": sweep.preset.name, "data": corpus.name, **out})
        atomic_write_json(sweep.run(row, seed).metrics_file, metrics.to_dict())
        return out

    runs = tmp_path / "runs"
    runner_backend(writes_metrics)
    assert main([*T3, "--out", str(runs), "--rows", "base,A1,A2,A3"]) == 1
    # A2 is run by a live worker now, A3 has not started yet
    for row in ("A2", "A3"):
        (runs / "tiny" / "synthetic" / row / "seed0" / "metrics.json").unlink()
    # A2 got to step 500 of its plan: its config.json as `aiayn train` writes it, and its periodic checkpoints
    a2 = runs / "tiny" / "synthetic" / "A2" / "seed0"
    capsys.readouterr()
    assert main(["train", "--preset", "tiny", "--row", "A2", "--out", str(runs), "--print-config"]) == 0
    (a2 / "config.json").write_text(capsys.readouterr().out)
    (a2 / "checkpoints").mkdir(parents=True)
    for name in ("step0000250.ckpt", "step0000500.ckpt", "last.ckpt"):
        (a2 / "checkpoints" / name).write_bytes(b"")
    held = LockClaims(SweepOut(runs), "pair").take(pair_key("tiny", SYNTHETIC, "A2", 0))
    try:
        capsys.readouterr()
        assert main(["status", str(runs), "--json"]) == 0
        (sweep,) = json.loads(capsys.readouterr().out)
        states = {p["row"]: p for p in sweep["pairs"]}
        assert {r: p["state"] for r, p in states.items()} == {
            "base": "completed",
            "A1": "failed",
            "A2": "running",
            "A3": "pending",
        }
        assert states["base"]["dev_bleu"] == 10.0 and states["A1"]["error"] == "RuntimeError: boom"
        assert states["A2"]["holder"].endswith(f":{os.getpid()}") and states["A2"]["age_s"] >= 0
        steps = PRESETS["tiny"].train_steps
        assert (states["A2"]["step"], states["A2"]["steps"], states["A3"]["step"]) == (500, steps, None)
        assert (sweep["preset"], sweep["corpus"], sweep["counts"]["pending"]) == ("tiny", "synthetic", 1)
        assert main(["status", str(runs)]) == 0
        text = capsys.readouterr().out
        assert "tiny on synthetic: 4 pairs (1 completed, 1 running, 1 failed, 1 pending)" in text
        assert "A1    seed 0   failed     RuntimeError: boom" in text
        assert f"A2    seed 0   running    {states['A2']['holder']}, for " in text
        assert text.split("A2    seed 0")[1].split("\n")[0].endswith(f", checkpointed at step 500 of {steps}")
    finally:
        held.close()


def test_status_of_a_directory_that_is_not_a_sweep_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path} holds no sweep" in err


def test_a_pair_that_fails_before_training_is_failed_in_status_and_report_alike(tmp_path, runner_backend, capsys):
    """One truth: a pair whose run never wrote a metrics.json (its directory holds another config, say)
    is `failed` with its reason in `aiayn status` and in the report, not `pending` and "none"; `aiayn status`
    writes nothing (no lock files); a later completion clears the failure."""
    from aiayn.common.files import atomic_write_json
    from aiayn.lightning_modules.run.rundir import RunMetrics

    def a1_fails_before_training(sweep, corpus, row, seed):
        if row == "A1":  # as the local back end returns it: metrics of the driver's, none in the run directory
            return {"row": row, "seed": seed, "status": "failed", "error": "exit 2: run directory holds another config"}
        out = {"row": row, "seed": seed, "status": "completed", "dev_bleu": 10.0, "dev_ppl": 2.0}
        metrics = RunMetrics.from_dict({"preset": sweep.preset.name, "data": corpus.name, **out})
        atomic_write_json(sweep.run(row, seed).metrics_file, metrics.to_dict())
        return out

    runs = tmp_path / "runs"
    runner_backend(a1_fails_before_training)
    assert main([*T3, "--out", str(runs), "--rows", "base,A1"]) == 1
    before = sorted(p.relative_to(runs) for p in runs.rglob("*"))
    capsys.readouterr()
    assert main(["status", str(runs), "--json"]) == 0
    (sweep,) = json.loads(capsys.readouterr().out)
    a1 = next(p for p in sweep["pairs"] if p["row"] == "A1")
    assert (a1["state"], a1["error"]) == ("failed", "exit 2: run directory holds another config")
    assert sorted(p.relative_to(runs) for p in runs.rglob("*")) == before, "aiayn status wrote files"
    assert main(["report", "--runs", str(runs), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "table3-tiny.md").read_text(encoding="utf-8")
    assert "- Runs that did not complete (1):\n  - A1 seed 0: failed: exit 2: run directory holds another config" in md
    runner_backend(FakeRunner())
    assert main([*T3, "--out", str(runs), "--rows", "base,A1"]) == 0
    assert not list(runs.rglob("*.failed.json"))


def test_status_writes_no_lock_file_for_a_pair_nobody_ever_claimed(tmp_path, capsys):
    runs = tmp_path / "runs"
    record = runs / "sweeps" / "tiny-synthetic.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"preset": "tiny", "corpus": "synthetic", "pairs": [["base", 0], ["A1", 0]]}))
    assert main(["status", str(runs)]) == 0
    assert "2 pending" in capsys.readouterr().out
    assert sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*")) == ["sweeps", "sweeps/tiny-synthetic.json"]


def test_a_rerun_appends_to_the_pairs_log_under_a_header_per_attempt(tmp_path, monkeypatch):
    from aiayn.sweeps.backends import local as backends

    class Child:  # the forkserver child, run in this process: _train_in_child's log handling, then "training"
        def __init__(self, target, args):
            self.logfile = args[2]
            self.exitcode, self.pid = None, 2**22 + 1  # a pid no process has

        def start(self):
            with open(self.logfile, "a") as f:
                f.write(backends.attempt_header() + "training output\n")
            self.exitcode = 1

        def join(self):
            pass

    monkeypatch.setattr(backends, "_forkserver", lambda: type("Ctx", (), {"Process": Child}))
    sweep = build_sweep(opts(tmp_path))
    for _ in range(2):
        LocalBackend().run_one(sweep, "base", 0, None)
    log_text = sweep_log(sweep.out.run("tiny", SYNTHETIC, "base", 0)).read_text()
    assert log_text.count("===== aiayn: attempt started") == 2 and log_text.count("training output") == 2
    # and the real child opens it for appending, never truncating
    source = inspect.getsource(backends._train_in_child)
    assert "O_APPEND" in source and "O_TRUNC" not in source
    assert "die_with_parent()" in source  # the forkserver's children end when it does, and it ends with its driver


def test_a_trainer_dies_with_its_driver(tmp_path):
    """A child that called die_with_parent() (every sweep trainer does, through the forkserver or AIAYN_DIE_WITH_
    PARENT) gets SIGTERM when its parent is killed, however it is killed."""
    import signal
    import subprocess
    import textwrap

    pidfile = tmp_path / "child.pid"
    driver = textwrap.dedent(f"""
        import os, subprocess, sys, time
        env = {{**os.environ, "AIAYN_DIE_WITH_PARENT": "1"}}
        child = subprocess.Popen([sys.executable, "-c", "import time; from aiayn.common.lifetime import "
                                  "die_with_parent; die_with_parent(); open({str(pidfile)!r}, 'w').write("
                                  "str(__import__('os').getpid())); time.sleep(60)"], env=env)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.time() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline, "the child never started"
        time.sleep(0.05)
    child = int(pidfile.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived its killed parent")


def test_print_config_masks_a_storage_password_and_a_dollar_reference_reads_the_environment(
    tmp_path, capsys, monkeypatch
):
    from aiayn.sweeps.storage import expand

    url = "postgresql://aiayn:s3cr3t-pw@db.example/aiayn"
    assert main(["table3", "--storage", url, "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "s3cr3t-pw" not in out and "postgresql://aiayn:***@db.example/aiayn" in out
    assert "printed as ***" in err
    monkeypatch.setenv("PGPASSWORD_TEST", "s3cr3t-pw")
    assert expand("postgresql://aiayn:$PGPASSWORD_TEST@db.example/aiayn") == url
    assert expand("postgresql://aiayn:${PGPASSWORD_TEST}@db.example/aiayn") == url
    # only the password is expanded: a variable elsewhere (a host, a user, a path) stays as written, so a shared
    # config cannot print a variable's value in a URL or send it to a host it names
    monkeypatch.setenv("AIAYN_HOST_TEST", "evil.example")
    for kept in ("postgresql://$AIAYN_HOST_TEST:pw@db.example/x", "postgresql://u:pw@$AIAYN_HOST_TEST/x"):
        assert expand(kept) == kept
    assert expand("journal:///$AIAYN_HOST_TEST/books.log") == "journal:///$AIAYN_HOST_TEST/books.log"


def test_a_sweeps_row_and_seed_are_on_each_trial_for_optunas_tools(tmp_path, runner_backend):
    """Optuna's tools show the table: each table3 trial carries its row and seed as user attributes (the books'
    source) and as parameters, the values enqueued, never sampled: the row a categorical over the table's rows when
    the study was created, the seed an integer on a fixed range; `trials_dataframe()` has a row column, and
    optuna-dashboard's own API names every trial's row (where it installs)."""
    runner_backend(FakeRunner())
    out = tmp_path / "runs"
    assert main([*T3, "--out", str(out), "--rows", "base,A1,C4", "--seeds", "2"]) == 0
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=f"sqlite:///{out / 'optuna.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    pairs = sorted((r, s) for r in ("base", "A1", "C4") for s in (0, 1))
    assert sorted((t.params["row"], t.params["seed"]) for t in done) == pairs
    assert all((t.params["row"], t.params["seed"]) == (t.user_attrs["row"], t.user_attrs["seed"]) for t in done)
    assert isinstance(done[0].distributions["seed"], optuna.distributions.IntDistribution)
    assert list(done[0].distributions["row"].choices) == list(load_rows())  # every row of the table, not the sweep's
    frame = study.trials_dataframe()
    assert sorted(zip(frame["params_row"], frame["params_seed"])) == pairs

    dashboard = pytest.importorskip("optuna_dashboard")
    from wsgiref.util import setup_testing_defaults

    app = dashboard.wsgi(optuna.storages.RDBStorage(f"sqlite:///{out / 'optuna.db'}"))

    def get(path: str) -> dict:
        environ = {}
        setup_testing_defaults(environ)
        environ["PATH_INFO"], _, environ["QUERY_STRING"] = path.partition("?")
        status = []
        body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
        assert status == ["200 OK"], (path, status, body[:300])
        return json.loads(body)

    (summary,) = get("/api/studies")["study_summaries"]
    trials = get(f"/api/studies/{summary['study_id']}?after=0")["trials"]
    named = {t["number"]: {p["name"]: p["param_external_value"] for p in t["params"]} for t in trials}
    assert sorted((p["row"], int(p["seed"])) for p in named.values()) == pairs


def test_optunas_lines_are_printed_in_aiayns_format(tmp_path):
    """Optuna's own lines (a study created) come out as aiayn's, once, not in Optuna's `[I 2026-...]` format before
    aiayn's first: in a fresh process, logging configured as the command line does it and Optuna imported after."""
    code = (
        "from aiayn.common.logs import configure_logging; configure_logging(); "
        "from aiayn.sweeps.storage import open_storage; import optuna; "
        "optuna.create_study(study_name='s', storage=open_storage('sqlite:///books.db'))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["INFO optuna.storages._rdb.storage: A new study created in RDB with name: s"]


def _as_a_new_process(monkeypatch, tables: tuple) -> None:
    """What a later `aiayn table3` process sees after the user edited ablations/: the table files `tables`, and
    every module-level value derived from them computed again (as a fresh import would)."""
    import importlib

    from aiayn.ablations import table
    from aiayn.sweeps.backends import queue

    monkeypatch.setattr(table, "TABLE_FILES", tables)
    table._load_rows.cache_clear()
    importlib.reload(queue)


@pytest.fixture
def restore_queue():
    yield
    import importlib

    from aiayn.ablations import table
    from aiayn.sweeps.backends import queue

    table._load_rows.cache_clear()
    importlib.reload(queue)


def test_a_row_added_to_the_table_joins_an_existing_study_and_runs_alone(
    tmp_path, runner_backend, monkeypatch, restore_queue, caplog
):
    """A row appended to ablations/extended.csv between two `aiayn table3` runs on one --out crashed the
    second ("CategoricalDistribution does not support dynamic value space": the row parameter's choices were the
    table's rows). Now the new row joins the study and runs alone; a row removed from the table, and a user --table
    with new names, join it too."""
    from aiayn.ablations import table

    extended = tmp_path / "extended.csv"
    extended.write_text(table.TABLE_FILES[1].read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "runs"
    _as_a_new_process(monkeypatch, (table.TABLE_FILES[0], extended))
    first = FakeRunner()
    runner_backend(first)
    assert main([*T3, "--out", str(out), "--rows", "base,A1,rope"]) == 0
    assert sorted(first.calls) == [("A1", 0), ("base", 0), ("rope", 0)]

    with extended.open("a", encoding="utf-8") as f:  # the user appends a row, then reruns on the same --out
        f.write("wide-ff,extended,,,4096,,,,,,,,,d_ff 4096 (added later)\n")
    _as_a_new_process(monkeypatch, (table.TABLE_FILES[0], extended))
    second = FakeRunner()
    runner_backend(second)
    with caplog.at_level("INFO"):
        assert main([*T3, "--out", str(out), "--rows", "base,A1,rope,wide-ff"]) == 0
    assert second.calls == [("wide-ff", 0)]
    assert "wide-ff: not among the rows this study was created with" in caplog.text

    # rope removed from the table, and a user's own table with a new name: both join the same study
    extended.write_text(
        "".join(
            line
            for line in extended.read_text(encoding="utf-8").splitlines(keepends=True)
            if not line.startswith("rope,")
        ),
        encoding="utf-8",
    )
    mine = tmp_path / "mine.csv"
    mine.write_text("row,group,h\nmy-heads,mine,2\n", encoding="utf-8")
    _as_a_new_process(monkeypatch, (table.TABLE_FILES[0], extended))
    third = FakeRunner()
    runner_backend(third)
    assert main([*T3, "--out", str(out), "--table", str(mine), "--rows", "base,A1,wide-ff,my-heads"]) == 0
    assert third.calls == [("my-heads", 0)]
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=f"sqlite:///{out / 'optuna.db'}")
    done = {t.user_attrs["row"]: t.params for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert set(done) == {"base", "A1", "rope", "wide-ff", "my-heads"}
    # the rows of the table when the study was created are its row parameter; the later ones a user attribute alone
    assert {row: params.get("row") for row, params in done.items()} == {
        "base": "base",
        "A1": "A1",
        "rope": "rope",
        "wide-ff": None,
        "my-heads": None,
    }


def test_back_ends_are_found_without_an_import_and_a_second_of_one_name_is_refused(tmp_path):
    """A back end is one module of sweeps/backends/ under @register: `load()` finds every one (no import added by
    hand), `aiayn status` reads every one's claims, and a second class under a taken name is refused."""
    code = "from aiayn.sweeps import backends; print(' '.join(sorted(backends.load())))"
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert found.stdout.split() == ["local", "slurm", "subprocess"], found.stderr
    from aiayn.lightning_modules.run.rundir import OutDir
    from aiayn.sweeps import backends

    claims = backends.status_claims(OutDir(tmp_path))
    assert sorted(type(c).__name__ for c in claims.kinds) == ["LockClaims", "SlurmClaims"]

    class Impostor(backends.Backend):
        name = "local"

        def launch(self, sweep, pairs):
            return {}

    with pytest.raises(ValueError, match="two sweep back ends are named 'local'"):
        backends.register(Impostor)
    assert backends.BACKENDS["local"].__module__ == "aiayn.sweeps.backends.local"


def test_a_pair_a_dead_peer_left_running_mid_sweep_is_run_before_the_driver_exits(tmp_path, runner_backend):
    """A second driver on one --out exited 0 while a pair a dead peer had taken was still RUNNING in the
    books, without a word (the peer died after this driver's setup, which is where stale pairs were found). The
    driver looks again when its queue is empty, fails the dead peer's pair and runs it."""
    out = tmp_path / "runs"
    storage = f"sqlite:///{out / 'optuna.db'}"

    class PeerDiesMidSweep(FakeRunner):
        def __call__(self, opts, corpus, row, seed):
            if not self.calls:  # while this driver trains its first pair, a peer pops the next and dies
                study = optuna.load_study(study_name="table3-tiny-synthetic", storage=storage)
                taken = study.ask()
                taken.set_user_attr("worker", "peer-host:4242")
                self.taken = (taken.user_attrs["row"], taken.user_attrs["seed"])
            return super().__call__(opts, corpus, row, seed)

    runner = PeerDiesMidSweep()
    runner_backend(runner)
    assert main([*T3, "--out", str(out), "--rows", "base,A1,C4", "--jobs", "1"]) == 0
    assert runner.taken in runner.calls and len(runner.calls) == 3  # the dead peer's pair, run here
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=storage)
    done = {
        (t.user_attrs["row"], t.user_attrs["seed"]) for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
    }
    assert done == {("base", 0), ("A1", 0), ("C4", 0)}


def _completed(out, row: str, config: dict) -> None:
    """A completed run OUT/tiny/synthetic/ROW/seed0 of `config`, in the books of a local sweep."""
    from aiayn.sweeps import books

    run = out / "tiny" / "synthetic" / row / "seed0"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config))
    metrics = dict(row=row, seed=0, preset="tiny", data="synthetic", status="completed", dev_ppl=2.0, dev_bleu=30.0)
    (run / "metrics.json").write_text(json.dumps(metrics))
    books.record_sweep(SweepOut(out), "tiny", SYNTHETIC, [(row, 0)], "local")


def test_a_row_edited_after_its_pair_completed_is_named_in_status_and_the_report(tmp_path, capsys):
    """A row edited in the table after its pair completed kept its old result with no word. `aiayn status`
    and the report name it now, with what changed, and say that the result is the old row's."""
    from aiayn.lightning_modules.run.rundir import DataIdentity, RunConfig, TrainPlan
    from aiayn.reports.build import write_reports
    from aiayn.sweeps.status import StatusOptions, status_text

    out = tmp_path / "runs"
    spec = resolve("C4", "tiny")
    config = RunConfig(
        spec, DataIdentity(SYNTHETIC, None, 1000), TrainPlan(0, 1200, 1, 1, 1024, "32-true"), options={"row": "C4"}
    ).to_dict()
    config["spec"]["knobs"]["d_model"] = 96  # as the table said when it ran: C4's d_model was 96, not 64
    config["spec"]["model"]["d_model"] = 96
    config["spec"]["model"]["d_k"] = config["spec"]["model"]["d_v"] = 24
    config["spec"]["knobs"]["d_k"] = config["spec"]["knobs"]["d_v"] = 24
    _completed(out, "C4", config)
    text = status_text(StatusOptions(out=str(out)))
    assert "its row changed since it ran (d_model 96 -> 64, d_k 24 -> 16, d_v 24 -> 16)" in text
    assert "this result is the old row's" in text
    write_reports(out, tmp_path / "rep")
    md = (tmp_path / "rep" / "table3-tiny.md").read_text(encoding="utf-8")
    assert "Rows that resolve otherwise now than when they ran" in md
    assert "  - C4 (seed 0): d_model 96 -> 64, d_k 24 -> 16, d_v 24 -> 16" in md


def test_a_row_of_a_users_table_edited_after_its_pair_completed_is_named_in_status_and_the_report(tmp_path):
    """The warning covered the rows of ablations/ only; a row of the user's --table edited after its pair
    completed was named nowhere. The run's config.json records its tables, read again as they are now."""
    from aiayn.lightning_modules.run.rundir import DataIdentity, RunConfig, TrainPlan
    from aiayn.reports.build import write_reports
    from aiayn.sweeps.status import StatusOptions, status_text

    table = tmp_path / "mine.csv"
    table.write_text("row,group,N,d_model,d_ff,note\nwide-ff,mine,,,4096,a wider FFN\n")
    spec = resolve("wide-ff", "tiny", tables=(str(table),))
    config = RunConfig(
        spec,
        DataIdentity(SYNTHETIC, None, 1000),
        TrainPlan(0, 1200, 1, 1, 1024, "32-true"),
        options={"row": "wide-ff", "table": [str(table)]},
    ).to_dict()
    out = tmp_path / "runs"
    _completed(out, "wide-ff", config)
    assert "changed since it ran" not in status_text(StatusOptions(out=str(out)))  # as it ran: nothing to say
    table.write_text("row,group,N,d_model,d_ff,note\nwide-ff,mine,,,2048,a wider FFN\n")  # edited afterwards
    text = status_text(StatusOptions(out=str(out)))
    assert "its row changed since it ran (d_ff 1024 -> 512)" in text and "this result is the old row's" in text
    write_reports(out, tmp_path / "rep")
    md = (tmp_path / "rep" / "table3-tiny.md").read_text(encoding="utf-8")
    assert "  - wide-ff (seed 0): d_ff 1024 -> 512" in md


@pytest.mark.parametrize("corpus", ["synthetic-20", "hf:wmt/wmt16:de-en"])
def test_every_name_of_a_sweep_is_built_from_its_one_key(corpus, tmp_path):
    """One preset-corpus key: the tracker's experiment, the Optuna study, the sweep's record in the books, its pairs'
    keys and a report's name all carry sweep_key, spelled once (a corpus with a slash, a file name)."""
    from aiayn.reports.build import report_name
    from aiayn.sweeps import books
    from aiayn.sweeps.backends import make_sweep
    from aiayn.sweeps.backends.queue import study_name

    ref = CorpusRef.parse(corpus)
    key = sweep_key("evidence", ref)
    spelled = {"synthetic-20": "evidence-synthetic-20", "hf:wmt/wmt16:de-en": "evidence-hf-wmt--wmt16-de-en"}
    assert key == spelled[corpus]
    assert experiment_name("evidence", ref) == f"aiayn-{key}"
    assert study_name("evidence", ref) == f"table3-{key}"
    assert books.pair_key("evidence", ref, "C1", 3) == f"{key}-C1-seed3"
    assert report_name("evidence", corpus) == (
        "table3-evidence" if corpus == PRESETS["evidence"].corpus else f"table3-{key}"
    )
    out = SweepOut(tmp_path)
    assert books.record_sweep(out, "evidence", ref, [("base", 0)], "local") == out.sweep_record(key)
    sweep = make_sweep([("base", 0)], TrainOptions(preset="evidence", data=corpus, out=str(tmp_path)))
    assert sweep.key == key


def test_every_capability_is_read_when_a_sweep_is_given_its_back_end(tmp_path):
    """Capabilities are data the choice reads (two of five were never read, and are gone): each field is a
    need of a sweep, the default, or how a back end runs `aiayn hpo`'s trials (and why it cannot), and a sweep (or a
    search) that needs one gets a back end that has it, or is told why not."""
    from aiayn.sweeps.backends import Capabilities, backend_for, make_sweep, needs
    from aiayn.sweeps.hpo import HpoOptions, trials_backend

    sweep = make_sweep([("base", 0)], TrainOptions(out=str(tmp_path), preset="tiny"))
    trials = {"trials", "no_trials"}
    assert set(needs(sweep)) | {"default"} | trials == {f.name for f in dataclasses.fields(Capabilities)}
    assert [trials_backend(HpoOptions(backend=name)) for name in ("local", "subprocess")] == ["here", "processes"]
    with pytest.raises(UserError, match="slurm cannot run hpo trials .its job array is the sweep's pairs"):
        trials_backend(HpoOptions(backend="slurm"))
    assert backend_for(None, sweep).name == "local"  # the default, when the sweep needs nothing more
    sweep.gpus_per_job = 1
    assert backend_for(None, sweep).capabilities.own_gpus
    ddp = make_sweep([("base", 0)], TrainOptions(out=str(tmp_path), preset="tiny", devices=2))
    assert backend_for(None, ddp).capabilities.ddp


def test_a_sweep_says_where_each_pair_under_way_is_at_its_log_interval(tmp_path, caplog):
    """A paper-scale pair trains for hours: between "N pairs, N to run" and its end, the driver prints a line per
    pair under way every --log-interval seconds (its step of its budget, its loss, its pace), read from the run's
    own curve as it grows."""

    def slow_runner(sweep, corpus, row, seed):
        version = sweep.run(row, seed).logs / "version_0"
        version.mkdir(parents=True, exist_ok=True)
        lines = ["step,train/loss"]
        for step in range(0, 600, 100):  # a curve that grows while the driver watches
            lines.append(f"{step - 1 if step else 0},{6 - step / 200}")
            (version / "metrics.csv").write_text("\n".join(lines) + "\n")
            time.sleep(0.15)
        steps = sweep.wanted[row]
        return {
            "row": row,
            "seed": seed,
            "status": "completed",
            "steps": steps,
            "planned_steps": steps,
            "dev_bleu": 1.0,
        }

    opts = SweepOptions(
        select=Selection(rows="base", seeds=1),
        report="",
        jobs=1,
        log_interval=0.2,
        train=TrainOptions(preset="tiny", out=str(tmp_path / "runs"), progress=False),
    )
    with caplog.at_level(logging.INFO, logger="aiayn.sweeps.backends.queue"):
        run_table3(opts, backend=RunnerBackend(slow_runner))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("under way")]
    assert len(said) >= 2, [r.getMessage() for r in caplog.records]
    assert all("base seed 0: step" in s and "of 1200" in s for s in said)
    assert any("steps/s" in s and "of training left" in s and "loss" in s for s in said)
    final = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[1/1]")]
    assert final and "ETA" in final[0]


def test_a_negative_log_interval_is_one_line(tmp_path):
    opts = SweepOptions(log_interval=-1, train=TrainOptions(preset="tiny", out=str(tmp_path / "runs")))
    with pytest.raises(UserError, match="--log-interval -1: pass a number of seconds"):
        build_sweep(opts)


def test_a_pending_pair_with_a_checkpoint_reads_as_one_phrase():
    """status printed "pending    , checkpointed at step 2000 of 4000" for a stopped pair: the phrase alone."""
    from aiayn.sweeps.status import render

    pair = {"row": "E1", "seed": 4, "state": "pending", "error": None, "step": 2000, "steps": 4000, "dev_bleu": None}
    pair.update(holder=None, age_s=None)
    text = render([{"preset": "real", "corpus": "multi30k", "counts": {"pending": 1}, "pairs": [pair]}])
    assert text.splitlines()[1] == "  E1  seed 4   pending    checkpointed at step 2000 of 4000"


def test_every_folder_a_sweep_or_back_end_keeps_under_out_is_reserved_and_no_presets_name(tmp_path):
    """The one-run layer lists the top-level names under --out that are not presets (`OutDir.RESERVED`: a run
    directory is never looked for there); every registered back end's own folder (OUT/NAME: `aiayn hpo --backend
    subprocess` keeps its trials' logs in OUT/subprocess) and the sweeps' folders must be among them, and no preset
    may take one of those names."""
    from aiayn.ablations.presets import PRESETS
    from aiayn.lightning_modules.run.rundir import OutDir
    from aiayn.sweeps.backends import load
    from aiayn.sweeps.folders import SweepOut

    out = SweepOut(tmp_path)
    kept = {out.backend(name).name for name in load()}
    kept |= {out.reports.name, out.lock("x").parent.name, out.sweep_record("k").parent.name}
    kept |= {out.hpo_best("tiny", "base").relative_to(tmp_path).parts[0]}
    assert kept <= set(OutDir.RESERVED), kept - set(OutDir.RESERVED)
    assert not set(PRESETS) & set(OutDir.RESERVED)


def test_concurrent_ddp_runs_on_gpus_without_gpus_of_their_own_are_refused(tmp_path, monkeypatch):
    """`--jobs 2 --devices 2` on a GPU machine without --gpus-per-job: both runs would train on GPUs 0 and 1 at once;
    one line names the flag that gives each run its own."""
    monkeypatch.setattr("aiayn.sweeps.backends.processes.visible_gpus", lambda: ["0", "1", "2", "3"])
    sweep = build_sweep(opts(tmp_path, jobs=2, devices=2, strategy="ddp", accelerator="gpu"))
    with pytest.raises(UserError, match="--jobs 2 runs of --devices 2 would each train on the same GPUs; pass "):
        SubprocessBackend().check(sweep)
    SubprocessBackend().check(build_sweep(opts(tmp_path, jobs=2, devices=2, strategy="ddp", accelerator="cpu")))
