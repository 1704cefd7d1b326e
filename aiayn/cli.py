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
from dataclasses import replace
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
from aiayn.sweeps.table3 import SweepOptions, exit_status

log = logging.getLogger("aiayn")

# Options a sweep sets for each of its runs, not the user.
PER_RUN = ("train.row", "train.seed", "train.progress")
HPO_SKIP = ("train.progress",)


# ---- one run


def cmd_rows(args) -> None:
    import pandas as pd

    from aiayn.ablations.knobs import MODEL_KEYS
    from aiayn.ablations.presets import get_preset
    from aiayn.ablations.table import select_rows
    from aiayn.lightning_modules.run.spec import resolve

    preset = get_preset(args.preset)
    tables = tuple(args.table or ())
    records = []
    for name in select_rows(args.rows, include_extended=args.extended, tables=tables):
        s = resolve(name, preset, tables=tables)
        records.append({
            "row": s.row, "group": s.group,
            **{k if k != "P_drop" else "p_drop": getattr(s.model, k) for k in MODEL_KEYS},
            "train_steps": s.train_steps, "params": s.model.params(), "paper_ppl": s.paper.ppl,
            "paper_bleu": s.paper.bleu, "paper_params_m": s.paper.params_m, "note": s.note, "preset": preset.name,
            "corpus": s.corpus, "vocab_size": s.model.vocab_size,
        })  # fmt: skip
    if args.format == "json":
        print(json.dumps(records, indent=2))
        return
    df = pd.DataFrame(records).drop(columns=["preset", "corpus", "vocab_size"])
    df["params"] = (df["params"] / 1e6).map("{:.1f}M".format)
    if not df["note"].any():
        df = df.drop(columns=["note"])
    print(f"preset {preset.name}: {preset.description}")
    print(f"rule: {preset.rule()}")
    print(df.to_string(index=False, na_rep=""))


def cmd_train(args) -> None:
    from aiayn.lightning_modules.run.train import plan, train

    opts = from_args(TrainOptions, args)
    spec = _spec_of(opts, args)
    opts = _with_config_tokenizer(opts, args, spec)
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


def _spec_of(opts: TrainOptions, args):
    """The run to train, resolved once: from the table, or, with --config of a run's config.json naming this row and
    preset, that run's own recorded spec (so the run is reproduced even when its table changed since or is not at
    hand), with the command line's --set on top."""
    from aiayn.lightning_modules.run.spec import RunSpec, resolve, spec_of

    recorded = getattr(args, "config_spec", None)
    if not recorded or recorded.get("row") != opts.row or recorded.get("preset", {}).get("name") != opts.preset:
        return spec_of(opts)
    try:
        spec = RunSpec.from_dict(recorded)
    except ValueError as e:
        raise UserError(f"--config: the run it records is not one aiayn wrote ({e})") from None
    if getattr(args, "config_resolved", False):  # a sweep's driver resolved it for this process: as it is
        return spec
    spec = spec.with_overrides(opts.overrides)
    try:
        now = resolve(opts.row, opts.preset, tables=opts.table).knobs
    except UserError:
        now = None  # the table is not at hand: the config's row is all there is
    if now is not None and now != spec.knobs:
        changed = {k: (spec.knobs.get(k), v) for k, v in now.items() if spec.knobs.get(k) != v}
        log.warning("row %s of the config file differs from its table now (config, table: %s); training the config "
                    "file's", opts.row, changed)  # fmt: skip
    return spec


def _with_config_tokenizer(opts: TrainOptions, args, spec) -> TrainOptions:
    """With --config RUN/config.json for a run elsewhere: RUN's tokenizer.model, when it is the one that
    config.json names (so the run is reproduced even where the cache holds another tokenizer)."""
    if not args.config or opts.tokenizer or getattr(args, "config_spec", None) is None:
        return opts
    from aiayn.common.files import sha256_file
    from aiayn.lightning_modules.run.rundir import OutDir

    source = Path(args.config_source).parent
    sibling = source / "tokenizer.model"
    recorded = args.config_tokenizer
    elsewhere = OutDir(opts.out).run_of(spec, opts.seed).path.resolve() != source.resolve()
    if recorded and elsewhere and sibling.is_file() and sha256_file(sibling) == recorded:
        return replace(opts, tokenizer=str(sibling))
    return opts


def cmd_eval(args) -> None:
    from aiayn.lightning_modules.use.ct2 import load_translator
    from aiayn.lightning_modules.use.translate import read_sentences, split_of

    opts = from_args(EvalOptions, args)
    if (opts.src is None) != (opts.ref is None):
        raise UserError("pass both --src FILE and --ref FILE (or --split dev|test)")
    if opts.src and opts.split:
        raise UserError("--split and --src/--ref each name a test set; pass one of them")
    if opts.src:  # read (and checked) before the model loads
        sources, refs = read_sentences(opts.src, "--src"), read_sentences(opts.ref, "--ref")
        test_set = {"src": opts.src, "ref": opts.ref}
    translator = load_translator(opts.model)
    if not opts.src:
        test_set = {"split": opts.split or "dev", "corpus": translator.data.get("corpus")}
        sources, refs = split_of(translator.data, test_set["split"], opts.data_dir, opts.cache_dir)
    print(json.dumps({**test_set, **translator.evaluate(sources, refs, name="--src line")}, indent=2))


def cmd_score(args) -> None:
    from aiayn.lightning_modules.use.bleu import bleu
    from aiayn.lightning_modules.use.translate import read_sentences

    hyps, refs = read_sentences(args.hyp, "--hyp"), read_sentences(args.ref, "--ref")
    if len(hyps) != len(refs) or not refs:
        raise UserError(
            f"--hyp {args.hyp} has {len(hyps)} lines and --ref {args.ref} has {len(refs)}; pass line-aligned, "
            "non-empty files (one sentence per line)"
        )
    result = bleu(hyps, refs, lang=args.lang)
    if args.json:
        print(json.dumps({**result, "n_sentences": len(refs)}, indent=2))
    else:
        print(f"BLEU {result['bleu']:.2f} ({result['bleu_signature']})")
        print(f"tokenized BLEU {result['tok_bleu']:.2f} ({result['tok_bleu_label']})")


def cmd_translate(args) -> None:
    from aiayn.common.files import atomic_write_text, check_writable_file
    from aiayn.lightning_modules.use.ct2 import load_translator
    from aiayn.lightning_modules.use.translate import read_sentences

    opts = from_args(TranslateOptions, args)
    if opts.output:
        check_writable_file(opts.output, "--output")
    lines = read_sentences(opts.input)  # all of it, checked, before anything is decoded or written
    translator = load_translator(opts.model)
    text = "".join(line + "\n" for line in translator.translate(lines, name="input line"))
    if opts.output:
        atomic_write_text(opts.output, text)
    else:
        sys.stdout.write(text)


def cmd_export(args) -> None:
    from aiayn.lightning_modules.use.export import export

    out = export(from_args(ExportOptions, args))
    print(f"exported to {out}")


def cmd_average(args) -> None:
    from aiayn.common.files import check_writable_file
    from aiayn.lightning_modules.use.checkpoints import average, last_checkpoints

    check_writable_file(args.out, "--out")
    chosen = last_checkpoints(args.run, args.last)
    out = average(chosen, args.out)
    print(f"averaged {len(chosen)} checkpoints ({chosen[0].name} .. {chosen[-1].name}) into {out}")


def cmd_bench(args) -> None:
    opts = from_args(BenchOptions, args)
    if opts.trainer:
        from aiayn.bench.trainer import main as bench_main
    else:
        from aiayn.bench.run import main as bench_main
    bench_main(opts)


def cmd_doctor(args) -> None:
    from aiayn.doctor.checks import main as doctor_main

    status = doctor_main(from_args(DoctorOptions, args))
    if status:
        raise SystemExit(status)


# ---- many runs


def _report(runs_dir, out_dir, preset: str | None, wandb: bool = False) -> None:
    """Write the report of `runs_dir` into `out_dir` and print the files written; with `wandb`, log each
    report to W&B (its table and its files)."""
    from aiayn.reports.build import command_line, write_reports

    paths = write_reports(runs_dir, out_dir, preset=preset)
    for path in paths:
        print(path)
    if wandb:
        from aiayn.reports.wandb_export import log_reports

        log_reports(paths, command_line(runs_dir, out_dir, preset))


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
    print(f"table3 {opts.train.preset}: {summary['completed']} completed, {summary['failed']} failed, "
          f"{summary.get('diverged', 0)} diverged of {summary['ran']} run ({summary['pairs']} pairs in the table)"
          f"; `aiayn status {opts.train.out}` lists each pair")  # fmt: skip
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
    from aiayn.sweeps.backends.slurm import SlurmBackend

    opts = from_args(SlurmOptions, args, kind=args.slurm_command)
    if _print_config(opts, args):
        return
    backend, sweep = SlurmBackend.from_options(opts)  # checked, and the rows resolved once
    summary = backend.launch(sweep, sweep.pairs)
    if opts.dry_run and summary.get("text"):
        sys.stdout.write(summary["text"])
    print(f"# slurm {opts.kind} {opts.train.preset}: {summary['pairs']} pairs, {summary['completed']} completed, "
          f"{summary['in_slurm']} queued or running, {summary['pending']} "
          f"{'to submit (dry run: nothing submitted)' if opts.dry_run else 'submitted'}"
          + (f"; job {summary['job']}, script {summary['script']}" if summary["job"] else "")
          + (f"; script {summary['script']}" if opts.dry_run and summary["script"] else ""))  # fmt: skip
    if summary.get("disk"):
        print(f"# {summary['disk']}")
    if summary.get("report_job"):
        print(f"# report: job {summary['report_job']} writes it when the array has ended (--dependency=afterany:"
              f"{summary['job']}); script {summary['report_script']}")  # fmt: skip
    elif summary.get("report_script") and opts.dry_run:
        print(f"# report: script {summary['report_script']}, submitted after the array with "
              f"`sbatch --dependency=afterany:<array job> {summary['report_script']}`")  # fmt: skip
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


# what an option's value completes to: names (rows, presets, loggers, corpora) or paths
NAME_OPTIONS = {"--row": "rows", "--rows": "rows", "--preset": "presets", "--logger": "loggers", "--data": "corpora"}
FILE_OPTIONS = ("--table", "--config", "--ckpt", "--tokenizer", "--input", "--output", "--space", "--hyp", "--ref",
                "--src", "--json")  # fmt: skip
DIR_OPTIONS = ("--out", "--runs", "--run", "--data-dir", "--cache-dir", "--ct2", "--report")


def _completion_names() -> dict[str, list[str]]:
    from aiayn.ablations.presets import PRESETS
    from aiayn.ablations.table import load_rows
    from aiayn.lightning_modules.data.corpora import CORPORA
    from aiayn.lightning_modules.run.loggers import KINDS

    rows = load_rows()
    return {"rows": [*rows, *sorted({r.group for r in rows.values()} - set(rows)), "all", "scored"],
            "presets": list(PRESETS), "loggers": list(KINDS), "corpora": [*CORPORA, "hf:"]}  # fmt: skip


def _mark_completions(parser: argparse.ArgumentParser, shtab, names: dict[str, list[str]]) -> None:
    """Tell shtab what each option's value is: one of `names` (a completion function per kind, below), a file or
    a directory; every subcommand's parser likewise."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _mark_completions(sub, shtab, names)
            continue
        flags = set(action.option_strings)
        kind = next((NAME_OPTIONS[f] for f in flags if f in NAME_OPTIONS), None)
        if kind is not None:
            action.complete = {"bash": f"_aiayn_{kind}", "zsh": "(" + " ".join(names[kind]) + ")"}
        elif flags & set(FILE_OPTIONS):
            action.complete = shtab.FILE
        elif flags & set(DIR_OPTIONS):
            action.complete = shtab.DIRECTORY


def cmd_completion(args) -> None:
    import shtab  # a maintained generator of completion scripts from argparse parsers

    parser, names = build_parser(), _completion_names()
    _mark_completions(parser, shtab, names)
    preamble = {"bash": "\n".join(f'_aiayn_{kind}() {{ compgen -W "{" ".join(words)}" -- "$1"; }}'
                                  for kind, words in names.items())}  # fmt: skip
    sys.stdout.write(shtab.complete(parser, shell=args.shell, preamble=preamble))


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
    e.set_defaults(func=cmd_eval)
    tr = sub.add_parser("translate", help="translate sentences (a file or stdin) with a run or a checkpoint")
    add_options(tr, TranslateOptions)
    tr.set_defaults(func=cmd_translate)

    ex = sub.add_parser("export", help="a trained model for Hugging Face Transformers (MarianMTModel) or CTranslate2")
    add_options(ex, ExportOptions, skip=("model.ct2", "model.device", "model.max_tokens"))
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
        values, spec, source, tokenizer, resolved = {}, None, None, None, False
        for path in args.config:
            if cls is TrainOptions:  # a YAML file of options, or a run's own config.json (its spec comes too)
                from aiayn.lightning_modules.run.options import read_config_file

                config = read_config_file(path)
                layer = config.values
                if config.spec is not None:
                    spec, source, tokenizer, resolved = config.spec, path, config.tokenizer_sha256, config.resolved
            else:
                doc = read_mapping(path, f"a YAML file of `{command}` options (e.g. what --print-config prints)")
                layer = config_values(cls, doc, f"config {path}", command, skip=skip)
            for key, value in layer.items():
                both = isinstance(value, dict) and isinstance(values.get(key), dict)
                values[key] = {**values[key], **value} if both else value
        sub.set_defaults(**defaults_of(cls, values, skip=skip))
        args = _parse_known(parser, argv)
        args.config_spec, args.config_source, args.config_tokenizer = spec, source, tokenizer
        args.config_resolved = resolved
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
