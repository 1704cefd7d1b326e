"""Every process exits when its work is done or it is told to stop, with DataLoader workers on: alone, in a sweep, and
stopped by a signal to its process group right after a validation. A worker ignores its first SIGTERM or SIGINT
(data/datamodule.py `worker_signals`), and multiprocessing's exit handler sends it only one before joining it
without a timeout, so a loader still holding workers at exit used to hang the process forever.

Each test trains a 1-layer, 32-wide model for a few steps in a child process and gives it a deadline."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SMALL = ["--preset", "tiny", "--set", "N=1 d_model=32 d_ff=64 h=2", "--no-progress", "--accelerator", "cpu"]
QUICK = ["--val-bleu-sentences", "0", "--eval-subset", "5", "--logger", "csv", "--num-workers", "2"]
EXIT_WITHIN_S = 60  # a run this small evaluates and exits in seconds; a hang is forever


def aiayn(*argv: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *argv]


def children_of(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in found.read_text().split()] if found.exists() else []


def runs_to_its_end(argv: list[str], cache: Path, limit: float) -> str:
    """Run `aiayn ARGV` in a process group of its own and wait for it to exit by itself, at most `limit` seconds (then
    its whole group is killed and the test fails, naming what was left); its exit status must be 0. Its stderr."""
    proc = subprocess.Popen(
        aiayn(*argv),
        env=dict(os.environ, AIAYN_CACHE=str(cache)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        err = proc.communicate(timeout=limit)[1]
    except subprocess.TimeoutExpired:
        left = children_of(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"`aiayn {argv[0]}` did not exit after its work, {limit:.0f} s (its children left: {left})")
    assert proc.returncode == 0, err[-2000:]
    return err


@pytest.mark.slow
def test_a_run_with_loader_workers_exits_when_its_work_is_done(cache, tmp_path):
    argv = ["train", "--row", "base", *SMALL, *QUICK, "--max-steps", "2", "--val-every", "2", "--ckpt-every", "2"]
    runs_to_its_end([*argv, "--out", str(tmp_path / "o")], cache, EXIT_WITHIN_S * 3)
    assert (tmp_path / "o" / "tiny" / "synthetic" / "base" / "seed0" / "metrics.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_run_stopped_by_a_signal_to_its_group_right_after_a_validation_exits_within_seconds(cache, tmp_path, signum):
    out = tmp_path / "o"
    argv = ["train", "--row", "base", *SMALL, *QUICK, "--max-steps", "100000", "--val-every", "4"]
    proc = subprocess.Popen(
        aiayn(*argv, "--ckpt-every", "4", "--out", str(out)),
        env=dict(os.environ, AIAYN_CACHE=str(cache)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    ckpt = out / "tiny" / "synthetic" / "base" / "seed0" / "checkpoints" / "step0000004.ckpt"
    deadline = time.monotonic() + 300
    while not ckpt.exists():  # saved right after step 4's validation
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.1)
    os.killpg(proc.pid, signum)
    stopped = time.monotonic()
    try:
        err = proc.communicate(timeout=EXIT_WITHIN_S)[1]
    except subprocess.TimeoutExpired:
        left = children_of(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running {EXIT_WITHIN_S} s after {signum.name} (loader workers left: {left})")
    assert proc.returncode == 128 + signum, err[-2000:]
    assert f"stopped by {signum.name} at step" in err
    assert time.monotonic() - stopped < EXIT_WITHIN_S


SWEEP = ["table3", "--rows", "base", "--seeds", "2", "--jobs", "1", "--report", "", *QUICK]
SWEEP += [a for a in SMALL if a != "--no-progress"]  # a sweep sets it for its runs


@pytest.mark.slow
def test_a_sweep_with_loader_workers_books_its_seeds_completed(cache, tmp_path):
    """`aiayn table3 --num-workers 2`: each trainer exits when its run is done, so the driver books both completed
    (a trainer that never exited was booked as stopped, FAIL in Optuna)."""
    import optuna

    out = tmp_path / "o"
    runs_to_its_end([*SWEEP, "--max-steps", "2", "--val-every", "2", "--out", str(out)], cache, EXIT_WITHIN_S * 5)
    study = optuna.load_study(study_name="table3-tiny-synthetic", storage=f"sqlite:///{out}/optuna.db")
    states = sorted((t.user_attrs["seed"], t.state.name) for t in study.trials)
    assert states == [(0, "COMPLETE"), (1, "COMPLETE")], states


@pytest.mark.slow
def test_a_killed_sweep_driver_leaves_no_trainer_or_loader_worker_behind(cache, tmp_path):
    """SIGKILL to the driver of a sweep with loader workers, mid-training: its trainer and the trainer's loader
    workers end with it (the trainer asked the kernel to be told of its parent's death), so no orphan goes on
    holding the run's lock."""
    out = tmp_path / "o"
    proc = subprocess.Popen(
        aiayn(*SWEEP, "--max-steps", "100000", "--val-every", "4", "--ckpt-every", "4", "--out", str(out)),
        env=dict(os.environ, AIAYN_CACHE=str(cache)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ckpts = out / "tiny" / "synthetic" / "base" / "seed0" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (ckpts.is_dir() and any(ckpts.glob("*.ckpt"))):
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before the run's checkpoint"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    while time.monotonic() - killed < EXIT_WITHIN_S:
        try:
            os.killpg(proc.pid, 0)  # anything left in the sweep's process group
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the driver's trainer or loader workers outlived it by {EXIT_WITHIN_S} s")


def test_a_ctrl_c_while_aiayn_is_being_imported_is_one_line_and_exit_130(monkeypatch, capsys):
    """A Ctrl-C in the first seconds (Python importing the command) printed Python's 30-line KeyboardInterrupt
    traceback: the `aiayn` command (pyproject's script, and `python -m aiayn`) ends in one line, exit 130."""
    import importlib.abc
    import sys

    from aiayn import __main__ as entry

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '\naiayn = "aiayn.__main__:run"\n' in pyproject  # the script the install makes

    class CtrlC(importlib.abc.MetaPathFinder):  # the key pressed while aiayn.cli is imported
        def find_spec(self, name, path=None, target=None):
            if name == "aiayn.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "aiayn.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [CtrlC(), *sys.meta_path])
    assert entry.run() == 130
    assert capsys.readouterr().err == "aiayn: interrupted (Ctrl-C)\n"
