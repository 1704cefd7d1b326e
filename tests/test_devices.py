"""What a run's hardware decides (lightning_modules/run/devices.py and the Trainer's environment), checked on a CPU
with the GPU's answers stood in for: a GPU run gets bf16, TF32 matmuls, loader workers and pinned memory; a CPU run
keeps fp32 and no workers; local DDP inside a SLURM allocation launches its own ranks; DDP broadcasts no buffers."""

import pytest
import torch

from aiayn.lightning_modules.run import devices
from aiayn.lightning_modules.run.callbacks import RequeueOnSignal, slurm_parts
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.train import strategy


@pytest.fixture
def gpu(monkeypatch):
    """A GPU with bf16, as torch would report it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)


def test_auto_precision_is_bf16_on_a_gpu_that_has_it_and_fp32_elsewhere(gpu, monkeypatch):
    assert devices.resolve_precision("auto", "auto") == "bf16-mixed"
    assert devices.resolve_precision("auto", "cpu") == "32-true"  # asked for the CPU on a GPU box
    assert devices.resolve_precision("32-true", "auto") == "32-true"  # as given
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a V100
    assert devices.resolve_precision("auto", "gpu") == "32-true"


def test_fp32_on_a_gpu_uses_tf32_matmuls_and_a_cpu_run_is_left_alone(gpu, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    devices.prepare_matmuls("cpu")
    assert calls == []
    devices.prepare_matmuls("auto")
    assert calls == ["high"]


def test_loader_workers_and_pinned_memory_follow_the_trainers_accelerator(gpu):
    assert (devices.data_workers(None, "auto"), devices.uses_cuda("auto")) == (4, True)
    assert (devices.data_workers(None, "cpu"), devices.uses_cuda("cpu")) == (0, False)  # a CPU run on a GPU box
    assert devices.data_workers(2, "cpu") == 2  # --num-workers as given


def test_loader_workers_fit_the_cpus_the_job_was_given_not_the_machines(gpu, monkeypatch):
    """A SLURM task given 4 CPUs of a 64-core node (its affinity, a cgroup) gets 3 workers beside its
    own process, not min(4, os.cpu_count()) = 4; with 1 CPU, none."""
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {8, 9, 10, 11}, raising=False)
    assert devices.usable_cpus() == 4 and devices.data_workers(None, "gpu") == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {5}, raising=False)
    assert devices.data_workers(None, "gpu") == 0 and devices.data_workers(2, "gpu") == 2  # --num-workers wins


def test_matmul_precision_is_the_users_and_a_runs_precision_is_recorded(gpu, monkeypatch):
    """`--matmul-precision highest` with `--precision 32-true` reruns a CPU-registered table exactly
    on a GPU; the default stays TF32 ("high")."""
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    devices.prepare_matmuls("auto", "highest")
    devices.prepare_matmuls("auto")
    assert calls == ["highest", "high"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert devices.trained_precision("32-true") == "32-true, fp32 matmuls highest"


def test_nothing_changes_on_a_cpu_machine():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert (devices.resolve_precision("auto", "auto"), devices.data_workers(None, "auto")) == ("32-true", 0)


def test_fp16_is_refused_in_one_line():
    with pytest.raises(Exception, match="fp16's gradient scaler cannot scale them") as e:
        devices.resolve_precision("16-mixed", "auto")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "ntasks, world, kind",
    [("2", 2, "SLURMEnvironment"), ("1", 2, "LightningEnvironment"), ("1", 1, "SLURMEnvironment")],
)
def test_in_a_slurm_allocation_a_run_not_launched_one_task_per_device_launches_its_own_ranks(
    monkeypatch, tmp_path, ntasks, world, kind
):
    """srun with one task per device: SLURM's ranks and our requeue handler. `aiayn train --devices 2` in an sbatch
    script without srun (SLURM_NTASKS=1): Lightning's SLURM environment would fail its ntasks check or wait forever."""
    monkeypatch.setenv("SLURM_NTASKS", ntasks)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", ntasks)
    monkeypatch.setenv("SLURM_JOB_NAME", "aiayn-table3-tiny")
    monkeypatch.setattr("signal.signal", lambda *a: None)
    plugins, callbacks = slurm_parts(tmp_path, world)
    assert [type(p).__name__ for p in plugins] == [kind]
    assert [type(c) for c in callbacks] == ([RequeueOnSignal] if kind == "SLURMEnvironment" else [])


def test_ddp_broadcasts_no_buffers_every_forward():
    assert strategy(TrainOptions(devices=2))._ddp_kwargs == {"broadcast_buffers": False}
    assert strategy(TrainOptions(strategy="ddp"))._ddp_kwargs == {"broadcast_buffers": False}
    assert strategy(TrainOptions()) == "auto" and strategy(TrainOptions(strategy="fsdp")) == "fsdp"


def test_a_few_bf16_mixed_steps_of_the_tiny_row_train_on_cpu_through_lightning(cache, tmp_path):
    from aiayn.lightning_modules.run.train import train

    small = {"N": 1, "d_model": 32, "d_ff": 64, "h": 2}
    opts = TrainOptions(
        out=str(tmp_path),
        max_steps=3,
        precision="bf16-mixed",
        accelerator="cpu",
        progress=False,
        overrides=small,
        eval_subset=4,
        val_every=1000,
    )
    metrics = train(opts)
    assert metrics.completed and metrics.steps == 3 and metrics.dev_ppl == metrics.dev_ppl < float("inf")


def test_each_test_worker_trains_on_cores_of_its_own_and_its_processes_count_only_those():
    """tests/conftest.py: under `-n N` each pytest-xdist worker takes its share of the cores, and a process it starts
    (a run, a sweep) sizes torch's threads and a sweep's shares by that share, not by the whole machine."""
    import os
    import subprocess
    import sys

    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if "PYTEST_XDIST_WORKER" not in os.environ or count < 2:
        pytest.skip("one test at a time (-n0): nothing shared out")
    cpus = os.cpu_count() or 1
    if cpus < count:
        pytest.skip(f"{count} workers on {cpus} cores: none has a core of its own")
    share = os.sched_getaffinity(0)
    assert len(share) == len(range(int(os.environ["PYTEST_XDIST_WORKER"][2:]) % count, cpus, count))
    assert torch.get_num_threads() == len(share) == devices.usable_cpus()
    probe = "import os, torch; print(len(os.sched_getaffinity(0)), torch.get_num_threads())"
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert child.stdout.split() == [str(len(share))] * 2
