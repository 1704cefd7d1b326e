"""`aiayn train/eval/average` end to end on the built-in corpus (a few steps), and bad input."""

import gzip
import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import checkpoint_of

from aiayn.cli import main
from aiayn.lightning_modules.run.spec import resolve
from aiayn.lightning_modules.use.checkpoints import run_config

FAST = "--max-steps 2 --ckpt-every 1 --val-bleu-sentences 4 --eval-subset 4 --no-progress --accelerator cpu".split()


@pytest.fixture(scope="module")
def trained(cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    assert main(["train", "--row", "base", "--preset", "tiny", "--out", str(out), *FAST]) == 0
    return out / "tiny" / "synthetic" / "base" / "seed0"


def test_train_writes_config_checkpoints_and_metrics(trained):
    metrics = json.loads((trained / "metrics.json").read_text())
    required = {
        "row",
        "seed",
        "preset",
        "data",
        "status",
        "dev_bleu",
        "dev_bleu_signature",
        "dev_ppl",
        "params",
        "steps",
        "train_time_s",
        "tokens_per_s",
    }
    assert required <= set(metrics)
    assert (metrics["row"], metrics["seed"], metrics["preset"], metrics["data"]) == ("base", 0, "tiny", "synthetic")
    assert metrics["status"] == "completed" and metrics["steps"] == 2 and metrics["dev_sentences"] == 4
    assert metrics["dev_bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert metrics["dev_ppl"] > 1 and metrics["params"] > 1e6
    # what it trained under, and how grad_w was accumulated: fp32 on a CPU
    assert (metrics["precision"], metrics["grad_w_path"]) == ("32-true", "float32: the product, then the add")
    config = json.loads((trained / "config.json").read_text())
    assert config["spec"]["model"]["d_model"] == 128 and config["spec"]["model"]["vocab_size"] == 1000
    assert (trained / "checkpoints" / "last.ckpt").is_file()
    assert len((trained / "dev.hyp").read_text().splitlines()) == 4


SMALL = ["--set", "N=1 d_model=32 d_ff=64 h=2", "--val-every", "100"]


@pytest.fixture
def batches_trained(monkeypatch):
    """The `idx` of every batch a training step sees, in order."""
    from aiayn.lightning_modules.run.module import TranslationModule

    seen, step = [], TranslationModule.training_step

    def recording(self, batch, batch_idx):
        seen.append(batch["idx"].tolist())
        return step(self, batch, batch_idx)

    monkeypatch.setattr(TranslationModule, "training_step", recording)
    return seen


def test_a_resumed_run_trains_exactly_the_batches_it_had_not(cache, tmp_path, batches_trained):
    """A rerun of a finished run trains nothing; raising --max-steps trains the batches an uninterrupted run
    trains after the checkpoint, no batch twice, none skipped."""
    run = lambda out, steps: main(["train", "--out", str(tmp_path / out), *SMALL, *FAST, "--max-steps", str(steps)])
    assert run("whole", 4) == 0
    whole = list(batches_trained)
    assert len(whole) == 4 and len({tuple(b) for b in whole}) == 4
    batches_trained.clear()
    assert run("split", 2) == 0 and batches_trained == whole[:2]
    batches_trained.clear()
    assert run("split", 2) == 0 and batches_trained == []  # finished: nothing retrained
    metrics = json.loads((tmp_path / "split/tiny/synthetic/base/seed0/metrics.json").read_text())
    assert metrics["steps"] == 2
    assert run("split", 4) == 0 and batches_trained == whole[2:]
    metrics = json.loads((tmp_path / "split/tiny/synthetic/base/seed0/metrics.json").read_text())
    assert metrics["steps"] == 4


def test_metrics_record_the_real_tokens_per_optimizer_step(trained):
    metrics = json.loads((trained / "metrics.json").read_text())
    budget = json.loads((trained / "config.json").read_text())["train"]["effective_tokens_per_step"]
    assert budget == metrics["effective_tokens_per_step"] == 1024
    assert 0.9 * budget <= metrics["tgt_tokens_per_step"] <= budget  # two steps: what arrived, not the budget
    assert 0 < metrics["src_tokens_per_step"] < budget


def test_the_final_evaluation_runs_on_the_device_the_run_trained_on(cache, tmp_path, monkeypatch):
    """Lightning's teardown moves the model to the CPU after fit(); the final evaluation must move it back to
    the strategy's device. A CPU-only machine cannot train anywhere else, so the strategy's device is
    changed to `meta` as fit() ends: the evaluation must see the model there."""
    import lightning.pytorch as pl

    from aiayn.lightning_modules.run import train as T

    seen = []

    def evaluate(model, dm, split):
        seen.append(next(model.parameters()).device)
        return {
            "ppl": 1.0,
            "bleu": 0.0,
            "bleu_signature": "",
            "tok_bleu": 0.0,
            "tok_bleu_label": "",
            "n_sentences": 0,
            "hypotheses": [],
        }

    class MoveStrategy(pl.Callback):
        def on_fit_end(self, trainer, pl_module):
            trainer.strategy._root_device = torch.device("meta")

    monkeypatch.setattr(T, "evaluate", evaluate)
    opts = T.TrainOptions(
        out=str(tmp_path),
        max_steps=1,
        val_bleu_sentences=2,
        progress=False,
        accelerator="cpu",
        overrides={"N": 1, "d_model": 32, "d_ff": 64, "h": 2},
    )
    T.train(opts, hooks=T.Hooks(callbacks=(MoveStrategy(),)))
    assert seen == [torch.device("meta")]


@pytest.mark.parametrize("residual", [["--residual-dtype", "bf16"], []], ids=["bf16", "default"])
def test_a_bf16_residual_stream_trains_and_is_evaluated_and_recorded(cache, tmp_path, residual):
    """`--residual-dtype bf16`, and the default (auto) under bf16-mixed, end to end: it trains under bf16-mixed with
    the stream in bf16, the final evaluation (outside autocast, in fp32) runs, and metrics.json says what the run
    trained under."""
    out = tmp_path / "runs"
    argv = [
        *"train --row base --preset tiny --out".split(),
        str(out),
        *FAST,
        *SMALL,
        "--precision",
        "bf16-mixed",
        *residual,
    ]
    assert main(argv) == 0
    metrics = json.loads((out / "tiny/synthetic/base/seed0/metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["dev_ppl"] > 1
    assert metrics["precision"] == "bf16-mixed, bf16 residual stream"


def test_the_residual_streams_dtype_is_bf16_by_default_only_under_bf16_mixed():
    """`--residual-dtype auto` (the default): bf16 where the run trains in bf16-mixed (a GPU's default precision),
    fp32 (None) under 32-true, a CPU's default, and under bf16-true (whose weights are bf16 already); fp32 and bf16
    as said."""
    from aiayn.lightning_modules.run.devices import residual_stream_dtype
    from aiayn.lightning_modules.run.options import TrainOptions

    assert residual_stream_dtype("auto", "bf16-mixed") == torch.bfloat16
    assert residual_stream_dtype("auto", "32-true") is None and residual_stream_dtype("auto", "bf16-true") is None
    assert residual_stream_dtype("fp32", "bf16-mixed") is None
    assert residual_stream_dtype("bf16", "bf16-mixed") == torch.bfloat16
    assert TrainOptions().residual_dtype == "auto"


def test_rerun_of_a_finished_run_resumes_instead_of_restarting(trained, capsys):
    before = json.loads((trained / "metrics.json").read_text())
    out = trained.parents[3]
    assert main(["train", "--row", "base", "--preset", "tiny", "--out", str(out), *FAST]) == 0
    after = json.loads((trained / "metrics.json").read_text())
    assert after["steps"] == before["steps"] == 2  # resumed at max_steps: nothing retrained


def test_a_run_re_recorded_from_its_checkpoint_keeps_its_measured_throughput(trained, tmp_path):
    """A completed run whose metrics.json was lost is recorded again from its last checkpoint: it recorded a
    throughput of 0 tokens/s and a training time of the seconds it took to find nothing to train. Training time
    and tokens are kept in the checkpoint over every attempt, so the record keeps what was measured."""
    import shutil

    run = tmp_path / "runs" / "tiny" / "synthetic" / "base" / "seed0"
    shutil.copytree(trained, run)
    before = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").unlink()
    assert main(["train", "--row", "base", "--preset", "tiny", "--out", str(tmp_path / "runs"), *FAST]) == 0
    after = json.loads((run / "metrics.json").read_text())
    assert after["steps"] == before["steps"] == 2
    assert after["src_tokens_per_step"] == before["src_tokens_per_step"]
    assert 0.5 * before["train_time_s"] <= after["train_time_s"] <= before["train_time_s"]
    assert after["tokens_per_s"] >= 0.9 * before["tokens_per_s"] > 0


def test_a_run_directory_of_another_config_is_refused(trained, capsys):
    """A run directory holding a run of another config (d_model 256 in its knobs and in the model derived from
    them) is refused in one line; so is a config.json whose model section was edited alone, which its knobs no
    longer give (it would otherwise be silently replaced by what they give)."""
    config = json.loads((trained / "config.json").read_text())
    spec = config["spec"]
    edited = dict(config, spec=dict(spec, model=dict(spec["model"], d_model=256)))
    knobs = dict(spec["knobs"], d_model=256)
    other = dict(config, spec=dict(spec, model=dict(spec["model"], d_model=256), knobs=knobs))
    try:
        for tampered, said in ((edited, "not the model section"), (other, "holds a run of another config")):
            (trained / "config.json").write_text(json.dumps(tampered))
            code = main(["train", "--row", "base", "--preset", "tiny", "--out", str(trained.parents[3]), *FAST])
            assert code == 2
            errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("INFO")]
            assert len(errors) == 1 and said in errors[0] and "d_model" in errors[0], errors
    finally:
        (trained / "config.json").write_text(json.dumps(config))


def test_eval_and_average_a_checkpoint(trained, capsys, tmp_path):
    avg = tmp_path / "avg.ckpt"
    assert main(["average", "--run", str(trained), "--last", "1", "--out", str(avg)]) == 0
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(avg), "--split", "test", "--beam", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "test" and result["n_sentences"] == 1000 and result["ppl"] > 1


def test_the_final_evaluation_says_how_far_its_beam_search_got(cache, tmp_path, monkeypatch, caplog):
    """A dev set's beam search runs a minute or more with nothing on the screen: it says how far it got."""
    from aiayn.lightning_modules.run import evaluate

    monkeypatch.setattr(evaluate, "SAY_EVERY_S", 0.0)
    argv = ["train", "--row", "base", "--preset", "tiny", *SMALL, "--max-steps", "2", "--eval-subset", "40"]
    argv += ["--val-bleu-sentences", "0", "--accelerator", "cpu", "--no-progress", "--out", str(tmp_path)]
    with caplog.at_level(logging.INFO, logger=evaluate.__name__):
        assert main(argv) == 0
    said = [r.getMessage() for r in caplog.records if r.name == evaluate.__name__]
    assert said and all("sentences" in s and "\n" not in s for s in said)
    import re

    assert re.fullmatch(r"evaluating on dev: \d+ sentences decoded so far \(beam 4\)", said[0]), said
    assert re.fullmatch(r"evaluated on dev: \d+ sentences in \d+ s", said[-1]), said


def test_a_look_is_evaluated_on_a_few_dev_sentences_and_a_run_at_its_budget_on_all(cache, tmp_path, caplog):
    """A look (--max-steps below the row's budget) spent most of its time in a beam search of 1000 dev sentences by
    an untrained model: its final evaluation is now the first LOOK_SENTENCES unless --eval-subset says, its lead
    says so; a run at its budget, and an hpo trial (its final dev PPL is the objective), are evaluated on all."""
    from aiayn.ablations.presets import PRESETS
    from aiayn.lightning_modules.run.options import LOOK_SENTENCES, TrainOptions, eval_sentences

    argv = ["train", "--row", "base", "--preset", "tiny", *SMALL, "--max-steps", "2", "--val-bleu-sentences", "0"]
    argv += ["--accelerator", "cpu", "--no-progress", "--out", str(tmp_path)]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    metrics = json.loads((tmp_path / "tiny" / "synthetic" / "base" / "seed0" / "metrics.json").read_text())
    assert metrics["dev_sentences"] == LOOK_SENTENCES
    assert f"a look: --max-steps 2 of the row's 1200, its final evaluation on the first {LOOK_SENTENCES}" in caplog.text
    budget = PRESETS["tiny"].train_steps
    look = TrainOptions(max_steps=2)
    assert eval_sentences(look, budget, "table3") == LOOK_SENTENCES
    assert eval_sentences(replace(look, eval_subset=7), budget, "table3") == 7
    assert eval_sentences(look, budget, "hpo") is None
    assert eval_sentences(TrainOptions(max_steps=budget), budget, "table3") is None
    assert eval_sentences(TrainOptions(), budget, "table3") is None


def test_a_run_prints_none_of_lightnings_start_up_noise(cache, tmp_path, capfd):
    """ "GPU available: False", "TPU available", the litlogger tip and torch's LeafSpec deprecation (from Lightning's
    pytree helper) on every run said nothing aiayn had not decided; the run's own lines stay."""
    argv = ["train", "--row", "base", "--preset", "tiny", *SMALL, "--max-steps", "2", "--eval-subset", "5"]
    argv += ["--val-bleu-sentences", "0", "--accelerator", "cpu", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    for noise in ("GPU available", "TPU available", "litlogger", "LeafSpec"):
        assert noise not in out + err, noise
    assert "base seed 0: dev BLEU" in out


def _checkpoint(path: Path, step: int, seed: int, d_model: int = 16) -> dict:
    g = torch.Generator().manual_seed(seed)
    spec = resolve("base", "tiny", overrides={"N": 1, "d_model": d_model, "d_ff": 32, "h": 2}, vocab_size=50)
    ckpt = checkpoint_of(
        spec,
        global_step=step,
        state_dict={
            "w": torch.randn(3, 4, generator=g),
            "b": torch.randn(4, generator=g) * 1e3,
            "count": torch.tensor([step]),
        },
    )
    torch.save(ckpt, path)
    return ckpt


def test_three_checkpoints_average_to_their_float64_mean(tmp_path):
    from aiayn.lightning_modules.use.checkpoints import average

    paths = [tmp_path / f"step{s:07d}.ckpt" for s in (10, 20, 30)]
    ckpts = [_checkpoint(p, s, seed=s) for p, s in zip(paths, (10, 20, 30))]
    out = torch.load(average(paths, tmp_path / "avg.ckpt"), weights_only=False)
    for key in ("w", "b"):
        mean = sum(c["state_dict"][key].double() for c in ckpts) / 3
        assert torch.equal(out["state_dict"][key], mean.float())
        assert not torch.equal(out["state_dict"][key], ckpts[0]["state_dict"][key])
    assert torch.equal(out["state_dict"]["count"], torch.tensor([30]))  # not a float: the newest one's
    assert out["averaged_from"] == [str(p) for p in paths]


def test_average_last_k_picks_by_step_number(tmp_path, capsys):
    """step99.ckpt is older than step0000100.ckpt though it sorts after it by name; file times say nothing."""
    import os

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    names = {"step0000100.ckpt": 100, "step99.ckpt": 99, "step0000250.ckpt": 250, "step0000005.ckpt": 5}
    for name, step in names.items():
        _checkpoint(ckpts / name, step, seed=step)
        os.utime(ckpts / name, (10**9 - step * 1000, 10**9 - step * 1000))  # the newest step has the oldest time
    assert main(["average", "--run", str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path / "avg.ckpt")]) == 0
    out = torch.load(tmp_path / "avg.ckpt", weights_only=False)
    assert out["averaged_from"] == [str(ckpts / "step0000100.ckpt"), str(ckpts / "step0000250.ckpt")]


def test_average_refuses_a_checkpoint_of_another_config(tmp_path, capsys):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    _checkpoint(ckpts / "step0000001.ckpt", 1, seed=1)
    _checkpoint(ckpts / "step0000002.ckpt", 2, seed=2, d_model=8)
    out = tmp_path / "avg.ckpt"
    assert main(["average", "--run", str(tmp_path / "run"), "--last", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has another model config" in err and err.count("\n") == 1 and not out.exists()


def test_average_of_identical_checkpoints_is_that_checkpoint(trained, tmp_path):
    from aiayn.lightning_modules.use.checkpoints import average, periodic_checkpoints

    last = periodic_checkpoints(trained)[-1]
    out = average([last, last], tmp_path / "same.ckpt")
    a, b = torch.load(last, weights_only=False)["state_dict"], torch.load(out, weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_truncated_checkpoint_is_a_clear_error(trained, tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes((trained / "checkpoints" / "last.ckpt").read_bytes()[:1000])
    assert main(["eval", "--ckpt", str(bad)]) == 2
    assert "is unreadable" in capsys.readouterr().err


def write_pair(d: Path, split: str, src: list[str], tgt: list[str], gz: bool = False):
    d.mkdir(parents=True, exist_ok=True)
    for lang, lines in (("en", src), ("de", tgt)):
        data = ("\n".join(lines) + "\n").encode()
        if gz:
            (d / f"{split}.{lang}.gz").write_bytes(gzip.compress(data))
        else:
            (d / f"{split}.{lang}").write_bytes(data)


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "has no file"),
        ("empty", "is empty"),
        ("mismatch", "line"),
        ("utf8", "UTF-8"),
    ],
)
def test_bad_corpus_is_one_line_exit_2_and_writes_no_run(case, message, tmp_path, cache, capsys):
    data = tmp_path / "corpus"
    lines = [f"sentence number {i} ." for i in range(50)]
    for split in ("train", "dev", "test"):
        write_pair(data, split, lines, lines)
    if case == "missing":
        (data / "dev.de").unlink()
    elif case == "empty":
        (data / "test.en").write_text("")
    elif case == "mismatch":
        (data / "train.de").write_text("\n".join(lines[:40]) + "\n")
    elif case == "utf8":
        (data / "train.en").write_bytes(b"ok\n\xff\xfe broken\n" + b"x\n" * 48)
    out = tmp_path / "runs"
    code = main(["train", "--data", "files", "--data-dir", str(data), "--vocab-size", "60", "--out", str(out), *FAST])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("aiayn: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--row", "Z1"], "unknown row 'Z1'"),
        (["train", "--preset", "huge"], "unknown preset 'huge'"),
        (["train", "--data", "europarl"], "europarl"),
    ],
)
def test_bad_flags_are_one_line_exit_2(argv, message, tmp_path, cache, capsys):
    out = tmp_path / "runs"
    assert main([*argv, "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_the_disk_estimate_is_within_10_percent_of_a_full_size_runs_checkpoints(trained):
    """The tiny preset's base model (1M parameters): weights and Adam's moments are nearly all of a checkpoint."""
    from aiayn.lightning_modules.run.disk import checkpoint_bytes
    from aiayn.lightning_modules.run.spec import resolve

    estimate = checkpoint_bytes(resolve("base", "tiny").model.params(), 1000, weights_only=False)
    for name in ("step0000002.ckpt", "last.ckpt"):
        assert estimate == pytest.approx((trained / "checkpoints" / name).stat().st_size, rel=0.1), name


def test_translate_a_file(trained, tmp_path, capsys):
    src = tmp_path / "in.en"
    src.write_text("The dog sees the cat.\nToday the small boy sleeps in the garden.\n")
    out = tmp_path / "out.de"
    ckpt = trained / "checkpoints" / "last.ckpt"
    assert main(["translate", "--ckpt", str(ckpt), "--input", str(src), "--output", str(out), "--beam", "2"]) == 0
    assert len(out.read_text().splitlines()) == 2


def test_a_checkpoint_whose_weights_do_not_fit_its_config_is_a_clear_error(trained, tmp_path, capsys):
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=False)
    config = run_config(ckpt, "last.ckpt")  # weights of d_ff=512 under a config of d_ff=64
    ckpt["aiayn"]["config"] = replace(config, spec=config.spec.with_overrides({"d_ff": 64})).to_dict()
    bad = tmp_path / "other.ckpt"
    torch.save(ckpt, bad)
    assert main(["eval", "--ckpt", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "does not match its own config" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "break_it,says",
    [
        (lambda c: c["state_dict"].pop(next(iter(c["state_dict"]))), "missing"),
        (lambda c: c["state_dict"].update({k: v[:1] for k, v in list(c["state_dict"].items())[:1]}), "of shape"),
        (lambda c: c.update(optimizer_states=[]), "optimizer state is not the one Adam"),
        (lambda c: c["optimizer_states"][0].update(param_groups=[{"params": []}]), "holds 0 parameters"),
        (
            lambda c: c["optimizer_states"][0]["state"][0].update(exp_avg=torch.zeros(3)),
            "exp_avg of parameter 0 has shape [3]",
        ),
    ],
    ids=["a weight missing", "a weight of another shape", "no optimizer", "an empty optimizer", "a moment's shape"],
)
def test_a_checkpoint_that_does_not_fit_the_run_it_resumes_is_one_line_and_nothing_failed(
    trained, tmp_path, capsys, break_it, says
):
    """A readable checkpoint of this run whose tensors do not fit (a weight missing or of another shape, an empty
    optimizer state) was a load_state_dict traceback inside fit, and metrics.json was written failed: it is one
    line naming what does not fit and the fix, exit 2, and the run's records as they were."""
    import shutil

    run = tmp_path / "runs" / "tiny" / "synthetic" / "base" / "seed0"
    shutil.copytree(trained, run)
    before = (run / "metrics.json").read_text()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    break_it(ckpt)
    torch.save(ckpt, run / "checkpoints" / "last.ckpt")
    cheap = [a for a in FAST if a not in ("--max-steps", "2")]
    argv = ["train", "--row", "base", "--preset", "tiny", "--out", str(tmp_path / "runs"), *cheap, "--max-steps", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("aiayn: error:")]
    assert says in line and "move it out of" in line and "does not fit this run" in line and "Traceback" not in err
    assert (run / "metrics.json").read_text() == before and not list(run.parent.glob("*.failed.json"))


def test_wandb_offline_run_writes_its_files(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "runs"
    assert main(["train", "--row", "C1", "--preset", "tiny", "--out", str(out), "--logger", "csv,wandb", *FAST]) == 0
    run = out / "tiny" / "synthetic" / "C1" / "seed0"
    offline = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
    import wandb

    assert wandb.run is None  # finished: the next run in this process starts its own


def test_compile_auto_is_the_default_compiling_the_model_on_cuda_and_nothing_on_a_cpu(monkeypatch):
    """A GPU user gets the compiled model without knowing the flag (the first H200: 45.3 ms a paper step compiled
    against 74.2 eager); a CPU run stays eager, where compiling costs more than it saves."""
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.transformer import compiled
    from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig

    assert TrainOptions().compile == "auto"
    asked = []
    monkeypatch.setattr(compiled.torch, "compile", lambda fn, **kw: asked.append(kw.get("mode")) or fn)
    small = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=40, max_len=64)
    cpu = Transformer(small)
    assert compiled.compile_model(cpu, "auto", cuda=False) == 0 and not asked
    assert not hasattr(cpu.encode, "aiayn_compiled")
    gpu = Transformer(small)
    assert compiled.compile_model(gpu, "auto", cuda=True) == 1 and asked == [None, None]  # encoder and decoder whole
    assert hasattr(gpu.encode, "aiayn_compiled")


def test_a_compile_that_fails_under_auto_trains_eager_saying_why_in_one_line(caplog):
    """`--compile auto` falls back to eager on a compile error (one warning, the same numbers as eager); a
    `--compile` the user chose fails as it is."""
    import torch._dynamo

    from aiayn.lightning_modules.transformer import compiled
    from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig

    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    small = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=40, max_len=64)
    src = torch.tensor([[5, 6, 7, 3]])
    eager = Transformer(small).eval()  # no dropout: eager's numbers exactly
    expected = eager.encode(src)
    torch._dynamo.reset()
    auto = Transformer(small).eval()
    auto.load_state_dict(eager.state_dict())
    compiled.compile_model(auto, "auto", cuda=True, backend=broken)
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        first, again = auto.encode(src), auto.encode(src)
    same = torch.utils._pytree.tree_leaves
    assert all(torch.equal(a, b) for out in (first, again) for a, b in zip(same(out), same(expected)))
    said = [r for r in caplog.records if "--compile auto" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "training eager from here" in said[0].getMessage()
    assert "\n" not in said[0].getMessage()
    torch._dynamo.reset()
    chosen = Transformer(small)
    compiled.compile_model(chosen, "model", cuda=True, backend=broken)
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        chosen.encode(src)
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_backward_compile_that_fails_under_auto_trains_eager_saying_why_in_one_line(dynamic, caplog):
    """AOTAutograd compiles a backward graph at its first backward, which training runs as `loss.backward()`,
    outside the forward's guard: a backend whose backward compiler fails crashed `--compile auto` there. The backward
    is now compiled inside the guard when a call makes a new graph, so the failure is the forward's: one warning,
    then eager, whose gradients the step gets."""
    import torch._dynamo
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from aiayn.lightning_modules.transformer import compiled
    from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig

    def no_backward(gm, example_inputs):
        raise RuntimeError("no backward compiler here")

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=no_backward)
    small = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=40, max_len=64, P_drop=0.0)
    src, tgt = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]]), torch.tensor([[4, 5, 6], [7, 8, 0]])

    def grads(model):
        memory, mask = model.encode(src)
        model.decode(tgt, memory, mask).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    eager = Transformer(small)
    expected = grads(eager)
    torch._dynamo.reset()
    auto = Transformer(small)
    auto.load_state_dict(eager.state_dict())
    compiled.compile_model(auto, "auto", dynamic=dynamic, cuda=True, backend=backend)
    try:
        with caplog.at_level(logging.WARNING, logger=compiled.__name__):
            got = grads(auto)
    finally:
        torch._dynamo.reset()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))
    said = [r.getMessage() for r in caplog.records if r.name == compiled.__name__ and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "no backward compiler here" in said[0] and "training eager from here" in said[0]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["layers", "model"])
def test_a_compiled_model_trains_to_eagers_numbers(how, tmp_path):
    """--compile layers|model on CPU, through inductor: three optimizer steps on fixed batches, with
    length buckets (--pad-to 8, as a GPU run has them: one compile per shape), give eager's losses and weights within
    float rounding (dropout off: inductor draws its own masks). Tolerance: 1e-4 relative, loose against fp32 sums
    reordered by fusion, tight against a wrong kernel (a missing residual or norm moves the loss by 10% and more)."""
    from aiayn.lightning_modules.data.batching import collate
    from aiayn.lightning_modules.transformer.compiled import compile_model
    from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss
    from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig

    g = torch.Generator().manual_seed(0)

    def pair(i: int, n: int) -> tuple:
        return i, torch.randint(4, 50, (n,), generator=g).tolist(), torch.randint(4, 50, (n + 1,), generator=g).tolist()

    batches = [collate([pair(i, n) for i, n in enumerate((5, 7, 9, 11))], pad_to=8) for _ in range(3)]

    def train(compiled: str):
        torch.manual_seed(0)
        model = Transformer(TransformerConfig(N=2, d_model=32, d_ff=64, h=4, vocab_size=50, max_len=64, P_drop=0.0))
        compile_model(model, compiled, dynamic=False, shapes=1)  # one shape (lengths padded to 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # linear in the gradient: rounding stays rounding (Adam's
        losses, grads = [], None  # update divides by tiny second moments and would amplify it)
        for b in batches:
            memory, mask = model.encode(b["src"])
            loss, _, _ = projected_label_smoothed_loss(
                model.decode(b["tgt_in"], memory, mask), model.embed.weight, b["tgt_out"], 0.1
            )
            loss.backward()
            grads = grads or {k: p.grad.clone() for k, p in model.named_parameters()}  # the first step's
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, grads, {k: v.detach().clone() for k, v in model.state_dict().items()}

    eager_losses, eager_grads, eager_state = train("none")
    losses, grads, state = train(how)
    assert losses == pytest.approx(eager_losses, rel=1e-4)
    assert state.keys() == eager_state.keys()  # checkpoints load either way
    for k in grads:
        torch.testing.assert_close(grads[k], eager_grads[k], rtol=1e-3, atol=1e-6)
    for k in state:
        torch.testing.assert_close(state[k], eager_state[k], rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
@pytest.mark.parametrize("how", ["layers", "model"])
def test_compiled_training_covers_every_shape_and_evaluation_and_decoding_compile_nothing(how):
    """Counted with the eager backend (what dynamo traces, without inductor's codegen): with
    static shapes every training shape of an epoch (11 here, Multi30k's count at --pad-to 8) gets its graph without
    hitting dynamo's recompile limit (8 per function: it then ran the rest eager for good), and validation under
    inference mode, teacher-forced evaluation and beam search (a KV cache that grows every step) add no graph: the
    compiled code runs only in training. With the paper's dropout: the CPU dropout's in-place random_
    broke the graph, so each residual block became a compiled function of its own, guarded on the sublayer it wraps
    (attention or FFN), and `--compile model --static-shapes` hit the limit at shapes x sublayer kinds; no break now."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from aiayn.lightning_modules.transformer.compiled import compile_model
    from aiayn.lightning_modules.transformer.decoding import beam_search
    from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss
    from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig

    torch._dynamo.reset()
    counters.clear()
    limits = {
        n: getattr(torch._dynamo.config, n)
        for n in ("recompile_limit", "cache_size_limit")
        if hasattr(torch._dynamo.config, n)
    }
    try:
        torch.manual_seed(0)
        model = Transformer(TransformerConfig(N=2, d_model=16, d_ff=32, h=2, vocab_size=40, max_len=128, P_drop=0.1))
        shapes = [(max(1, 64 // n), n) for n in range(8, 96, 8)]  # (sentences, length): 11 buckets of width 8
        compile_model(model, how, dynamic=False, shapes=len(shapes), backend="eager")
        for b, n in shapes:
            src, tgt = torch.randint(4, 40, (b, n)), torch.randint(4, 40, (b, n))
            memory, mask = model.encode(src)
            loss, _, _ = projected_label_smoothed_loss(model.decode(tgt, memory, mask), model.embed.weight, tgt, 0.1)
            loss.backward()
        limited = [k for k in counters["unimplemented"] if "recompile limit" in k]
        assert not limited, "an epoch's shapes hit dynamo's recompile limit: the rest ran eager"
        assert not counters["graph_break"], f"graph breaks in the training step: {dict(counters['graph_break'])}"
        trained = counters["stats"]["unique_graphs"]
        assert trained >= len(shapes)
        with torch.inference_mode():  # validation
            model(torch.randint(4, 40, (3, 13)), torch.randint(4, 40, (3, 17)))
        with torch.no_grad():  # the final evaluation and translation
            model(torch.randint(4, 40, (5, 9)), torch.randint(4, 40, (5, 11)))
            beam_search(model, torch.randint(4, 40, (2, 7)), 2, 3, beam=2, alpha=0.6, extra_len=6)
        assert counters["stats"]["unique_graphs"] == trained, "evaluation or decoding compiled graphs of its own"
    finally:
        for name, value in limits.items():
            setattr(torch._dynamo.config, name, value)
        torch._dynamo.reset()


def test_the_progress_bar_names_the_steps_not_epoch_minus_two():
    """Lightning 2.6's Rich bar read "Epoch 0/-2" for a run bounded by steps (#21925); ours names the epoch
    and the step the run trains to."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

    from aiayn.lightning_modules.run.callbacks import StepsProgressBar, progress_bar

    if not _RICH_AVAILABLE:
        assert progress_bar() == []
        return
    bar = StepsProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=-1, max_steps=3000)
    assert bar._get_train_description(0).strip() == "Epoch 0 (to step 3000)"
    bar._trainer = SimpleNamespace(max_epochs=3, max_steps=-1)
    assert bar._get_train_description(1).strip() == "Epoch 1/2"
    assert isinstance(progress_bar()[0], StepsProgressBar)
