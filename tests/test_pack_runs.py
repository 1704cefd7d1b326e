"""Packs as runs (lightning_modules/run/pack.py): `aiayn train --pack-seeds` leaves each seed a run of its
own (config.json, curve, last.ckpt, metrics.json), trains each as `aiayn train` trains it alone with its recorded
config, keeps a diverged seed to itself, and resumes after a kill."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from aiayn.cli import main

ROOT = Path(__file__).resolve().parents[1]

SMALL = [
    "--row",
    "base",
    "--preset",
    "tiny",
    "--set",
    "N=1 d_model=32 d_ff=64 h=2",
    "--val-every",
    "6",
    "--val-bleu-sentences",
    "0",
    "--eval-subset",
    "4",
    "--accelerator",
    "cpu",
    "--no-progress",
]


def curve(run, metric: str) -> pd.Series:
    df = pd.read_csv(run / "logs" / "version_0" / "metrics.csv")
    return df[["step", metric]].dropna().set_index("step")[metric]


def weights(run) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_each_seed_of_a_packed_run_is_a_run_that_trains_as_it_would_alone(cache, tmp_path, capsys):
    """Two seeds packed: each has its run directory (config.json recording the seed alone with the counter stream,
    metrics.json, a curve with train/loss and the scheduled val/ppl, a last.ckpt that translate and export read); the
    seeds saw different sentences; and seed 1 trained alone from its config.json has the same curve and weights."""
    from aiayn.lightning_modules.run.module import TranslationModule

    assert main(["train", *SMALL, "--pack-seeds", "0,1", "--max-steps", "12", "--out", str(tmp_path / "p")]) == 0
    base = tmp_path / "p/tiny/synthetic/base"
    assert sorted(p.name for p in base.iterdir()) == ["pack-seed0-seed1", "seed0", "seed1"]
    for seed in (0, 1):
        run = base / f"seed{seed}"
        metrics = json.loads((run / "metrics.json").read_text())
        assert (metrics["status"], metrics["seed"], metrics["steps"]) == ("completed", seed, 12)
        options = json.loads((run / "config.json").read_text())["options"]
        assert (options["seed"], options["dropout_rng"], options.get("pack_seeds")) == (seed, "counter", None)
        assert options["batch_order_seed"] == seed  # its own batch order, as a separate run's
        assert {5, 11} <= set(curve(run, "val/ppl").index)  # after steps 6 and 12 (and the stability rule's)
        assert TranslationModule.from_checkpoint(run / "checkpoints" / "last.ckpt").cfg.d_model == 32
    # the disk `--print-config` says a pack keeps: its folder's one file (no periodic one due in 12 steps), the seeds'
    files = [
        base / "pack-seed0-seed1/checkpoints/last.ckpt",
        *(base / f"seed{s}/checkpoints/last.ckpt" for s in (0, 1)),
    ]
    assert sorted(p.name for p in (base / "pack-seed0-seed1/checkpoints").iterdir()) == ["last.ckpt"]
    assert main(["train", *SMALL, "--pack-seeds", "0,1", "--max-steps", "12", "--print-config"]) == 0
    said = capsys.readouterr().err.split("about ")[1].split(" = the pack's 1 x ")[0]
    assert float(said.split()[0]) * {"kB": 1e3, "MB": 1e6}[said.split()[1]] == pytest.approx(
        sum(f.stat().st_size for f in files), rel=0.1
    )
    tokens = [curve(base / f"seed{s}", "train/tgt_tokens_per_step").tolist() for s in (0, 1)]
    assert tokens[0] != tokens[1]  # each seed's own batches

    alone = tmp_path / "alone"
    assert main(["train", "--config", str(base / "seed1/config.json"), "--out", str(alone)]) == 0
    run = alone / "tiny/synthetic/base/seed1"
    for metric in ("train/loss", "val/ppl"):
        packed, single = curve(base / "seed1", metric), curve(run, metric)
        assert list(packed.index) == list(single.index)
        assert packed.tolist() == pytest.approx(single.tolist(), rel=1e-4), metric
    mine, theirs = weights(base / "seed1"), weights(run)
    for name, value in mine.items():
        if not name.endswith("w_k.bias"):  # an exact gradient of 0: Adam turns rounding into steps (test_packed.py)
            torch.testing.assert_close(value, theirs[name], rtol=1e-3, atol=1e-3, msg=name)


@pytest.mark.parametrize("static", [False, True])
def test_a_packs_seeds_draw_their_own_batch_orders_and_a_shared_one_pads_little(cache, static):
    """A pack is K runs: by default each seed draws its own batch order, as separate runs do, static shapes or not
    (with static shapes they shared the first seed's, a random factor the replicates' spread was never tested
    against), and the stacked step then holds a quarter more positions or more than the seeds' own batches. With one
    order shared (--batch-order-seed: each seed's sentences in the lengths of one seed's) it holds at most 5% more
    (static shapes: none more)."""
    import importlib.util

    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.pack import seed_options

    script = importlib.util.spec_from_file_location("pack_padding", ROOT / "scripts" / "pack_padding.py")
    counted = importlib.util.module_from_spec(script)
    script.loader.exec_module(counted)  # scripts/pack_padding.py's count, which BENCHMARKS.md cites

    seeds = (0, 1, 2, 3)
    alone = TrainOptions(
        row="base", preset="tiny", accelerator="cpu", static_shapes=static, pad_to=8 if static else None
    )
    assert [seed_options(alone, s, seeds).batch_order_seed for s in seeds] == list(seeds)
    stacked, own = counted.positions([seed_options(alone, s, seeds) for s in seeds], 60)
    assert stacked >= 1.25 * own  # measured 1.62x (1.30x with static shapes)
    shared = replace(alone, batch_order_seed=0)
    stacked, own = counted.positions([seed_options(shared, s, seeds) for s in seeds], 60)
    assert stacked <= (1.0 if static else 1.05) * own


def test_a_packs_room_for_shapes_covers_its_seeds_mixed_static_batches(cache):
    """With static shapes and each seed its own order, a step's stacked shape mixes its seeds' buckets: the count a
    compiled pack makes room for (recompile limit, CUDA graphs) bounds the shapes an epoch's steps really take."""
    from aiayn.lightning_modules.data.batching import batch_shapes
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.pack import PackData, seed_options
    from aiayn.lightning_modules.run.spec import spec_of
    from aiayn.lightning_modules.run.train import plan

    seeds = (0, 1, 2, 3)
    alone = TrainOptions(row="base", preset="tiny", accelerator="cpu", static_shapes=True, pad_to=8)
    dms = []
    for s in seeds:
        o = seed_options(alone, s, seeds)
        dms.append(plan(o, spec_of(o)).dm)
    data = PackData(dms)
    data.setup("fit")
    steps = []
    for dm in dms:
        sampler = dm._samplers["train"]
        steps.append(
            [
                batch_shapes([b], sampler.src_lens, sampler.tgt_lens, pad_to=8, square=True).pop()
                for b in sampler.all_batches(0)
            ]
        )
    stacked = {tuple(map(max, zip(*step))) for step in zip(*steps)}
    own = set().union(*(dm.train_shapes() for dm in dms))
    assert stacked - own, "no step mixed its seeds' buckets"  # a shape no seed's batch has
    assert len(stacked) <= data.train_shape_count()


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_pack_compiled_as_graphs_trains_to_the_eager_packs_numbers(cache, tmp_path, monkeypatch, caplog):
    """`--pack-seeds 0,1 --compile graphs --static-shapes`: the packed static-shape step compiled
    whole (CUDA graphs on a CUDA device; here dynamo's tracing with the eager backend, the fallback said once): each
    seed's curve is the eager pack's, and no function hit the recompile limit."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setenv("AIAYN_COMPILE_BACKEND", "eager")
    flags = [*SMALL, "--pack-seeds", "0,1", "--max-steps", "12", "--static-shapes", "--pad-to", "8"]
    assert main(["train", *flags, "--out", str(tmp_path / "eager")]) == 0
    torch._dynamo.reset()
    counters.clear()
    try:
        with caplog.at_level("INFO"):
            assert main(["train", *flags, "--compile", "graphs", "--out", str(tmp_path / "graphs")]) == 0
        # dynamo's own count (its log does not reach caplog: torch's loggers do not propagate)
        assert counters["stats"]["unique_graphs"] > 0
        assert not [k for k in counters["unimplemented"] if "recompile limit" in k], "a function ran eager for good"
    finally:
        torch._dynamo.reset()
    assert caplog.text.count("CUDA graphs need a CUDA device") == 1
    for seed in (0, 1):
        runs = [tmp_path / how / f"tiny/synthetic/base/seed{seed}" for how in ("eager", "graphs")]
        assert json.loads((runs[1] / "config.json").read_text())["options"]["compile"] == "graphs"
        for metric in ("train/loss", "val/ppl"):
            eager, graphed = curve(runs[0], metric), curve(runs[1], metric)
            assert list(eager.index) == list(graphed.index)
            assert graphed.tolist() == pytest.approx(eager.tolist(), rel=1e-4), (seed, metric)


def test_a_seed_that_diverges_in_a_pack_is_reported_alone(cache, tmp_path, monkeypatch):
    """Seed 1's loss goes NaN at step 4: its metrics.json says diverged at 4, its last.ckpt holds its finite
    weights of step 3, and seed 0 trains to the end, completed."""
    from aiayn.lightning_modules.run import pack as run_pack

    real = run_pack.packed_loss

    def poisoned(model, src, *args):
        loss, nll, n = real(model, src, *args)
        if model.training and poisoned.module.trainer.global_step == 3:
            loss = loss * torch.tensor([1.0, float("nan")])
        return loss, nll, n

    init = run_pack.PackModule.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        poisoned.module = self

    monkeypatch.setattr(run_pack, "packed_loss", poisoned)
    monkeypatch.setattr(run_pack.PackModule, "__init__", remember)
    argv = ["train", *SMALL, "--pack-seeds", "0,1", "--max-steps", "8", "--trainer", "log_every_n_steps=1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    base = tmp_path / "tiny/synthetic/base"
    dead = json.loads((base / "seed1/metrics.json").read_text())
    assert (dead["status"], dead["diverged_at_step"]) == ("diverged", 4)
    assert json.loads((base / "seed0/metrics.json").read_text())["status"] == "completed"
    ckpt = torch.load(base / "seed1/checkpoints/last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    monkeypatch.setattr(run_pack, "packed_loss", real)  # the same pack, unpoisoned, 3 steps: seed 1's weights then
    assert main(["train", *SMALL, "--pack-seeds", "0,1", "--max-steps", "3", "--out", str(tmp_path / "three")]) == 0
    then = weights(tmp_path / "three/tiny/synthetic/base/seed1")
    assert all(torch.equal(value, then[name]) for name, value in ckpt["state_dict"].items())
    assert curve(base / "seed1", "train/loss").index.max() < 3 <= curve(base / "seed0", "train/loss").index.max()


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_killed_pack_resumes_to_the_numbers_of_one_that_was_not(cache, tmp_path):
    """A pack killed (SIGKILL) after its step-10 checkpoint, run again with the same command, ends with each seed's
    weights and final curve bit-equal to a pack that ran through."""
    argv = ["train", *SMALL, "--pack-seeds", "2,5", "--max-steps", "24", "--ckpt-every", "10"]
    assert main([*argv, "--out", str(tmp_path / "through")]) == 0
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [sys.executable, "-m", "aiayn", *argv, "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = out / "tiny/synthetic/base/pack-seed2-seed5/checkpoints/step0000010.ckpt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert checkpoint.exists() and not (out / "tiny/synthetic/base/seed2/metrics.json").exists()
    assert main([*argv, "--out", str(out)]) == 0
    for seed in (2, 5):
        a, b = (tmp_path / "through", out)
        run_a, run_b = (x / f"tiny/synthetic/base/seed{seed}" for x in (a, b))
        wa, wb = weights(run_a), weights(run_b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert (
            json.loads((run_b / "metrics.json").read_text())["dev_ppl"]
            == json.loads((run_a / "metrics.json").read_text())["dev_ppl"]
        )


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_seed_of_a_pack_left_unrecorded_resumes_with_its_pack_not_from_step_0(cache, tmp_path, capsys):
    """One seed of a completed pack loses its metrics.json (as a kill between the seeds' evaluations leaves it): the
    same command resumes the whole pack from its checkpoint and records that seed from the pack's weights (its
    numbers the same), not a pack of one from step 0 in a folder of its own; the done seed is not recorded again."""
    argv = ["train", *SMALL, "--pack-seeds", "0,1", "--max-steps", "4", "--out", str(tmp_path)]
    assert main(argv) == 0
    base = tmp_path / "tiny" / "synthetic" / "base"
    before = json.loads((base / "seed1" / "metrics.json").read_text())
    (base / "seed1" / "metrics.json").unlink()
    stamp = (base / "seed0" / "metrics.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(argv) == 0
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == ["pack-seed0-seed1", "seed0", "seed1"]
    after = json.loads((base / "seed1" / "metrics.json").read_text())
    assert (after["status"], after["steps"], after["dev_ppl"]) == ("completed", 4, before["dev_ppl"])
    assert (base / "seed0" / "metrics.json").stat().st_mtime_ns == stamp


def test_a_seed_trained_in_a_pack_is_not_extended_alone(cache, tmp_path, capsys):
    """`aiayn train` asked for more steps of a seed whose last.ckpt a pack wrote: one line naming the pack (its
    optimizer state is the pack's), not a silent start from step 0."""
    assert main(["train", *SMALL, "--pack-seeds", "0,1", "--max-steps", "4", "--out", str(tmp_path)]) == 0
    argv = ["train", *SMALL, "--seed", "0", "--max-steps", "6", "--out", str(tmp_path), "--dropout-rng", "counter"]
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err.count("pack-seed0-seed1") == 1
    assert not (tmp_path / "tiny/synthetic/base/seed0/logs/version_1").exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--pack-seeds", "3"], "two or more different seeds"),
        (["--pack-seeds", "1,1"], "two or more different seeds"),
        (["--pack-seeds", "0,x"], "two or more different seeds"),
        (["--pack-seeds", "0,1", "--devices", "2"], "one device"),
        (["--pack-seeds", "0,1", "--val-bleu-sentences", "5"], "--val-bleu-sentences 0"),
        (["--pack-seeds", "0,1", "--logger", "wandb"], "--logger wandb"),
        (["--pack-seeds", "0,18446744073709551616"], "seeds from 0 to 9999"),
        (["--pack-seeds", ",".join(map(str, range(40)))], "a pack trains at most 16"),
        (["--pack-seeds", "0,1", "--seed", "5"], "--seed 5 beside --pack-seeds"),
        (["--pack-seeds", "0,1", "--trainer", "gradient_clip_val=1.0"], "coupling them"),
    ],
)
def test_what_a_pack_cannot_do_is_one_line_and_writes_nothing(tmp_path, capsys, flags, says):
    argv = ["train", "--row", "base", "--preset", "tiny", "--accelerator", "cpu", "--out", str(tmp_path / "o")]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not (tmp_path / "o").exists()


def test_a_pack_under_bf16_mixed_keeps_its_residual_stream_in_bf16_by_default(cache, tmp_path, monkeypatch):
    """A pack takes the residual stream's dtype as a run alone does: bf16 under bf16-mixed by default (auto), fp32
    with --residual-dtype fp32; set on the packed model before it is compiled or trained."""
    from aiayn.lightning_modules.run import pack as P
    from aiayn.lightning_modules.run.options import TrainOptions

    class Built(Exception):
        pass

    def seen(model, dtype):
        raise Built(dtype, type(model).__name__, model.encoder[0].self_attn.w_q.weight.dim())

    monkeypatch.setattr(P, "residual_stream", seen)
    for flag, dtype in (("auto", torch.bfloat16), ("fp32", None)):
        opts = TrainOptions(
            row="base",
            preset="tiny",
            out=str(tmp_path / flag),
            pack_seeds="0,1",
            precision="bf16-mixed",
            residual_dtype=flag,
            accelerator="cpu",
            progress=False,
            val_bleu_sentences=0,
        )
        with pytest.raises(Built) as built:
            P.train_pack(opts)
        assert built.value.args == (dtype, "Transformer", 3)  # the packed model: its weights (K, out, in)


# ---- the sweep's packs (aiayn table3 --pack)


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_sweep_packs_a_rows_seeds_and_its_books_hold_each_pair(cache, tmp_path):
    """`aiayn table3 --pack 2` over 3 seeds of base and C4: in each row seeds 0 and 1 train as one pack (its
    checkpoint folder beside them) and seed 2 alone, never with the other row's seeds; every pair completed in the
    books, each with its own metrics.json; the same command again trains nothing."""
    argv = [
        "table3",
        "--preset",
        "tiny",
        "--rows",
        "base,C4",
        "--seeds",
        "3",
        "--jobs",
        "1",
        "--pack",
        "2",
        "--set",
        "N=1 d_model=32 d_ff=64 h=2",
        "--max-steps",
        "6",
        "--val-every",
        "3",
        "--eval-subset",
        "4",
        "--accelerator",
        "cpu",
        "--report",
        "",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    for row in ("base", "C4"):
        found = sorted(p.name for p in (tmp_path / "tiny/synthetic" / row).iterdir() if p.is_dir())
        assert found == ["pack-seed0-seed1", "seed0", "seed1", "seed2"], row
        for seed in (0, 1, 2):
            metrics = json.loads((tmp_path / "tiny/synthetic" / row / f"seed{seed}/metrics.json").read_text())
            assert (metrics["status"], metrics["row"], metrics["seed"], metrics["steps"]) == ("completed", row, seed, 6)
    base = tmp_path / "tiny/synthetic/base"
    packed = json.loads((base / "seed1/config.json").read_text())["options"]
    alone = json.loads((base / "seed2/config.json").read_text())["options"]
    assert (packed["dropout_rng"], alone["dropout_rng"]) == ("counter", "torch")
    assert "pack-seed0-seed1" not in (base / "seed2.log").read_text()
    assert "one pack with seeds 0, 1" in (base / "seed1.log").read_text()
    stamp = (base / "seed0/metrics.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (base / "seed0/metrics.json").stat().st_mtime_ns == stamp


def test_a_sweeps_workers_claim_each_rows_seeds_as_one_pack(tmp_path, monkeypatch):
    """`--jobs 4 --pack 4` over 4 seeds of base and C4: four workers start at once, yet each row's seeds train as one
    pack. Claimed one pop at a time, the workers dealt a row's seeds among themselves (a pack of one each: no
    packing at all on a GPU sweep's --jobs 8); a worker now claims its whole pack under a lock of its own. The pops
    are slowed here so that the workers interleave."""
    import contextlib
    import threading

    from conftest import RunnerBackend, StepsRunner

    from aiayn.ablations.selection import Selection
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.sweeps import books
    from aiayn.sweeps.backends.local import LocalBackend
    from aiayn.sweeps.table3 import SweepOptions, table3

    groups, lock = [], threading.Lock()

    class Recording(LocalBackend):
        def run_pack(self, sweep, row, seeds, slot):
            with lock:
                groups.append((row, tuple(seeds)))
            return [self.run_one(sweep, row, seed, slot) for seed in seeds]

    real = books.pop_and_claim

    @contextlib.contextmanager
    def slow(*args, **kwargs):
        with real(*args, **kwargs) as got:
            time.sleep(0.05)  # the pop lock is free: another worker may pop now
            yield got

    monkeypatch.setattr(books, "pop_and_claim", slow)
    train = TrainOptions(preset="tiny", out=str(tmp_path / "runs"), progress=False, val_bleu_sentences=0)
    opts = SweepOptions(select=Selection(rows="base,C4", seeds=4), report="", jobs=4, pack="4", train=train)
    assert table3(opts, backend=RunnerBackend(StepsRunner(), base=Recording)) == 0
    assert sorted(groups) == [("C4", (0, 1, 2, 3)), ("base", (0, 1, 2, 3))]


def test_pack_auto_packs_on_a_gpu_only_and_where_every_run_can_be_packed(tmp_path, monkeypatch):
    """--pack auto: up to 8 seeds a pack where the runs train on a GPU; none on a CPU, or where a run validates BLEU;
    a pack is a need of the sweep (a back end that cannot pack is not chosen, and refused when named); a number that
    cannot be honoured is one line."""
    from dataclasses import replace

    from aiayn.common.errors import UserError
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.sweeps import table3
    from aiayn.sweeps.backends import backend_for, load, needs
    from aiayn.sweeps.table3 import SweepOptions, build_sweep, pack_size

    sweep = build_sweep(SweepOptions(train=TrainOptions(preset="tiny", out=str(tmp_path))))
    monkeypatch.setattr(table3, "visible_gpus", lambda: [])
    assert pack_size("auto", sweep) == 1  # a CPU: a pack trains about as fast as its seeds apart
    monkeypatch.setattr(table3, "visible_gpus", lambda: ["0"])
    assert pack_size("auto", sweep) == table3.AUTO_PACK == 8
    assert (pack_size("off", sweep), pack_size("4", sweep)) == (1, 4)
    sweep.pack = 4
    assert needs(sweep)["packs"] and backend_for(None, sweep).capabilities.packs
    assert not load()["slurm"].capabilities.packs
    with pytest.raises(UserError, match="pass auto, off"):
        pack_size("many", sweep)
    sweep.train = replace(sweep.train, val_bleu_sentences=5)
    assert pack_size("auto", sweep) == 1
    with pytest.raises(UserError, match=r"--pack 4 validates perplexity only.*--val-bleu-sentences 5 was asked"):
        pack_size("4", sweep)
    sweep.train = replace(sweep.train, val_bleu_sentences=None, preset="laptop")
    with pytest.raises(UserError, match=r"preset laptop decodes 200\)"):
        pack_size("4", build_sweep(SweepOptions(train=sweep.train)))


def test_the_evidence_tables_packs_are_counted_for_one_wave(tmp_path):
    """`pack_count`: a row's seeds make ceil(seeds / K) packs; the evidence table's 43 runs are 11 packs at K 8, the
    --jobs that gpu-check.sh gives its whole-table stage so that every pack trains at once."""
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.sweeps.table3 import SweepOptions, build_sweep, pack_count

    sweep = build_sweep(SweepOptions(train=TrainOptions(preset="evidence", out=str(tmp_path))))
    assert (len(sweep.pairs), pack_count(sweep), pack_count(sweep, 2)) == (43, 11, 25)
    assert "pack_count(build_sweep(" in (ROOT / "scripts" / "gpu-check.sh").read_text()


def test_slurm_refuses_pack_in_one_line(tmp_path, capsys):
    """The SLURM array trains one pair a task: `aiayn table3 --backend slurm --pack 4` is refused, with the reason."""
    assert main(["table3", "--backend", "slurm", "--pack", "4", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pack" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_seed_begun_alone_is_not_restarted_by_a_pack(cache, tmp_path, capsys):
    """A seed with a checkpoint of its own (trained alone, capped at 4 steps): `--pack-seeds` naming it is refused in
    one line (a pack would train it again from step 0); the sweep's worker runs it on alone, packing only the rest."""
    flags = [*SMALL, "--max-steps", "4", "--ckpt-every", "2", "--out", str(tmp_path)]
    assert main(["train", *flags, "--seed", "0"]) == 0
    capsys.readouterr()
    assert main(["train", *SMALL, "--pack-seeds", "0,1", "--max-steps", "6", "--out", str(tmp_path)]) == 2
    assert "seed 0 has a checkpoint of its own" in capsys.readouterr().err
    argv = [
        "table3",
        "--preset",
        "tiny",
        "--rows",
        "base",
        "--seeds",
        "3",
        "--jobs",
        "1",
        "--pack",
        "3",
        "--set",
        "N=1 d_model=32 d_ff=64 h=2",
        "--max-steps",
        "6",
        "--val-every",
        "3",
        "--eval-subset",
        "4",
        "--accelerator",
        "cpu",
        "--report",
        "",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    base = tmp_path / "tiny/synthetic/base"
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == ["pack-seed1-seed2", "seed0", "seed1", "seed2"]
    assert [json.loads((base / f"seed{s}/metrics.json").read_text())["steps"] for s in (0, 1, 2)] == [6, 6, 6]
    assert json.loads((base / "seed0/config.json").read_text())["options"]["dropout_rng"] == "torch"  # resumed alone


class Foreign:
    """Not a tensor, a number or a container: a checkpoint holding one is a pickle that runs code."""


@pytest.mark.slow
def test_a_packs_checkpoint_is_read_with_a_runs_checks_in_one_line_each(cache, tmp_path, capsys):
    """A shorter budget than the pack trained, a truncated or pickled or foreign checkpoint, a pack folder that is a
    file: each one line and exit 2 (a shorter budget was recorded as done, the rest were tracebacks that marked the
    seeds failed); a kill's temporary file in the pack's checkpoints is removed at the restart."""
    out = tmp_path / "o"
    argv = ["train", *SMALL, "--pack-seeds", "0,1", "--out", str(out)]
    assert main([*argv, "--max-steps", "4"]) == 0
    pack = out / "tiny" / "synthetic" / "base" / "pack-seed0-seed1"
    last = pack / "checkpoints" / "last.ckpt"
    good = last.read_bytes()
    capsys.readouterr()

    def refused(says: str) -> None:
        assert main([*argv, "--max-steps", "6"] if "shortened" not in says else [*argv, "--max-steps", "2"]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("INFO ", "WARNING "))]
        assert len(err) == 1 and says in err[0], err

    refused("a run cannot be shortened")
    for s in (0, 1):  # the seeds' records lost: the pack's checkpoint alone says how far it trained
        (out / "tiny" / "synthetic" / "base" / f"seed{s}" / "metrics.json").unlink()
    refused("a run cannot be shortened")
    last.write_bytes(good[: len(good) // 2])
    refused("is unreadable")
    torch.save({"global_step": 4, "x": Foreign()}, last)  # a pickle that would run code on load
    refused("cannot resume the pack from checkpoint")
    last.write_bytes(good)
    state = torch.load(last, weights_only=False)
    state["aiayn_pack"] = {**state["aiayn_pack"], "seeds": [0, 7]}
    torch.save(state, last)
    refused("holds the pack of seeds [0, 7]")
    last.write_bytes(good)
    stale = pack / "checkpoints" / ".last.ckpt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    assert main([*argv, "--max-steps", "6"]) == 0 and not stale.exists()
    shutil.rmtree(pack)
    pack.write_text("not a folder")
    for s in (0, 1):
        (out / "tiny" / "synthetic" / "base" / f"seed{s}" / "metrics.json").unlink()
    capsys.readouterr()
    assert main([*argv, "--max-steps", "8"]) == 2
    assert "is not a folder" in capsys.readouterr().err


def _training_step():
    from aiayn.lightning_modules.run.pack import PackModule

    return PackModule.training_step


TRAINING_STEP = _training_step()


def operators_of_a_trainers_step(cache, tmp_path, monkeypatch, seeds: str) -> list[int]:
    """The ATen operators each `training_step` of a pack ran through the Trainer (a CPU counts them as a GPU would
    launch them): the step's forward, from the batch Lightning hands it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from aiayn.lightning_modules.run.pack import PackModule

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    counts, step = [], TRAINING_STEP

    def counted(self, batch, batch_idx):
        Count.n = 0
        with Count():
            out = step(self, batch, batch_idx)
        counts.append(Count.n)
        return out

    monkeypatch.setattr(PackModule, "training_step", counted)
    monkeypatch.setenv("AIAYN_CACHE", str(cache))
    argv = ["train", *SMALL, "--out", str(tmp_path / seeds.replace(",", "-")), "--max-steps", "3"]
    assert main([*argv, "--pack-seeds", seeds, "--batch-order-seed", "0"]) == 0
    return counts


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_packs_step_through_the_trainer_launches_as_many_operators_for_any_number_of_seeds(
    cache, tmp_path, monkeypatch
):
    """The K seeds' batches were moved to the device one by one and stacked there (K copies, K pads and a
    concatenation of each tensor, every step: about 4K launches): they are stacked on the host before Lightning
    moves them, so a step's operators through the Trainer are the same for 2 seeds and for 4."""
    two = operators_of_a_trainers_step(cache, tmp_path, monkeypatch, "0,1")
    four = operators_of_a_trainers_step(cache, tmp_path, monkeypatch, "0,1,2,3")
    assert len(two) == len(four) == 3 and two[0] > 100  # a whole forward was counted
    assert two == four
