"""`--logger`: each logger writes its own files under the run directory, one version (or run) per attempt, read
back here with each tool's own reader; a bad name or a missing package is one line, exit 2, nothing written."""

import sys
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run import loggers

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset


FAST = [
    "--set",
    "N=1 d_model=32 d_ff=64 h=2",
    "--ckpt-every",
    "1",
    "--val-every",
    "1",
    "--val-bleu-sentences",
    "2",
    "--eval-subset",
    "4",
    "--no-progress",
    "--accelerator",
    "cpu",
]


def tensorboard_scalars(version_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve of the TensorBoard event files in `version_dir`, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(version_dir))
    events.Reload()
    return {tag: [(s.step, s.value) for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def two_attempts(cache, tmp_path_factory):
    """One run trained for 2 steps with every file logger, then resumed for a third (another attempt)."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    out = tmp_path_factory.mktemp("runs")
    for steps in ("2", "3"):
        argv = [
            "train",
            "--out",
            str(out),
            *FAST,
            "--max-steps",
            steps,
            "--logger",
            "csv,tensorboard,mlflow",
            "--log-model",
        ]
        assert main(argv) == 0
    return out / "tiny" / "synthetic" / "base" / "seed0"


def test_tensorboard_and_csv_write_one_version_per_attempt(two_attempts):
    logs = two_attempts / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["version_0", "version_1"]
    first, second = (tensorboard_scalars(logs / v) for v in ("version_0", "version_1"))
    assert [step for step, _ in first["val/ppl"]] == [0, 1]  # validation after steps 1 and 2 (0-based)
    assert [step for step, _ in second["val/ppl"]] == [2]  # the resumed attempt: step 3 only
    for version, scalars in (("version_0", first), ("version_1", second)):
        csv = (logs / version / "metrics.csv").read_text().splitlines()
        column = csv[0].split(",").index("val/ppl")
        from_csv = [float(line.split(",")[column]) for line in csv[1:] if line.split(",")[column]]
        assert from_csv == pytest.approx([value for _, value in scalars["val/ppl"]])  # the same curve in both


def test_mlflow_keeps_one_run_per_attempt_in_one_store_under_out_and_one_experiment_per_sweep(
    two_attempts, tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = two_attempts.parents[3]  # OUT/tiny/synthetic/base/seed0
    uri, artifacts = loggers.mlflow_uri(out)
    assert uri == f"sqlite:///{out.resolve()}/mlflow.db" and (out / "mlflow.db").is_file()
    assert not (two_attempts / "mlflow.db").exists()  # not one store per run directory
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("aiayn-tiny-synthetic")
    assert experiment.artifact_location == artifacts == (out.resolve() / "mlartifacts").as_uri()
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"base-s0", "base-s0 attempt 2"}
    for name, steps in (("base-s0", [0, 1]), ("base-s0 attempt 2", [2])):
        run = runs[name]
        assert run.info.status == "FINISHED"
        assert (run.data.tags["row"], run.data.tags["seed"], run.data.tags["corpus"]) == ("base", "0", "synthetic")
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val/ppl")] == steps
        assert run.data.params["d_model"] == "32"  # the run's config (LogRunConfig), as W&B's config has it
        # one key a value: no knob both at the top and in a section (TensorBoard's hparams showed d_model twice)
        tops = {k for k in run.data.params if "/" not in k}
        assert not [k for k in run.data.params if "/" in k and k.rsplit("/", 1)[1] in tops]
        assert (run.data.params["row"], run.data.params["train_steps"]) == ("base", str(len(steps) + steps[0]))
    csv = (two_attempts / "logs" / "version_1" / "metrics.csv").read_text().splitlines()
    last = client.get_metric_history(runs["base-s0 attempt 2"].info.run_id, "val/ppl")[-1].value
    assert last == pytest.approx(float(csv[-1].split(",")[csv[0].split(",").index("val/ppl")]))


def test_every_tracker_holds_the_final_table(two_attempts, monkeypatch):
    """The final dev BLEU, tokenized BLEU and PPL reached W&B's summary only. TensorBoard now has them in
    its HParams (the run's config beside its final metrics, so rows compare in its table) and as scalars at the last
    step; MLflow as metrics at the last step, and with --log-model the final checkpoint as an artifact; the MLflow
    experiment and the W&B project have one name."""
    import json

    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from aiayn.lightning_modules.run import wandb_run
    from aiayn.lightning_modules.run.rundir import RunDir

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    metrics = json.loads((two_attempts / "metrics.json").read_text())
    final = {"dev/bleu": metrics["dev_bleu"], "dev/ppl": metrics["dev_ppl"], "dev/tok_bleu": metrics["dev_tok_bleu"]}
    events = EventAccumulator(str(two_attempts / "logs" / "version_1"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == set(final) | {
        "budget/steps",
        "budget/budget_steps",
        "budget/capped",
    }
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["row"].string_value == "base" and session.hparams["d_model"].number_value == 32
    assert "model/d_model" not in session.hparams and "train/seed" not in session.hparams
    for tag, value in final.items():
        assert events.Scalars(tag)[-1].value == pytest.approx(value, rel=1e-6) and events.Scalars(tag)[-1].step == 3

    out = two_attempts.parents[3]
    uri, _ = loggers.mlflow_uri(out)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("aiayn-tiny-synthetic")
    run = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}["base-s0 attempt 2"]
    for tag, value in final.items():
        history = client.get_metric_history(run.info.run_id, tag)
        assert (history[-1].step, history[-1].value) == (3, pytest.approx(value, rel=1e-6))
    files = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/MLmodel", "model/mlflow_model.py", "model/artifacts", "model/README.md"} <= files
    assert {"model/config.json", "model/metrics.json", "model/tokenizer.model"} <= files
    assert client.get_run(run.info.run_id).data.tags["capped"] == "true"  # 3 steps of the tiny preset's 1200
    readme = Path(client.download_artifacts(run.info.run_id, "model/README.md", str(out / "dl"))).read_text()
    assert "Translator.from_checkpoint('last.ckpt')" in readme and "capped: 3 of its 1200" in readme
    assert "pip install aiayn" not in readme  # no index has it: the README says to install from the repository

    config = RunDir(two_attempts).read_config()
    kwargs = wandb_run.init_kwargs(RunDir(two_attempts), config, "offline", "test")
    assert kwargs["project"] == experiment.name == loggers.experiment_name("tiny", SYNTHETIC)


def test_the_logged_model_is_an_mlflow_model_that_translates(two_attempts, monkeypatch):
    """--log-model's `model/` was a folder of files, not an MLflow Model (`mlflow.pyfunc.load_model` found no
    MLmodel): it is a pyfunc model whose predictions are the run's own translations (`aiayn translate`'s)."""
    import mlflow
    import pandas as pd

    from aiayn.lightning_modules.use.translate import Translator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri, _ = loggers.mlflow_uri(two_attempts.parents[3])
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name("aiayn-tiny-synthetic")
    runs = mlflow.search_runs([experiment.experiment_id], output_format="list")
    run = next(r for r in runs if r.info.run_name == "base-s0 attempt 2")
    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    sentences = ["der hund sieht die katze", "ein mann"]
    got = model.predict(pd.DataFrame({"text": sentences}))
    assert list(got) == Translator.from_run(two_attempts, device="cpu").translate(sentences)
    assert list(model.predict(pd.DataFrame({"text": sentences}), params={"beam": 1})) == Translator.from_run(
        two_attempts, device="cpu"
    ).translate(sentences, beam=1)


def test_mlflow_tracking_uri_wins_over_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert loggers.mlflow_uri(tmp_path) == ("http://mlflow.example:5000", None)


def test_the_default_is_csv_and_tensorboard_where_it_is_installed(monkeypatch):
    pytest.importorskip("tensorboard")
    assert loggers.chosen(None) == ("csv", "tensorboard")
    assert loggers.chosen(None, wandb=True) == ("csv", "tensorboard", "wandb")  # --wandb adds W&B
    assert loggers.chosen("CSV, wandb", wandb=True) == ("csv", "wandb")
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # an import of it now fails
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    assert loggers.chosen(None) == ("csv",)  # not an error: the default works wherever aiayn does


@pytest.mark.parametrize(
    "argv, missing, message",
    [
        (
            ["--logger", "csv,tensorboard"],
            ("tensorboard", "tensorboardX"),
            "--logger tensorboard needs the tensorboard package, which is not installed; pip install "
            "'aiayn[tensorboard]' (or drop tensorboard from --logger)",
        ),
        (
            ["--logger", "mlflow"],
            ("mlflow",),
            "--logger mlflow needs the mlflow package, which is not installed; pip install 'aiayn[mlflow]' (or drop "
            "mlflow from --logger)",
        ),
        (
            ["--logger", "csv,neptune"],
            (),
            "--logger: unknown logger 'neptune'; pass a comma-separated subset of csv, tensorboard, mlflow, wandb",
        ),
        (
            ["--logger", "csv,"],
            (),
            "--logger 'csv,' names no logger; pass a comma-separated subset of csv, tensorboard, mlflow, wandb",
        ),
    ],
)
@pytest.mark.parametrize("command", ["train", "table3", "hpo", "slurm"])
def test_a_bad_logger_is_one_line_exit_2_and_nothing_written(
    command, argv, missing, message, tmp_path, monkeypatch, capsys
):
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)
    out = tmp_path / "runs"
    before = {
        "train": ["train", "--max-steps", "2", "--accelerator", "cpu"],
        "table3": ["table3", "--rows", "base"],
        "hpo": ["hpo", "--trials", "1", "--accelerator", "cpu"],
        "slurm": ["slurm", "table3", "--accelerator", "cpu", "--partition", "p", "--time", "1:00:00", "--dry-run"],
    }[command]
    assert main([*before, *argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"aiayn: error: {message}\n"
    assert not out.exists()


def test_slurm_runs_carry_the_loggers_into_every_task(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = [
        "slurm",
        "table3",
        "--preset",
        "tiny",
        "--rows",
        "base",
        "--accelerator",
        "cpu",
        "--partition",
        "p",
        "--time",
        "1:00:00",
        "--logger",
        "csv,mlflow",
        "--wandb",
        "--out",
        str(out),
        "--dry-run",
    ]
    assert main(argv) == 0
    text = (out / "slurm" / "aiayn-table3-tiny.sbatch").read_text()
    assert "--logger csv,mlflow" in text and "--wandb" in text
