"""Checkpoints under control: how many periodic checkpoints a run keeps (`--keep-last`), weights-only periodic
checkpoints (`--weights-only-checkpoints`) that still average, translate and leave the resume exact."""

import pytest
import torch

from aiayn.cli import main

SMALL = ["--set", "N=1 d_model=32 d_ff=64 h=2", "--val-every", "100", "--val-bleu-sentences", "0", "--eval-subset",
         "4", "--no-progress", "--accelerator", "cpu", "--logger", "csv"]  # fmt: skip
TRAINING_STATE = ("optimizer_states", "lr_schedulers", "callbacks")


def train(out, *argv) -> None:
    assert main(["train", "--out", str(out), *SMALL, *argv]) == 0


def run_of(out):
    return out / "tiny" / "synthetic" / "base" / "seed0"


def load(path):
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def weights_only(cache, tmp_path_factory):
    """4 steps, a checkpoint after each, the newest 2 kept, weights only."""
    out = tmp_path_factory.mktemp("runs")
    train(out, "--max-steps", "4", "--ckpt-every", "1", "--keep-last", "2", "--weights-only-checkpoints")
    return run_of(out)


def test_keep_last_keeps_the_newest_periodic_checkpoints_and_last(weights_only):
    names = sorted(p.name for p in (weights_only / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step0000003.ckpt", "step0000004.ckpt"]


def test_periodic_checkpoints_hold_the_weights_and_the_run_files_last_holds_everything(weights_only):
    step, last = (load(weights_only / "checkpoints" / name) for name in ("step0000004.ckpt", "last.ckpt"))
    assert not set(TRAINING_STATE) & set(step) and set(TRAINING_STATE) <= set(last)
    assert step["global_step"] == last["global_step"] == 4
    assert all(torch.equal(step["state_dict"][k], v) for k, v in last["state_dict"].items())  # the same weights
    assert step["hyper_parameters"]["model_cfg"]["d_model"] == 32
    tokenizer = (weights_only / "tokenizer.model").read_bytes()
    assert step["aiayn"]["tokenizer_model"] == tokenizer and step["aiayn"]["config"]["spec"]["row"] == "base"


def test_weights_only_checkpoints_average_and_translate(weights_only, tmp_path, capsys):
    avg = tmp_path / "avg.ckpt"
    assert main(["average", "--run", str(weights_only), "--last", "2", "--out", str(avg)]) == 0
    a, b = (load(weights_only / "checkpoints" / f"step000000{s}.ckpt")["state_dict"] for s in (3, 4))
    got = load(avg)["state_dict"]
    key = "model.embed.weight"
    assert torch.equal(got[key], ((a[key].double() + b[key].double()) / 2).float())
    src = tmp_path / "in.en"
    src.write_text("The dog sees the cat.\n")
    for model in (["--run", str(weights_only), "--average", "2"], ["--ckpt", str(avg)]):
        out = tmp_path / "out.de"
        assert main(["translate", *model, "--input", str(src), "--output", str(out), "--beam", "2"]) == 0
        assert len(out.read_text().splitlines()) == 1


def test_a_run_with_weights_only_checkpoints_resumes_exactly(weights_only, tmp_path):
    """Stopped after step 2 and resumed to 4, it ends with the uninterrupted run's weights, bit for bit (CPU)."""
    for steps in ("2", "4"):
        train(tmp_path, "--max-steps", steps, "--ckpt-every", "1", "--weights-only-checkpoints")
    resumed, whole = (load(run / "checkpoints" / "last.ckpt") for run in (run_of(tmp_path), weights_only))
    assert resumed["global_step"] == whole["global_step"] == 4
    assert all(torch.equal(resumed["state_dict"][k], v) for k, v in whole["state_dict"].items())
    assert all(torch.equal(a, b) for a, b in zip(resumed["optimizer_states"][0]["state"][0].values(),
                                                  whole["optimizer_states"][0]["state"][0].values()))  # fmt: skip


def test_keep_last_0_is_one_line(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "runs"), "--keep-last", "0"]) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: argument --keep-last: expected a positive integer, got 0; see `aiayn train --help`\n"
    )
    assert not (tmp_path / "runs").exists()
