"""W&B as its users run it, tested offline by reading the files W&B writes: the mode from W&B's own
conventions, one W&B run per run directory (its id kept across attempts; offline attempts named),
the run config and summary, the model artifact, and `aiayn report --wandb`.

The offline `run-ID.wandb` files are read with W&B's own reader, `wandb leet inspect --json` (wandb 0.31), not by
hand.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.rundir import OutDir, RunDir
from aiayn.lightning_modules.run.wandb_run import init_kwargs

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset


FAST = "--max-steps 2 --ckpt-every 1 --val-bleu-sentences 4 --eval-subset 4 --no-progress --accelerator cpu".split()
FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "report" / "runs"


def records(path: Path) -> list[dict]:
    """Every record of a W&B offline `.wandb` file, in order, as W&B's own reader prints them (`wandb leet inspect
    --json`, wandb >= 0.31: one JSON object per record, its `type` and its fields)."""
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"wandb leet inspect {path}: {done.stderr[-2000:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def wandb_run(run_file: Path) -> dict:
    """What an offline W&B run file says: id, name, group, config, summary, artifacts."""
    out = {"config": {}, "summary": {}, "artifacts": [], "kinds": []}
    for r in records(run_file):
        kind = r["type"]
        out["kinds"].append(kind)
        if kind == "run":
            run = r["run"]
            out.update(
                id=run["run_id"],
                name=run.get("display_name"),
                group=run.get("run_group"),
                project=run.get("project"),
                job_type=run.get("job_type"),
            )
            out["config"].update(run.get("config", {}).get("update", {}))
        elif kind == "config":
            out["config"].update(r["config"].get("update", {}))
        elif kind == "summary":
            out["summary"].update(r["summary"].get("update", {}))
        elif kind == "artifact":
            a = r["artifact"]
            out["artifacts"].append(
                {"type": a["type"], "name": a["name"], "files": sorted(e["path"] for e in a["manifest"]["contents"])}
            )
    assert "id" in out, f"no run record in {run_file} ({run_file.stat().st_size} bytes): {out['kinds']}"
    return out


def offline_runs(directory: Path) -> dict:
    """The offline W&B runs under `directory`/wandb, by id."""
    import wandb

    # run.finish() in offline mode returns before W&B's service has written the run's records (seen in CI: the
    # file held its 7-byte header when read, its 7,938 bytes 10 ms later); teardown waits for the service.
    wandb.teardown()
    found = {}
    for f in sorted((directory / "wandb").glob("offline-run-*/run-*.wandb")):
        run = wandb_run(f)
        found[run["id"]] = run
    return found


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_resumed_run_logs_its_config_summary_and_attempts(cache, tmp_path, offline, capsys):
    out = tmp_path / "runs"
    argv = ["train", "--row", "C1", "--preset", "tiny", "--out", str(out), "--wandb", *FAST]
    assert main(argv) == 0
    run = OutDir(out).run("tiny", SYNTHETIC, "C1", 0)
    base = json.loads(run.wandb_record.read_text())["id"]
    assert base.startswith("C1-s0-") and len(base) == len("C1-s0-") + 12
    capsys.readouterr()
    argv[argv.index("--max-steps") + 1] = "3"  # the same run directory, resumed for one more step
    assert main([*argv, "--wandb-checkpoints"]) == 0
    err = capsys.readouterr().err
    assert (
        f"W&B cannot resume an offline run, so attempt 2 of {run.path} is its own W&B run {base}-a2 "
        f"('C1-s0 attempt 2'; earlier attempts: {base})"
    ) in err
    attempts = json.loads(run.wandb_record.read_text())["attempts"]
    assert [(a["attempt"], a["mode"], a["id"]) for a in attempts] == [
        (1, "offline", base),
        (2, "offline", f"{base}-a2"),
    ]

    runs = offline_runs(run.path)
    assert set(runs) == {base, f"{base}-a2"}
    first, second = runs[base], runs[f"{base}-a2"]
    assert (first["name"], second["name"]) == ("C1-s0", "C1-s0 attempt 2")
    assert first["group"] == second["group"] == "C1" and first["project"] == "aiayn-tiny-synthetic"
    config = second["config"]
    assert (config["row"], config["seed"], config["preset"], config["corpus"]) == ("C1", 0, "tiny", "synthetic")
    assert (config["precision"], config["accumulate"], config["effective_tokens_per_step"]) == ("32-true", 1, 1024)
    assert config["preset_rule"].startswith("d_model, d_ff, h·d_k, h·d_v x 0.25") and config["N"] == 1
    assert config["data"]["corpus"] == "synthetic" and config["options"]["wandb"] is True
    assert config["tokenizer_sha256"] == json.loads(run.config_file.read_text())["tokenizer"]["sha256"]
    metrics = json.loads(run.metrics_file.read_text())
    assert second["summary"]["dev/bleu"] == metrics["dev_bleu"] and second["summary"]["status"] == "completed"
    assert second["summary"]["steps"] == 3 and first["summary"]["steps"] == 2
    assert second["artifacts"][-1] == {"type": "model", "name": f"model-{base}", "files": ["last.ckpt"]}


def test_online_every_attempt_resumes_the_run_directorys_one_w_and_b_run(tmp_path, monkeypatch):
    """What each attempt passes to wandb.init: the same id with resume="allow" online; W&B's
    WANDB_RUN_ID (e.g. from `wandb agent`) wins."""
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.train import plan

    run = RunDir(tmp_path / "seed0")
    config = plan(TrainOptions(row="C1", out=str(tmp_path))).config  # what config.json would say; nothing prepared
    kwargs = [init_kwargs(run, config, "online", "test") for _ in range(3)]
    assert len({k["id"] for k in kwargs}) == 1 and {k["resume"] for k in kwargs} == {"allow"}
    assert {(k["name"], k["group"], k["mode"], k["project"]) for k in kwargs} == {
        ("C1-s0", "C1", "online", "aiayn-tiny-synthetic")
    }
    assert init_kwargs(run, config, "offline", "test")["id"] == kwargs[0]["id"] + "-a4"
    monkeypatch.setenv("WANDB_RUN_ID", "sweeprun1")
    monkeypatch.setenv("WANDB_PROJECT", "theirs")
    agent = init_kwargs(run, config, "online", "test")
    assert (agent["id"], agent["project"], agent["resume"]) == ("sweeprun1", "theirs", "allow")
    assert init_kwargs(RunDir(tmp_path / "off"), config, "disabled", "WANDB_MODE=disabled") is None


MODE = "from aiayn.common.wandb_mode import wandb_mode; print(wandb_mode()[0])"


@pytest.mark.parametrize(
    "env, netrc, expected",
    [
        ({"WANDB_MODE": "offline", "WANDB_API_KEY": "k" * 40}, False, "offline"),  # WANDB_MODE wins over a key
        ({"WANDB_MODE": "disabled"}, True, "disabled"),
        ({"WANDB_MODE": "dryrun"}, False, "offline"),
        ({"WANDB_API_KEY": "k" * 40}, False, "online"),
        ({}, True, "online"),  # `wandb login` wrote ~/.netrc
        ({}, False, "offline"),  # nothing to log in with
    ],
)
def test_the_mode_follows_wandbs_conventions(env, netrc, expected, tmp_path):
    """In a fresh process each (W&B reads its settings once per process), with HOME in tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    if netrc:
        (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {'n' * 40}\n")
        (home / ".netrc").chmod(0o600)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k not in ("NETRC", "HOME")}
    # WANDB_SILENT: W&B would otherwise look up the account of the key on its server (no network here)
    full = dict(clean, HOME=str(home), WANDB_SILENT="true", WANDB_CONFIG_DIR=str(home / ".config"), **env)
    proc = subprocess.run([sys.executable, "-c", MODE], env=full, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


def test_an_unknown_wandb_mode_is_one_line(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    assert main(["report", "--runs", str(FIXTURE_RUNS), "--out", str(tmp_path / "rep"), "--wandb"]) == 2
    assert capsys.readouterr().err.endswith(
        "aiayn: error: WANDB_MODE=sometimes is not a W&B mode; set it to online, offline or disabled, or unset it\n"
    )


def test_report_logs_the_table_and_the_report_files(tmp_path, offline, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURE_RUNS, runs)
    rep = tmp_path / "rep"
    assert main(["report", "--runs", str(runs), "--out", str(rep), "--wandb"]) == 0
    written = [Path(p) for p in capsys.readouterr().out.split()]
    (logged,) = offline_runs(rep).values()
    assert (logged["name"], logged["job_type"], logged["project"]) == ("table3-tiny", "report", "aiayn-tiny-synthetic")
    (artifact,) = logged["artifacts"][-1:]
    assert artifact["type"] == "report" and artifact["name"] == "table3-tiny"
    assert artifact["files"] == sorted(p.name if p.parent == rep else f"{p.parent.name}/{p.name}" for p in written)
    assert logged["summary"]["table3._type"] == "table-file"
    (table_file,) = (rep / "wandb").glob("offline-run-*/files/media/table/table3_*.table.json")
    table = json.loads(table_file.read_text())
    csv = (rep / "table3-tiny.csv").read_text().splitlines()
    assert table["columns"] == csv[0].split(",") and len(table["data"]) == len(csv) - 1  # the header is line 1
    assert sorted(row[table["columns"].index("row")] for row in table["data"]) == sorted(
        line.split(",")[1] for line in csv[1:]
    )
    assert logged["summary"]["runs._type"] == "table-file"  # and the per-run table beside it
    assert logged["summary"]["curves._type"] == "table-file"  # and every run's curve, in the same W&B run


@pytest.mark.slow  # trains a step in a process of its own (seconds): the slow tier
def test_a_wandb_run_starts_without_the_anonymous_warning(cache, tmp_path):
    """W&B warned on every run that "the anonymous setting has no effect": Lightning passes wandb.init anonymous=None
    whatever it is given. A fresh process (W&B says it once a process) prints no such line."""
    argv = [sys.executable, "-m", "aiayn", "train", "--out", str(tmp_path / "runs"), "--wandb", *FAST]
    env = dict(os.environ, WANDB_MODE="offline", AIAYN_CACHE=str(cache))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Tracking run with wandb" in done.stderr and "anonymous setting" not in done.stderr
