"""`aiayn`: the command line, the top of the import graph.

The commands are data (COMMANDS): each one a name, its options dataclass in the layer that does the work and the
function that calls that layer and prints the result. Every parser is generated from those dataclasses
(aiayn.common.options), with --config/--print-config on each; nothing else is decided here. Heavy imports (torch,
Lightning, pandas) happen inside the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiayn import __version__
from aiayn.bench import BENCH_SIZES, BenchOptions
from aiayn.common.errors import UserError, print_error
from aiayn.common.lifetime import DIE_WITH_PARENT, die_with_parent
from aiayn.common.logs import configure_logging
from aiayn.common.options import (
    HelpFormatter,
    add_options,
    config_values,
    defaults_of,
    from_args,
    read_mapping,
    to_config,
)
from aiayn.completion import CompletionOptions
from aiayn.doctor import DoctorOptions
from aiayn.lightning_modules.run.options import (
    AverageOptions,
    EvalOptions,
    ExportOptions,
    ScoreOptions,
    TrainOptions,
    TranslateOptions,
)
from aiayn.reports.options import ReportOptions
from aiayn.reports.rows import RowsOptions
from aiayn.sweeps.books import report_dir
from aiayn.sweeps.export import SweepExportOptions
from aiayn.sweeps.hpo import HpoOptions
from aiayn.sweeps.slurm import SlurmOptions
from aiayn.sweeps.status import StatusOptions
from aiayn.sweeps.table3 import SweepOptions, exit_status, summary_line

log = logging.getLogger("aiayn")


# ---- one run: each command is a function of its options (and the parsed namespace, for what it alone reads)


def cmd_rows(opts, args) -> None:
    from aiayn.reports.rows import show_rows

    print(show_rows(opts))


def cmd_train(opts, args) -> None:
    from aiayn.lightning_modules.run.spec import spec_for
    from aiayn.lightning_modules.run.train import plan, train, with_recorded_tokenizer

    spec = spec_for(opts, args.recorded)
    opts = with_recorded_tokenizer(opts, spec, args.recorded)
    if args.print_config:
        from aiayn.lightning_modules.run.disk import estimate

        print(json.dumps(plan(opts, spec).config.to_dict(), indent=2))
        # on stderr, so that stdout stays the config.json that `aiayn train --config` reads back
        print(f"# {estimate(opts, spec).describe()}", file=sys.stderr)
        return
    metrics = train(opts, spec)
    if metrics is not None and metrics.status == "diverged":
        print(f"{metrics.row} seed {metrics.seed}: diverged ({metrics.error}); metrics.json status diverged")
    elif metrics is not None:
        print(
            f"{metrics.row} seed {metrics.seed}: dev BLEU {metrics.dev_bleu:.2f} (sacreBLEU), "
            f"dev PPL {metrics.dev_ppl:.2f}, {metrics.params / 1e6:.2f}M params, {metrics.steps} steps "
            f"in {metrics.train_time_s:.0f} s ({metrics.tokens_per_s:.0f} tokens/s)"
        )


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
    if opts.trainer:
        from aiayn.bench.trainer import main as bench_main
    else:
        from aiayn.bench.run import main as bench_main
    bench_main(opts)


def cmd_doctor(opts, args) -> None:
    from aiayn.doctor.checks import main as doctor_main

    status = doctor_main(opts)
    if status:
        raise SystemExit(status)


# ---- many runs


def _print_paths(paths) -> None:
    for path in paths:
        print(path)


def cmd_report(opts, args) -> None:
    from aiayn.reports.options import report_command

    _print_paths(report_command(opts))


def cmd_table3(opts, args) -> None:
    from aiayn.common.files import check_writable_dir
    from aiayn.sweeps.storage import check_url
    from aiayn.sweeps.table3 import run_table3

    check_writable_dir(opts.train.out, "--out")
    report = report_dir(opts.report, opts.train.out)
    if report:
        check_writable_dir(report, "--report")
    if opts.storage:
        check_url(opts.storage)  # before the sweep takes its setup lock under --out
    summary = run_table3(opts)
    print(summary_line(summary, opts))
    if report:
        from aiayn.lightning_modules.run.loggers import of as loggers_of
        from aiayn.reports.build import report as write_report

        _print_paths(write_report(opts.train.out, report, opts.train.preset, wandb="wandb" in loggers_of(opts.train)))
    status = exit_status(summary, opts.fail_on_diverged)
    if status:
        raise SystemExit(status)


def cmd_hpo(opts, args) -> None:
    from aiayn.sweeps.hpo import run_hpo

    result = run_hpo(opts)
    print(json.dumps(result, indent=2))
    if result["best_trial"] is None:
        raise SystemExit(1)  # every trial pruned or failed: a result of the search, not a usage error (2)


def cmd_slurm(opts, args) -> None:
    from aiayn.sweeps.backends.slurm import SlurmBackend, summary_text

    backend, sweep = SlurmBackend.from_options(opts)  # checked, and the rows resolved once
    summary = backend.launch(sweep, sweep.pairs)
    if opts.dry_run and summary.get("text"):
        sys.stdout.write(summary["text"])
    print(summary_text(summary, opts))
    results = summary.get("results", {})
    for pair, status in results.items():
        print(f"{pair}: {status}")
    report = report_dir(opts.report, opts.train.out)
    if opts.kind == "table3" and report and "completed" in results.values():
        from aiayn.reports.build import report as write_report

        _print_paths(write_report(opts.train.out, report, opts.train.preset))
    if any(status != "completed" for status in results.values()):
        raise SystemExit(1)


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


@dataclass(frozen=True)
class Command:
    """One subcommand. `name` is its words after `aiayn` ("slurm table3"); its parser is `options`'s fields
    (`skip`: those it does not take, by dotted path), plus --config/--print-config unless `config` is False (bench
    reads its own); `fixed`: (field, value) pairs the command itself sets (slurm's kind); `own_print`: `run`
    answers --print-config itself (train prints the resolved config.json)."""

    name: str
    help: str
    options: type
    run: Callable[[Any, argparse.Namespace], None]
    skip: tuple[str, ...] = ()
    config: bool = True
    own_print: bool = False
    fixed: tuple[tuple[str, Any], ...] = ()
    config_help: str = ""
    print_help: str = ""


# Options a sweep sets for each of its runs, not the user.
PER_RUN = ("train.row", "train.seed", "train.progress")
HPO_SKIP = ("train.progress",)
EXPORT_SKIP = ("model.ct2", "model.device", "model.max_tokens", "model.ct2_batching")  # what an export does not read
ONE_RUN = ("select.rows", "select.extended", "select.seeds", "select.base_seeds", "select.first_seed", "report",
           "train.progress")  # fmt: skip
GROUPS = {  # the commands with subcommands
    "slurm": "submit Table 3 (or one run) to SLURM as a job array; requeued on preemption",
    "sweep": "sweep definitions generated from ablations/",
}


COMMANDS = (
    Command("rows", "the Table 3 rows resolved at a preset (no training)", RowsOptions, cmd_rows),
    Command("train", "train one (row, preset, corpus, seed); reruns resume", TrainOptions, cmd_train, own_print=True,
            config_help="start from a run's config.json (it trains that run again) or a YAML file of these options; "
            "repeatable, later files over earlier ones; flags given here override them (--set and --table add to "
            "them)", print_help="print the run's resolved config.json (JSON, which --config reads back) and exit: "
            "nothing prepared, trained or written"),
    Command("eval", "BLEU (sacreBLEU and tokenized) and perplexity on --src/--ref files or a split", EvalOptions,
            cmd_eval),
    Command("translate", "translate sentences (a file or stdin) with a run or a checkpoint", TranslateOptions,
            cmd_translate),
    Command("export", "a trained model for Hugging Face Transformers (MarianMTModel) or CTranslate2", ExportOptions,
            cmd_export, skip=EXPORT_SKIP),
    Command("score", "BLEU of any system's output: sacreBLEU and the paper's tokenized BLEU", ScoreOptions, cmd_score),
    Command("bench", "training and decoding speed, side by side with peers", BenchOptions, cmd_bench),
    Command("doctor", "check this machine's GPUs for aiayn in a few minutes: a pass/fail/skip table and a JSON for "
            "bug reports", DoctorOptions, cmd_doctor),
    Command("table3", "run Table 3 as a sweep (Optuna keeps the books), then write the report", SweepOptions,
            cmd_table3, skip=PER_RUN),
    Command("slurm table3", "one array task per pending (row, seed)", SlurmOptions, cmd_slurm, skip=PER_RUN,
            fixed=(("kind", "table3"),)),
    Command("slurm train", "one run", SlurmOptions, cmd_slurm, skip=ONE_RUN, fixed=(("kind", "train"),)),
    Command("hpo", "Optuna TPE over lr factor, warmup, dropout, label smoothing of one row", HpoOptions, cmd_hpo,
            skip=HPO_SKIP),
    Command("status", "the state of every (row, seed) of the sweeps under OUT: completed, running (host and age), "
            "failed (its reason), pending; trains and writes nothing", StatusOptions, cmd_status),
    Command("sweep export", "write a sweep definition (to stdout without --out)", SweepExportOptions,
            cmd_sweep_export),
    Command("report", "Table 3 report tables and plots from every metrics.json under --runs", ReportOptions,
            cmd_report),
    Command("completion", "print a shell completion script: `eval \"$(aiayn completion bash)\"` in ~/.bashrc (zsh: "
            "`aiayn completion zsh > ~/.zfunc/_aiayn`)", CompletionOptions, cmd_completion),
    Command("average", "average the last k periodic checkpoints of a run", AverageOptions, cmd_average),
)  # fmt: skip


# ---- the parser


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (`aiayn: error: …; <fix>`, exit 2), not usage + error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # `--max-step` is a typo answered with "did you mean", not a guess
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message}; see `{self.prog} --help`")


def _config_arguments(p, command: Command) -> None:
    """--config FILE and --print-config for `command`."""
    p.add_argument("--config", metavar="FILE", action="append", default=None, help=command.config_help or (
        "a YAML file of these options (what --print-config prints; nested by group or dotted, e.g. train.max_steps); "
        "repeatable, later files over earlier ones; flags given here override them all"))  # fmt: skip
    p.add_argument("--print-config", action="store_true", help=command.print_help or (
        "print these options as YAML (every value, the config file included) and exit: `--config` of that file runs "
        "the same command"))  # fmt: skip


def _print_config(opts, command: Command) -> None:
    """Print `opts` as the YAML that --config reads back, secrets masked."""
    import yaml

    from aiayn.common.secrets import redact

    text = yaml.safe_dump(to_config(opts, skip=command.skip), sort_keys=False)
    masked = redact(text)  # a password in --storage, a key in --setup: never printed, so never in a file from it
    sys.stdout.write(masked)
    if masked != text:
        print(
            "aiayn: secrets in these options are printed as ***: put them back where the file is read (e.g. "
            "--storage 'postgresql://user:$PGPASSWORD@host/db', expanded from the environment)",
            file=sys.stderr,
        )


def build_parser() -> argparse.ArgumentParser:
    """The `aiayn` parser, every subcommand built from COMMANDS."""
    p = _Parser(prog="aiayn", description="Table 3 of 'Attention Is All You Need', reproduced.")
    p.add_argument("--version", action="version", version=f"aiayn {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    groups = {}
    for command in COMMANDS:
        words = command.name.split()
        where = sub
        if len(words) == 2:
            if words[0] not in groups:
                group = sub.add_parser(words[0], help=GROUPS[words[0]])
                groups[words[0]] = group.add_subparsers(dest=f"{words[0]}_command", required=True,
                                                        parser_class=_Parser)  # fmt: skip
            where = groups[words[0]]
        cp = where.add_parser(words[-1], help=command.help)
        add_options(cp, command.options, skip=command.skip)
        if command.config:
            _config_arguments(cp, command)
        cp.set_defaults(command_of=command)
    _own_parsers(p)
    return p


def _own_parsers(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's parser records itself (`args.parser_of`), so an unknown flag is matched against its options."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                sub.set_defaults(parser_of=sub)
                _own_parsers(sub)


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line. `--config FILE` (every command but bench; repeatable): each FILE's options, in
    order, become the command's parser's defaults (argparse's own layering; a later file's value replaces an earlier
    one's, and `set`/`trainer` mappings merge key by key), so the flags given on the command line override them all."""
    from aiayn.common.options import lightning_spellings

    argv = lightning_spellings(argv)
    parser = build_parser()
    args = _parse_known(parser, argv)
    command = getattr(args, "command_of", None)
    if getattr(args, "config", None) and command is not None and command.config:
        cls, skip, sub = command.options, command.skip, args.parser_of
        values, recorded = {}, None
        for path in args.config:
            if cls is TrainOptions:  # a YAML file of options, or a run's own config.json (its spec comes too)
                from aiayn.lightning_modules.run.options import read_config_file

                config = read_config_file(path)
                layer = config.values
                recorded = config if config.spec is not None else recorded
            else:
                if cls is BenchOptions and path in BENCH_SIZES:  # bench's model size was --config before issue 39
                    raise UserError(f"--config {path}: --config is a YAML file of options; the model's size is "
                                    f"--size {path}")  # fmt: skip
                doc = read_mapping(path, f"a YAML file of `{sub.prog}` options (e.g. what --print-config prints)")
                layer = config_values(cls, doc, f"config {path}", sub.prog, skip=skip)
            for key, value in layer.items():
                both = isinstance(value, dict) and isinstance(values.get(key), dict)
                values[key] = {**values[key], **value} if both else value
        sub.set_defaults(**defaults_of(cls, values, skip=skip))
        args = _parse_known(parser, argv)
        args.recorded = recorded  # the last run config.json among them (its spec, tokenizer and path)
    else:
        args.recorded = None
    return args


# options a sweep sets for each of its runs, and what to use instead
SWEEP_SETS = {
    "--row": "choose the rows with --rows", "--seed": "choose the seeds with --seeds and --first-seed",
    "--progress": "its runs print one line each as they end", "--no-progress": "its runs print one line each as they "
    "end, without progress bars",
}  # fmt: skip


def _parse_known(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args`, with an unknown flag answered by the nearest option of its own subcommand."""
    from aiayn.common.options import did_you_mean

    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    sub = getattr(args, "parser_of", parser)
    word = next((w for w in extra if w.startswith("-")), extra[0]).split("=")[0]
    flags = [f for p in (sub, parser) for a in p._actions for f in a.option_strings if a.help != argparse.SUPPRESS]
    if word in SWEEP_SETS and sub.prog.split()[-1] in ("table3", "hpo"):
        raise UserError(f"{sub.prog} sets {word} for each of its runs ({SWEEP_SETS[word]}); leave it out")
    near = did_you_mean(word, flags) if word.startswith("--") else ""
    raise UserError(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {near[1:-1]}?)" if near else "")
                    + f"; see `{sub.prog} --help`")  # fmt: skip


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
        run(args.command_of, args)
    except UserError as e:
        return print_error(e)
    except BrokenPipeError:  # `aiayn rows | head`: the reader left; what it read is all it wanted
        return closed_stdout()
    return 0


def closed_stdout() -> int:
    """After the reader of stdout closed the pipe: point stdout at /dev/null so that Python's own flush at exit does
    not raise again, and exit as a program killed by SIGPIPE does (128 + 13), silently."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def run(command: Command, args: argparse.Namespace) -> None:
    """`command` with its options built from `args` (and checked: a required one missing is one line), or, with
    --print-config, those options printed."""
    opts = from_args(command.options, args, **dict(command.fixed))
    if command.config and args.print_config and not command.own_print:
        _print_config(opts, command)
        return
    command.run(opts, args)


if __name__ == "__main__":
    sys.exit(main())
