"""Checkpoints under control: how many periodic checkpoints a run keeps (`--keep-last`), weights-only periodic
checkpoints (`--weights-only-checkpoints`) that still average, translate and leave the resume exact, and the disk a
run will need, estimated before it runs and measured after."""

import json
import re

import pytest
import torch

from aiayn.cli import main
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run import disk
from aiayn.lightning_modules.run.spec import resolve
from aiayn.lightning_modules.use.checkpoints import run_config

SMALL = [
    "--set",
    "N=1 d_model=32 d_ff=64 h=2",
    *"--val-every 100 --val-bleu-sentences 0 --eval-subset 4 --no-progress --accelerator cpu --logger csv".split(),
]
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


@pytest.mark.slow  # trains end to end (seconds): the slow tier
def test_keep_last_keeps_the_newest_periodic_checkpoints_and_last(weights_only):
    names = sorted(p.name for p in (weights_only / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step0000003.ckpt", "step0000004.ckpt"]


def test_periodic_checkpoints_hold_the_weights_and_the_run_files_last_holds_everything(weights_only):
    step, last = (load(weights_only / "checkpoints" / name) for name in ("step0000004.ckpt", "last.ckpt"))
    assert not set(TRAINING_STATE) & set(step) and set(TRAINING_STATE) <= set(last)
    assert step["global_step"] == last["global_step"] == 4
    assert all(torch.equal(step["state_dict"][k], v) for k, v in last["state_dict"].items())  # the same weights
    assert "hyper_parameters" not in step and "datamodule_hyper_parameters" not in step  # one config, not two
    assert run_config(step, "step").spec.model.d_model == 32
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
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            resumed["optimizer_states"][0]["state"][0].values(), whole["optimizer_states"][0]["state"][0].values()
        )
    )


@pytest.fixture(scope="module")
def averaging(cache, tmp_path_factory):
    """The same 4 steps, the newest 3 periodic checkpoints kept, only the newest whole."""
    out = tmp_path_factory.mktemp("runs")
    train(out, "--max-steps", "4", "--ckpt-every", "1", "--keep-last", "1", "--keep-for-averaging", "3")
    return run_of(out)


def test_keep_for_averaging_keeps_the_older_ones_as_weights_only(averaging, weights_only):
    names = sorted(p.name for p in (averaging / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step0000002.ckpt", "step0000003.ckpt", "step0000004.ckpt"]
    ckpt = {s: load(averaging / "checkpoints" / f"step000000{s}.ckpt") for s in (2, 3, 4)}
    assert set(TRAINING_STATE) <= set(ckpt[4])  # the newest, whole: a run can be rewound to it
    # an older one is the file --weights-only-checkpoints writes at its step: the same keys, the same weights
    written = load(weights_only / "checkpoints" / "step0000003.ckpt")
    assert set(ckpt[3]) == set(written) and ckpt[3]["global_step"] == 3
    assert all(torch.equal(ckpt[3]["state_dict"][k], v) for k, v in written["state_dict"].items())
    assert not set(TRAINING_STATE) & set(ckpt[2])
    sizes = {s: (averaging / "checkpoints" / f"step000000{s}.ckpt").stat().st_size for s in (2, 3, 4)}
    assert sizes[2] == sizes[3] < 0.7 * sizes[4]


def test_keep_for_averaging_slims_down_after_a_resume_and_averages(cache, tmp_path):
    """Stopped after step 2 (step 1 slim, step 2 whole) and resumed to 4: the resumed process slims step 2 and 3."""
    for steps in ("2", "4"):
        train(tmp_path, "--max-steps", steps, "--ckpt-every", "1", "--keep-last", "1", "--keep-for-averaging", "3")
    run = run_of(tmp_path)
    whole = {s: "optimizer_states" in load(run / "checkpoints" / f"step000000{s}.ckpt") for s in (2, 3, 4)}
    assert whole == {2: False, 3: False, 4: True}
    assert main(["average", "--run", str(run), "--last", "3", "--out", str(tmp_path / "avg.ckpt")]) == 0


def test_keep_for_averaging_below_keep_last_is_one_line(tmp_path, capsys):
    argv = ["train", "--out", str(tmp_path / "runs"), "--keep-last", "3", "--keep-for-averaging", "2"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: --keep-for-averaging 2 keeps fewer periodic checkpoints than --keep-last 3; pass "
        "--keep-for-averaging 3 or more, or a smaller --keep-last\n"
    )
    assert not (tmp_path / "runs").exists()


def test_the_estimate_is_within_10_percent_of_the_real_files(weights_only):
    """Of a model whose tokenizer outweighs its weights: the estimate's per-file overheads are right too (the
    full-size model's checkpoints: tests/test_train.py)."""
    spec = resolve("base", "tiny", overrides={"N": 1, "d_model": 32, "d_ff": 64, "h": 2})
    periodic = (weights_only / "checkpoints" / "step0000004.ckpt").stat().st_size
    last = (weights_only / "checkpoints" / "last.ckpt").stat().st_size
    assert disk.checkpoint_bytes(spec.model.params(), 1000, weights_only=True) == pytest.approx(periodic, rel=0.1)
    assert disk.checkpoint_bytes(spec.model.params(), 1000, weights_only=False) == pytest.approx(last, rel=0.1)
    assert periodic < 0.7 * last


def test_print_config_says_the_disk_on_stderr_and_keeps_stdout_json(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path), "--preset", "paper", "--row", "big", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["spec"]["row"] == "big"
    params = resolve("big", "paper").model.params()
    full, weights = 12 * params, 4 * params  # + the tokenizer and the rest: under a percent of it at this size
    # the paper preset's periodic checkpoints are weights only (every 10 minutes: ablations/presets.py)
    assert err.startswith(
        "# checkpoints: about 19.7 GB = 20 periodic x 858 MB (weights only) + last.ckpt 1 x "
        "2.57 GB (weights + Adam moments, fp32)"
    )
    assert 20 * weights + full == pytest.approx(19.7e9, rel=0.01)

    def planned(flags: str) -> str:
        assert main(["train", "--out", str(tmp_path), *f"--print-config --row big {flags}".split()]) == 0
        return capsys.readouterr().err

    err = planned("--preset paper --weights-only-checkpoints --keep-last 5")
    assert "about 6.86 GB = 5 periodic x 858 MB (weights only) + last.ckpt 1 x 2.57 GB" in err
    # the paper preset's periodic files are weights only already: the 20 kept for averaging are all of that size
    err = planned("--preset paper --keep-last 2 --keep-for-averaging 20")
    assert "about 19.7 GB = 20 periodic x 858 MB (weights only) + last.ckpt 1 x 2.57 GB" in err
    assert "about 19.7 GB" in planned("--preset paper --ckpt-every 1000 --keep-last 2 --keep-for-averaging 20")
    # a preset with whole periodic files: the newest 2 whole, 18 older slimmed down for averaging
    err = planned("--preset small --keep-last 2 --keep-for-averaging 20")
    assert re.search(
        r"= 2 periodic x \S+ \S+ \(weights \+ Adam moments, fp32\) \+ 18 older for averaging x \S+ \S+ "
        r"\(weights only\) \+ last\.ckpt 1 x",
        err,
    ), err
    assert not any(tmp_path.iterdir())


def test_slurm_dry_run_says_the_disk_of_the_whole_array(tmp_path, capsys):
    argv = [
        *"slurm table3 --preset paper --rows base,big --seeds 2 --partition p --time 1-00:00:00".split(),
        *"--gpus-per-node 8 --out".split(),
        str(tmp_path / "runs"),
        "--dry-run",
    ]
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("# disk:"))

    def per_run(row):  # 20 periodic, weights only (the paper preset's), + last.ckpt and requeue.ckpt whole
        params = resolve(row, "paper").model.params()
        return 20 * disk.checkpoint_bytes(params, 37000, True) + 2 * disk.checkpoint_bytes(params, 37000, False)

    total = 2 * per_run("base") + 2 * per_run("big")
    assert line.startswith(f"# disk: checkpoints of the 4 runs: about {disk.human(total)} in all (the largest, big: ")
    assert disk.human(total) == "57.8 GB"


def test_keep_last_0_is_one_line(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "runs"), "--keep-last", "0"]) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: argument --keep-last: expected a positive integer, got 0; see `aiayn train --help`\n"
    )
    assert not (tmp_path / "runs").exists()


def test_the_paper_preset_checkpoints_every_ten_minutes_weights_only(tmp_path):
    """The paper preset wrote a full synchronous checkpoint (model and Adam: about 0.76 GB) every 1000
    steps, every 30 s on an H100. It checkpoints as the paper did, every 10 minutes ("the last 5 checkpoints, which
    were written at 10-minute intervals"), its periodic files weights only; --ckpt-every still asks for steps, and the
    tiny preset keeps its steps."""
    from aiayn.ablations.presets import get_preset
    from aiayn.lightning_modules.run import disk
    from aiayn.lightning_modules.run.options import TrainOptions

    paper, tiny = get_preset("paper"), get_preset("tiny")
    assert disk.checkpoint_every(TrainOptions(preset="paper"), paper) == (None, 10.0)
    assert disk.weights_only(TrainOptions(preset="paper"), paper)
    assert disk.checkpoint_every(TrainOptions(preset="paper", ckpt_every=500), paper) == (500, None)
    assert disk.checkpoint_every(TrainOptions(preset="paper", ckpt_every_minutes=30.0), paper) == (None, 30.0)
    assert disk.checkpoint_every(TrainOptions(), tiny) == (tiny.ckpt_every, None)
    assert not disk.weights_only(TrainOptions(), tiny)
    estimate = disk.estimate(TrainOptions(preset="paper"), resolve("base", "paper"))
    assert estimate.periodic_bytes == disk.checkpoint_bytes(estimate.params, 37000, weights_only=True)


def test_a_checkpoint_loads_as_lightning_users_expect(tmp_path):
    """The run config a checkpoint carries is read on the type (`RunConfig.from_checkpoint`, as litgpt's
    `Config.from_checkpoint`), and the module builds itself from it: `TranslationModule.from_checkpoint(path)`, and
    Lightning's own `load_from_checkpoint(path)`, which failed (the module keeps no hyper-parameters)."""
    from conftest import checkpoint_of

    from aiayn.lightning_modules.run.module import TranslationModule
    from aiayn.lightning_modules.run.rundir import RunConfig

    ckpt = checkpoint_of()
    path = tmp_path / "last.ckpt"
    torch.save(ckpt, path)
    config = RunConfig.from_checkpoint(path)
    assert config.spec.row == "base" and config.spec.model == run_config(ckpt, path).spec.model
    for module in (TranslationModule.from_checkpoint(path), TranslationModule.load_from_checkpoint(path)):
        assert module.cfg == config.spec.model and (module.warmup, module.lr_factor) == (
            config.spec.schedule.warmup,
            config.spec.schedule.lr_factor,
        )
        for name, value in module.state_dict().items():
            assert torch.equal(value, ckpt["state_dict"][name]), name
    with pytest.raises(TypeError, match="no hparams_file"):
        TranslationModule.load_from_checkpoint(path, hparams_file="h.yaml")


def test_averaging_checkpoints_far_from_the_end_is_said(tmp_path, caplog):
    """`--average 5` of the tiny preset averaged steps 250-1200 (most of its run) without a word; the paper's
    last 5 lay in its last 7%. A span over a tenth of the run is a warning naming it; the paper's span is not."""
    from aiayn.lightning_modules.use.checkpoints import last_checkpoints, span_warning

    def files(steps):
        return [tmp_path / f"step{s:07d}.ckpt" for s in steps]

    assert span_warning(files([6600, 6700, 6800, 6900, 7000])) is None  # the last 5.7%: as the paper
    said = span_warning(files([250, 500, 750, 1000, 1200]))
    assert said.startswith("--average 5 averages the checkpoints of steps 250-1200, 79% of the run")
    from conftest import checkpoint_of

    from aiayn.lightning_modules.use.checkpoints import averaged

    (tmp_path / "checkpoints").mkdir()
    spec = resolve("base", "tiny", overrides={"N": 1, "d_model": 16, "d_ff": 32, "h": 2}, vocab_size=50)
    paths = [tmp_path / "checkpoints" / f"step{s:07d}.ckpt" for s in (250, 500, 750, 1000, 1200)]
    for p in paths:
        torch.save(checkpoint_of(spec, global_step=int(p.stem[4:]), state_dict={"w": torch.randn(3)}), p)
    with caplog.at_level("WARNING"):
        averaged(last_checkpoints(tmp_path, 5), "--average")
    assert "--average 5 averages the checkpoints of steps 250-1200, 79% of the run" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        averaged(last_checkpoints(tmp_path, 2), "--average")  # steps 1000-1200: 17%
        assert "17% of the run" in caplog.text
        caplog.clear()
        averaged(paths[-1:] * 2, "--average")
    assert "of the run" not in caplog.text


def test_another_runs_checkpoint_in_a_run_directory_is_refused_in_one_line_not_resumed(tmp_path):
    """Another row's last.ckpt put in a run directory went to Lightning's state-dict load (a traceback),
    or, with the same shapes, would have continued that run under this one's name. A run resumes only its own."""
    from conftest import checkpoint_of

    from aiayn.common.errors import UserError
    from aiayn.common.files import atomic_write_json
    from aiayn.lightning_modules.run.rundir import DataIdentity, RunConfig, RunDir, TrainPlan

    small = {"N": 1, "d_model": 16, "d_ff": 32, "h": 2}
    mine, other = (resolve(row, "tiny", overrides=small, vocab_size=50) for row in ("base", "A1"))
    run = RunDir(tmp_path / "tiny" / "synthetic" / "base" / "seed0")
    run.checkpoints.mkdir(parents=True)
    atomic_write_json(
        run.config_file,
        RunConfig(
            mine, DataIdentity(CorpusRef.parse("synthetic"), None, 50), TrainPlan(0, 2, 1, 1, 1024, "32-true")
        ).to_dict(),
    )
    torch.save(checkpoint_of(mine, global_step=3), run.checkpoints / "step0000003.ckpt")
    assert run.resume_checkpoint() is None or run.resume_checkpoint().name == "step0000003.ckpt"  # its own: fine
    torch.save(checkpoint_of(other, global_step=5, optimizer_states=[]), run.checkpoints / "last.ckpt")
    with pytest.raises(
        UserError,
        match=r"last.ckpt is another run's \(row A1, seed 0, preset tiny\), not this one's \(row base, "
        r"seed 0, preset tiny\); move it out of .*checkpoints and run again",
    ):
        run.resume_checkpoint()
    # the same row, seed and model under another preset (another budget, schedule or data): another run too
    elsewhere = resolve("base", "tiny-2k", overrides=small, vocab_size=50)
    assert elsewhere.model == mine.model and elsewhere.preset.name != mine.preset.name
    torch.save(checkpoint_of(elsewhere, global_step=5, optimizer_states=[]), run.checkpoints / "last.ckpt")
    with pytest.raises(UserError, match=r"\(row base, seed 0, preset tiny-2k\), not this one's \(row base, seed 0, "):
        run.resume_checkpoint()
