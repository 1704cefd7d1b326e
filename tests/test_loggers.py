"""`--logger`: each logger writes its own files under the run directory, one version (or run) per attempt, read
back here with each tool's own reader; a bad name or a missing package is one line, exit 2, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run import loggers

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset
ROOT = Path(__file__).resolve().parents[1]


FAST = [
    "--set",
    "N=1 d_model=32 d_ff=64 h=2",
    *"--ckpt-every 1 --val-every 1 --val-bleu-sentences 2 --eval-subset 4 --no-progress --accelerator cpu".split(),
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
            *"--logger csv,tensorboard,mlflow --log-model".split(),
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
    for tag, value in final.items():  # once, at the last step (not also at step 0: a flat line from the start)
        assert [(s.step, s.value) for s in events.Scalars(tag)] == [(3, pytest.approx(value, rel=1e-6))]
    assert [s.step for s in events.Scalars("budget/capped")] == [3]

    out = two_attempts.parents[3]
    uri, _ = loggers.mlflow_uri(out)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("aiayn-tiny-synthetic")
    run = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}["base-s0 attempt 2"]
    for tag, value in final.items():
        history = client.get_metric_history(run.info.run_id, tag)
        assert [(m.step, m.value) for m in history] == [(3, pytest.approx(value, rel=1e-6))]
    assert client.get_run(run.info.run_id).data.tags["capped"] == "true"  # 3 steps of the tiny preset's 1200

    config = RunDir(two_attempts).read_config()
    kwargs = wandb_run.init_kwargs(RunDir(two_attempts), config, "offline", "test")
    assert kwargs["project"] == experiment.name == loggers.experiment_name("tiny", SYNTHETIC)


def test_the_logged_model_is_an_mlflow_3_model_that_translates_anywhere(two_attempts, monkeypatch, tmp_path):
    """--log-model logs an MLflow 3 logged model: `search_logged_models` finds it (the UI's Models tab lists it);
    `predict` takes a list of strings as well as a DataFrame's `text` column and returns the run's own
    translations (`aiayn translate`'s), `beam` a parameter; it carries the aiayn code it runs, so a Python where
    aiayn is not installed loads it; its environment names what that code imports; its MLmodel names no path of
    this checkout; and logging it printed no MLflow warning or progress bar."""
    import mlflow
    import pandas as pd

    from aiayn.lightning_modules.use.translate import Translator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri, _ = loggers.mlflow_uri(two_attempts.parents[3])
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name("aiayn-tiny-synthetic")
    run = next(
        r
        for r in mlflow.search_runs([experiment.experiment_id], output_format="list")
        if r.info.run_name == "base-s0 attempt 2"
    )
    (logged,) = mlflow.search_logged_models(
        experiment_ids=[experiment.experiment_id],
        filter_string=f"source_run_id = '{run.info.run_id}'",
        output_format="list",
    )
    assert logged.name == "model"
    model = mlflow.pyfunc.load_model(logged.model_uri)
    sentences = ["der hund sieht die katze", "ein mann"]
    ours = Translator.from_run(two_attempts, device="cpu")
    assert list(model.predict(sentences)) == ours.translate(sentences)
    assert list(model.predict(pd.DataFrame({"text": sentences}))) == ours.translate(sentences)
    assert list(model.predict(sentences, params={"beam": 1})) == ours.translate(sentences, beam=1)

    local = Path(mlflow.artifacts.download_artifacts(logged.model_uri, dst_path=str(tmp_path / "model")))
    assert (local / "code" / "aiayn" / "lightning_modules" / "use" / "translate.py").is_file()
    assert (local / "artifacts" / "README.md").is_file() and (local / "artifacts" / "tokenizer.model").is_file()
    readme = (local / "artifacts" / "README.md").read_text()
    assert "Translator.from_checkpoint('last.ckpt')" in readme and "capped: 3 of its 1200" in readme
    requirements = (local / "requirements.txt").read_text().split()
    assert {"torch", "sentencepiece", "sacrebleu"} <= {r.split(">")[0].split("=")[0] for r in requirements}
    assert str(ROOT) not in (local / "MLmodel").read_text()
    # a Python in which only the model's own code is aiayn: the installed aiayn hidden, the model loads from code/
    hide = (
        "import sys, importlib.machinery as m\n"
        "class Only:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'aiayn':\n"
        f"            return m.PathFinder.find_spec(name, [{str(local / 'code')!r}]) or "
        "(_ for _ in ()).throw(ImportError(name))\n"
        "sys.meta_path.insert(0, Only())\n"
        "import mlflow, aiayn\n"
        f"model = mlflow.pyfunc.load_model({str(local)!r})\n"
        "print(aiayn.__file__); print(model.predict(['ein mann'])[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", hide], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    where, translation = done.stdout.splitlines()[-2:]
    assert where.startswith(str(local / "code")) and translation == ours.translate(["ein mann"])[0]


def test_logging_a_model_prints_no_mlflow_warning_or_bar(cache, tmp_path, capfd):
    """MLflow's type-hint and input-example warnings and its download bars were printed by every --log-model run:
    the run's own output has none of them."""
    pytest.importorskip("mlflow")
    argv = ["train", "--out", str(tmp_path), *FAST, "--max-steps", "2", "--logger", "csv,mlflow", "--log-model"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    assert "WARNING mlflow" not in err and "Downloading artifacts" not in err and "it/s]" not in err, err[-3000:]


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
        *"slurm table3 --preset tiny --rows base --accelerator cpu --partition p --time 1:00:00".split(),
        *"--logger csv,mlflow --wandb --out".split(),
        str(out),
        "--dry-run",
    ]
    assert main(argv) == 0
    text = (out / "slurm" / "aiayn-table3-tiny.sbatch").read_text()
    assert "--logger csv,mlflow" in text and "--wandb" in text
