"""Options dataclasses generate the command line: one place for each default, and to_argv round-trips."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from aiayn import __version__
from aiayn.bench import BenchOptions
from aiayn.cli import build_parser
from aiayn.common.options import from_args, to_argv
from aiayn.lightning_modules.options import TrainOptions
from aiayn.sweeps.hpo import HpoOptions
from aiayn.sweeps.slurm import SlurmOptions
from aiayn.sweeps.table3 import SweepOptions


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_train_defaults_are_the_dataclass_defaults():
    assert from_args(TrainOptions, parse("train")) == TrainOptions()
    assert from_args(BenchOptions, parse("bench")) == BenchOptions()


def test_to_argv_round_trips_through_the_train_parser():
    opts = TrainOptions(
        row="C3", preset="small", data="files", data_dir="/d", seed=3, devices=2, precision="bf16-mixed",
        max_steps=7, max_tokens=3000, wandb=True, progress=False, ckpt_every_minutes=2.5,
        overrides={"d_model": 256, "norm_first": True, "lr_factor": 0.5},
    )  # fmt: skip
    argv = to_argv(opts)
    assert "--no-progress" in argv and "--wandb" in argv and argv.count("--set") == 3
    assert from_args(TrainOptions, parse("train", *argv)) == opts
    assert to_argv(TrainOptions()) == []  # every default is left out ...
    assert to_argv(TrainOptions(), always=("row", "seed")) == ["--row", "base", "--seed", "0"]  # ... unless asked


def test_every_train_option_passes_through_table3_hpo_and_slurm():
    """A sweep's runs take every `aiayn train` option but the ones the sweep sets per run."""
    train_flags = {f.name for f in dataclasses.fields(TrainOptions) if f.metadata["aiayn.option"]["cli"]}
    per_run = {"row", "seed", "progress"}
    argv = to_argv(TrainOptions(preset="paper", precision="bf16-mixed", max_tokens=3125, vocab_size=8000,
                                accelerator="cpu", overrides={"P_drop": 0.3}, wandb=True))  # fmt: skip
    for command, cls, skipped in (("table3", SweepOptions, per_run), ("hpo", HpoOptions, {"progress"})):
        got = from_args(cls, parse(command, *argv)).train
        assert (got.precision, got.max_tokens, got.vocab_size, got.overrides, got.wandb) == (
            "bf16-mixed", 3125, 8000, {"P_drop": 0.3}, True,
        )  # fmt: skip
        dests = {a.dest for a in _subparser(command)._actions}
        assert {f"train__{n}" for n in train_flags - skipped} <= dests, command
    slurm = from_args(SlurmOptions, parse("slurm", "table3", *argv), kind="table3")
    assert slurm.train.max_tokens == 3125 and slurm.train.devices is None  # devices follow the SLURM resources


def _subparser(command: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command]


def test_help_shows_defaults_and_allowed_values():
    text = " ".join(_subparser("train").format_help().split())
    assert "(default: tiny)" in text and "(default: auto)" in text
    assert "{auto,cpu,cuda}" in _subparser("bench").format_help()
    assert "--no-progress" in text and "KEY=VALUE" in text


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_python_m_aiayn(argv):
    proc = subprocess.run([sys.executable, "-m", "aiayn", *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (f"aiayn {__version__}" if argv == ["--version"] else "usage: aiayn") in proc.stdout
