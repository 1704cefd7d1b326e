"""Fault injection: exact resume after SIGKILL, sweeps that lose and duplicate nothing, divergence as a
result, atomic writes under a kill, and secrets that never reach a file or a terminal.

Real training runs use a 1-layer, 32-wide model (`--set`) on the tiny preset's corpus with explicit
step, checkpoint and validation counts, so nothing here depends on the tiny preset's defaults.
"""

import contextlib
import csv
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import optuna
import pytest
import torch
from conftest import RunnerBackend
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aiayn.ablations.selection import Selection
from aiayn.cli import main
from aiayn.common.locks import file_lock
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.rundir import RunDir, RunMetrics
from aiayn.sweeps import books
from aiayn.sweeps.backends.queue import pair_of, study_name
from aiayn.sweeps.folders import SweepOut
from aiayn.sweeps.storage import open_storage
from aiayn.sweeps.table3 import SweepOptions, run_table3

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset


def pair_lock_path(opts, corpus, row, seed):
    return books.LockClaims(SweepOut(opts.train.out), "pair").path(books.pair_key("tiny", corpus, row, seed))


def fail_stale_trials(study, opts):
    out, key = SweepOut(opts.train.out), lambda t: books.pair_key("tiny", SYNTHETIC, *pair_of(t))
    stale = books.fail_stale_trials(study, out.lock(f"{study.study_name}.pop"), books.LockClaims(out, "pair"), key)
    return [pair_of(t) for t in stale]


ROOT = Path(__file__).resolve().parents[1]
optuna.logging.set_verbosity(optuna.logging.WARNING)
SMALL_MODEL = ["--set", "N=1 d_model=32 d_ff=64 h=2"]
QUIET = ["--no-progress", "--accelerator", "cpu"]


def aiayn(*argv: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *argv]


def run_dir(out: Path, row: str = "base", seed: int = 0) -> Path:
    return out / "tiny" / "synthetic" / row / f"seed{seed}"


# --- exact resume ------------------------------------------------------------------------------


class Toy(pl.LightningModule):
    """Dropout between two layers: its masks come from the global torch RNG, as in the Transformer."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def toy_fit(tmp_path, steps, val_every=None, ckpt=None, callbacks=None):
    from aiayn.lightning_modules.run.callbacks import RNGStates

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(12, 4, generator=g), torch.randn(12, 1, generator=g))
    pl.seed_everything(0, verbose=False)
    model = Toy()
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=ckpt is None and callbacks is not None,
        callbacks=[RNGStates(), *(callbacks or [])],
        val_check_interval=val_every,
        check_val_every_n_epoch=1 if val_every else None,
        limit_val_batches=1 if val_every else 0,
        num_sanity_val_steps=0,
        deterministic=True,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4), ckpt_path=ckpt)
    return model


def test_validation_and_restarts_leave_no_trace_in_the_training_rng(tmp_path):
    """Bitwise: validation every step (each start of a validation loader draws from the global RNG)
    and a restart from a checkpoint give the weights of a plain uninterrupted run."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    plain = toy_fit(tmp_path / "a", 6)
    validated = toy_fit(tmp_path / "b", 6, val_every=1)
    ckpt = ModelCheckpoint(tmp_path / "c", "s{step}", every_n_train_steps=3, save_top_k=-1)
    ckpt.auto_insert_metric_name = False
    toy_fit(tmp_path / "c", 3, callbacks=[ckpt])
    pl.seed_everything(123, verbose=False)  # a restarted process's RNG is anywhere
    resumed = toy_fit(tmp_path / "d", 6, ckpt=str(tmp_path / "c" / "s3.ckpt"))
    for other in (validated, resumed):
        for a, b in zip(plain.state_dict().values(), other.state_dict().values()):
            assert torch.equal(a, b)


KILL_AT_STEP = """
import os, signal, sys
from aiayn.cli import main
from aiayn.lightning_modules.run.module import TranslationModule
step, end = int(sys.argv[1]), TranslationModule.on_train_batch_end
def on_train_batch_end(self, *args):
    end(self, *args)
    if self.trainer.global_step >= step:
        os.kill(os.getpid(), signal.SIGKILL)
TranslationModule.on_train_batch_end = on_train_batch_end
main(sys.argv[2:])
"""


@pytest.mark.slow
def test_a_run_killed_at_a_random_step_resumes_bit_for_bit(cache, tmp_path):
    """SIGKILL after the first checkpoint, restart with the same command: same final weights,
    optimizer state, dev translations and dev metrics as an uninterrupted run (CPU, deterministic)."""
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    common = [
        *"train --preset tiny --max-steps 30 --ckpt-every 10 --val-every 5".split(),
        *"--val-bleu-sentences 2 --eval-subset 4".split(),
        *SMALL_MODEL,
        *QUIET,
    ]
    env = dict(os.environ, AIAYN_CACHE=str(cache))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(aiayn(*common, "--out", str(whole)), env=env, check=True, capture_output=True)

    # SIGKILL at a random step after the first checkpoint: the process kills itself when that step's batch
    # ends (after the checkpoint callbacks), whatever the speed of the machine
    step = rng.randint(11, 29)
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AT_STEP, str(step), *common, "--out", str(killed)], env=env, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert not (run_dir(killed) / "metrics.json").exists()
    assert (run_dir(killed) / "checkpoints" / "step0000010.ckpt").exists(), f"random seed {seed}, step {step}"
    subprocess.run(aiayn(*common, "--out", str(killed)), env=env, check=True, capture_output=True)

    a, b = run_dir(whole), run_dir(killed)
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    same = ("status", "steps", "dev_bleu", "dev_tok_bleu", "dev_ppl", "dev_sentences", "params")
    assert {k: ma[k] for k in same} == {k: mb[k] for k in same}, f"random seed {seed}"
    assert (a / "dev.hyp").read_text() == (b / "dev.hyp").read_text()
    ca, cb = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=False) for d in (a, b))
    assert ca["global_step"] == cb["global_step"] == 30
    assert all(torch.equal(ca["state_dict"][k], cb["state_dict"][k]) for k in ca["state_dict"]), f"seed {seed}"
    sa, sb = ca["optimizer_states"][0]["state"], cb["optimizer_states"][0]["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in ("exp_avg", "exp_avg_sq"))
    assert ca["lr_schedulers"] == cb["lr_schedulers"]
    assert len(list((b / "logs").glob("version_*"))) == 2  # it was really interrupted and resumed


KILL_IN_LAST_WRITE = """
import io, os, signal, sys, torch
from aiayn.cli import main

real_save = torch.save
def save(obj, f, *a, **k):  # the first last.ckpt: half written, then SIGKILL (its periodic twin is on disk)
    if os.path.basename(getattr(f, "name", "")).startswith(".last.ckpt."):
        buf = io.BytesIO(); real_save(obj, buf); f.write(buf.getvalue()[: len(buf.getvalue()) // 2]); f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *a, **k)
torch.save = save
main(sys.argv[1:])
"""


@pytest.mark.slow
def test_a_kill_inside_a_checkpoint_write_loses_only_the_steps_since_the_last_checkpoint(cache, tmp_path):
    """A kill inside the write of the first last.ckpt: the periodic step0000010.ckpt written just before
    it holds the whole state, so the rerun resumes at step 10, not 0, and ends where an uninterrupted run does."""
    common = [
        *"train --preset tiny --max-steps 20 --ckpt-every 10 --val-every 10".split(),
        *"--val-bleu-sentences 0 --eval-subset 4".split(),
        *SMALL_MODEL,
        *QUIET,
    ]
    env = dict(os.environ, AIAYN_CACHE=str(cache))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(aiayn(*common, "--out", str(whole)), env=env, check=True, capture_output=True)
    proc = subprocess.run(
        [sys.executable, "-c", KILL_IN_LAST_WRITE, *common, "--out", str(killed)], env=env, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    ckpts = run_dir(killed) / "checkpoints"
    assert (ckpts / "step0000010.ckpt").exists() and not (ckpts / "last.ckpt").exists()
    done = subprocess.run(aiayn(*common, "--out", str(killed)), env=env, check=True, capture_output=True, text=True)
    assert "step0000010.ckpt" in done.stderr  # Lightning names the checkpoint it restores
    a, b = run_dir(whole), run_dir(killed)
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert (ma["steps"], ma["dev_ppl"]) == (mb["steps"], mb["dev_ppl"]) == (20, ma["dev_ppl"])
    second = next(p for p in sorted((b / "logs").glob("version_*")) if p.name == "version_1") / "metrics.csv"
    steps = [int(r["step"]) for r in csv.DictReader(second.read_text().splitlines())]  # 0-based: 9 is step 10
    assert steps and min(steps) >= 10, f"the rerun trained from step 0 again (it logged steps {steps})"


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum,to,workers", [(signal.SIGTERM, "process", 0), (signal.SIGTERM, "group", 2), (signal.SIGINT, "group", 2)]
)
def test_a_sigterm_stops_the_run_with_exit_143_and_the_same_command_resumes_it(cache, tmp_path, signum, to, workers):
    """SIGTERM (a driver's death, `kill`, a scheduler) is not a finished run: exit 128 + 15, no metrics.json, and the
    rerun resumes from the last checkpoint (Lightning's SIGTERMException alone exits 0). Sent to the whole
    process group (SLURM at a time limit, `timeout`), with DataLoader workers on, it killed the workers and ended in a
    chain of tracebacks and exit 1; Ctrl-C's SIGINT to the group exited 1 without a word. Now each is one line and
    exit 128 + the signal."""
    common = [
        *"train --preset tiny --max-steps 100000 --ckpt-every 5 --val-every 100000 --eval-subset 4".split(),
        "--num-workers",
        str(workers),
        *SMALL_MODEL,
        *QUIET,
        "--out",
        str(tmp_path / "runs"),
    ]
    env = dict(os.environ, AIAYN_CACHE=str(cache))
    proc = subprocess.Popen(
        aiayn(*common), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    ckpts = run_dir(tmp_path / "runs") / "checkpoints"
    deadline = time.monotonic() + 300
    while not (ckpts / "step0000005.ckpt").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    if to == "group":
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    err = proc.communicate(timeout=120)[1]
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err[-2000:]
    assert f"stopped by {name} at step" in err and "the same command resumes it" in err
    assert "Traceback" not in err and "Error" not in err, err[-2000:]
    assert not (run_dir(tmp_path / "runs") / "metrics.json").exists()
    assert RunDir(run_dir(tmp_path / "runs")).resume_checkpoint() is not None


class _SignalsInItsFinalizer:
    """What a DataLoader iterator does at an epoch's end: its `__del__` joins the workers, and a signal that arrives
    meanwhile runs its handler inside the finalizer."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside __del__


def test_a_ctrl_c_that_lands_inside_a_finalizer_still_stops_the_run(cache, tmp_path, monkeypatch, caplog):
    """A flake: Python raises KeyboardInterrupt wherever the main thread is, and inside a finalizer it is
    printed and dropped, so the run trained on to its budget (a Ctrl-C to the group left a trainer training 22
    minutes). Ctrl-C is a flag now, read at the step's end: the run stops at the step it landed in, one line, exit
    130, no metrics.json, and the SIGINT handler is the one it found."""
    from aiayn.lightning_modules.run.module import TranslationModule

    step = TranslationModule.training_step

    def signalling(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            _SignalsInItsFinalizer()  # dropped at once: its finalizer runs here
        return step(self, batch, batch_idx)

    monkeypatch.setattr(TranslationModule, "training_step", signalling)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                *"train --preset tiny --max-steps 40 --ckpt-every 2 --val-every 100 --eval-subset 4".split(),
                *SMALL_MODEL,
                *QUIET,
                "--out",
                str(tmp_path / "runs"),
            ]
        )
    assert stopped.value.code == 128 + signal.SIGINT
    assert "stopped by SIGINT at step 4" in caplog.text
    assert not (run_dir(tmp_path / "runs") / "metrics.json").exists()
    assert signal.getsignal(signal.SIGINT) is before


# --- divergence --------------------------------------------------------------------------------


def test_a_diverging_run_ends_with_status_diverged_its_step_and_a_finite_last_checkpoint(cache, tmp_path, capsys):
    out = tmp_path / "runs"
    argv = [
        *"train --preset tiny --max-steps 20 --ckpt-every 1 --val-every 100 --val-bleu-sentences 2".split(),
        *"--eval-subset 2 --set".split(),
        "N=1 d_model=32 d_ff=64 h=2 lr_factor=1e9 warmup=1",
        "--out",
        str(out),
        *QUIET,
    ]
    assert main(argv) == 0
    metrics = json.loads((run_dir(out) / "metrics.json").read_text())
    step = metrics["diverged_at_step"]
    assert metrics["status"] == "diverged" and 1 <= step < 20
    assert metrics["error"] in (f"loss nan at optimizer step {step}", f"loss inf at optimizer step {step}")
    assert "dev_bleu" not in metrics
    assert metrics["deviations"][-1] == "overridden: N=1 d_model=32 d_ff=64 h=2 lr_factor=1000000000.0 warmup=1"
    printed = capsys.readouterr().out
    assert f"base seed 0: diverged ({metrics['error']}); metrics.json status diverged" in printed
    last = run_dir(out) / "checkpoints" / "last.ckpt"
    if step == 1:
        assert not last.exists()
    else:  # the diverged step was never saved: a rerun resumes from finite weights
        ckpt = torch.load(last, weights_only=False)
        assert ckpt["global_step"] == step - 1
        assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert main(["report", "--runs", str(out), "--out", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "table3-tiny.md").read_text()
    assert f"base seed 0: diverged: {metrics['error']}" in report


class _StateAfterEachStep(pl.Callback):
    """The weights and Adam's state after each optimizer step, by step, and the steps whose training batch began."""

    def __init__(self):
        self.after, self.began, self.validated = {}, [], []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.validated.append(trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.began.append(trainer.global_step + 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        state = trainer.optimizers[0].state
        self.after[trainer.global_step] = (
            {k: v.detach().clone() for k, v in pl_module.state_dict().items()},
            {i: {k: v.clone() for k, v in state[p].items()} for i, p in enumerate(pl_module.parameters())},
        )


@pytest.mark.parametrize("val_every", [1000, 5], ids=["between steps", "before a validation"])
def test_a_non_finite_step_between_log_steps_changes_no_weight_and_is_named_at_the_next_step(
    cache, tmp_path, monkeypatch, val_every
):
    """On one device with fused Adam, a step between log steps does not read its non-finite flag at once
    (no host-device sync); the step's update is skipped on the device (fused Adam's found_inf) and the run stops at
    the next step with the step it diverged at. Step 5's loss is made NaN: after step 5 the weights, Adam's moments
    and its step count are step 4's, the next step began but took no update, and metrics.json names step 5. With a
    validation after step 5, the flag is read before it: no validation of a step that diverged."""
    from aiayn.lightning_modules.run import module
    from aiayn.lightning_modules.run import train as T

    real_loss, bad_step = module.projected_label_smoothed_loss, 5

    def nan_at_step_5(*a, **kw):
        loss, nll, rest = real_loss(*a, **kw)
        if watch.began[-1] == bad_step:
            loss = loss * float("nan")
        return loss, nll, rest

    monkeypatch.setattr(module, "projected_label_smoothed_loss", nan_at_step_5)
    watch = _StateAfterEachStep()
    opts = TrainOptions(
        out=str(tmp_path),
        max_steps=10,
        val_every=val_every,
        ckpt_every=1000,
        progress=False,
        accelerator="cpu",
        overrides={"N": 1, "d_model": 32, "d_ff": 64, "h": 2},
        eval_subset=2,
        trainer={"log_every_n_steps": 100},
    )
    T.train(opts, hooks=T.Hooks(callbacks=(watch,)))
    metrics = json.loads((run_dir(tmp_path) / "metrics.json").read_text())
    assert metrics["status"] == "diverged" and metrics["diverged_at_step"] == bad_step, metrics
    assert metrics["error"] == f"loss nan at optimizer step {bad_step}"
    if val_every == 1000:
        assert watch.began[-1] == bad_step + 1  # deferred: read at the next step, before its update
    else:
        assert watch.began[-1] == bad_step and bad_step not in watch.validated, watch.validated
    (weights4, adam4), (weights5, adam5) = watch.after[bad_step - 1], watch.after[bad_step]
    assert all(torch.isfinite(v).all() for v in weights5.values() if v.is_floating_point())
    assert all(torch.equal(weights4[k], weights5[k]) for k in weights4)
    assert all(torch.equal(adam4[i][k], adam5[i][k]) for i in adam4 for k in adam4[i])
    assert float(adam5[0]["step"]) == bad_step - 1
    assert not torch.equal(watch.after[bad_step - 2][0]["model.embed.weight"], weights4["model.embed.weight"])


def test_a_diverged_pair_fails_its_trial_and_the_sweep_carries_on(tmp_path):
    calls = []

    def runner(opts, corpus, row, seed):
        calls.append((row, seed))
        if row == "A1":
            return {
                "row": row,
                "seed": seed,
                "status": "diverged",
                "diverged_at_step": 7,
                "error": "loss nan at optimizer step 7",
            }
        return {"row": row, "seed": seed, "status": "completed", "dev_bleu": 1.0}

    opts = SweepOptions(select=Selection(rows="base,A1,A2"), train=TrainOptions(out=str(tmp_path / "runs")))
    assert run_table3(opts, backend=RunnerBackend(runner)).counts() == {
        "pairs": 3,
        "ran": 3,
        "completed": 2,
        "failed": 0,
        "diverged": 1,
    }
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=f"sqlite:///{tmp_path}/runs/optuna.db")
    (failed,) = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert (failed.user_attrs["row"], failed.user_attrs["seed"]) == ("A1", 0)
    assert failed.user_attrs["metrics"]["status"] == "diverged"
    assert sorted(calls) == [("A1", 0), ("A2", 0), ("base", 0)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_sweep_in_one_line_and_the_same_command_runs_what_it_stopped(tmp_path, caplog, signum):
    """A SIGTERM (a scheduler, `timeout`) or SIGINT (Ctrl-C) to a sweep's driver killed it at once, without
    a word, its pairs left running in the books. Now the pair under way is told and ends, no new pair starts, the
    driver says so in one line and exits 128 + the signal, the stopped pair is not booked as failed, and the same
    command runs the stopped pair and the rest."""
    calls = []

    def runner(opts, corpus, row, seed):
        calls.append((row, seed))
        if len(calls) == 1:
            os.kill(os.getpid(), signum)  # to the driver, while its first pair runs
            time.sleep(0.5)  # the main thread runs the handler
            return {"row": row, "seed": seed, "status": "failed", "error": "exit 143: stopped"}
        return {"row": row, "seed": seed, "status": "completed", "dev_bleu": 1.0}

    opts = SweepOptions(select=Selection(rows="base,A1,A2"), jobs=1, train=TrainOptions(out=str(tmp_path / "runs")))
    before = signal.getsignal(signum)
    with pytest.raises(SystemExit) as stopped, caplog.at_level("INFO"):
        run_table3(opts, backend=RunnerBackend(runner))
    assert stopped.value.code == 128 + signum and signal.getsignal(signum) is before
    name = signal.Signals(signum).name
    assert len(calls) == 1 and f"table3 tiny stopped by {name}: 0 pair(s) completed in this call" in caplog.text
    assert not list((tmp_path / "runs").rglob("*.failed.json")), "a stopped pair was booked as failed"
    # in the study (optuna-dashboard) the stopped attempt is PRUNED (Optuna's word for a trial stopped before its
    # end), not failed, and its pair waits to be resumed, as aiayn's books say: one WAITING trial, no new one beside
    # it when the sweep resumes; the driver's line on it is not numbered as a completed pair's
    study = optuna.load_study(
        study_name="table3-tiny-synthetic", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    )
    stopped_trial = next(t for t in study.trials if t.user_attrs.get("stopped") == name)
    assert stopped_trial.state == optuna.trial.TrialState.PRUNED
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert f"[stopped] {stopped_trial.user_attrs['row']} seed 0: stopped by {name}" in caplog.text
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    pair = (stopped_trial.user_attrs["row"], stopped_trial.user_attrs["seed"])
    assert [
        (t.user_attrs["row"], t.user_attrs["seed"]) for t in waiting if t.user_attrs.get("resumes") is not None
    ] == [pair]
    caplog.clear()
    with caplog.at_level("INFO"):
        assert run_table3(opts, backend=RunnerBackend(runner)).counts()["completed"] == 3
    assert "3 pairs, 3 to run" in caplog.text  # the queued pairs counted too, not only those enqueued now (0)
    assert (
        sum(
            t.state == optuna.trial.TrialState.COMPLETE
            for t in optuna.load_study(
                study_name="table3-tiny-synthetic", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
            ).trials
        )
        == 3
    )
    assert sorted(calls[1:]) == [("A1", 0), ("A2", 0), ("base", 0)]


def test_a_trainer_a_stopping_sweep_would_start_is_not_started_or_is_stopped_at_once(tmp_path, monkeypatch):
    """Seen on a CPU run of the GPU check's table call, cut by `timeout`: a worker that claimed a pack as the group's
    SIGTERM came started its trainer after it; that process never got the signal, trained on, and held the driver
    until `timeout` killed both (exit 137, nothing reported). Now a back end starts no trainer once the sweep has
    stopped, and one started while the stop was handled is sent it at once."""
    from conftest import fake_popen

    from aiayn.sweeps.backends.local import LocalBackend
    from aiayn.sweeps.backends.processes import SubprocessBackend
    from aiayn.sweeps.table3 import build_sweep

    train = TrainOptions(preset="tiny", out=str(tmp_path / "runs"), progress=False)
    sweep = build_sweep(SweepOptions(select=Selection(rows="base"), backend="subprocess", train=train))
    spawned, made = [], []
    monkeypatch.setattr("subprocess.Popen", fake_popen(spawned))
    monkeypatch.setattr("aiayn.sweeps.backends.local._forkserver", lambda: pytest.fail("forked after the stop"))
    for backend in (SubprocessBackend(), LocalBackend()):  # stopped while the pair was claimed: nothing starts
        backend.stop.signum = signal.SIGTERM
        assert backend.run_one(sweep, "base", 0, None).status == "failed" and spawned == []
    backend = SubprocessBackend()

    class Starting(fake_popen(spawned)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            backend.stop.signum = signal.SIGTERM  # handled while the trainer was being started, before it joined
            made.append(self)

    monkeypatch.setattr("subprocess.Popen", Starting)
    backend.run_one(sweep, "base", 0, None)
    assert len(spawned) == 1 and made[0].signals == [signal.SIGTERM]


def test_a_diverged_hpo_trial_is_pruned_and_the_search_goes_on(tmp_path, monkeypatch):
    import aiayn.lightning_modules.run.train as train_mod
    from aiayn.sweeps.hpo import HpoOptions, run_hpo

    results = iter(
        [
            RunMetrics("base", 0, "tiny", "diverged", diverged_at_step=3, error="loss nan at optimizer step 3"),
            RunMetrics("base", 0, "tiny", "completed", dev_ppl=9.5, dev_bleu=1.0),
        ]
    )
    monkeypatch.setattr(train_mod, "train", lambda opts, spec, hooks: next(results))
    result = run_hpo(HpoOptions(trials=2, train=TrainOptions(row="base", preset="tiny", out=str(tmp_path))))
    assert (result["trials"], result["pruned"], result["best_trial"], result["best_dev_ppl"]) == (2, 1, 1, 9.5)
    study = optuna.load_study(study_name="hpo-tiny-base", storage=f"sqlite:///{tmp_path}/hpo.db")
    assert study.trials[0].user_attrs["diverged_at_step"] == 3


# --- sweeps: dead workers ----------------------------------------------------------------------


def sweep_opts(tmp_path, storage, **kw):
    url = f"sqlite:///{tmp_path}/runs/optuna.db" if storage == "sqlite" else f"journal:///{tmp_path}/runs/j.log"
    return SweepOptions(select=Selection(**kw), storage=url, train=TrainOptions(out=str(tmp_path / "runs")))


def claimed_trial(opts, worker="ghost:1"):
    """A trial popped by a worker that then died: RUNNING, claimed, its pair lock free."""
    (Path(opts.train.out)).mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=study_name("tiny", SYNTHETIC),
        storage=open_storage(opts.storage),
        direction="maximize",
        load_if_exists=True,
    )
    study.enqueue_trial({}, user_attrs={"row": "base", "seed": 0})  # as the sweep enqueues a pair
    trial = study.ask()
    if worker:
        trial.set_user_attr("worker", worker)
    return study, trial


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, opts, corpus, row, seed):
        self.calls.append((row, seed))
        return {"row": row, "seed": seed, "status": "completed", "dev_bleu": 1.0}


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_trial_left_running_by_a_dead_worker_is_failed_and_its_pair_run_once(tmp_path, storage):
    opts = sweep_opts(tmp_path, storage, rows="base,A1")
    study, trial = claimed_trial(opts)
    runner = Recorder()
    assert run_table3(opts, backend=RunnerBackend(runner)).completed == 2
    assert sorted(runner.calls) == [("A1", 0), ("base", 0)]
    states = Counter((t.user_attrs["row"], t.state.name) for t in study.get_trials() if "row" in t.user_attrs)
    assert states == Counter({("base", "FAIL"): 1, ("base", "COMPLETE"): 1, ("A1", "COMPLETE"): 1})
    stale = study.get_trials()[trial.number]
    assert stale.user_attrs["stale"] == "worker ghost:1 died; enqueued again"


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_trial_whose_worker_holds_the_pair_lock_is_left_alone(tmp_path, storage):
    opts = sweep_opts(tmp_path, storage, rows="base,A1")
    study, trial = claimed_trial(opts, worker="alive:2")
    runner = Recorder()
    with file_lock(pair_lock_path(opts, SYNTHETIC, "base", 0)) as mine:  # the live worker
        assert mine
        run_table3(opts, backend=RunnerBackend(runner))
    assert runner.calls == [("A1", 0)]
    assert study.get_trials()[trial.number].state == optuna.trial.TrialState.RUNNING


def test_an_unclaimed_running_trial_is_stale_unless_a_worker_holds_the_pop_lock(tmp_path):
    """Workers pop and claim under one lock: a trial found unclaimed while a worker holds it may be that
    worker's (left alone); found unclaimed with the lock free, its worker died between pop and claim."""
    opts = sweep_opts(tmp_path, "sqlite", rows="base")
    study, trial = claimed_trial(opts, worker=None)  # popped, and the worker died before claiming it
    with file_lock(SweepOut(opts.train.out).lock(f"{study.study_name}.pop")) as held:
        assert held
        assert fail_stale_trials(study, opts) == []
    assert study.get_trials()[trial.number].state == optuna.trial.TrialState.RUNNING
    assert fail_stale_trials(study, opts) == [("base", 0)]
    assert study.get_trials()[trial.number].state == optuna.trial.TrialState.FAIL


def _children(pid: int) -> list[int]:
    """Every descendant (training processes are forked from the sweep's forkserver, a grandchild)."""
    found = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    return found + [d for p in found for d in _children(p)]


@pytest.mark.slow
def test_a_sweep_killed_mid_way_and_restarted_runs_every_pair_exactly_once(cache, tmp_path):
    """SIGKILL the driver and its training processes once one pair is done and another trains; the
    rerun fails the stale trials, trains what was killed or never started, and nothing done twice.
    (Whatever the queue order and the number of pairs trained at once.)"""
    out = tmp_path / "runs"
    rows = ("base", "A1", "A2")
    argv = aiayn(
        "table3",
        "--preset",
        "tiny",
        "--rows",
        ",".join(rows),
        "--out",
        str(out),
        "--report",
        "",
        "--max-steps",
        "2",
        "--eval-subset",
        "2",
        "--accelerator",
        "cpu",
    )
    env = dict(os.environ, AIAYN_CACHE=str(cache))
    driver = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def done(row):
        return (run_dir(out, row) / "metrics.json").exists()

    def training(row):
        return (run_dir(out, row).parent / "seed0.log").exists() and not done(row)

    while not (any(map(done, rows)) and any(map(training, rows))):
        assert driver.poll() is None, "the sweep ended before it could be killed mid-way"
        time.sleep(0.05)
    workers = _children(driver.pid)
    driver.send_signal(signal.SIGKILL)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):  # a worker that ended since it was listed needs no kill
            os.kill(pid, signal.SIGKILL)
    driver.wait()
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=f"sqlite:///{out}/optuna.db")
    # told COMPLETE before the kill (a pair whose metrics.json was written but not yet told is retried:
    # its run resumes at its last step and trains nothing)
    finished_before = {t.user_attrs["row"] for t in study.get_trials() if t.state.name == "COMPLETE"}
    assert finished_before != set(rows)

    subprocess.run(argv, env=env, check=True, capture_output=True)
    trials = study.get_trials()
    assert Counter(t.user_attrs["row"] for t in trials if t.state.name == "COMPLETE") == Counter(rows)  # once each
    failed = [t for t in trials if t.state.name == "FAIL" and "row" in t.user_attrs]  # not an empty-queue ask()
    assert failed and all(t.user_attrs["stale"].endswith("died; enqueued again") for t in failed)
    assert not {t.user_attrs["row"] for t in failed} & finished_before
    for row in rows:
        assert json.loads((run_dir(out, row) / "metrics.json").read_text())["status"] == "completed"
        versions = len(list((run_dir(out, row) / "logs").glob("version_*")))
        assert versions == 1 if row in finished_before else versions >= 1  # done pairs never trained again


# --- atomic writes under a kill ----------------------------------------------------------------

KILL_MID_WRITE = textwrap.dedent("""
    import io, os, signal, sys, torch
    from aiayn.lightning_modules.run.callbacks import AtomicCheckpointIO
    from aiayn.common.files import atomic_write_json
    target = sys.argv[1]
    if target.endswith(".ckpt"):
        AtomicCheckpointIO().save_checkpoint({"step": 1, "w": torch.ones(1000)}, target)
        real_save = torch.save
        def save_half_then_die(obj, f, *a, **k):  # a kill in the middle of writing the new version
            buf = io.BytesIO(); real_save(obj, buf); f.write(buf.getvalue()[: len(buf.getvalue()) // 2]); f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = save_half_then_die
        AtomicCheckpointIO().save_checkpoint({"step": 2, "w": torch.zeros(1000)}, target)
    else:
        atomic_write_json(target, {"status": "completed", "dev_bleu": 1.0})
        real_fsync = os.fsync
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # written, not yet renamed
        atomic_write_json(target, {"status": "completed", "dev_bleu": 2.0})
""")


@pytest.mark.slow  # kills a training process mid-write (seconds each): the slow tier
@pytest.mark.parametrize("name", ["last.ckpt", "metrics.json"])
def test_a_kill_during_a_write_leaves_the_old_file_and_a_restart_clears_the_temp(tmp_path, name):
    from aiayn.common.files import remove_stale_temps

    target = tmp_path / name
    proc = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, str(target)], cwd=ROOT, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-500:]
    if name.endswith(".ckpt"):
        old = torch.load(target, weights_only=False)
        assert old["step"] == 1 and torch.equal(old["w"], torch.ones(1000))
    else:
        assert json.loads(target.read_text()) == {"status": "completed", "dev_bleu": 1.0}
    (temp,) = [p for p in tmp_path.iterdir() if p.name != name]  # the kill left the temporary file
    assert temp.name.startswith(f".{name}.") and temp.name.endswith(".tmp")
    assert remove_stale_temps(tmp_path) == [temp] and [p.name for p in tmp_path.iterdir()] == [name]


def test_the_trainer_writes_checkpoints_through_the_atomic_checkpoint_io(tmp_path):
    from aiayn.lightning_modules.run.callbacks import AtomicCheckpointIO, RNGStates
    from aiayn.lightning_modules.run.train import build_trainer, plan

    opts = TrainOptions(accelerator="cpu", out=str(tmp_path))
    trainer = build_trainer(opts, plan(opts))
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    kinds = [type(c) for c in trainer.callbacks]
    assert kinds.index(RNGStates) < kinds.index(type(trainer.checkpoint_callback))


def test_a_report_write_that_fails_midway_keeps_the_old_report(tmp_path, monkeypatch):
    import aiayn.reports.build as build

    runs = ROOT / "tests" / "fixtures" / "report" / "runs"
    out = tmp_path / "rep"
    build.write_reports(runs, out, preset="tiny")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real = build.atomic_write_text
    calls = []

    def fail_on_the_third(path, text):
        calls.append(path)
        if len(calls) == 3:
            from aiayn.common.files import atomic_open

            with atomic_open(path) as f:
                f.write(text[: len(text) // 2])
                raise OSError("disk full")
        return real(path, text + "changed")

    monkeypatch.setattr(build, "atomic_write_text", fail_on_the_third)
    with pytest.raises(OSError):
        build.write_reports(runs, out, preset="tiny")
    assert calls[2].read_bytes() == before[calls[2]]  # the file being written when it failed: old content
    assert {p for p in out.rglob("*") if p.is_file()} == set(before)  # no temporary file left


# --- secrets -----------------------------------------------------------------------------------

KEY = "0123456789abcdef0123456789abcdef01234567"  # shaped like a W&B API key; fake
PASSWORD = "hunter2-Pa55"


def test_redact_masks_url_passwords_named_keys_and_secret_env_values(monkeypatch):
    from aiayn.common.secrets import redact

    monkeypatch.setenv("WANDB_API_KEY", KEY)
    text = f"postgresql://me:{PASSWORD}@db:5432/aiayn api_key={PASSWORD} key {KEY}; tokens_per_s=9 pe=rope"
    assert redact(text) == "postgresql://me:***@db:5432/aiayn api_key=*** key ***; tokens_per_s=9 pe=rope"


def test_no_secret_reaches_a_run_directory_a_report_or_the_terminal(cache, tmp_path, monkeypatch, capsys, caplog):
    """A W&B run with WANDB_API_KEY set, then a run that fails with the key and a storage password in
    its error: every file written (W&B's offline files included) and everything printed is masked."""
    import aiayn.lightning_modules.run.module as module

    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "runs"
    fast = [
        *"--preset tiny --max-steps 2 --val-every 100 --val-bleu-sentences 2 --eval-subset 2".split(),
        *SMALL_MODEL,
        *QUIET,
        "--out",
        str(out),
    ]
    try:
        assert main(["train", "--row", "C1", "--wandb", *fast]) == 0
    finally:
        import wandb

        wandb.finish()  # train() leaves its W&B run open; the next W&B run in this process would reuse it

    def leak(self, batch, batch_idx):
        raise RuntimeError(f"cannot log to postgresql://me:{PASSWORD}@db/aiayn with WANDB_API_KEY={KEY}")

    monkeypatch.setattr(module.TranslationModule, "training_step", leak)
    with pytest.raises(RuntimeError):
        main(["train", "--row", "C2", *fast])
    failed = json.loads((run_dir(out, "C2") / "metrics.json").read_text())
    assert failed["status"] == "failed" and "postgresql://me:***@db/aiayn with WANDB_API_KEY=***" in failed["error"]
    old = run_dir(out, "C3")  # a metrics.json from before masking: the report masks it too
    old.mkdir(parents=True)
    (old / "metrics.json").write_text(json.dumps(dict(failed, row="C3", error=f"postgresql://me:{PASSWORD}@db")))
    assert main(["report", "--runs", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert "C3 seed 0: failed: postgresql://me:***@db" in (tmp_path / "rep" / "table3-tiny.md").read_text()
    (old / "metrics.json").unlink()
    printed = capsys.readouterr()
    written = [p for d in (out, tmp_path / "rep") for p in d.rglob("*") if p.is_file()]
    assert any(p.name == "config.json" for p in written) and any(p.suffix == ".wandb" for p in written)
    for p in written:
        data = p.read_bytes()
        assert KEY.encode() not in data and PASSWORD.encode() not in data, p
    for text in (printed.out, printed.err, caplog.text):
        assert KEY not in text and PASSWORD not in text


def test_cuda_rng_state_is_the_own_devices_so_a_resume_with_fewer_gpus_restores_it(monkeypatch):
    """A checkpoint written with 8 GPUs visible, resumed with 1 (`table3 --gpus-per-job 1` on a run begun with
    --devices 1 on an 8-GPU box): the states of every visible device, restored by index, raised IndexError."""
    from aiayn.lightning_modules.run import callbacks as C

    saved, restored = torch.tensor([1, 2, 3], dtype=torch.uint8), []

    def one_device_now(states):
        if len(states) > 1:
            raise IndexError("list index out of range")
        restored.extend(states)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": saved)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [saved] * 8)  # what 8 visible GPUs would give
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", one_device_now)
    C.restore_rng(C.capture_rng())
    assert len(restored) == 1 and torch.equal(restored[0], saved)


def test_each_rank_restores_its_own_rng_states_and_draws_from_its_own_seed(monkeypatch):
    from types import SimpleNamespace

    from aiayn.lightning_modules.run.callbacks import RNGStates

    states = [{"torch": torch.tensor([r])} for r in range(2)]
    for rank in (0, 1, 2):  # resumed with a third rank: it starts from its seed
        cb = RNGStates(seed=7)
        torch.manual_seed(0)
        cb.setup(SimpleNamespace(global_rank=rank, world_size=3), None, "fit")
        drawn = torch.rand(1)
        cb.load_state_dict({"ranks": states})
        assert cb.states == (states[rank] if rank < 2 else None)
        torch.manual_seed(7 + rank)
        assert torch.equal(drawn, torch.rand(1)) == (rank > 0)  # rank 0 keeps the stream it had


@pytest.mark.parametrize(
    "flags, said",
    [
        (
            "--max-tokens 512",  # the same 1024 tokens a step, as two accumulated batches (as 2 ranks would split it)
            "world size 1 x 1 accumulated batch(es) of 1024 tokens; resuming it with accumulate 1 -> 2 would misplace "
            "its position in the data",
        ),
        (
            "--static-shapes --pad-to 8",  # batches of a fixed size per length bucket, not the token buckets
            "token-bucket batches (no --static-shapes); resuming it with --static-shapes (buckets of 8) would make "
            "other batches and misplace its position in the data: resume with the flags it ran with, or start it "
            "again in another --out",
        ),
    ],
)
def test_resuming_with_other_batches_is_refused_in_one_line(flags, said, cache, tmp_path, capsys):
    """A run's data position is counted in its own split of the epoch's batches (world size x accumulated
    batches of max_tokens, token buckets or --static-shapes); resuming with other batches would misplace it. Refused
    before anything is written; resumed as it ran, it goes on."""
    argv = [
        *"train --preset tiny --max-steps 2 --ckpt-every 1 --val-every 100 --val-bleu-sentences 0".split(),
        *"--eval-subset 2 --out".split(),
        str(tmp_path),
        *SMALL_MODEL,
        *QUIET,
    ]
    assert main(argv) == 0
    run = run_dir(tmp_path)
    (run / "metrics.json").unlink()  # as if it had been killed: there is a checkpoint to resume from
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*argv[:4], "3", *argv[5:], *flags.split()]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"aiayn: error: run directory {run} was trained with {said}"), err[-1]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert main([*argv[:4], "3", *argv[5:]]) == 0  # as it ran: it resumes
    assert main([*argv[:4], "3", *argv[5:], "--pad-to", "8"]) == 0  # --pad-to alone pads the same batches: resumes


@pytest.mark.slow
def test_a_killed_sweep_drivers_trainers_stop_with_it(cache, tmp_path):
    """Killing only the `aiayn table3` driver left its trainers training to their end. Each trainer is
    forked from a forkserver that exits when its driver does (and the trainer with it: die_with_parent), but CPython
    handed every forked child the write end of the forkserver's keep-alive pipe, so the forkserver never saw its
    driver go. A trainer now closes its copy: SIGKILL the driver mid-run, and the trainer stops (SIGTERM: its
    checkpoints kept, the same command resumes it)."""
    out = tmp_path / "runs"
    cmd = aiayn(
        "table3",
        "--preset",
        "tiny",
        "--rows",
        "base",
        "--seeds",
        "1",
        "--max-steps",
        "100000",
        "--ckpt-every",
        "50",
        "--val-every",
        "100000",
        "--report",
        "",
        "--out",
        str(out),
        *SMALL_MODEL,
        "--accelerator",
        "cpu",
    )
    env = {**os.environ, "AIAYN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = RunDir(run_dir(out))
    deadline = time.time() + 300
    while not (run.checkpoints.is_dir() and any(run.checkpoints.glob("step*.ckpt"))):
        assert driver.poll() is None and time.time() < deadline, "the trainer never checkpointed"
        time.sleep(0.5)
    assert run.is_training()
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.time() + 60
    try:
        while run.is_training():
            assert time.time() < deadline, "the trainer outlived its killed driver"
            time.sleep(0.5)
    finally:
        subprocess.run(["pkill", "-KILL", "-f", str(out)], check=False)  # a survivor must not train on in CI


def test_one_ctrl_c_during_a_test_that_trains_ends_the_session(tmp_path):
    """A run or a sweep trained in-process takes the first Ctrl-C as a stop at the step and ends with
    SystemExit(128 + SIGINT): pytest counted that test failed and went on, so a second Ctrl-C was needed. The
    suite's conftest turns that exit into the KeyboardInterrupt it is: the session ends, with its summary."""
    (tmp_path / "test_x.py").write_text(
        "import signal\n\ndef test_trains():\n    raise SystemExit(128 + signal.SIGINT)\n\ndef test_next():\n    pass\n"
    )
    tests = Path(__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "test_x.py"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(tests)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "KeyboardInterrupt" in done.stdout, done.stdout
    assert "1 passed" not in done.stdout  # test_next never ran
