"""`aiayn`: the command line, the top of the import graph.

The commands are data (COMMANDS): each one a name, its options dataclass in the layer that does the work and the
function that calls that layer and prints the result. Every parser is generated from those dataclasses by
aiayn.common.commands, with --config/--print-config on each; nothing else is decided here. Heavy imports (torch,
Lightning, pandas) happen inside the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from aiayn import __version__
from aiayn.bench import BenchOptions
from aiayn.common import commands
from aiayn.common.commands import Command
from aiayn.common.errors import UserError, print_error
from aiayn.common.lifetime import DIE_WITH_PARENT, die_with_parent
from aiayn.common.logs import configure_logging
from aiayn.completion import CompletionOptions
from aiayn.doctor import DoctorOptions
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.use.options import (
    EXPORT_SKIP,
    AverageOptions,
    EvalOptions,
    ExportOptions,
    ScoreOptions,
    TranslateOptions,
)
from aiayn.reports.options import ReportOptions, sweep_report_writer
from aiayn.reports.rows import RowsOptions
from aiayn.sweeps.backends import command_of
from aiayn.sweeps.backends.slurm.options import ONE_RUN, SlurmOptions
from aiayn.sweeps.export import SweepExportOptions
from aiayn.sweeps.hpo import HPO_SKIP, HpoOptions
from aiayn.sweeps.status import StatusOptions
from aiayn.sweeps.table3 import PER_RUN, SWEEP_SETS, SweepOptions, backend_commands

log = logging.getLogger("aiayn")


# ---- one run: each command is a function of its options (and the parsed namespace, for what it alone reads)


def cmd_rows(opts, args) -> None:
    from aiayn.reports.rows import show_rows

    print(show_rows(opts))


def cmd_train(opts, args) -> None:
    from aiayn.lightning_modules.run.spec import spec_for

    spec = spec_for(opts, args.recorded)  # a row or table mistake is told before lightning's import (seconds)
    from aiayn.lightning_modules.run.train import print_plan, train, with_recorded_tokenizer

    opts = with_recorded_tokenizer(opts, spec, args.recorded)
    if args.print_config:
        return print_plan(opts, spec)
    metrics = train(opts, spec)
    if metrics is not None:  # none on a DDP rank but 0, or when the run was checkpointed for a SLURM requeue
        print(metrics.summary_line())


def cmd_eval(opts, args) -> None:
    from aiayn.lightning_modules.use.commands import evaluate_test_set

    print(json.dumps(evaluate_test_set(opts), indent=2))


def cmd_score(opts, args) -> None:
    from aiayn.lightning_modules.use.commands import score_files, score_text

    result = score_files(opts)
    print(json.dumps(result, indent=2) if opts.json else score_text(result))


def cmd_translate(opts, args) -> None:
    from aiayn.lightning_modules.use.commands import translate_file

    translate_file(opts)


def cmd_export(opts, args) -> None:
    from aiayn.lightning_modules.use.export import export

    print(f"exported to {export(opts)}")


def cmd_average(opts, args) -> None:
    from aiayn.lightning_modules.use.commands import average_last

    print(average_last(opts))


def cmd_bench(opts, args) -> None:
    from aiayn.bench.main import bench

    bench(opts)


def cmd_doctor(opts, args) -> int:
    from aiayn.doctor.checks import main as doctor_main

    return doctor_main(opts)


# ---- many runs


def _print_paths(paths) -> None:
    for path in paths:
        print(path)


def cmd_report(opts, args) -> None:
    from aiayn.reports.options import report_command

    _print_paths(report_command(opts))


def cmd_table3(opts, args) -> int:
    from aiayn.sweeps.table3 import table3

    return table3(opts, sweep_report_writer(opts.train))


def cmd_hpo(opts, args) -> int:
    from aiayn.sweeps.hpo import hpo_exit_status, run_hpo

    result = run_hpo(opts)
    print(json.dumps(result, indent=2))
    return hpo_exit_status(result)


def cmd_slurm(opts, args) -> int:
    from aiayn.sweeps.backends.slurm import slurm

    return slurm(opts, sweep_report_writer(opts.train))


def cmd_status(opts, args) -> None:
    from aiayn.sweeps.status import status_text

    sys.stdout.write(status_text(opts))


def cmd_completion(opts, args) -> None:
    from aiayn.completion import completion_script

    sys.stdout.write(completion_script(build_parser(), opts.shell))


def cmd_sweep_export(opts, args) -> None:
    from aiayn.sweeps.export import export_sweep

    text = export_sweep(opts)
    if text is not None:
        sys.stdout.write(text)


# ---- the commands, as data: each one (name, help, options dataclass, function); the parsers are built from them


GROUPS = {  # the commands with subcommands
    "slurm": "submit Table 3 (or one run) to SLURM as a job array; requeued on preemption",
    "sweep": "sweep definitions generated from ablations/",
}


COMMANDS = (
    Command("rows", "the Table 3 rows resolved at a preset (no training)", RowsOptions, cmd_rows),
    Command(
        "train",
        "train one (row, preset, corpus, seed); reruns resume",
        TrainOptions,
        cmd_train,
        own_print=True,
        config_help="start from a run's config.json (it trains that run again) or a YAML file of these options; "
        "repeatable, later files over earlier ones; flags given here override them (--set and --table add to "
        "them)",
        print_help="print the run's resolved config.json (JSON, which --config reads back) and exit: "
        "nothing prepared, trained or written",
    ),
    Command(
        "eval", "BLEU (sacreBLEU and tokenized) and perplexity on --src/--ref files or a split", EvalOptions, cmd_eval
    ),
    Command(
        "translate", "translate sentences (a file or stdin) with a run or a checkpoint", TranslateOptions, cmd_translate
    ),
    Command(
        "export",
        "a trained model for Hugging Face Transformers (MarianMTModel) or CTranslate2",
        ExportOptions,
        cmd_export,
        skip=EXPORT_SKIP,
    ),
    Command("score", "BLEU of any system's output: sacreBLEU and the paper's tokenized BLEU", ScoreOptions, cmd_score),
    Command("bench", "training and decoding speed, side by side with peers", BenchOptions, cmd_bench),
    Command(
        "doctor",
        "check this machine's GPUs for aiayn in a few minutes: a pass/fail/skip table and a JSON for bug reports",
        DoctorOptions,
        cmd_doctor,
    ),
    Command(
        "table3",
        "run Table 3 as a sweep (Optuna keeps the books), then write the report",
        SweepOptions,
        cmd_table3,
        skip=PER_RUN,
        sets=SWEEP_SETS,
    ),
    *backend_commands(sweep_report_writer),  # `aiayn table3 --backend NAME`, for each back end with options
    Command("slurm train", "one run", SlurmOptions, cmd_slurm, skip=ONE_RUN, fixed=(("kind", "train"),)),
    Command(
        "hpo",
        "Optuna TPE over the lr factor, warmup and dropout of one row, pruned on val/ppl",
        HpoOptions,
        cmd_hpo,
        skip=HPO_SKIP,
        sets=SWEEP_SETS[:2],
    ),
    Command(
        "status",
        "the state of every (row, seed) of the sweeps under OUT: completed, running (host and age), "
        "failed (its reason), pending; trains and writes nothing",
        StatusOptions,
        cmd_status,
    ),
    Command("sweep export", "write a sweep definition (to stdout without --out)", SweepExportOptions, cmd_sweep_export),
    Command(
        "report", "Table 3 report tables and plots from every metrics.json under --runs", ReportOptions, cmd_report
    ),
    Command(
        "completion",
        'print a shell completion script: `eval "$(aiayn completion bash)"` in ~/.bashrc (zsh: '
        "`aiayn completion zsh > ~/.zfunc/_aiayn`)",
        CompletionOptions,
        cmd_completion,
    ),
    Command("average", "average the last k periodic checkpoints of a run", AverageOptions, cmd_average),
)


# ---- the parser (aiayn.common.commands builds it from COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    """The `aiayn` parser, every subcommand built from COMMANDS."""
    return commands.build_parser(
        COMMANDS,
        GROUPS,
        prog="aiayn",
        version=__version__,
        description="Table 3 of 'Attention Is All You Need', as experiments.",
    )


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line (--config files layered under the flags: aiayn.common.commands.parse); `aiayn table3
    --backend NAME ...`, where back end NAME has options of its own, is that back end's command (`--backend slurm`:
    `aiayn slurm table3 ...`, whose --help lists SLURM's options)."""
    return commands.parse(build_parser(), commands.route(list(argv), "table3", "--backend", command_of))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if os.environ.get(DIE_WITH_PARENT) == "1":  # a sweep's trainer: it ends when its driver does
        die_with_parent()
    try:
        args = parse(argv)
    except UserError as e:
        return print_error(e)
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return commands.run(args.command_of, args)  # 0, or the command's own exit status (1: a run failed)
    except UserError as e:
        return print_error(e)
    except BrokenPipeError:  # `aiayn rows | head`: the reader left; what it read is all it wanted
        return commands.closed_stdout()
    except OSError as e:  # stdout on a full disk (`aiayn completion bash > /dev/full`): one line, exit 2
        return commands.unwritable_stdout(e)


if __name__ == "__main__":
    sys.exit(main())
