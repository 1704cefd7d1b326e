"""Out of the island: checkpoints load without running code, and a trained model exported to Hugging Face
(`MarianMTModel` + `MarianTokenizer`) and CTranslate2 computes what aiayn computes."""

import os
from pathlib import Path

import pytest
import torch

from aiayn.cli import main


class Planted:
    """What a shared checkpoint could hold: unpickling it calls Path.touch (any callable would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_holding_a_pickled_object_is_refused_in_one_line_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    ckpt = {"hyper_parameters": {"model_cfg": {"N": 1}}, "state_dict": {}, "planted": Planted(marker)}
    torch.save(ckpt, tmp_path / "shared.ckpt")
    torch.load(tmp_path / "shared.ckpt", weights_only=False)  # the file does what it says: loading it runs code
    assert marker.is_file()
    marker.unlink()

    (tmp_path / "in.en").write_text("The dog sees the cat.\n")
    argv = ["translate", "--ckpt", str(tmp_path / "shared.ckpt"), "--input", str(tmp_path / "in.en"), "--output",
            str(tmp_path / "out.de")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"aiayn: error: checkpoint {tmp_path}/shared.ckpt holds a pickled Python object (getattr), which "
        "could run code when loaded; aiayn loads tensors and plain data only: use a checkpoint that aiayn "
        "wrote\n"
    )
    assert not marker.exists() and sorted(os.listdir(tmp_path)) == ["in.en", "shared.ckpt"]


def test_a_run_does_not_resume_from_a_planted_checkpoint(tmp_path):
    from aiayn.common.errors import UserError
    from aiayn.lightning_modules.rundir import RunDir

    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    torch.save({"global_step": 7, "planted": Planted(marker)}, run.checkpoints / "last.ckpt")
    with pytest.raises(UserError, match=r"^cannot resume from checkpoint .*last\.ckpt holds a pickled Python object"):
        run.resume_checkpoint()
    assert not marker.exists()
    torch.save({"global_step": 7}, run.checkpoints / "last.ckpt")  # plain data resumes as before
    assert run.resume_checkpoint() == run.checkpoints / "last.ckpt"
