"""Options dataclasses generate the command line: one place for each default, and to_argv round-trips."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import typing

import pytest
import yaml

from aiayn import __version__
from aiayn.ablations.selection import Selection
from aiayn.bench import BenchOptions
from aiayn.cli import COMMANDS, build_parser
from aiayn.common.errors import UserError
from aiayn.common.options import from_args, to_argv
from aiayn.completion import CompletionOptions
from aiayn.doctor import DoctorOptions
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.use.options import (
    AverageOptions,
    EvalOptions,
    ExportOptions,
    ScoreOptions,
    TranslateOptions,
)
from aiayn.reports.options import ReportOptions
from aiayn.reports.rows import RowsOptions
from aiayn.sweeps.backends.slurm import SlurmOptions
from aiayn.sweeps.export import SweepExportOptions
from aiayn.sweeps.hpo import HPO_SKIP, HpoOptions
from aiayn.sweeps.status import StatusOptions
from aiayn.sweeps.table3 import PER_RUN, SweepOptions


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_train_defaults_are_the_dataclass_defaults():
    assert from_args(TrainOptions, parse("train")) == TrainOptions()
    assert from_args(BenchOptions, parse("bench")) == BenchOptions()


def test_to_argv_round_trips_through_the_train_parser():
    opts = TrainOptions(
        row="C3",
        preset="small",
        data="files",
        data_dir="/d",
        seed=3,
        devices=2,
        precision="bf16-mixed",
        max_steps=7,
        max_tokens=3000,
        wandb=True,
        progress=False,
        ckpt_every_minutes=2.5,
        overrides={"d_model": 256, "norm_first": True, "lr_factor": 0.5},
    )
    argv = to_argv(opts)
    assert "--no-progress" in argv and "--wandb" in argv and argv.count("--set") == 3
    assert from_args(TrainOptions, parse("train", *argv)) == opts
    assert to_argv(TrainOptions()) == []  # every default is left out ...
    assert to_argv(TrainOptions(), always=("row", "seed")) == ["--row", "base", "--seed", "0"]  # ... unless asked


def test_every_train_option_passes_through_table3_hpo_and_slurm():
    """A sweep's runs take every `aiayn train` option but the ones the sweep sets per run."""
    train_flags = {f.name for f in dataclasses.fields(TrainOptions) if f.metadata["aiayn.option"]["cli"]}
    per_run = {name.split(".", 1)[1] for name in PER_RUN}  # what the sweep sets, as the sweep says
    hpo_skips = {name.split(".", 1)[1] for name in HPO_SKIP}
    argv = to_argv(
        TrainOptions(
            preset="paper",
            precision="bf16-mixed",
            max_tokens=3125,
            vocab_size=8000,
            accelerator="cpu",
            overrides={"P_drop": 0.3},
            wandb=True,
        )
    )
    for command, cls, skipped in (("table3", SweepOptions, per_run), ("hpo", HpoOptions, hpo_skips)):
        got = from_args(cls, parse(command, *argv)).train
        assert (got.precision, got.max_tokens, got.vocab_size, got.overrides, got.wandb) == (
            "bf16-mixed",
            3125,
            8000,
            {"P_drop": 0.3},
            True,
        )
        dests = {a.dest for a in _subparser(command)._actions}
        assert {f"train__{n}" for n in train_flags - skipped} <= dests, command
    slurm = from_args(SlurmOptions, parse("slurm", "table3", *argv), kind="table3")
    assert slurm.train.max_tokens == 3125 and slurm.train.devices is None  # devices follow the SLURM resources


def _subparser(command: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command]


@pytest.mark.parametrize("cls", [TrainOptions, SweepOptions, Selection])
def test_every_option_is_in_one_help_section(cls):
    """`--help` in sections (the run, data, training, ...; the sweep, back end): each command-line field of the class
    in exactly one, and every name a section lists is a field (a new option, or a renamed one, must be placed). The
    nested option classes (a sweep's `select` and `train`) list their own."""
    listed = [name for _, names in cls.OPTION_GROUPS for name in names]
    hints = typing.get_type_hints(cls)
    options = [
        f.name
        for f in dataclasses.fields(cls)
        if f.metadata.get("aiayn.option", {}).get("cli", True) and not dataclasses.is_dataclass(hints[f.name])
    ]
    assert len(listed) == len(set(listed)), "an option in two sections"
    assert sorted(listed) == sorted(options)


@pytest.mark.parametrize(
    "command, expected",
    [
        ("train", ["the run", "data", "training", "validation", "checkpoints", "compile", "logging"]),
        ("table3", ["the sweep", "back end", "the run", "data", "training", "validation", "checkpoints"]),
    ],
)
def test_train_and_table3_help_are_in_sections(command, expected):
    out = subprocess.run([sys.executable, "-m", "aiayn", command, "--help"], capture_output=True, text=True)
    sections = [line[:-1] for line in out.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert sections[0] == "options" and sections[1 : 1 + len(expected)] == expected, sections


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


def _commands(parser=None, name="aiayn"):
    """(name, parser) of every command and subcommand."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for sub_name, sub in action.choices.items():
                yield f"{name} {sub_name}", sub, helps.get(sub_name)
                yield from _commands(sub, f"{name} {sub_name}")


def test_every_command_and_option_has_a_one_line_description():
    seen = 0
    for name, parser, help_text in _commands():
        assert help_text, f"`{name}` has no description in `aiayn --help`"
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue  # the dotted aliases (--train.max_steps) of options listed under their own flag
            assert action.help, f"{name} {'/'.join(action.option_strings) or action.dest} has no help text"
            seen += 1
    assert seen > 200


CONFIGURED = {
    "table3": (
        SweepOptions,
        "--rows base,A1 --jobs 1 --max-steps 3 --set N=1 --trainer log_every_n_steps=5 --fail-on-diverged".split(),
    ),
    "hpo": (HpoOptions, ["--trials", "4", "--row", "C1", "--max-tokens", "512", "--set", "h=2"]),
    "slurm table3": (
        SlurmOptions,
        [*"--partition gpu --time 01:00:00 --seeds 2 --preset small --setup".split(), "module load cuda"],
    ),
    "slurm train": (SlurmOptions, ["--row", "B1", "--gpus-per-node", "2", "--sbatch=--qos=high"]),
    "eval": (EvalOptions, ["--run", "r", "--split", "test", "--beam", "2"]),
    "translate": (TranslateOptions, ["--ckpt", "m.ckpt", "--alpha", "0.7", "--output", "o.txt"]),
    "export": (ExportOptions, ["--run", "r", "--out", "x", "--format", "ctranslate2", "--quantization", "int8"]),
    "doctor": (DoctorOptions, ["--steps", "5"]),
    "rows": (RowsOptions, ["--preset", "tiny", "--rows", "base,A1", "--extended", "--format", "json"]),
    "score": (ScoreOptions, ["--hyp", "h.txt", "--ref", "r.txt", "--lang", "en", "--json"]),
    "average": (AverageOptions, ["--run", "r", "--out", "a.ckpt", "--last", "3"]),
    "status": (StatusOptions, ["runs", "--json"]),
    "sweep export": (SweepExportOptions, ["--wandb", "--rows", "A", "--seeds", "2", "--out", "s.yaml"]),
    "report": (ReportOptions, ["--runs", "a", "--runs", "b", "--preset", "tiny"]),
    "completion": (CompletionOptions, ["zsh"]),
    "bench": (BenchOptions, ["--size", "paper", "--compile", "layers", "--steps", "2"]),
}


def test_every_command_is_one_entry_built_from_its_options_with_config_files():
    """Every subcommand is one (name, options dataclass, function) entry of COMMANDS, and every one takes
    --config and --print-config (bench's --config was a model size; it is --size now);
    CONFIGURED round-trips each of them."""
    leaves = {
        name.removeprefix("aiayn "): parser
        for name, parser, _ in _commands()
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    }
    assert set(leaves) == {c.name for c in COMMANDS} and len(leaves) == 17
    for command in COMMANDS:
        assert dataclasses.is_dataclass(command.options) and callable(command.run), command.name
        flags = {f for a in leaves[command.name]._actions for f in a.option_strings}
        assert {"--config", "--print-config"} <= flags, command.name
        if command.name != "train":  # train prints its resolved config.json: tests/test_config.py
            assert command.name in CONFIGURED, f"{command.name}: add it to CONFIGURED, so that its config round-trips"


def test_a_required_option_comes_from_the_command_line_or_a_config_file(tmp_path, capsys):
    from aiayn.cli import main

    assert main(["score", "--lang", "en"]) == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: --hyp, --ref" in err and err.count("\n") == 1
    (tmp_path / "c.yaml").write_text(f"hyp: {tmp_path / 'h.txt'}\nref: {tmp_path / 'r.txt'}\n")
    (tmp_path / "h.txt").write_text("ein kleines rotes Haus steht am Fluss .\n")
    (tmp_path / "r.txt").write_text("ein kleines rotes Haus steht am Fluss .\n")
    assert main(["score", "--config", str(tmp_path / "c.yaml"), "--json"]) == 0
    assert '"bleu": 100.0' in capsys.readouterr().out
    assert main(["status"]) == 2 and "required: OUT" in capsys.readouterr().err
    (tmp_path / "s.yaml").write_text(f"out: {tmp_path / 'none'}\n")
    assert main(["status", "--config", str(tmp_path / "s.yaml")]) == 2  # OUT from the file: then its own check
    assert f"{tmp_path / 'none'} does not exist" in capsys.readouterr().err


def _options(command: str, argv: list[str]):
    from aiayn.cli import parse

    cls = CONFIGURED[command][0]
    args = parse([*command.split(), *argv])
    return from_args(cls, args, **({"kind": args.slurm_command} if cls is SlurmOptions else {})), args


@pytest.mark.parametrize("command", CONFIGURED)
def test_print_config_is_yaml_that_config_reads_back_as_the_same_options(command, tmp_path, capsys):
    from aiayn.cli import main

    argv = CONFIGURED[command][1]
    opts, _ = _options(command, argv)
    assert main([*command.split(), *argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    first = "train" if "train" in {f.name for f in dataclasses.fields(CONFIGURED[command][0])} else None
    assert isinstance(yaml.safe_load(printed), dict) and (first is None or first in yaml.safe_load(printed))
    (tmp_path / "c.yaml").write_text(printed)
    again, _ = _options(command, ["--config", str(tmp_path / "c.yaml")])
    try:
        default = _options(command, [])[0]
    except UserError:  # a command with a required option (score, average, status, completion) has no default
        default = None
    assert again == opts != default
    assert not list(tmp_path.glob("runs*"))  # printing writes nothing


def test_a_config_file_nests_dots_or_flattens_and_the_command_line_overrides_it(tmp_path):
    files = {
        "nested": "jobs: 1\ntrain:\n  max_steps: 3\n  set: {N: 1}\nselect: {rows: base}\n",
        "dotted": "jobs: 1\ntrain.max_steps: 3\ntrain.overrides: {N: 1}\nselect.rows: base\n",
        "flat": "jobs: 1\nmax-steps: 3\nset: [N=1]\nrows: base\n",
    }
    got = []
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        got.append(_options("table3", ["--config", str(tmp_path / name)])[0])
    assert got[0] == got[1] == got[2]
    assert (got[0].jobs, got[0].train.max_steps, got[0].train.overrides, got[0].select.rows) == (1, 3, {"N": 1}, "base")
    over, _ = _options("table3", ["--config", str(tmp_path / "nested"), "--max-steps", "7", "--set", "h=2"])
    assert over.train.max_steps == 7 and over.train.overrides == {"N": 1, "h": 2}  # flags win; --set adds
    dotted, _ = _options("table3", ["--train.max_steps", "9", "--select.rows", "A1"])  # dotted flags, as in a file
    assert (dotted.train.max_steps, dotted.select.rows) == (9, "A1")


def test_config_files_layer_in_order_and_the_command_line_overrides_them_all(tmp_path):
    (tmp_path / "a.yaml").write_text("jobs: 1\ntrain:\n  max_steps: 3\n  set: {N: 1, h: 2}\n")
    (tmp_path / "b.yaml").write_text("train:\n  max_steps: 5\n  set: {h: 4}\n")
    ab, _ = _options("table3", ["--config", str(tmp_path / "a.yaml"), "--config", str(tmp_path / "b.yaml")])
    assert (ab.jobs, ab.train.max_steps, ab.train.overrides) == (1, 5, {"N": 1, "h": 4})  # b over a; --set merged
    ba, _ = _options("table3", ["--config", str(tmp_path / "b.yaml"), "--config", str(tmp_path / "a.yaml")])
    assert (ba.train.max_steps, ba.train.overrides) == (3, {"N": 1, "h": 2})
    flags, _ = _options(
        "table3", ["--config", str(tmp_path / "a.yaml"), "--config", str(tmp_path / "b.yaml"), "--max-steps", "7"]
    )
    assert flags.train.max_steps == 7
    (tmp_path / "t1.yaml").write_text("max_steps: 2\nseed: 3\n")
    (tmp_path / "t2.yaml").write_text("max_steps: 4\n")
    from aiayn.cli import parse as cli_parse

    run = from_args(
        TrainOptions, cli_parse(["train", "--config", str(tmp_path / "t1.yaml"), "--config", str(tmp_path / "t2.yaml")])
    )
    assert (run.max_steps, run.seed) == (4, 3)


def test_a_sweeps_nested_defaults_are_its_own():
    """A group's flags default to the group's default instance, not its class: `aiayn slurm`'s runs leave devices,
    nodes and strategy to the SLURM resources (the accelerator auto, as `aiayn table3`'s, resolved against them);
    a sweep's runs show no progress bars."""
    text = " ".join(_subparser("table3").format_help().split())
    sl = from_args(SlurmOptions, parse("slurm", "table3"), kind="table3")
    assert (sl.train.accelerator, sl.train.devices, sl.train.num_nodes, sl.train.strategy) == ("auto", None, None, None)
    assert from_args(SweepOptions, parse("table3")).train.progress is False
    assert "--accelerator ACCELERATOR Lightning accelerator: auto" in text


@pytest.mark.parametrize(
    "text,message",
    [
        ("train: {max_step: 3}\n", "unknown option 'train.max_step'"),
        ("select: {seeds: [1, 2]}\n", "select.seeds must be an integer or null, not [1, 2]"),
        ("fail_on_diverged: maybe\n", "fail_on_diverged must be true or false, not 'maybe'"),
        ("train: {max_steps: 2.5}\n", "train.max_steps must be an integer or null, not 2.5"),
        ("train: {data_dir: [a, b]}\n", "train.data_dir must be a string or null, not ['a', 'b']"),
        ("row: C1\n", "unknown option 'row'"),  # the sweep sets each run's row: not an option of table3
        ("jobs: -1\n", "argument --jobs: expected a positive integer, got -1"),
    ],
)
def test_a_bad_sweep_config_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    from aiayn.cli import main

    (tmp_path / "c.yaml").write_text(text)
    assert main(["table3", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_trainer_arguments_pass_through_and_the_ones_aiayn_sets_are_refused(capsys):
    from aiayn.cli import main

    opts, _ = _options(
        "table3",
        "--trainer log_every_n_steps=5 --trainer gradient_clip_val=1.0 --trainer limit_val_batches=0.5".split(),
    )
    assert opts.train.trainer == {"log_every_n_steps": 5, "gradient_clip_val": 1.0, "limit_val_batches": 0.5}
    assert from_args(TrainOptions, parse("train", *to_argv(opts.train))).trainer == opts.train.trainer  # to_argv
    for item, message in (
        ("max_steps=3", "use --max-steps"),
        ("precision=16", "use --precision"),
        ("log_every=3", "not an argument of lightning.pytorch.Trainer"),
    ):
        assert main(["train", "--trainer", item, "--print-config"]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion_completes_commands_and_their_flags(shell, tmp_path, capsys):
    from aiayn.cli import main

    assert main(["completion", shell]) == 0
    script = tmp_path / "aiayn.sh"
    script.write_text(capsys.readouterr().out)
    if shell == "zsh":
        assert script.read_text().startswith("#compdef aiayn") and "--max-steps" in script.read_text()
        return

    def complete(*words: str) -> list[str]:
        probe = (
            f"source {script}; COMP_WORDS=(aiayn {' '.join(words)}); COMP_CWORD={len(words)}; _shtab_aiayn; "
            'echo "${COMPREPLY[@]}"'
        )
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()

    assert complete("tab") == ["table3"] and complete("sta") == ["status"]
    assert complete("table3", "--max-s") == ["--max-steps"] and complete("hpo", "--spa") == ["--space"]
    # values: rows and groups, presets, loggers, corpora, and file names where a file is asked for
    # one row for --row (train refuses a group), rows and groups for --rows
    assert complete("train", "--row", "C") == ["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
    assert complete("table3", "--rows", "C") == ["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C"]
    (tmp_path / "runs").mkdir()
    assert complete("status", str(tmp_path / "ru")) == [str(tmp_path / "runs")]
    assert complete("table3", "--preset", "ti") == ["tiny", "tiny-2k"] and complete("train", "--logger", "ml") == [
        "mlflow"
    ]
    assert complete("train", "--data", "synthetic-") == ["synthetic-20", "synthetic-40"]
    (tmp_path / "rows.csv").write_text("row\n")
    assert complete("train", "--table", str(tmp_path / "ro")) == [str(tmp_path / "rows.csv")]


def test_fish_completion_completes_commands_flags_and_rows(tmp_path, capsys):
    """`aiayn completion fish` (shtab writes fish's too), read by fish itself where it is installed."""
    import shutil

    from aiayn.cli import main

    assert main(["completion", "fish"]) == 0
    script = tmp_path / "aiayn.fish"
    script.write_text(capsys.readouterr().out)
    if shutil.which("fish") is None:  # AIAYN_REQUIRE_FISH=1 (CI sets it, after installing fish): a failure
        reason = "fish is not installed here (apt-get install fish): the script was written, not read"
        if os.environ.get("AIAYN_REQUIRE_FISH") == "1":
            pytest.fail(reason)
        pytest.skip(reason)

    def complete(line: str) -> list[str]:
        probe = f"source {script}; complete -C '{line}'"
        out = subprocess.run(["fish", "-c", probe], capture_output=True, text=True, check=True).stdout
        return [candidate.split("\t")[0] for candidate in out.splitlines()]

    assert complete("aiayn tab") == ["table3"]
    assert complete("aiayn train --row C") == ["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
    assert "--max-steps" in complete("aiayn table3 --max-s") and complete("aiayn train --preset ti") == [
        "tiny",
        "tiny-2k",
    ]


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--model.d_model", "64"],
            "--model.d_model is LightningCLI's spelling; aiayn's model is a Table 3 row: `--row C3`, its knobs "
            "changed with `--set d_model=256 --set h=4`",
        ),
        (["--seed_everything", "3"], "--seed_everything is LightningCLI's spelling; aiayn's is `--seed`"),
        (
            ["--data.data_dir=x"],
            "--data.data_dir is LightningCLI's spelling; aiayn's data is a corpus name, `--data multi30k` (with "
            "`--data-dir` for its files)",
        ),
        (["--print_config=comments"], "--print_config=comments: aiayn's --print-config takes no value"),
    ],
)
def test_lightningclis_flag_spellings_get_the_hint_in_the_spelling_they_were_typed_in(capsys, argv, says):
    from aiayn.cli import main

    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert main(["train", "--data", "synthetic", "--print-config"]) == 0  # aiayn's own --data is not LightningCLI's


def test_lightning_users_spellings_are_accepted_or_answered_with_aiayns(capsys):
    """`--trainer.gradient_clip_val 1.0` (LightningCLI's dotted Trainer arguments), `--print_config` and
    `aiayn fit` were refused without a hint; the first two are accepted as aiayn's forms, the last is answered with
    aiayn's command. bench's old `--config SIZE` is answered with `--size`."""
    from aiayn.cli import main, parse

    args = parse(["train", "--trainer.gradient_clip_val", "1.0", "--trainer.log_every_n_steps=2", "--print_config"])
    aiayns = parse(["train", "--trainer", "gradient_clip_val=1.0", "--trainer", "log_every_n_steps=2"])
    assert from_args(TrainOptions, args).trainer == from_args(TrainOptions, aiayns).trainer
    assert set(from_args(TrainOptions, args).trainer) == {"gradient_clip_val", "log_every_n_steps"}
    assert args.print_config
    assert main(["fit", "--row", "base"]) == 2
    assert "aiayn has no `fit` command (LightningCLI's); `aiayn train` does that here" in capsys.readouterr().err
    assert main(["train", "--trainer.max_epochs"]) == 2
    assert "--trainer.max_epochs needs a value" in capsys.readouterr().err
    assert main(["bench", "--config", "paper"]) == 2
    assert "the model's size is --size paper" in capsys.readouterr().err


@pytest.mark.parametrize(
    "block, said",
    [
        (
            "model:\n  class_path: x.Transformer\n  init_args: {d_model: 256}\n",
            "`model:` is a LightningCLI config block",
        ),
        ("data:\n  class_path: MyData\n", "`data:` is a LightningCLI config block; aiayn's data is a corpus name"),
        ("seed_everything: 3\n", "aiayn's is `seed:`"),
        ("ckpt_path: last.ckpt\n", "a run resumes from its own directory by itself"),
    ],
)
def test_a_lightningcli_config_block_is_answered_not_taken_for_a_typo(tmp_path, capsys, block, said):
    """A LightningCLI `model:` block got "did you mean 'log_model'"; each of its blocks is named as
    LightningCLI's, with aiayn's way of saying the same, for train and for a sweep."""
    from aiayn.cli import main

    path = tmp_path / "lightning.yaml"
    path.write_text(block)
    for command in ("train", "table3"):
        assert main([command, "--config", str(path), "--print-config"]) == 2
        err = capsys.readouterr().err
        assert said in err and "did you mean" not in err and err.count("\n") == 1
