"""Distributed training: the same effective batch on 1 and N devices (fast), and DDP for real (slow):
2 CPU processes (gloo, strategy ddp), two "nodes" on one machine through Lightning's generic environment
(MASTER_ADDR, MASTER_PORT, NODE_RANK) and 1 process accumulating 2 batches, each against the reference:
1 process training each optimizer step on ONE batch, the sampler's own (`aiayn train` as it is). The others
train every step on the same tokens split in two unequal parts (`SPLIT`: a fifth of the batch and the rest),
one part per rank or per accumulated batch, so a set-up that weighs the parts' tokens differently (each part
its own mean, then averaged; or each rank normalized by its own tokens) lands far from the reference, while
it would agree with another set-up of the same flaw.

Row D1 has P_drop = 0: without dropout masks (drawn per rank) every set-up computes the gradient of the
same loss on the same tokens, so they differ only by the order of float sums. Measured after 20 steps
(dev PPL on 50 sentences): reference 439.7508, 1 process accumulating the parts 439.7514, 2 processes
439.7765 (relative differences 1.4e-6 and 5.8e-5); with each part's loss its own mean (the normalization
before this fix) 451.5078 and 451.5083 (2.7e-2 away). REL_TOL = 1e-3 sits 17x above the float noise and 27x
below that flaw.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiayn.ablations.presets import get_preset
from aiayn.lightning_modules.data.batching import derive_accumulation
from aiayn.lightning_modules.run.train import device_tokens

ROW, STEPS, REL_TOL = "D1", 20, 1e-3
# `aiayn train` whose training sampler builds the batches of twice its budget (--max-tokens 512: the reference's
# 1024) and yields each as two parts, its first fifth and the rest: with 2 ranks (r::2) or 2 accumulated batches,
# step k trains on the tokens of the reference's batch k. A script file, not `python -c`: Lightning starts the
# other DDP ranks by running sys.argv again.
SPLIT = """
import sys
from aiayn.lightning_modules.data import batching as data
whole = data.TokenBucketSampler.all_batches
def parts(self, epoch=None):
    if not self.shuffle:  # dev and test: as they are
        return whole(self, epoch)
    budget, self.max_tokens = self.max_tokens, 2 * self.max_tokens
    try:
        batches = whole(self, epoch)
    finally:
        self.max_tokens = budget
    return [part for b in batches if len(b) >= 5 for part in (b[: len(b) // 5], b[len(b) // 5 :])]
data.TokenBucketSampler.all_batches = parts
from aiayn.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("preset,world", [("paper", 1), ("paper", 2), ("paper", 8), ("paper", 16), ("small", 4)])
def test_default_budget_keeps_the_presets_tokens_per_step(preset, world):
    p = get_preset(preset)
    per_device = device_tokens(p, world)
    assert per_device > p.max_len  # a sentence must fit in a batch
    effective = per_device * world * derive_accumulation(p.tokens_per_step, per_device, world)
    assert p.tokens_per_step <= effective <= p.tokens_per_step + world  # rounding up to whole tokens per device


def test_paper_on_one_gpu_with_a_smaller_budget_accumulates():
    """README: the paper's 25k tokens per step on 1 GPU with --max-tokens 4096 is 7 accumulated batches."""
    assert derive_accumulation(get_preset("paper").tokens_per_step, 4096, 1) == 7
    assert device_tokens(get_preset("paper"), 8) == 3125  # the paper's 8 GPUs, one batch each


def _train(out: Path, cache: Path, *extra: str, env: dict | None = None, split: Path | None = None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        *([str(split)] if split else ["-m", "aiayn"]),
        *"train --preset tiny --row".split(),
        ROW,
        *"--accelerator cpu --max-steps".split(),
        str(STEPS),
        *"--eval-subset 50 --out".split(),
        str(out),
        "--no-progress",
        *extra,
    ]
    env = {**os.environ, "AIAYN_CACHE": str(cache), **(env or {})}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(*procs: subprocess.Popen) -> None:
    outputs = [p.communicate()[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-4000:]


def _result(out: Path) -> tuple[dict, dict]:
    run = out / "tiny" / "synthetic" / ROW / "seed0"
    assert list(out.rglob("metrics.json")) == [run / "metrics.json"]  # exactly one, from rank 0
    return json.loads((run / "metrics.json").read_text()), json.loads((run / "config.json").read_text())["train"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ddp-cache")


HALF = str(device_tokens(get_preset("tiny"), 2))  # the per-device budget of 2 processes


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ddp-split") / "split_train.py"
    path.write_text(SPLIT)
    return path


@pytest.fixture(scope="module")
def union(tmp_path_factory, cache):
    """The reference: 1 process, each step one batch (the tokens the others split in two)."""
    out = tmp_path_factory.mktemp("ddp-union")
    _finish(_train(out, cache))
    return _result(out)


@pytest.mark.slow
def test_one_process_accumulating_two_unequal_parts_reaches_the_loss_of_their_union(union, split, cache, tmp_path):
    _finish(_train(tmp_path, cache, "--max-tokens", HALF, split=split))
    (m1, t1), (mu, tu) = _result(tmp_path), union
    assert (t1["accumulate"], tu["accumulate"]) == (2, 1)
    assert m1["steps"] == mu["steps"] == STEPS
    assert m1["tgt_tokens_per_step"] == pytest.approx(mu["tgt_tokens_per_step"], abs=1e-9)  # the same tokens
    assert m1["dev_ppl"] == pytest.approx(mu["dev_ppl"], rel=REL_TOL)


@pytest.mark.slow
def test_two_processes_reach_the_loss_of_one_process_on_the_union(union, split, cache, tmp_path):
    offline = {"WANDB_MODE": "offline", "WANDB_API_KEY": "", "WANDB_SILENT": "true"}
    _finish(_train(tmp_path, cache, "--devices", "2", "--strategy", "ddp", "--wandb", env=offline, split=split))
    (m2, t2), (mu, _) = _result(tmp_path), union
    assert len(list(tmp_path.rglob("offline-run-*"))) == 1  # one W&B run, from rank 0
    assert t2["world_size"] == 2 and t2["accumulate"] == 1
    assert t2["effective_tokens_per_step"] == m2["effective_tokens_per_step"] == get_preset("tiny").tokens_per_step
    assert m2["steps"] == mu["steps"] == STEPS
    assert m2["tgt_tokens_per_step"] == pytest.approx(mu["tgt_tokens_per_step"], abs=1e-9)  # counted over both ranks
    assert m2["dev_ppl"] == pytest.approx(mu["dev_ppl"], rel=REL_TOL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_through_the_generic_environment(union, split, cache, tmp_path):
    """Two `aiayn train --num-nodes 2 --devices 1` processes, as on two machines without SLURM: each
    gets MASTER_ADDR/MASTER_PORT of node 0 and its NODE_RANK; Lightning derives the world size
    (num_nodes x devices). One thread each, as one core per "node"."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
    nodes = [
        _train(
            tmp_path,
            cache,
            "--num-nodes",
            "2",
            "--devices",
            "1",
            "--strategy",
            "ddp",
            env={**env, "NODE_RANK": str(rank)},
            split=split,
        )
        for rank in (0, 1)
    ]
    _finish(*nodes)
    (m2, t2), (mu, _) = _result(tmp_path), union
    assert t2["world_size"] == 2 and m2["steps"] == STEPS
    assert m2["dev_ppl"] == pytest.approx(mu["dev_ppl"], rel=REL_TOL)


# Counts, per optimizer step of each rank, the reads of tensors derived from the step's loss (a host-device sync on a
# GPU; OnDevice, as in tests/test_syncs.py) and the collectives called from Python (DDP's gradient all-reduce runs
# in its C++ reducer, overlapped with the backward, and is not one of them); each rank writes its counts at exit.
COUNT_SYNCS = """
import atexit, json, os, sys
import torch, torch.distributed as dist
from aiayn.lightning_modules.run import module
class OnDevice(torch.Tensor):
    pass
counts, inside, per_step, last = {"reads": 0, "collectives": 0}, [False], [], [None]
for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
    def read(self, *a, _real=getattr(torch.Tensor, name), **kw):
        if inside[0]:
            return _real(self, *a, **kw)
        counts["reads"] += isinstance(self, OnDevice)
        inside[0] = True
        try:
            return _real(self, *a, **kw)
        finally:
            inside[0] = False
    setattr(torch.Tensor, name, read)
for name in ("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_object", "reduce"):
    def collective(*a, _real=getattr(dist, name), **kw):
        counts["collectives"] += 1
        return _real(*a, **kw)
    setattr(dist, name, collective)
real_loss = module.projected_label_smoothed_loss
def on_device(*a, **kw):
    loss, nll, rest = real_loss(*a, **kw)
    return loss.as_subclass(OnDevice), nll.as_subclass(OnDevice), rest
module.projected_label_smoothed_loss = on_device
validated = [False]  # a validation after the batch (the run validates at 75% and 87.5% of its budget): left out
def on_train_batch_start(self, *a):
    now = dict(counts)
    if last[0] is not None:
        per_step.append(None if validated[0] else {k: now[k] - last[0][k] for k in now})
    last[0], validated[0] = now, False
real_validation_start = module.TranslationModule.on_validation_start
def on_validation_start(self):
    validated[0] = True
    real_validation_start(self)
module.TranslationModule.on_train_batch_start = on_train_batch_start
module.TranslationModule.on_validation_start = on_validation_start
rank = os.environ.get("LOCAL_RANK", "0")
atexit.register(lambda: open(os.path.join(os.environ["SYNC_COUNTS"], f"rank{rank}.json"), "w").write(
    json.dumps(per_step)))
from aiayn.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_two_processes_sync_on_log_steps_only_with_one_collective_a_step(cache, tmp_path):
    """Under DDP (2 processes, gloo) with the progress bar on and log steps in the window, each rank calls
    one collective per optimizer step (the packed counts and flags; Lightning's strategy.reduce would add a barrier
    to it) and reads the device once on a log step. And not at all between log steps (the reduced flags
    are read at the next step, fused Adam skipping a non-finite update on the device meanwhile)."""
    script = tmp_path / "count_syncs.py"
    script.write_text(COUNT_SYNCS)
    counts = tmp_path / "counts"
    counts.mkdir()
    cmd = [
        sys.executable,
        str(script),
        *"train --preset tiny --row base --accelerator cpu --devices 2 --strategy ddp --max-steps 10".split(),
        *"--val-every 1000 --ckpt-every 1000 --eval-subset 8 --out".split(),
        str(tmp_path / "runs"),
        *"--progress --trainer log_every_n_steps=2 --set".split(),
        "N=1 d_model=32 d_ff=64 h=2",
    ]
    env = {**os.environ, "AIAYN_CACHE": str(cache), "SYNC_COUNTS": str(counts), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        # entry i is step i + 1; the first sets things up; the two validated ones (75%, 87.5% of 10) are None
        per_step = {
            i: s
            for i, s in enumerate(json.loads((counts / f"rank{rank}.json").read_text()), start=1)
            if i > 1 and s is not None
        }
        assert len(per_step) >= 6, per_step
        assert per_step == {i: {"collectives": 1, "reads": 1 if i % 2 == 0 else 0} for i in per_step}, (rank, per_step)


# Rank 1's 5th training loss (optimizer step 5: one batch a step) made NaN; rank 0's stays finite.
NAN_ON_RANK_1 = """
import os, sys
from aiayn.lightning_modules.run import module
real_loss, calls = module.projected_label_smoothed_loss, [0]
def nan_at_step_5(*a, **kw):
    loss, nll, rest = real_loss(*a, **kw)
    calls[0] += 1
    if os.environ.get("LOCAL_RANK") == "1" and calls[0] == 5:
        loss = loss * float("nan")
    return loss, nll, rest
module.projected_label_smoothed_loss = nan_at_step_5
from aiayn.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("log_every", [100, 5], ids=["read a step late", "read at its log step"])
def test_a_loss_not_finite_on_one_rank_stops_every_rank_with_that_step_never_saved(cache, tmp_path, log_every):
    """The non-finite flag is reduced over the ranks, so one rank's NaN stops them all at the same step:
    read a step late between log steps (fused Adam skipped the step's update on every rank meanwhile, so the
    checkpoint saved after it is refused: last.ckpt holds step 4, finite), or at once on a log step. The
    message says the loss was not finite on another rank (rank 0's own was)."""
    script = tmp_path / "nan_on_rank_1.py"
    script.write_text(NAN_ON_RANK_1)
    flags = "--preset tiny --accelerator cpu --devices 2 --strategy ddp --max-steps 20 --val-every 1000 --ckpt-every 1"
    cmd = [sys.executable, str(script), "train", *flags.split(), "--row", ROW, "--eval-subset", "8", "--no-progress"]
    cmd += ["--out", str(tmp_path / "runs"), "--trainer", f"log_every_n_steps={log_every}"]
    cmd += ["--set", "N=1 d_model=32 d_ff=64 h=2"]
    env = {**os.environ, "AIAYN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "tiny" / "synthetic" / ROW / "seed0"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "diverged" and metrics["diverged_at_step"] == 5, metrics
    assert metrics["error"].startswith("loss not finite on another rank (this rank's "), metrics["error"]
    import torch

    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())


@pytest.mark.slow
def test_a_ddp_checkpoint_holds_each_ranks_own_rng_states(cache, tmp_path):
    """RNGStates under two processes (no test failed when its gather was reverted): the checkpoint rank 0
    writes holds both ranks' states, gathered, and they differ (rank 1 draws from seed + 1)."""
    import torch

    _finish(_train(tmp_path, cache, "--devices", "2", "--strategy", "ddp", "--ckpt-every", "10"))
    ckpt = torch.load(tmp_path / "tiny" / "synthetic" / ROW / "seed0" / "checkpoints" / "last.ckpt", weights_only=False)
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("RNGStates")]
    ranks = state["ranks"]
    assert len(ranks) == 2 and all(r is not None for r in ranks)
    assert not torch.equal(ranks[0]["torch"], ranks[1]["torch"])


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("signalled", [0, 1])
def test_a_sigterm_to_either_rank_stops_every_rank_at_the_same_step(cache, tmp_path, signalled):
    """SIGTERM under DDP rides in the step's one all-reduce (callbacks.SigtermWithTheStep): whichever rank gets it,
    every rank learns it from the step's reduce and stops before the same step. With Lightning's own handling a
    SIGTERM to rank 1 alone stops rank 1 and leaves rank 0 to fail in its next collective, which logs no decision."""
    log_path = tmp_path / "log.txt"
    cmd = [
        sys.executable,
        *"-m aiayn train --preset tiny --row".split(),
        ROW,
        *"--accelerator cpu --devices 2 --strategy ddp --max-steps 100000 --val-every 100000 --ckpt-every 5".split(),
        *"--eval-subset 8 --out".split(),
        str(tmp_path / "runs"),
        "--no-progress",
        "--set",
        "N=1 d_model=32 d_ff=64 h=2",
    ]
    env = {**os.environ, "AIAYN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ckpts = tmp_path / "runs" / "tiny" / "synthetic" / ROW / "seed0" / "checkpoints"
        deadline = time.monotonic() + 300
        while not (ckpts / "step0000005.ckpt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        (rank1,) = _children(proc.pid)
        os.kill(proc.pid if signalled == 0 else rank1, signal.SIGTERM)
        proc.wait(timeout=120)
        deadline = time.monotonic() + 60
        with pytest.raises(ProcessLookupError):  # no rank is left behind
            while time.monotonic() < deadline:
                os.killpg(proc.pid, 0)
                time.sleep(0.2)
        assert proc.returncode == 128 + signal.SIGTERM  # not 0: the run did not finish
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text()
    stops = sorted(
        line.split("SIGTERM, every rank stops before step ")[1] + f" (rank {line.split('rank ')[1][0]})"
        for line in text.splitlines()
        if "SIGTERM, every rank stops" in line
    )
    assert len(stops) == 2 and stops[0].split()[0] == stops[1].split()[0], text[-3000:]
    assert not (ckpts.parent / "metrics.json").exists()


@pytest.mark.slow
def test_a_dev_set_of_fewer_batches_than_ranks_validates_under_ddp(cache, tmp_path):
    """One dev sentence is one batch, and rank 1 had none: it skipped validation while rank 0 waited
    for it in the epoch's gather, and the run crashed at its first validation. Every rank now gets a batch (a filler
    row of padding that counts no token), and the validation's perplexity is the one sentence's."""
    cmd = [
        sys.executable,
        *"-m aiayn.cli train --preset tiny --row base --accelerator cpu --devices 2 --strategy ddp".split(),
        *"--max-steps 4 --val-every 2 --ckpt-every 1000 --eval-subset 1 --val-bleu-sentences 1 --out".split(),
        str(tmp_path / "runs"),
        "--no-progress",
        "--set",
        "N=1 d_model=32 d_ff=64 h=2",
    ]
    env = {**os.environ, "AIAYN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "tiny" / "synthetic" / "base" / "seed0"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["dev_sentences"] == 1
    curve = (run / "logs" / "version_0" / "metrics.csv").read_text().splitlines()
    column = curve[0].split(",").index("val/ppl")
    # validated at steps 2 and 4 (--val-every 2) and 3 (75% of the budget: the stability rule's, scheduled by the run)
    assert len([line for line in curve[1:] if line.split(",")[column]]) == 3


@pytest.mark.slow
def test_two_ddp_runs_of_one_sweep_at_once_both_complete(cache, tmp_path):
    """`aiayn table3 --jobs 2 --devices 2 --strategy ddp` (gloo on a CPU): each run's processes meet on a MASTER_PORT
    of their own; the two used to get one port, and one run failed with "address already in use"."""
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "aiayn", "table3", "--preset", "tiny", "--rows", "base", "--seeds", "2"]
    cmd += ["--jobs", "2", "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu", "--backend", "subprocess"]
    cmd += ["--max-steps", "4", "--val-every", "1000", "--eval-subset", "8", "--val-bleu-sentences", "0"]
    cmd += ["--set", "N=1 d_model=32 d_ff=64 h=2", "--logger", "csv", "--report", "", "--out", str(out)]
    env = {**os.environ, "AIAYN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text() for p in out.glob("**/*.log"))
    assert done.returncode == 0, done.stderr[-3000:] + logs[-3000:]
    for seed in (0, 1):
        metrics = json.loads((out / "tiny" / "synthetic" / "base" / f"seed{seed}" / "metrics.json").read_text())
        assert metrics["status"] == "completed" and metrics["steps"] == 4
