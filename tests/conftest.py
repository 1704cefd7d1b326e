"""Fixtures shared by the test modules."""

import os
import shutil
import signal
import threading

import pytest


def pytest_configure(config):
    """Under pytest-xdist (`-n N`), each worker on cores of its own: worker i of N takes every N-th of this process's
    CPUs, and the processes its tests start inherit them (torch, OpenMP and a sweep's thread shares count the
    affinity: lightning_modules/run/devices.py). Two tests at a time on 2 cores each sized their threads for both
    cores, so each ran beside four busy threads; a neighbour then slowed a test by more than running alone would."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        return  # fewer cores than workers: nothing to give each its own
    share = set(cpus[int(worker.removeprefix("gw")) % count :: count])
    os.sched_setaffinity(0, share)
    import torch

    torch.set_num_threads(len(share))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """One Ctrl-C ends the test session with its summary. A test that trains in-process (a run, a sweep's driver)
    takes the first Ctrl-C as aiayn takes it, a stop at the step: the run ends with SystemExit(128 + SIGINT), which
    pytest would count as that test's failure and go on. Such an exit escaping a test is the user's Ctrl-C."""
    try:
        return (yield)
    except SystemExit as e:
        if e.code == 128 + signal.SIGINT:
            raise KeyboardInterrupt from e
        raise


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """The tiny preset's data (the synthetic corpus, its tokenizer, the encoded splits), prepared once per test
    process as `aiayn train --preset tiny` prepares it: the data most tests train on, copied into each module's cache
    (the `cache` fixture)."""
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.spec import resolve
    from aiayn.lightning_modules.run.train import build_datamodule

    path = tmp_path_factory.mktemp("tiny-data")
    build_datamodule(TrainOptions(cache_dir=str(path)), resolve("base", "tiny")).prepare_data()
    return path


@pytest.fixture(scope="module")
def cache(request, tmp_path_factory):
    """A fresh AIAYN_CACHE for the module (corpora, tokenizers, encoded data), restored afterwards. It holds the tiny
    preset's data already, as a user's cache does after a first run; a module marked `cold_cache` starts empty."""
    path = tmp_path_factory.mktemp("cache")
    if not request.node.get_closest_marker("cold_cache"):
        shutil.copytree(request.getfixturevalue("tiny_data"), path, dirs_exist_ok=True)
    old = os.environ.get("AIAYN_CACHE")
    os.environ["AIAYN_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("AIAYN_CACHE", None)
    else:
        os.environ["AIAYN_CACHE"] = old


class FakePopen:
    """subprocess.Popen that starts nothing (the subprocess back end's trainer): records (cmd, env) in `started`
    and the signals it is sent, and exits with `returncode`."""

    started: list = []
    returncode = 1

    def __init__(self, cmd, env=None, **kwargs):
        self.signals = []
        type(self).started.append((cmd, env))

    def send_signal(self, signum):
        self.signals.append(signum)

    def wait(self):
        return self.returncode


def fake_popen(started: list, returncode: int = 1) -> type:
    """A FakePopen class recording into `started`."""
    return type("Popen", (FakePopen,), {"started": started, "returncode": returncode})


class RunnerBackend:
    """A test double of a sweep back end (sweeps/backends.py): `runner(sweep, corpus, row, seed)` (and `gpus=` when
    the worker has GPUs) stands in for the training run and returns its metrics as a dict; the queue, the claims
    and the books are the real ones. `base`: the back end whose slots and checks it keeps."""

    def __new__(cls, runner, base=None):
        from aiayn.lightning_modules.run.rundir import RunMetrics
        from aiayn.sweeps.backends.queue import QueueBackend

        class Runner(base or QueueBackend):
            name = "runner"

            def run_one(self, sweep, row, seed, slot):
                out = runner(sweep, sweep.corpus, row, seed, **({"gpus": slot} if slot is not None else {}))
                return RunMetrics.from_dict({"preset": sweep.preset.name, "data": sweep.corpus.name, **out})

        return Runner()


class StepsRunner:
    """Trains nothing: writes the metrics.json a completed run of the steps the sweep asks for would write (its row's
    budget, or --max-steps), and records what it was asked."""

    def __init__(self):
        self.calls, self.lock = [], threading.Lock()

    def __call__(self, sweep, corpus, row, seed):
        from aiayn.common.files import atomic_write_json

        steps = sweep.wanted[row]
        with self.lock:
            self.calls.append((row, seed, steps))
        metrics = {
            "row": row,
            "seed": seed,
            "preset": sweep.preset.name,
            "data": corpus,
            "status": "completed",
            "steps": steps,
            "planned_steps": steps,
            "budget_steps": sweep.specs[row].train_steps,
            "dev_bleu": 10.0 + seed,
            "dev_ppl": 5.0,
        }
        run = sweep.run(row, seed)
        run.path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run.metrics_file, metrics)
        return {k: v for k, v in metrics.items() if k not in ("preset", "data")}


@pytest.fixture(params=["cpu fast paths", "cuda paths"])
def both_paths(request, monkeypatch):
    """Run a test twice: with the CPU fast paths (plain-ops attention, bit-mask dropout), and with them off, through
    exactly the code a GPU takes (scaled_dot_product_attention, F.dropout)."""
    from aiayn.lightning_modules.transformer import model

    monkeypatch.setattr(model, "CPU_FAST_PATHS", request.param == "cpu fast paths")
    return request.param


def checkpoint_of(spec=None, state_dict=None, data=None, **extra) -> dict:
    """A checkpoint as `aiayn train` writes one, made by hand: its state_dict (default: `spec`'s model's fresh
    weights under "model.") and its one run config (`checkpoint["aiayn"]`, config.json's form); `spec` defaults to
    a small resolved tiny base row."""
    from aiayn.lightning_modules.data.corpora import CorpusRef
    from aiayn.lightning_modules.run.module import TranslationModule
    from aiayn.lightning_modules.run.rundir import DataIdentity, RunConfig, TrainPlan
    from aiayn.lightning_modules.run.spec import resolve

    spec = spec or resolve("base", "tiny", overrides={"N": 1, "d_model": 16, "d_ff": 32, "h": 2}, vocab_size=50)
    config = RunConfig(
        spec,
        data or DataIdentity(CorpusRef.parse("synthetic"), None, spec.model.vocab_size),
        TrainPlan(0, 2, 1, 1, 1024, "32-true"),
    )
    if state_dict is None:
        state_dict = TranslationModule(spec.model).state_dict()
    return {"state_dict": state_dict, "aiayn": {"format": 1, "config": config.to_dict()}, **extra}
