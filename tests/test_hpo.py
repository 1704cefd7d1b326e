"""`aiayn hpo` on real hardware: its trials train with every `aiayn train` flag (accelerator, precision,
data, max tokens), on one device; an interrupted search resumes, its killed trial in its own run
directory. Training is stood in for here (the slow tier runs real trials: tests/test_sweeps.py)."""

import json
import shlex
from pathlib import Path

import optuna
import pytest

import aiayn.lightning_modules.run.train as train_mod
from aiayn.cli import main
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.rundir import RunMetrics
from aiayn.sweeps.books import LockClaims
from aiayn.sweeps.folders import SweepOut
from aiayn.sweeps.hpo import HpoOptions, default_space, run_hpo, suggest


def trial_lock(opts, number):
    t = opts.train
    return LockClaims(SweepOut(t.out), f"hpo-{t.preset}-{t.row}").path(f"trial{number:04d}")


optuna.logging.set_verbosity(optuna.logging.WARNING)
SEARCHED = {"lr_factor", "warmup", "P_drop"}  # not eps_ls: it raises dev PPL by construction (sweeps/hpo.py)


@pytest.fixture
def trains(monkeypatch):
    """Each trial's train() call (options, keyword arguments), each completing at once."""
    calls = []

    def fake(opts, spec, hooks):
        assert spec.overrides == opts.overrides  # the search's one spec, with this trial's values on top
        calls.append((opts, hooks))
        return RunMetrics(
            opts.row, opts.seed, opts.preset, "completed", dev_ppl=10.0 - len(calls), dev_bleu=float(len(calls))
        )

    monkeypatch.setattr(train_mod, "train", fake)
    return calls


def test_trials_train_with_the_train_flags_on_the_chosen_accelerator(tmp_path, trains, capsys):
    argv = [
        *"hpo --row C1 --trials 2 --out".split(),
        str(tmp_path),
        *"--accelerator gpu --precision bf16-mixed --data multi30k --data-dir /data/m30k --max-tokens 3000".split(),
        "--set",
        "N=1",
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["trials"] == 2 and len(trains) == 2
    for number, (opts, kw) in enumerate(trains):
        assert (opts.accelerator, opts.precision, opts.data, opts.data_dir, opts.max_tokens, opts.devices) == (
            "gpu",
            "bf16-mixed",
            "multi30k",
            "/data/m30k",
            3000,
            1,
        )
        assert opts.overrides["N"] == 1 and set(opts.overrides) == SEARCHED | {"N"}
        assert kw.run_dir == str(tmp_path / "hpo" / "tiny" / "C1" / f"trial{number:04d}") and kw.kind == "hpo"
    trains.clear()
    assert main(["hpo", "--row", "C1", "--trials", "3", "--out", str(tmp_path)]) == 0  # one more, default device
    assert len(trains) == 1 and trains[0][0].accelerator == "auto"  # auto: the GPU when there is one


def test_a_search_ends_with_the_run_that_trains_its_best_trial_again(tmp_path, trains, capsys, caplog):
    """`aiayn hpo` ends with its best trial as a config file `aiayn train --config` reads and as the same run on a
    command line (the search's flags, the trial's knobs as --set): both read back as one run."""
    argv = ["hpo", "--row", "C1", "--trials", "2", "--out", str(tmp_path), "--data-dir", "/data/m30k", "--set", "N=1"]
    with caplog.at_level("INFO"):
        assert main([*argv, "--max-tokens", "3000"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert f"trains again with `{result['train']}`, or `{result['set']}`" in caplog.text
    assert main(["train", "--config", result["train_config"], "--print-config"]) == 0
    from_file = json.loads(capsys.readouterr().out)  # the run as it resolves: its spec and its options
    assert main([*shlex.split(result["set"])[1:], "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out) == from_file
    from_file = from_file["options"]
    assert from_file["overrides"] == {"N": 1, **result["best_params"]} and set(result["best_params"]) == SEARCHED
    assert (from_file["data_dir"], from_file["max_tokens"]) == ("/data/m30k", 3000)
    assert "--no-progress" not in result["set"]  # a trial trains without bars; the run again with them


def test_more_than_one_device_is_refused_in_one_line(tmp_path, trains, capsys):
    assert main(["hpo", "--trials", "2", "--out", str(tmp_path), "--devices", "2"]) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: aiayn hpo trains each trial in its own process on one device, not 2; drop "
        "--devices/--num-nodes (Optuna cannot run inside DDP ranks)\n"
    )
    assert trains == [] and not (tmp_path / "hpo.db").exists()


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_an_interrupted_search_resumes_its_killed_trial_and_runs_only_what_is_missing(tmp_path, trains, storage):
    url = None if storage == "sqlite" else f"journal:///{tmp_path}/hpo.log"
    opts = HpoOptions(trials=1, storage=url, train=TrainOptions(row="C1", out=str(tmp_path), progress=False))
    run_hpo(opts)  # trial 0 done
    from aiayn.sweeps.storage import open_storage

    study = optuna.load_study(study_name="hpo-tiny-C1", storage=open_storage(url or f"sqlite:///{tmp_path}/hpo.db"))
    killed = study.ask()  # trial 1: its search was SIGKILLed while it trained
    from aiayn.ablations.presets import get_preset

    params = suggest(killed, default_space(get_preset("tiny")))
    killed.set_user_attr("worker", "ghost:1")
    killed.set_user_attr("run_dir", str(tmp_path / "hpo" / "tiny" / "C1" / "trial0001"))
    trains.clear()

    opts.trials = 3
    result = run_hpo(opts)
    assert len(trains) == 2  # the killed trial again, then the third
    retry_opts, retry_kw = trains[0]
    assert retry_kw.run_dir == str(tmp_path / "hpo" / "tiny" / "C1" / "trial0001")  # resumes where it was
    assert {k: retry_opts.overrides[k] for k in SEARCHED} == params
    states = [t.state.name for t in study.get_trials()]
    assert states == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"] and result["failed"] == 1
    assert study.get_trials()[1].user_attrs["stale"] == "worker ghost:1 died; enqueued again"
    trains.clear()
    assert run_hpo(opts)["trials"] == 4 and trains == []  # nothing missing: a rerun runs nothing


def test_a_running_trial_whose_search_is_alive_is_left_alone(tmp_path, trains):
    from aiayn.common.locks import file_lock

    opts = HpoOptions(trials=1, train=TrainOptions(row="C1", out=str(tmp_path), progress=False))
    run_hpo(opts)
    study = optuna.load_study(study_name="hpo-tiny-C1", storage=f"sqlite:///{tmp_path}/hpo.db")
    alive = study.ask()
    alive.set_user_attr("worker", "alive:2")
    with file_lock(trial_lock(opts, alive.number)) as held:
        assert held
        opts.trials = 2
        run_hpo(opts)
    assert study.get_trials()[alive.number].state.name == "RUNNING" and Path(trial_lock(opts, 1)).exists()


@pytest.mark.slow
def test_a_search_killed_mid_trial_resumes_that_trial_from_its_checkpoint(cache, tmp_path):
    """SIGKILL `aiayn hpo` once its second trial has a checkpoint; the rerun fails that trial, runs its
    parameters again in its run directory (a second attempt there, from its checkpoint) and completes
    the search to --trials."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "runs"
    argv = [
        sys.executable,
        *"-m aiayn hpo --row C1 --trials 3 --out".split(),
        str(out),
        *"--max-steps 20 --ckpt-every 5 --eval-subset 4 --accelerator cpu".split(),
    ]
    env = dict(os.environ, AIAYN_CACHE=str(cache))
    search = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trial1 = out / "hpo" / "tiny" / "C1" / "trial0001"
    while not list((trial1 / "checkpoints").glob("step*.ckpt")):
        assert search.poll() is None, "the search ended before its second trial could be killed"
        time.sleep(0.05)
    search.send_signal(signal.SIGKILL)
    search.wait()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    study = optuna.load_study(study_name="hpo-tiny-C1", storage=f"sqlite:///{out}/hpo.db")
    trials = study.get_trials()
    assert [t.state.name for t in trials].count("FAIL") == 1 and trials[1].state.name == "FAIL"
    retry = next(t for t in trials[2:] if t.user_attrs.get("resume_dir") == str(trial1))
    assert retry.params == trials[1].params and retry.state.name in ("COMPLETE", "PRUNED")
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 3
    assert len(list((trial1 / "logs").glob("version_*"))) == 2  # two attempts in one run directory


def test_a_search_space_from_a_file_is_searched_typed_and_kept_with_its_study(tmp_path, trains, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("P_drop: {low: 0.0, high: 0.3}\nN: {low: 1, high: 3}\npe: {choices: [sinusoid, learned]}\n")
    base = ["hpo", "--row", "base", "--trials", "3", "--out", str(tmp_path / "out")]
    assert main([*base, "--space", str(space)]) == 0
    assert len(trains) == 3
    for opts, _ in trains:
        o = opts.overrides
        assert set(o) == {"P_drop", "N", "pe"}  # only the file's knobs, nothing of the default space
        assert 0.0 <= o["P_drop"] <= 0.3 and isinstance(o["N"], int) and 1 <= o["N"] <= 3
        assert o["pe"] in ("sinusoid", "learned")
    capsys.readouterr()
    # the same study with another space is refused in one line, before any trial
    trains.clear()
    assert main([*base, "--trials", "4"]) == 2
    assert "searched another space" in capsys.readouterr().err and trains == []


@pytest.mark.parametrize(
    "text,message",
    [
        ("dropout: {low: 0, high: 1}\n", "'dropout' is not a knob"),
        ("P_drop: 0.1\n", "P_drop must be {low: L, high: H}"),
        ("P_drop: {low: 0, top: 1}\n", "P_drop must be {low: L, high: H}"),
        ("- P_drop\n", "is not a mapping of options"),
    ],
)
def test_a_bad_search_space_file_is_one_line_before_any_study(tmp_path, trains, capsys, text, message):
    space = tmp_path / "space.yaml"
    space.write_text(text)
    assert main(["hpo", "--trials", "1", "--out", str(tmp_path / "out"), "--space", str(space)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert trains == [] and not (tmp_path / "out" / "hpo.db").exists()


def test_a_search_whose_every_trial_is_pruned_exits_1_not_the_usage_code(tmp_path, monkeypatch, capsys, caplog):
    def pruned(opts, spec, hooks):
        raise optuna.TrialPruned("pruned at step 1: val/ppl 45.2")

    monkeypatch.setattr(train_mod, "train", pruned)
    with caplog.at_level("INFO", logger="aiayn.sweeps.hpo"):
        assert main(["hpo", "--trials", "2", "--out", str(tmp_path)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["best_trial"] is None and (result["pruned"], result["completed"]) == (2, 0)
    # A pruned trial gets its line, as a completed one does (it printed nothing)
    lines = [r.getMessage() for r in caplog.records if "pruned at step" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("trial 0: pruned at step 1: val/ppl 45.2, with {")


def test_trials_validate_every_val_every_steps_and_report_each_validation_by_global_step(tmp_path, trains):
    """The pruner gets an intermediate value at every validation (`--val-every`), by global step, and the
    study names its metric. Before, trials validated at epoch ends only and reported by epoch, so a short run gave
    the pruner nothing."""
    import torch

    from aiayn.sweeps.hpo import OBJECTIVE, StepPruning

    assert main(["hpo", "--row", "C1", "--trials", "1", "--out", str(tmp_path), "--val-every", "50"]) == 0
    opts, hooks = trains[0]
    assert hooks.val_per_epoch is False and opts.val_every == 50
    study = optuna.load_study(study_name="hpo-tiny-C1", storage=f"sqlite:///{tmp_path}/hpo.db")
    assert study.metric_names == [OBJECTIVE] and "value_dev_ppl" in study.trials_dataframe().columns  # no space

    class Trainer:  # what the callback reads of Lightning's trainer
        sanity_checking, callback_metrics, global_step = False, {}, 0

    pruning = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    first = pruning.ask()
    callback, trainer = StepPruning.make(first, "val/ppl"), Trainer()
    for step, ppl in ((50, 9.0), (100, 7.0), (150, 6.0)):  # three validations within one epoch
        trainer.global_step, trainer.callback_metrics = step, {"val/ppl": torch.tensor(ppl)}
        callback.on_validation_end(trainer, None)
    assert pruning.trials[0].intermediate_values == {50: 9.0, 100: 7.0, 150: 6.0}
    pruning.tell(first, 6.0)
    second = pruning.ask()
    callback = StepPruning.make(second, "val/ppl")
    trainer.sanity_checking, trainer.global_step, trainer.callback_metrics = True, 0, {"val/ppl": torch.tensor(99.0)}
    callback.on_validation_end(trainer, None)  # the sanity check is not a validation of the trial
    trainer.sanity_checking, trainer.global_step, trainer.callback_metrics = False, 50, {"val/ppl": torch.tensor(20.0)}
    with pytest.raises(optuna.TrialPruned, match="pruned at step 50"):
        callback.on_validation_end(trainer, None)
    assert pruning.trials[1].intermediate_values == {50: 20.0}


def test_a_trial_in_a_process_of_its_own_is_found_by_number_and_its_pruning_reaches_the_search(tmp_path, monkeypatch):
    """`--backend subprocess`, its plumbing with the child stood in (the same `aiayn hpo` entry, in this process,
    with the environment the search gives it): the search fixes the trial's parameters, the child finds the trial by
    number in the storage its environment names, trains it with those parameters, reports to the trial and is
    pruned; the search tells PRUNED. The storage URL is in the child's environment only: not on its command line,
    not in the files it is handed."""
    import os
    import subprocess

    import torch

    url = f"sqlite:///{tmp_path}/secret-hpo.db"
    seen = {}

    class Trainer:  # what StepPruning reads of Lightning's trainer: one validation at step 5
        sanity_checking, global_step, callback_metrics = False, 5, {"val/ppl": torch.tensor(9.5)}

    def pruned_after_a_report(opts, spec, hooks):
        hooks.callbacks[0].on_validation_end(Trainer(), None)  # StepPruning, on the trial the child found by number
        seen["params"] = {k: opts.overrides[k] for k in SEARCHED}
        raise optuna.TrialPruned("pruned at step 5: val/ppl 9.5")

    monkeypatch.setattr(train_mod, "train", pruned_after_a_report)

    def child(cmd, stdout, stderr, env):
        seen["cmd"], seen["files"] = cmd, [p.read_text() for p in (tmp_path / "subprocess").rglob("*.json")]
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            code = main(cmd[3:])  # python -m aiayn hpo --config FILE
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return subprocess.CompletedProcess(cmd, code)

    monkeypatch.setattr(subprocess, "run", child)
    result = run_hpo(
        HpoOptions(
            trials=1, storage=url, backend="subprocess", train=TrainOptions(row="C1", out=str(tmp_path), progress=False)
        )
    )
    assert (result["pruned"], result["completed"], result["failed"]) == (1, 0, 0)
    trial = optuna.load_study(study_name="hpo-tiny-C1", storage=url).trials[0]
    assert trial.state.name == "PRUNED" and trial.user_attrs["pruned"] == "pruned at step 5: val/ppl 9.5"
    assert trial.intermediate_values == {5: 9.5}  # the child's report, in the study
    assert seen["params"] == trial.params  # the child trained the parameters the search fixed
    assert "secret-hpo" not in " ".join(seen["cmd"]) and not any("secret-hpo" in f for f in seen["files"])
    assert "AIAYN_HPO_STORAGE" not in os.environ  # the child's environment stayed the child's


def test_a_trial_whose_process_fails_is_one_line_and_the_search_goes_on(tmp_path, monkeypatch, capsys):
    """`--backend subprocess`: a trial's process that ends without an outcome (exit 1, its traceback in its own log)
    is a FAIL trial named in one line with its log, not a traceback of the search; the next trial still trains, and
    the search exits 1."""
    import subprocess

    calls = []

    def child(cmd, stdout, stderr, env):
        calls.append(env["AIAYN_HPO_TRIAL"])
        stdout.write("Traceback (most recent call last):\nRuntimeError: CUDA error\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(subprocess, "run", child)
    argv = ["hpo", "--backend", "subprocess", "--trials", "2", "--row", "C1", "--out", str(tmp_path)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and calls == ["0", "1"]
    assert json.loads(captured.out)["failed_here"] == 2
    study = optuna.load_study(study_name="hpo-tiny-C1", storage=f"sqlite:///{tmp_path}/hpo.db")
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    log = tmp_path / "subprocess" / "hpo" / "hpo-tiny-C1" / "trial0000.log"
    assert study.trials[0].user_attrs["failed"].endswith(f"exit code 1 and no outcome; its log: {log}")
    assert "CUDA error" in log.read_text()


def test_a_back_end_that_cannot_run_trials_is_refused_with_its_reason(tmp_path, trains, capsys):
    assert main(["hpo", "--backend", "slurm", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--backend slurm cannot run hpo trials (its job array is the sweep's pairs" in err
    assert not list(tmp_path.iterdir()) and trains == []


@pytest.mark.slow
def test_trials_train_in_processes_of_their_own_two_at_once(cache, tmp_path):
    """`aiayn hpo --backend subprocess --jobs 2` for real: three trials, each trained by a fresh process (its log
    under OUT/subprocess/hpo), each reporting its validations to the study from there, the best written."""
    out = tmp_path / "runs"
    argv = [
        *"hpo --backend subprocess --jobs 2 --row C1 --trials 3 --out".split(),
        str(out),
        *"--max-steps 12 --val-every 4 --eval-subset 4 --accelerator cpu --set".split(),
        "N=1 d_model=32 d_ff=64 h=2",
    ]
    assert main(argv) in (0, 1)  # 1 only if every trial were pruned, which the pruner's two startup trials forbid
    study = optuna.load_study(study_name="hpo-tiny-C1", storage=f"sqlite:///{out}/hpo.db")
    trials = study.get_trials()
    assert len(trials) == 3 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    assert all(t.intermediate_values for t in trials)  # reported from the trial's own process
    logs = sorted((out / "subprocess" / "hpo" / "hpo-tiny-C1").glob("trial*.log"))
    assert [p.name for p in logs] == ["trial0000.log", "trial0001.log", "trial0002.log"]
    best = json.loads((out / "hpo" / "tiny" / "C1" / "best.json").read_text())
    assert best["best_trial"] in {t.number for t in trials if t.state.name == "COMPLETE"}
    # its objective was measured on 4 dev sentences, its pruned values on all of them: the result says so
    assert best["objective"].startswith("final dev perplexity on the first 4 dev sentences (--eval-subset)")
