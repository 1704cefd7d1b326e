"""`aiayn slurm`: the generated script, the books, bad input (fast); and on a real SLURM cluster
(slow; scripts/slurm-local-up.sh brings one up): a two-row Table 3 array with its report, and a
job that gets the warning signal, is requeued and resumes from its checkpoint.

The SLURM tests skip where `sbatch` is not on PATH or no controller answers, unless
AIAYN_REQUIRE_SLURM=1 (CI sets it), where they fail instead.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aiayn.ablations.selection import Selection
from aiayn.cli import main
from aiayn.common.errors import UserError
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.sweeps.backends import make_sweep, slurm
from aiayn.sweeps.backends.slurm import SlurmOptions, SlurmResources, classify, render, time_limit_seconds

ARGS_CPU = "--preset tiny --accelerator cpu --tasks-per-node 2 --partition debug --time 00:30:00".split()


def slurm_opts(rows=None, seeds=1, resources=None, dry_run=False, **train) -> SlurmOptions:
    return SlurmOptions(
        select=Selection(rows=rows, seeds=seeds),
        resources=resources or SlurmResources(),
        dry_run=dry_run,
        train=TrainOptions(
            **{"accelerator": "gpu", "devices": None, "num_nodes": None, "strategy": None, "progress": False, **train}
        ),
    )


def sweep_of(opts: SlurmOptions):
    """The sweep the SLURM back end is handed for `opts`, resolved once as `aiayn slurm` resolves it."""
    return make_sweep(slurm.pairs(opts), opts.train)


def _no_sbatch_path(tmp_path) -> str:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    return str(empty)


# ---- bad input: one line, exit 2, nothing written or submitted

BAD = [
    # (what, argv after `aiayn slurm`, words the message must hold)
    ("missing partition", ["table3", "--gpus-per-node", "8", "--time", "1:00:00"], "--partition is missing"),
    ("missing gpus-per-node", ["table3", "--partition", "p", "--time", "1:00:00"], "--gpus-per-node is missing"),
    ("gpus on a cpu run", ["table3", *ARGS_CPU, "--gpus-per-node", "2"], "--accelerator cpu trains on CPUs"),
    (
        "devices vs gpus-per-node",
        ["table3", "--partition", "p", "--time", "1:00:00", "--gpus-per-node", "8", "--devices", "4"],
        "--devices 4 differs from --gpus-per-node 8",
    ),
    (
        "num-nodes vs nodes",
        ["table3", "--partition", "p", "--time", "1:00:00", "--gpus-per-node", "8", "--num-nodes", "2"],
        "--num-nodes 2 differs from --nodes 1",
    ),
    (
        "tasks vs gpus",
        ["train", "--partition", "p", "--time", "1:00:00", "--gpus-per-node", "8", "--tasks-per-node", "4"],
        "--tasks-per-node 4 differs from --gpus-per-node 8",
    ),
    ("spawning strategy", ["table3", *ARGS_CPU, "--strategy", "ddp_spawn"], "pass --strategy ddp"),
    ("bad time", ["table3", "--accelerator", "cpu", "--partition", "p", "--time", "soon"], "is not a SLURM time"),
    ("no time", ["table3", "--accelerator", "cpu", "--partition", "p"], "--time is missing"),
    (
        "time under the warning",
        ["table3", "--accelerator", "cpu", "--partition", "p", "--time", "1"],
        "no room for the warning signal",
    ),
    ("seeds 0", ["table3", *ARGS_CPU, "--seeds", "0"], "argument --seeds: expected a positive integer, got 0"),
    ("unknown row", ["train", *ARGS_CPU, "--row", "Z9"], "unknown row 'Z9'"),
    ("unknown preset", ["table3", *ARGS_CPU, "--preset", "huge"], "unknown preset 'huge'"),
    ("local run dir, 2 nodes", ["table3", *ARGS_CPU, "--nodes", "2"], "needs a run directory every node sees"),
    ("no sbatch on PATH", ["table3", *ARGS_CPU], "sbatch is not on PATH"),
    # A line break would start a line of its own in the script (an #SBATCH directive, a command)
    (
        "a line break in --partition",
        ["table3", "--accelerator", "cpu", "--partition", "debug\n#SBATCH --qos=high", "--time", "00:30:00"],
        "--partition holds a line break",
    ),
    (
        "a line break in --sbatch",
        ["table3", *ARGS_CPU, "--sbatch", "--qos=high\nrm -rf ~"],
        "--sbatch 1 holds a line break",
    ),
    # A space would make a second option of the rest of an #SBATCH line
    (
        "a space in --partition",
        ["table3", "--accelerator", "cpu", "--partition", "debug --qos=high", "--time", "00:30:00"],
        "--partition 'debug --qos=high' holds a space",
    ),
    ("a space in --mem", ["table3", *ARGS_CPU, "--mem", "4G --exclusive"], "--mem '4G --exclusive' holds a space"),
]


@pytest.mark.parametrize("what,argv,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_exit_2_nothing_written(what, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", _no_sbatch_path(tmp_path))  # and so nothing can be submitted by any case
    out = tmp_path / "runs"
    assert main(["slurm", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("aiayn: error: ") and message in err[0], err
    assert ";" in err[0]  # problem; fix
    assert not out.exists()


def test_an_out_with_a_space_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """A space in --out split `#SBATCH --output=` (sbatch reads the rest as another option)."""
    monkeypatch.setenv("PATH", _no_sbatch_path(tmp_path))
    out = tmp_path / "my runs"
    assert main(["slurm", "table3", *ARGS_CPU, "--rows", "base", "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"aiayn: error: --out {str(out)!r} holds a space, which would split its #SBATCH line into two "
        "options; pass a path without spaces (or a link to it without any)"
    ]
    assert not out.exists()


def test_the_script_quotes_the_users_out_so_that_the_job_runs_none_of_it(tmp_path, capsys):
    """--out was written inside double quotes in the srun line, so `$(...)` in it ran when the job did. The
    word is quoted for the shell now: evaluated as the job's bash would, with $ROW set, it is the literal path."""
    out = tmp_path / "a$(touch${IFS}pwned)b"  # ${IFS}: a space once a shell evaluates it (a literal one is refused)
    assert main(["slurm", "table3", *ARGS_CPU, "--rows", "base", "--out", str(out), "--dry-run"]) == 0
    text = (out / "slurm" / "aiayn-table3-tiny.sbatch").read_text()
    line = next(part for part in text.split(" \\\n") if "--config" in part)
    word = line.split("--config ", 1)[1].split(" --row", 1)[0]
    done = subprocess.run(["bash", "-c", f"ROW=base; printf %s {word}"], cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout == f"{out.resolve()}/slurm/aiayn-table3-tiny.specs/base.json"
    assert not (tmp_path / "pwned").exists()


def test_a_gpu_job_asks_for_cpus_for_its_loader_unless_told(tmp_path):
    """A GPU job got SLURM's one CPU a task unless --cpus-per-task was given, so its data loader had
    none; it asks for the training process and its workers now (--cpus-per-task still wins)."""
    resources = SlurmResources(gpus_per_node=1, partition="gpu", time="1:00:00")
    opts = slurm_opts(out=str(tmp_path), resources=resources, dry_run=True)
    text = render(opts, sweep_of(opts), [("base", 0)], slurm.check(opts))
    assert "#SBATCH --cpus-per-task=5\n" in text and "srun --kill-on-bad-exit=1 --cpus-per-task=5 aiayn" in text
    cpu = slurm_opts(
        out=str(tmp_path),
        resources=SlurmResources(tasks_per_node=1, partition="p", time="1:00:00"),
        dry_run=True,
        accelerator="cpu",
    )
    assert "--cpus-per-task" not in render(cpu, sweep_of(cpu), [("base", 0)], slurm.check(cpu))  # a CPU job


def test_local_run_dir_is_refused_for_two_nodes_unless_declared_shared(tmp_path):
    mount, fstype = slurm.filesystem_of(tmp_path)
    assert fstype not in slurm.SHARED_FS and Path(tmp_path).resolve().is_relative_to(mount)
    resources = SlurmResources(nodes=2, gpus_per_node=8, partition="p", time="1:00:00")
    opts = slurm_opts(out=str(tmp_path), resources=resources, dry_run=True)
    with pytest.raises(UserError, match="local filesystem"):
        slurm.check(opts)
    opts.resources.assume_shared = True
    assert slurm.check(opts) == 8


def test_unknown_partition_is_refused_before_anything_is_written(cluster, tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["slurm", "train", "--accelerator", "cpu", "--partition", "no-such-partition", "--time", "10:00"]
    assert main([*argv, "--out", str(out)]) == 2
    assert "partition 'no-such-partition' does not exist" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "text,seconds",
    [("90", 5400), ("10:30", 630), ("01:00:00", 3600), ("2-00:00:00", 172800), ("1-12", 129600), ("0-1:30", 5400)],
)
def test_time_limit_formats(text, seconds):
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text, says", [(None, "--time is missing"), ("", "--time is missing"), ("soon", "'soon'")])
def test_a_missing_or_bad_time_limit_is_named_as_such(text, says):
    with pytest.raises(UserError, match=says):
        time_limit_seconds(text)


# ---- the script


def test_dry_run_writes_and_prints_an_array_of_the_pending_pairs(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = [
        *"slurm table3 --preset tiny --rows base,A1 --seeds 2".split(),
        *ARGS_CPU,
        *"--max-steps 20 --setup".split(),
        "module load python",
        "--out",
        str(out),
        "--dry-run",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    script = out / "slurm" / "aiayn-table3-tiny.sbatch"
    text = script.read_text()
    assert printed.startswith(text) and "dry run: nothing submitted" in printed
    for directive in (
        "--array=0-3",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--partition=debug",
        "--time=00:30:00",
        "--signal=USR1@90",
        "--requeue",
        "--open-mode=append",
    ):
        assert f"#SBATCH {directive}\n" in text, directive
    assert "--gpus-per-node" not in text
    assert "PAIRS=(base:0 base:1 A1:0 A1:1)" in text and "module load python\n" in text
    assert "--devices 2" in text and "--num-nodes 1" in text and "--strategy ddp" in text and "--max-steps 20" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert not (out / "slurm" / "pairs").exists()  # a dry run submits nothing, so it books nothing
    report = (out / "slurm" / "aiayn-table3-tiny-report.sbatch").read_text()  # the report job, one CPU
    assert f"aiayn report --runs {out} --out {out / 'reports'} --preset tiny\n" in report
    assert "#SBATCH --ntasks=1\n" in report and "module load python\n" in report and "--array" not in report
    assert "sbatch --dependency=afterany:<array job>" in printed


def test_a_users_table_reaches_the_array_and_every_task(tmp_path, monkeypatch, capsys):
    """--table: its rows are among the array's pairs, and each task's `aiayn train` gets the table's
    absolute path (the task runs elsewhere, in another directory)."""
    monkeypatch.chdir(tmp_path)
    Path("my.csv").write_text("row,group,d_ff\nwide-ff,mine,4096\n")
    out = tmp_path / "runs"
    argv = [
        *"slurm table3 --preset tiny --rows base,mine".split(),
        *ARGS_CPU,
        *"--table my.csv --out".split(),
        str(out),
        "--dry-run",
    ]
    assert main(argv) == 0
    text = (out / "slurm" / "aiayn-table3-tiny.sbatch").read_text()
    assert "PAIRS=(base:0 wide-ff:0)" in text and f"--table {tmp_path / 'my.csv'}" in text


def test_array_task_runs_its_own_pair(tmp_path):
    """Run the generated script with `srun` replaced by a recorder: task 3 trains A1 seed 1."""
    opts = slurm_opts(
        rows="base,A1",
        seeds=2,
        accelerator="cpu",
        out=str(tmp_path / "runs"),
        resources=SlurmResources(tasks_per_node=2, partition="debug", time="10:00"),
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render(opts, sweep_of(opts), slurm.pairs(opts), 2))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/srun-args\n')
    (bin_dir / "srun").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_ARRAY_JOB_ID": "41",
        "SLURM_JOB_NODELIST": "node1",
    }
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "row A1 seed 1, attempt 1, job 41_3 on node1" in proc.stdout
    args = (tmp_path / "srun-args").read_text().split()
    assert args[:3] == ["--kill-on-bad-exit=1", "aiayn", "train"]
    assert args[args.index("--row") + 1] == "A1" and args[args.index("--seed") + 1] == "1"
    assert args[args.index("--out") + 1] == str((tmp_path / "runs").resolve())


def test_paper_on_gpu_nodes_matches_trainer_settings(tmp_path):
    resources = SlurmResources(
        nodes=2, gpus_per_node=8, cpus_per_task=8, partition="gpu", time="2-00:00:00", assume_shared=True
    )
    # a dry run: rendering the script needs no SLURM client (the README's test command passes without one)
    opts = slurm_opts(preset="paper", out=str(tmp_path), precision="bf16-mixed", resources=resources, dry_run=True)
    per_node = slurm.check(opts)
    text = render(opts, sweep_of(opts), [("big", 0)], per_node)
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --ntasks-per-node=8\n" in text
    assert "#SBATCH --gpus-per-node=8\n" in text and "#SBATCH --array=0-0\n" in text
    assert "--devices 8" in text and "--num-nodes 2" in text and "--precision bf16-mixed" in text
    assert "#SBATCH --cpus-per-task=8\n" in text and "srun --kill-on-bad-exit=1 --cpus-per-task=8 aiayn train" in text


def test_the_array_is_the_sweep_it_is_handed_not_one_derived_again_from_its_options(tmp_path, monkeypatch):
    """SLURM works on the Sweep its driver resolved once (its out, preset, corpus, options and each row's
    spec); it re-derives nothing from its own options. Handed a sweep that says otherwise than SLURM's options (another
    corpus, another budget), the script, the books' record and the rows each task trains follow the sweep, with no
    preset looked up or row resolved again."""
    import importlib

    P, S = (importlib.import_module(f"aiayn.sweeps.backends.slurm.{m}") for m in ("pairs", "script"))
    from aiayn.common.errors import UserError as Refused

    res = SlurmResources(tasks_per_node=1, partition="p", time="1:00:00")
    opts = slurm_opts(rows="base", accelerator="cpu", out=str(tmp_path), resources=res, dry_run=True)
    sweep = make_sweep([("base", 0)], replace(opts.train, data="synthetic-20", max_steps=7))

    def again(*a, **k):
        raise Refused("the sweep was resolved again")

    for module, name in ((P, "get_preset"), (P, "get_row")):
        monkeypatch.setattr(module, name, again)
    monkeypatch.setattr("aiayn.lightning_modules.run.spec.resolve", again)
    summary = slurm.submit(opts, sweep)
    text = slurm.script_path(opts).read_text()
    assert "--data synthetic-20" in text and "--max-steps 7" in text, text
    assert (summary.pairs, summary.completed, summary.details["pending"]) == (1, 0, 1)  # typed: a SweepSummary
    assert "disk:" in summary.details["disk"]
    assert sweep.out.sweep_record(sweep.key).name == "tiny-synthetic-20.json"
    assert not sweep.out.sweep_record(sweep.key).exists()  # a dry run records nothing
    spec = json.loads((slurm.resolved_dir(opts) / "base.json").read_text())["spec"]
    assert spec["corpus"] == "synthetic-20" and spec == json.loads(json.dumps(sweep.specs["base"].to_dict()))
    assert not hasattr(S, "specs_of")  # the rows are the sweep's, never resolved here


# ---- the books


def _metrics(sweep, row, seed, status):
    d = sweep.run(row, seed).path
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"row": row, "seed": seed, "preset": "tiny", "status": status}))


def test_books_skip_completed_and_queued_pairs_and_retry_failed_ones(tmp_path):
    sweep = sweep_of(slurm_opts(rows="base,A1,A2,A3", accelerator="cpu", out=str(tmp_path)))
    _metrics(sweep, "base", 0, "completed")
    _metrics(sweep, "A1", 0, "failed")
    for row, job in (("A2", "7_2"), ("A3", "7_3")):  # A2's job is still in SLURM, A3's is gone
        slurm.marker(sweep, row, 0).parent.mkdir(parents=True, exist_ok=True)
        slurm.marker(sweep, row, 0).write_text(json.dumps({"job": job}))
    books = classify(sweep, sweep.pairs, live={"7_2", "8_0"})
    assert books == {"completed": [("base", 0)], "in_slurm": [("A2", 0)], "pending": [("A1", 0), ("A3", 0)]}


# ---- the requeue handler, in one process (no SLURM needed)


def test_requeue_handler_checkpoints_at_the_step_it_was_signalled_and_stops(tmp_path, monkeypatch):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    from aiayn.lightning_modules.run.callbacks import RequeueOnSignal
    from aiayn.lightning_modules.run.rundir import REQUEUE_CHECKPOINT

    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(var, raising=False)  # outside SLURM: saves, and has nothing to requeue

    class SignalAt(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.getsignal(signal.SIGUSR1)
    try:
        requeue = RequeueOnSignal(tmp_path)
        trainer = pl.Trainer(
            max_steps=50,
            accumulate_grad_batches=2,
            callbacks=[SignalAt(), requeue],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
        )
        trainer.fit(BoringModel())
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert requeue.requeued and trainer.global_step == 3
    saved = torch.load(tmp_path / REQUEUE_CHECKPOINT, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 3


@pytest.mark.parametrize("requeued", [True, False])
def test_a_run_stopped_after_its_requeue_says_slurm_resumes_it(requeued, caplog):
    """SLURM kills a job it was asked to requeue: the run's line said "the same command resumes it", with nothing to
    run again. After a requeue it says SLURM's requeued job resumes it; any other stop keeps the command."""
    from types import SimpleNamespace

    from aiayn.lightning_modules.run.train import _stopped

    trainer = SimpleNamespace(callbacks=[SimpleNamespace(requeued=requeued)], global_step=7, is_global_zero=False)
    with pytest.raises(SystemExit) as stopped, caplog.at_level("WARNING"):
        _stopped(trainer, "base", 0, signal.SIGTERM)
    assert stopped.value.code == 128 + signal.SIGTERM
    said = "SLURM requeued its job, which resumes it from its checkpoint: nothing to run again"
    assert (said in caplog.text) is requeued and ("the same command resumes it" in caplog.text) is not requeued


def test_resume_takes_the_checkpoint_with_the_highest_step(tmp_path):
    from aiayn.lightning_modules.run.rundir import RunDir

    def resume_checkpoint(path):
        return RunDir(path).resume_checkpoint()

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    assert resume_checkpoint(tmp_path) is None
    torch.save({"global_step": 40}, ckpts / "last.ckpt")
    assert resume_checkpoint(tmp_path) == ckpts / "last.ckpt"
    torch.save({"global_step": 43}, ckpts / "requeue.ckpt")
    assert resume_checkpoint(tmp_path) == ckpts / "requeue.ckpt"
    torch.save({"global_step": 50}, ckpts / "last.ckpt")  # periodic saves after the resume
    assert resume_checkpoint(tmp_path) == ckpts / "last.ckpt"
    (ckpts / "last.ckpt").write_bytes(b"truncated")  # a kill mid-save: fall back to the other one
    assert resume_checkpoint(tmp_path) == ckpts / "requeue.ckpt"


# ---- on a real SLURM cluster


@functools.cache
def _slurm_up() -> bool:
    # `scontrol ping` answers at once; sinfo would wait ~10 s for a controller that is down
    if subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0:
        return False
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return proc.returncode == 0 and any(s in proc.stdout for s in ("idle", "mix", "alloc"))


@pytest.fixture
def cluster() -> str:
    """The default partition of a live SLURM cluster, or skip (fail under AIAYN_REQUIRE_SLURM=1)."""
    reason = None
    if shutil.which("sbatch") is None:
        reason = "sbatch is not on PATH (no SLURM client); CI brings a cluster up with scripts/slurm-local-up.sh"
    elif not _slurm_up():
        reason = "sbatch is on PATH but no SLURM controller answers; run scripts/slurm-local-up.sh"
    if reason:
        if os.environ.get("AIAYN_REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    partitions = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()
    return next((p.rstrip("*") for p in partitions if p.endswith("*")), partitions[0])


@pytest.fixture
def cache(tmp_path, monkeypatch, tiny_data):
    """The test's own cache, holding the tiny preset's data (tests/conftest.py): its jobs inherit the environment."""
    shutil.copytree(tiny_data, tmp_path / "cache")
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))


def _logs(out: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((out / "slurm" / "logs").glob("*.out")))


def _run(argv, out: Path, capsys) -> str:
    code = main(argv)  # 1 with --wait when a run failed
    printed = capsys.readouterr().out
    assert code == 0, f"{printed}\n--- job logs ---\n{_logs(out)[-6000:]}"
    return printed


@pytest.mark.slow
@pytest.mark.alone
def test_table3_array_on_slurm_with_report(cluster, cache, tmp_path, capsys):
    out, reports = tmp_path / "runs", tmp_path / "reports"
    argv = [
        *"slurm table3 --preset tiny --rows base,A1 --accelerator cpu --tasks-per-node 2 --partition".split(),
        cluster,
        *"--time 00:20:00 --max-steps 20 --eval-subset 20 --out".split(),
        str(out),
        "--report",
        str(reports),
        "--wait",
    ]
    printed = _run(argv, out, capsys)
    assert "2 submitted" in printed and "base seed 0: completed" in printed and "A1 seed 0: completed" in printed
    for row in ("base", "A1"):
        run = out / "tiny" / "synthetic" / row / "seed0"
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["status"] == "completed" and metrics["steps"] == 20
        assert json.loads((run / "config.json").read_text())["train"]["world_size"] == 2
    assert len(list(out.rglob("metrics.json"))) == 2  # rank 0 alone writes
    logs = _logs(out)
    assert logs.count("All distributed processes registered. Starting with 2 processes") == 2
    report = (reports / "table3-tiny.md").read_text()
    assert "| base " in report and "| A1 " in report
    assert "2 completed, 0 queued or running, 0 submitted" in _run(argv, out, capsys)  # the books: nothing again


@pytest.mark.slow
@pytest.mark.alone
def test_the_report_is_a_job_that_runs_after_the_array_without_waiting_here(cluster, cache, tmp_path, capsys):
    out = tmp_path / "runs"
    argv = [
        *"slurm table3 --preset tiny --rows base --accelerator cpu --tasks-per-node 1 --partition".split(),
        cluster,
        *"--time 00:20:00 --max-steps 10 --eval-subset 10 --out".split(),
        str(out),
    ]
    printed = _run(argv, out, capsys)  # returns at once: no --wait
    array = printed.split("; job ")[1].split(",")[0]
    assert f"writes it when the array has ended (--dependency=afterany:{array})" in printed
    report_job = printed.split("# report: job ")[1].split()[0]
    dependency = subprocess.run(["squeue", "-h", "-j", report_job, "-o", "%E"], capture_output=True, text=True)
    assert f"afterany:{array}" in dependency.stdout  # held until the array ends
    deadline = time.time() + 600
    while slurm.live_jobs() & {report_job, f"{array}_0"} and time.time() < deadline:
        time.sleep(2)
    report = (out / "reports" / "table3-tiny.md").read_text()
    assert "| base " in report and (out / "tiny" / "synthetic" / "base" / "seed0" / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.alone
def test_warning_signal_requeues_and_resumes_to_the_same_step_count(cluster, cache, tmp_path, capsys):
    out, steps = tmp_path / "runs", 80
    argv = [
        *"slurm train --preset tiny --row base --accelerator cpu --tasks-per-node 2 --partition".split(),
        cluster,
        *"--time 00:20:00 --max-steps".split(),
        str(steps),
        *"--ckpt-every 5 --eval-subset 20 --out".split(),
        str(out),
    ]
    assert "1 submitted" in _run(argv, out, capsys)
    run = out / "tiny" / "synthetic" / "base" / "seed0"
    job = json.loads(slurm.marker(sweep_of(slurm_opts(out=str(out))), "base", 0).read_text())["job"]
    # training is under way once the first periodic checkpoint exists (a guard against a hang, not a timing)
    deadline = time.monotonic() + 600
    while not (run / "checkpoints" / "step0000005.ckpt").exists():
        assert time.monotonic() < deadline and job in slurm.live_jobs(), _logs(out)[-6000:]
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR1", job], check=True)  # what SLURM sends LEAD s before the limit
    printed = _run([*argv, "--wait"], out, capsys)  # the same command: the job is still booked, so it waits
    assert "1 queued or running, 0 submitted" in printed and "base seed 0: completed" in printed
    logs = _logs(out)
    assert "attempt 1," in logs and "attempt 2," in logs and "attempt 3," not in logs
    requeue_ckpt = run / "checkpoints" / "requeue.ckpt"
    assert f"Restoring states from the checkpoint path at {requeue_ckpt}" in logs
    saved_at = torch.load(requeue_ckpt, map_location="cpu", weights_only=False)["global_step"]
    assert 5 <= saved_at < steps
    assert json.loads((run / "metrics.json").read_text())["steps"] == steps
    assert (run / "logs" / "version_1" / "metrics.csv").exists()  # the second attempt's curve


@pytest.mark.slow
@pytest.mark.alone
def test_wait_exits_1_and_names_the_log_when_a_task_fails(cluster, cache, tmp_path, capsys):
    out = tmp_path / "runs"
    argv = [
        *"slurm train --preset tiny --accelerator cpu --partition".split(),
        cluster,
        *"--time 05:00 --data files --data-dir".split(),
        str(tmp_path / "no-such-corpus"),
        "--out",
        str(out),
        "--wait",
    ]
    assert main(argv) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("base seed 0:"))
    log_file = Path(line.split("; see ")[1])
    assert "no metrics.json" in line and log_file.is_file()
    assert "aiayn: error: " in log_file.read_text() and "no-such-corpus" in log_file.read_text()


def test_a_secret_in_setup_is_never_printed_and_its_script_is_private(tmp_path, capsys):
    """A key in --setup must reach the job verbatim, so the .sbatch keeps it but only its owner can read it; the dry
    run's printout and --print-config mask it."""
    out = tmp_path / "runs"
    setup = "export HF_TOKEN=hf_abcdefghijklmnop; source venv/bin/activate"
    argv = ["slurm", "table3", *ARGS_CPU, "--rows", "base", "--setup", setup, "--out", str(out), "--dry-run"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "hf_abcdefghijklmnop" not in printed and "HF_TOKEN=***" in printed
    script = out / "slurm" / "aiayn-table3-tiny.sbatch"
    assert "hf_abcdefghijklmnop" in script.read_text() and stat.S_IMODE(script.stat().st_mode) == 0o600
    assert main([*argv, "--print-config"]) == 0
    assert "hf_abcdefghijklmnop" not in capsys.readouterr().out
    plain = tmp_path / "plain"
    assert main(["slurm", "table3", *ARGS_CPU, "--rows", "base", "--out", str(plain), "--dry-run"]) == 0
    assert stat.S_IMODE((plain / "slurm" / "aiayn-table3-tiny.sbatch").stat().st_mode) & 0o044  # others may read


def test_a_config_file_that_says_backend_slurm_is_the_same_sweep_either_way(tmp_path, capsys):
    """`backend: slurm` in a --config file of `aiayn table3` failed ("unknown back end"), and the YAML that
    `aiayn slurm table3 --print-config` prints was refused by `aiayn table3 --config` ("unknown option 'resources'").
    Now the file routes the command, reads back to the same options, and both spellings write the same script."""
    config = tmp_path / "sweep.yaml"
    config.write_text(
        'backend: slurm\ntrain: {preset: tiny, out: %s}\nselect: {rows: "base,A1"}\n'
        "resources: {partition: p, time: '1:00:00', gpus_per_node: 1}\n" % (tmp_path / "runs")
    )
    scripts = []
    for argv in (
        ["table3", "--config", str(config)],
        ["slurm", "table3", "--config", str(config)],
        ["table3", "--backend", "slurm", "--config", str(config)],
    ):
        assert main([*argv, "--dry-run"]) == 0, capsys.readouterr().err
        scripts.append(capsys.readouterr().out)
    assert scripts[0] == scripts[1] == scripts[2] and "#SBATCH --partition=p" in scripts[0]
    assert "PAIRS=(base:0 A1:0)" in scripts[0]
    # --print-config of either spelling reads back through `aiayn table3 --config`, to the same YAML
    assert main(["slurm", "table3", "--config", str(config), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "backend: slurm" in printed
    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    assert main(["table3", "--config", str(again), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_slurm_table3_has_the_defaults_of_table3():
    """The same sweep on every back end: `aiayn table3`'s defaults (the main job, --preset quick; --accelerator auto),
    not `aiayn train`'s (tiny) and a GPU fixed in advance; auto is made what SLURM is asked for."""
    from aiayn.cli import parse
    from aiayn.common.options import from_args
    from aiayn.sweeps.backends.slurm.backend import SlurmBackend
    from aiayn.sweeps.backends.slurm.options import with_accelerator
    from aiayn.sweeps.table3 import SweepOptions, options_for

    here = from_args(SweepOptions, parse(["table3"])).train
    there = from_args(options_for(SlurmBackend), parse(["table3", "--backend", "slurm"])).train
    assert (there.preset, there.accelerator, there.progress) == (here.preset, here.accelerator, here.progress)
    assert (there.preset, there.accelerator) == ("quick", "auto")
    gpus = SlurmOptions(train=there, resources=SlurmResources(gpus_per_node=2))
    cpus = SlurmOptions(train=there, resources=SlurmResources(tasks_per_node=2))
    assert with_accelerator(gpus).train.accelerator == "gpu" and with_accelerator(cpus).train.accelerator == "cpu"
    assert from_args(SlurmOptions, parse(["slurm", "train"]), kind="train").train.preset == "tiny"  # as `aiayn train`


@pytest.mark.parametrize(
    "flag, fix",
    [
        (["--jobs", "4"], "--max-parallel"),
        (["--gpus-per-job", "2"], "--gpus-per-node"),
        (["--storage", "sqlite:///x.db"], "run directories under --out"),
    ],
)
def test_a_table3_flag_slurm_cannot_honour_is_refused_with_the_reason(flag, fix, tmp_path, capsys):
    for head in (["table3", "--backend", "slurm"], ["slurm", "table3"]):
        assert main([*head, *ARGS_CPU, *flag, "--out", str(tmp_path), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"does not take {flag[0]}" in err and fix in err, err
    assert not any(tmp_path.iterdir())


def test_fail_on_diverged_reaches_slurms_exit_status(tmp_path, monkeypatch):
    """`--fail-on-diverged` was refused under SLURM; with --wait its exit status counts a diverged run as failed."""
    from aiayn.sweeps import run as sweep_run

    seen = {}
    monkeypatch.setattr(sweep_run, "run_and_report", lambda launches, **kw: seen.update(kw) or 0)
    argv = ["slurm", "table3", *ARGS_CPU, "--rows", "base", "--out", str(tmp_path), "--dry-run"]
    assert main([*argv, "--fail-on-diverged"]) == 0 and seen["fail_on_diverged"] is True
    assert main(argv) == 0 and seen["fail_on_diverged"] is False


def test_table3_with_backend_slurm_is_slurm_table3(tmp_path, capsys):
    """SLURM is reached as a back end like the others: `aiayn table3 --backend slurm` takes SLURM's
    options (its --help lists them) and does what `aiayn slurm table3` does, to the byte."""
    with pytest.raises(SystemExit) as shown:  # argparse's --help
        main(["table3", "--backend", "slurm", "--help"])
    assert shown.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: aiayn slurm table3") and "--partition" in help_text and "--dry-run" in help_text
    common = "--preset tiny --rows base,A1 --partition p --time 1:00:00 --gpus-per-node 1 --dry-run".split()
    assert main(["table3", "--backend=slurm", *common, "--out", str(tmp_path / "a")]) == 0
    via_table3 = capsys.readouterr().out
    assert main(["slurm", "table3", *common, "--out", str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out == via_table3 and "#SBATCH --partition=p" in via_table3
    # a back end without options of its own stays a table3 flag
    assert main(["table3", "--backend", "slurmm", "--out", str(tmp_path / "b")]) == 2
    assert "invalid choice: 'slurmm'" in capsys.readouterr().err
