"""`aiayn`: the command line, the top of the import graph.

Each subcommand turns its arguments into the options dataclass of the layer that does the work (the
parsers are generated from those dataclasses: aiayn.common.options), calls that layer's function,
and prints the result. Heavy imports (torch, Lightning) happen inside the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from aiayn import __version__
from aiayn.bench import BenchOptions
from aiayn.common.errors import UserError, print_error
from aiayn.common.lifetime import DIE_WITH_PARENT, die_with_parent
from aiayn.common.logs import configure_logging
from aiayn.common.options import (
    HelpFormatter,
    add_options,
    config_values,
    defaults_of,
    from_args,
    positive_int,
    read_mapping,
    to_config,
)
from aiayn.doctor import DoctorOptions
from aiayn.lightning_modules.run.options import EvalOptions, ExportOptions, TrainOptions, TranslateOptions
from aiayn.sweeps.books import report_dir
from aiayn.sweeps.hpo import HpoOptions
from aiayn.sweeps.slurm import SlurmOptions
from aiayn.sweeps.table3 import SweepOptions, exit_status, summary_line

log = logging.getLogger("aiayn")

# Options a sweep sets for each of its runs, not the user.
PER_RUN = ("train.row", "train.seed", "train.progress")
HPO_SKIP = ("train.progress",)
EXPORT_SKIP = ("model.ct2", "model.device", "model.max_tokens", "model.ct2_batching")  # what an export does not read


# ---- one run


def cmd_rows(args) -> None:
    from aiayn.ablations.presets import get_preset
    from aiayn.reports.rows import rows_records, rows_text

    preset = get_preset(args.preset)
    records = rows_records(args.rows, preset, extended=args.extended, tables=tuple(args.table or ()))
    print(json.dumps(records, indent=2) if args.format == "json" else rows_text(records, preset))


def cmd_train(args) -> None:
    from aiayn.lightning_modules.run.spec import spec_for
    from aiayn.lightning_modules.run.train import plan, train, with_recorded_tokenizer

    opts = from_args(TrainOptions, args)
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


def cmd_eval(args) -> None:
    from aiayn.lightning_modules.use.commands import evaluate_test_set

    opts = from_args(EvalOptions, args)
    if not _print_config(opts, args):
        print(json.dumps(evaluate_test_set(opts), indent=2))


def cmd_score(args) -> None:
    from aiayn.lightning_modules.use.commands import score_files

    result = score_files(args.hyp, args.ref, args.lang)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"BLEU {result['bleu']:.2f} ({result['bleu_signature']})")
        print(f"tokenized BLEU {result['tok_bleu']:.2f} ({result['tok_bleu_label']})")


def cmd_translate(args) -> None:
    from aiayn.lightning_modules.use.commands import translate_file

    opts = from_args(TranslateOptions, args)
    if not _print_config(opts, args):
        translate_file(opts)


def cmd_export(args) -> None:
    from aiayn.lightning_modules.use.export import export

    opts = from_args(ExportOptions, args)
    if not _print_config(opts, args):
        print(f"exported to {export(opts)}")


def cmd_average(args) -> None:
    from aiayn.lightning_modules.use.commands import average_last

    print(average_last(args.run, args.last, args.out))


def cmd_bench(args) -> None:
    opts = from_args(BenchOptions, args)
    if opts.trainer:
        from aiayn.bench.trainer import main as bench_main
    else:
        from aiayn.bench.run import main as bench_main
    bench_main(opts)


def cmd_doctor(args) -> None:
    from aiayn.doctor.checks import main as doctor_main

    opts = from_args(DoctorOptions, args)
    if _print_config(opts, args):
        return
    status = doctor_main(opts)
    if status:
        raise SystemExit(status)


# ---- many runs


def _report(runs_dir, out_dir, preset: str | None, wandb: bool = False) -> None:
    from aiayn.reports.build import report

    for path in report(runs_dir, out_dir, preset, wandb=wandb):
        print(path)


def cmd_report(args) -> None:
    from aiayn.common.files import check_writable_dir

    runs = args.runs or ["runs"]
    out = args.out or str(Path(runs[0]) / "reports")
    check_writable_dir(out, "--out")
    _report(runs, out, args.preset, wandb=args.wandb)


def cmd_table3(args) -> None:
    from aiayn.common.files import check_writable_dir
    from aiayn.sweeps.storage import check_url
    from aiayn.sweeps.table3 import run_table3

    opts = from_args(SweepOptions, args)
    if _print_config(opts, args):
        return
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

        _report(opts.train.out, report, opts.train.preset, wandb="wandb" in loggers_of(opts.train))
    status = exit_status(summary, opts.fail_on_diverged)
    if status:
        raise SystemExit(status)


def cmd_hpo(args) -> None:
    from aiayn.sweeps.hpo import run_hpo

    opts = from_args(HpoOptions, args)
    if _print_config(opts, args):
        return
    result = run_hpo(opts)
    print(json.dumps(result, indent=2))
    if result["best_trial"] is None:
        raise SystemExit(1)  # every trial pruned or failed: a result of the search, not a usage error (2)


def cmd_slurm(args) -> None:
    from aiayn.sweeps.backends.slurm import SlurmBackend, summary_text

    opts = from_args(SlurmOptions, args, kind=args.slurm_command)
    if _print_config(opts, args):
        return
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
        _report(opts.train.out, report, opts.train.preset)
    if any(status != "completed" for status in results.values()):
        raise SystemExit(1)


def cmd_status(args) -> None:
    from aiayn.sweeps.status import render, sweep_status

    found = sweep_status(args.out)
    sys.stdout.write(json.dumps(found, indent=2) + "\n" if args.json else render(found))


def cmd_completion(args) -> None:
    from aiayn.completion import completion_script

    sys.stdout.write(completion_script(build_parser(), args.shell))


def cmd_sweep_export(args) -> None:
    from aiayn.common.files import atomic_write_text
    from aiayn.sweeps.export import wandb_yaml

    if not args.wandb:
        raise UserError("sweep export needs a target; pass --wandb (the W&B sweep YAML)")
    text = wandb_yaml(args.preset, args.rows, args.seeds, args.extended, tuple(args.table or ()))
    if args.out:
        atomic_write_text(args.out, text)
    else:
        sys.stdout.write(text)


# ---- the parser


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (`aiayn: error: …; <fix>`, exit 2), not usage + error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # `--max-step` is a typo answered with "did you mean", not a guess
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message}; see `{self.prog} --help`")


def _config_arguments(p, cls, command: str, *, skip=(), config_help: str = "", print_help: str = "") -> None:
    """--config FILE and --print-config for a command whose options are the dataclass `cls`."""
    p.add_argument("--config", metavar="FILE", action="append", default=None, help=config_help or (
        "a YAML file of these options (what --print-config prints; nested by group or dotted, e.g. train.max_steps); "
        "repeatable, later files over earlier ones; flags given here override them all"))  # fmt: skip
    p.add_argument("--print-config", action="store_true", help=print_help or (
        "print these options as YAML (every value, the config file included) and exit: `--config` of that file runs "
        "the same command"))  # fmt: skip
    p.set_defaults(options_of=(cls, skip, command, p))


def _print_config(opts, args) -> bool:
    """With --print-config: print `opts` as the YAML that --config reads back; True when printed."""
    if not args.print_config:
        return False
    import yaml

    from aiayn.common.secrets import redact

    text = yaml.safe_dump(to_config(opts, skip=args.options_of[1]), sort_keys=False)
    masked = redact(text)  # a password in --storage, a key in --setup: never printed, so never in a file from it
    sys.stdout.write(masked)
    if masked != text:
        print(
            "aiayn: secrets in these options are printed as ***: put them back where the file is read (e.g. "
            "--storage 'postgresql://user:$PGPASSWORD@host/db', expanded from the environment)",
            file=sys.stderr,
        )
    return True


def _rows_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", default=None, help="row ids and/or groups, comma-separated (default: all paper rows)")
    p.add_argument("--extended", action="store_true", help="include the extended rows beyond the paper")
    p.add_argument(
        "--table",
        action="append",
        metavar="FILE",
        default=None,
        help="a table file of your own rows, in the layout of ablations/extended.csv (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="aiayn", description="Table 3 of 'Attention Is All You Need', reproduced.")
    p.add_argument("--version", action="version", version=f"aiayn {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("rows", help="the Table 3 rows resolved at a preset (no training)")
    r.add_argument("--preset", default="paper", help="the scale whose rule resolves the rows (`aiayn train --help` "
                   "lists the presets)")  # fmt: skip
    _rows_arguments(r)
    r.add_argument("--format", choices=("table", "json"), default="table", help="a table for reading or JSON")
    r.set_defaults(func=cmd_rows)

    t = sub.add_parser("train", help="train one (row, preset, corpus, seed); reruns resume")
    add_options(t, TrainOptions)
    _config_arguments(
        t, TrainOptions, "aiayn train",
        config_help="start from a run's config.json (it trains that run again) or a YAML file of these options; "
        "repeatable, later files over earlier ones; flags given here override them (--set and --table add to them)",
        print_help="print the run's resolved config.json (JSON, which --config reads back) and exit: nothing "
        "prepared, trained or written",
    )  # fmt: skip
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="BLEU (sacreBLEU and tokenized) and perplexity on --src/--ref files or a split")
    add_options(e, EvalOptions)
    _config_arguments(e, EvalOptions, "aiayn eval")
    e.set_defaults(func=cmd_eval)
    tr = sub.add_parser("translate", help="translate sentences (a file or stdin) with a run or a checkpoint")
    add_options(tr, TranslateOptions)
    _config_arguments(tr, TranslateOptions, "aiayn translate")
    tr.set_defaults(func=cmd_translate)

    ex = sub.add_parser("export", help="a trained model for Hugging Face Transformers (MarianMTModel) or CTranslate2")
    add_options(ex, ExportOptions, skip=EXPORT_SKIP)
    _config_arguments(ex, ExportOptions, "aiayn export", skip=EXPORT_SKIP)
    ex.set_defaults(func=cmd_export)

    sc = sub.add_parser("score", help="BLEU of any system's output: sacreBLEU and the paper's tokenized BLEU")
    sc.add_argument("--hyp", required=True, help="detokenized system output, one sentence per line")
    sc.add_argument("--ref", required=True, help="detokenized references, line by line with --hyp")
    sc.add_argument("--lang", default="de", help="target language, for the Moses tokenizer of the tokenized BLEU")
    sc.add_argument("--json", action="store_true", help="print bleu, bleu_signature, tok_bleu, tok_bleu_label as JSON")
    sc.set_defaults(func=cmd_score)

    b = sub.add_parser("bench", help="training and decoding speed, side by side with peers")
    add_options(b, BenchOptions)
    b.set_defaults(func=cmd_bench)

    dr = sub.add_parser("doctor", help="check this machine's GPUs for aiayn in a few minutes: a pass/fail/skip table "
                        "and a JSON for bug reports")  # fmt: skip
    add_options(dr, DoctorOptions)
    _config_arguments(dr, DoctorOptions, "aiayn doctor")
    dr.set_defaults(func=cmd_doctor)

    t3 = sub.add_parser("table3", help="run Table 3 as a sweep (Optuna keeps the books), then write the report")
    add_options(t3, SweepOptions, skip=PER_RUN)
    _config_arguments(t3, SweepOptions, "aiayn table3", skip=PER_RUN)
    t3.set_defaults(func=cmd_table3)

    sl = sub.add_parser("slurm", help="submit Table 3 (or one run) to SLURM as a job array; requeued on preemption")
    slsub = sl.add_subparsers(dest="slurm_command", required=True, parser_class=_Parser)
    sp = slsub.add_parser("table3", help="one array task per pending (row, seed)")
    add_options(sp, SlurmOptions, skip=PER_RUN)
    _config_arguments(sp, SlurmOptions, "aiayn slurm table3", skip=PER_RUN)
    sp.set_defaults(func=cmd_slurm)
    sp = slsub.add_parser("train", help="one run")
    one_run = ("select.rows", "select.extended", "select.seeds", "select.base_seeds", "select.first_seed", "report",
               "train.progress")  # fmt: skip
    add_options(sp, SlurmOptions, skip=one_run)
    _config_arguments(sp, SlurmOptions, "aiayn slurm train", skip=one_run)
    sp.set_defaults(func=cmd_slurm)

    hp = sub.add_parser("hpo", help="Optuna TPE over lr factor, warmup, dropout, label smoothing of one row")
    add_options(hp, HpoOptions, skip=HPO_SKIP)
    _config_arguments(hp, HpoOptions, "aiayn hpo", skip=HPO_SKIP)
    hp.set_defaults(func=cmd_hpo)

    st = sub.add_parser("status", help="the state of every (row, seed) of the sweeps under OUT: completed, running "
                        "(host and age), failed (its reason), pending; trains and writes nothing")  # fmt: skip
    st.add_argument("out", metavar="OUT", help="the --out of an `aiayn table3` or `aiayn slurm` sweep")
    st.add_argument("--json", action="store_true", help="print every sweep and pair as JSON, for scripts")
    st.set_defaults(func=cmd_status)

    sw = sub.add_parser("sweep", help="sweep definitions generated from ablations/")
    swsub = sw.add_subparsers(dest="sweep_command", required=True, parser_class=_Parser)
    ex = swsub.add_parser("export", help="write a sweep definition (to stdout without --out)")
    ex.add_argument("--wandb", action="store_true", help="a W&B sweep YAML (grid over row x seed)")
    ex.add_argument("--preset", default="tiny", help="the scale each run of the sweep trains at")
    _rows_arguments(ex)
    ex.add_argument("--seeds", type=positive_int, default=1, help="seeds 0..N-1 per row")
    ex.add_argument("--out", default=None, help="the file to write (default: stdout)")
    ex.set_defaults(func=cmd_sweep_export)

    rp = sub.add_parser("report", help="Table 3 report tables and plots from every metrics.json under --runs")
    rp.add_argument(
        "--runs",
        action="append",
        default=None,
        help="the --out of the runs to report (every metrics.json under it); repeat it to pool seed sets run "
        "into separate directories into one table (default: runs)",
    )
    rp.add_argument("--out", default=None, help="report directory (default: the first RUNS/reports)")
    rp.add_argument("--preset", default=None, help="only this preset (default: every preset found)")
    rp.add_argument(
        "--wandb",
        action="store_true",
        help="also log each report to W&B: the table as a wandb.Table, the files as an artifact",
    )
    rp.set_defaults(func=cmd_report)

    c = sub.add_parser("completion", help="print a shell completion script: `eval \"$(aiayn completion bash)\"` in "
                       "~/.bashrc (zsh: `aiayn completion zsh > ~/.zfunc/_aiayn`)")  # fmt: skip
    c.add_argument("shell", choices=("bash", "zsh", "tcsh"), help="the shell the script is for")
    c.set_defaults(func=cmd_completion)

    a = sub.add_parser("average", help="average the last k periodic checkpoints of a run")
    a.add_argument("--run", required=True, help="run directory or its checkpoints/ directory")
    a.add_argument("--last", type=positive_int, default=5, help="how many of the newest periodic checkpoints")
    a.add_argument("--out", required=True, help="the averaged checkpoint to write (a .ckpt file)")
    a.set_defaults(func=cmd_average)
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
    """The parsed command line. `--config FILE` (train, table3, hpo, slurm; repeatable): each FILE's options, in
    order, become the command's parser's defaults (argparse's own layering; a later file's value replaces an earlier
    one's, and `set`/`trainer` mappings merge key by key), so the flags given on the command line override them all."""
    parser = build_parser()
    args = _parse_known(parser, argv)
    if getattr(args, "config", None) and hasattr(args, "options_of"):  # (bench's --config is its own)
        cls, skip, command, sub = args.options_of
        values, recorded = {}, None
        for path in args.config:
            if cls is TrainOptions:  # a YAML file of options, or a run's own config.json (its spec comes too)
                from aiayn.lightning_modules.run.options import read_config_file

                config = read_config_file(path)
                layer = config.values
                recorded = config if config.spec is not None else recorded
            else:
                doc = read_mapping(path, f"a YAML file of `{command}` options (e.g. what --print-config prints)")
                layer = config_values(cls, doc, f"config {path}", command, skip=skip)
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
        args.func(args)
    except UserError as e:
        return print_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
