"""`aiayn`: the command line. Each subcommand imports what it needs, so `aiayn rows` stays quick."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from ablations.errors import UserError

log = logging.getLogger("aiayn")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def cmd_rows(args) -> None:
    import pandas as pd

    from ablations.presets import get_preset, model_config, resolve
    from ablations.table import select_rows
    from lightning_modules.model import count_params

    preset = get_preset(args.preset)
    records = []
    for name in select_rows(args.rows, include_extended=args.extended):
        r = resolve(name, preset.name)
        cfg = model_config(r, preset.vocab_size)
        records.append({
            "row": r["row"], "group": r["group"], "N": r["N"], "d_model": r["d_model"], "d_ff": r["d_ff"], "h": r["h"],
            "d_k": r["d_k"], "d_v": r["d_v"], "p_drop": r["P_drop"], "eps_ls": r["eps_ls"], "pe": r["pe"],
            "norm_first": r["norm_first"], "train_steps": r["train_steps"], "params": count_params(cfg),
            "paper_ppl": r["paper_ppl"], "paper_bleu": r["paper_bleu"], "paper_params_m": r["paper_params_m"],
            "preset": preset.name, "corpus": preset.corpus, "vocab_size": preset.vocab_size,
        })  # fmt: skip
    if args.format == "json":
        print(json.dumps(records, indent=2))
        return
    df = pd.DataFrame(records).drop(columns=["preset", "corpus", "vocab_size"])
    df["params"] = (df["params"] / 1e6).map("{:.1f}M".format)
    print(f"preset {preset.name}: {preset.description}")
    print(f"rule: {preset.rule()}")
    print(df.to_string(index=False, na_rep=""))


def parse_overrides(items: list[str] | None) -> dict:
    """`--set KEY=VALUE` (repeatable, or several pairs in one): the value typed as the key's column."""
    from ablations.table import KNOBS

    types = {**{k: t for k, t in KNOBS.items() if k != "train_steps"}, "warmup": int, "lr_factor": float}
    out = {}
    for item in (pair for arg in items or () for pair in arg.split()):
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise UserError(f"--set {item}: expected KEY=VALUE; e.g. --set d_model=256")
        if key not in types:
            raise UserError(f"--set {key}: unknown key; use one of {', '.join(types)}")
        if key == "norm_first" and text.lower() not in ("true", "false"):
            raise UserError(f"--set {item}: norm_first must be true or false; e.g. --set norm_first=true")
        try:
            out[key] = types[key](text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(types[key], "a value")
            raise UserError(f"--set {item}: {key} must be {kind}; e.g. --set {key}=1") from None
    return out


def cmd_train(args) -> None:
    from lightning_modules.train import TrainOptions, train

    fields = TrainOptions.__dataclass_fields__
    opts = TrainOptions(**{k: v for k, v in vars(args).items() if k in fields and k != "overrides"})
    opts.overrides = parse_overrides(args.overrides)
    metrics = train(opts)
    if metrics.get("status") == "diverged":
        print(f"{metrics['row']} seed {metrics['seed']}: diverged ({metrics['error']}); metrics.json status diverged")
    elif metrics:
        print(
            f"{metrics['row']} seed {metrics['seed']}: dev BLEU {metrics['dev_bleu']:.2f} (sacreBLEU), "
            f"dev PPL {metrics['dev_ppl']:.2f}, {metrics['params'] / 1e6:.2f}M params, {metrics['steps']} steps "
            f"in {metrics['train_time_s']:.0f} s ({metrics['tokens_per_s']:.0f} tokens/s)"
        )


def _datamodule_for(module, args):
    from lightning_modules.data import TranslationDataModule

    ident = dict(module.hparams.data or {})
    if args.data_dir:
        ident["data_dir"] = args.data_dir
    dm = TranslationDataModule(**ident, cache_dir=args.cache_dir, dev_subset=None)
    dm.prepare_data()
    dm.setup("validate")
    return dm


def cmd_eval(args) -> None:
    from lightning_modules.checkpoints import load_module
    from lightning_modules.evaluate import TOK_BLEU_LABEL, evaluate
    from lightning_modules.model import count_params

    module = load_module(args.ckpt)
    dm = _datamodule_for(module, args)
    result = evaluate(module.model, dm, args.split, beam=args.beam, alpha=args.alpha)
    result.pop("hypotheses")
    result.update(
        params=count_params(module.cfg), split=args.split, checkpoint=str(args.ckpt), tok_bleu_label=TOK_BLEU_LABEL
    )
    print(json.dumps(result, indent=2))


def cmd_translate(args) -> None:
    import torch

    from lightning_modules.checkpoints import load_module
    from lightning_modules.evaluate import translate_batch

    module = load_module(args.ckpt)
    dm = _datamodule_for(module, args)
    try:
        lines = (
            open(args.input, encoding="utf-8").read().splitlines()
            if args.input != "-"
            else sys.stdin.read().splitlines()
        )
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read input {args.input} ({e}); pass a UTF-8 text file, one sentence per line") from e
    out = []
    for start in range(0, len(lines), args.batch_size):
        ids = dm.encode(lines[start : start + args.batch_size])
        width = max((len(x) for x in ids), default=1)
        src = torch.tensor([x + [0] * (width - len(x)) for x in ids], dtype=torch.long)
        hyps = translate_batch(module.model, src, dm.bos_id, dm.eos_id, args.beam, args.alpha)
        out.extend(dm.decode(h) for h in hyps)
    text = "\n".join(out) + "\n"
    if args.output:
        from ablations.files import atomic_write_text

        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)


def cmd_average(args) -> None:
    from lightning_modules.checkpoints import average, periodic_checkpoints

    paths = periodic_checkpoints(args.run)
    if args.last > len(paths):
        raise UserError(f"--last {args.last} asks for more checkpoints than the {len(paths)} kept in {args.run}")
    chosen = paths[-args.last :]
    out = average(chosen, args.out)
    print(f"averaged {len(chosen)} checkpoints ({chosen[0].name} .. {chosen[-1].name}) into {out}")


def cmd_bench(args) -> None:
    from lightning_modules.bench import main as bench_main

    code = bench_main(args.bench_args)
    if code:
        raise SystemExit(code)


def cmd_report(args) -> None:
    from ablations.files import check_writable_dir
    from reports.build import write_reports

    check_writable_dir(args.out, "--out")
    for path in write_reports(args.runs, args.out, preset=args.preset):
        print(path)


def cmd_table3(args) -> None:
    from ablations.files import check_writable_dir
    from sweeps.table3 import SweepOptions, run_table3

    check_writable_dir(args.out, "--out")
    if args.report:
        check_writable_dir(args.report, "--report")
    if args.storage:
        from sweeps.storage import check_url

        check_url(args.storage)  # before the sweep takes its setup lock under --out
    opts = SweepOptions(
        preset=args.preset, rows=args.rows, extended=args.extended, seeds=args.seeds, storage=args.storage,
        out=args.out, report=args.report or None, data=args.data, data_dir=args.data_dir, wandb=args.wandb,
        train_args=tuple(_passthrough(args, ("max_steps", "eval_subset", "accelerator", "devices"))), jobs=args.jobs,
    )  # fmt: skip
    summary = run_table3(opts)
    print(f"table3 {args.preset}: {summary['completed']} completed, {summary['failed']} failed of {summary['ran']} run "
          f"({summary['pairs']} pairs in the table)")  # fmt: skip
    for path in summary.get("report", []):
        print(path)


def cmd_hpo(args) -> None:
    from sweeps.hpo import HpoOptions, run_hpo

    result = run_hpo(HpoOptions(**{k: v for k, v in vars(args).items() if k in HpoOptions.__dataclass_fields__}))
    print(json.dumps(result, indent=2))


def cmd_slurm(args) -> None:
    from sweeps.slurm import SlurmOptions, submit

    passed = ("max_steps", "eval_subset", "max_tokens", "precision", "ckpt_every", "vocab_size", "cache_dir")
    train_args = tuple(_passthrough(args, passed)) + (("--wandb",) if args.wandb else ())
    fields = SlurmOptions.__dataclass_fields__
    opts = SlurmOptions(
        kind=args.slurm_command, train_args=train_args, setup=tuple(args.setup), extra_sbatch=tuple(args.sbatch),
        **{k: v for k, v in vars(args).items() if k in fields and k not in ("setup", "train_args", "kind")},
    )  # fmt: skip
    summary = submit(opts)
    if opts.dry_run and summary.get("text"):
        sys.stdout.write(summary["text"])
    print(f"# slurm {opts.kind} {opts.preset}: {summary['pairs']} pairs, {summary['completed']} completed, "
          f"{summary['in_slurm']} queued or running, {summary['pending']} "
          f"{'to submit (dry run: nothing submitted)' if opts.dry_run else 'submitted'}"
          + (f"; job {summary['job']}, script {summary['script']}" if summary["job"] else "")
          + (f"; script {summary['script']}" if opts.dry_run and summary["script"] else ""))  # fmt: skip
    results = summary.get("results", {})
    for pair, status in results.items():
        print(f"{pair}: {status}")
    for path in summary.get("report", []):
        print(path)
    if any(status != "completed" for status in results.values()):
        raise SystemExit(1)


def _passthrough(args, names):
    """`aiayn train` flags given to `aiayn table3`, rebuilt for each training process."""
    for name in names:
        value = getattr(args, name)
        if value is not None:
            yield from (f"--{name.replace('_', '-')}", str(value))


def cmd_sweep_export(args) -> None:
    from ablations.files import atomic_write_text
    from sweeps.export import wandb_yaml

    if not args.wandb:
        raise UserError("sweep export needs a target; pass --wandb (the W&B sweep YAML)")
    text = wandb_yaml(args.preset, args.rows, args.seeds, args.extended)
    if args.out:
        atomic_write_text(args.out, text)
    else:
        sys.stdout.write(text)


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (`aiayn: error: …; <fix>`, exit 2), not usage + error."""

    def error(self, message: str):
        raise UserError(f"{message}; see `{self.prog} --help`")


def _fail(message: str) -> int:
    from ablations.secrets import redact

    print(f"aiayn: error: {redact(message)}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="aiayn", description="Table 3 of 'Attention Is All You Need', reproduced.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("rows", help="the Table 3 rows resolved at a preset (no training)")
    r.add_argument("--preset", default="paper")
    r.add_argument("--rows", default=None, help="row ids and/or groups, comma-separated (default: all paper rows)")
    r.add_argument("--extended", action="store_true", help="include the extended rows beyond the paper")
    r.add_argument("--format", choices=("table", "json"), default="table")
    r.set_defaults(func=cmd_rows)

    t = sub.add_parser("train", help="train one (row, preset, corpus, seed); reruns resume")
    t.add_argument("--row", default="base")
    t.add_argument("--preset", default="tiny")
    t.add_argument("--data", default=None, help="synthetic | multi30k | wmt14 | files (default: the preset's)")
    t.add_argument("--data-dir", default=None)
    t.add_argument("--src-lang", default="en")
    t.add_argument("--tgt-lang", default="de")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", default="runs")
    t.add_argument("--cache-dir", default=None, help="tokenizer/corpus cache (default: $AIAYN_CACHE or ~/.cache/aiayn)")
    t.add_argument("--accelerator", default="auto")
    t.add_argument("--devices", type=_positive_int, default=1)
    t.add_argument("--num-nodes", type=_positive_int, default=1)
    t.add_argument("--strategy", default="auto")
    t.add_argument("--precision", default="32-true")
    t.add_argument("--max-steps", type=_positive_int, default=None)
    t.add_argument(
        "--vocab-size", type=_positive_int, default=None, help="joint BPE vocabulary (default: the preset's)"
    )
    t.add_argument("--max-tokens", type=_positive_int, default=None, help="tokens per side per device batch")
    t.add_argument("--dev-subset", type=int, default=-1, help="dev sentences decoded at each validation")
    t.add_argument("--ckpt-every", type=_positive_int, default=None, help="steps between kept checkpoints")
    t.add_argument("--ckpt-every-minutes", type=float, default=None, help="minutes between kept checkpoints")
    t.add_argument("--val-every", type=_positive_int, default=None, help="steps between validations")
    t.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        help="override a knob of the row: N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, pe, norm_first, warmup, "
        "lr_factor (repeatable; listed among the run's deviations)",
    )
    t.add_argument(
        "--eval-subset",
        type=_positive_int,
        default=None,
        help="final evaluation on the first K dev sentences (default: all, as the paper)",
    )
    t.add_argument("--num-workers", type=int, default=0)
    t.add_argument("--wandb", action="store_true", help="log to Weights & Biases (offline without an API key)")
    t.add_argument("--no-progress", dest="progress", action="store_false")
    t.set_defaults(func=cmd_train)

    for name, helptext in (
        ("eval", "BLEU, PPL and params of a checkpoint on a split"),
        ("translate", "translate a file"),
    ):
        e = sub.add_parser(name, help=helptext)
        e.add_argument("--ckpt", required=True)
        e.add_argument("--beam", type=_positive_int, default=4)
        e.add_argument("--alpha", type=float, default=0.6)
        e.add_argument("--data-dir", default=None)
        e.add_argument("--cache-dir", default=None)
        if name == "eval":
            e.add_argument("--split", choices=("dev", "test"), default="dev")
            e.set_defaults(func=cmd_eval)
        else:
            e.add_argument("--input", required=True, help="source sentences, one per line ('-' for stdin)")
            e.add_argument("--output", default=None)
            e.add_argument("--batch-size", type=_positive_int, default=64)
            e.set_defaults(func=cmd_translate)

    b = sub.add_parser("bench", help="training and decoding speed, side by side with peers", add_help=False)
    b.add_argument("bench_args", nargs=argparse.REMAINDER, help="see `aiayn bench --help`")
    b.set_defaults(func=cmd_bench)

    t3 = sub.add_parser("table3", help="run Table 3 as a sweep (Optuna keeps the books), then write the report")
    t3.add_argument("--preset", default="tiny")
    t3.add_argument("--rows", default=None, help="row ids and/or groups, comma-separated (default: all paper rows)")
    t3.add_argument("--extended", action="store_true", help="include the extended rows beyond the paper")
    t3.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per row")
    t3.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///OUT/optuna.db)")
    t3.add_argument("--out", default="runs")
    t3.add_argument("--report", default="reports", help="report directory ('' for none)")
    t3.add_argument("--data", default=None)
    t3.add_argument("--data-dir", default=None)
    t3.add_argument("--wandb", action="store_true")
    t3.add_argument("--max-steps", type=_positive_int, default=None, help="cap every row's steps (quick looks only)")
    t3.add_argument("--eval-subset", type=_positive_int, default=None, help="final evaluation on K dev sentences")
    t3.add_argument("--accelerator", default=None)
    t3.add_argument("--devices", type=_positive_int, default=None)
    t3.add_argument(
        "--jobs", type=_positive_int, default=None,
        help="training runs at once, sharing the CPU cores (default: the preset's; tiny: 2)",
    )  # fmt: skip
    t3.set_defaults(func=cmd_table3)

    sl = sub.add_parser("slurm", help="submit Table 3 (or one run) to SLURM as a job array; requeued on preemption")
    slsub = sl.add_subparsers(dest="slurm_command", required=True)
    for name, helptext in (("table3", "one array task per pending (row, seed)"), ("train", "one run")):
        sp = slsub.add_parser(name, help=helptext)
        sp.add_argument("--preset", default="tiny")
        if name == "table3":
            sp.add_argument("--rows", default=None, help="row ids and/or groups, comma-separated (default: all)")
            sp.add_argument("--extended", action="store_true")
            sp.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per row")
            sp.add_argument("--report", default="reports", help="report directory written after --wait ('' for none)")
        else:
            sp.add_argument("--row", default="base")
            sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--out", default="runs", help="run directories, scripts and logs (shared when --nodes > 1)")
        sp.add_argument("--partition", default=None)
        sp.add_argument("--account", default=None)
        sp.add_argument("--time", default=None, help="time limit per attempt, HH:MM:SS or D-HH:MM:SS")
        sp.add_argument("--nodes", type=_positive_int, default=1)
        sp.add_argument("--gpus-per-node", type=_positive_int, default=None, help="GPUs = srun tasks per node")
        sp.add_argument("--tasks-per-node", type=_positive_int, default=None, help="with --accelerator cpu")
        sp.add_argument("--cpus-per-task", type=_positive_int, default=None)
        sp.add_argument("--mem", default=None, help="memory per node, e.g. 64G")
        sp.add_argument("--accelerator", choices=("gpu", "cuda", "cpu"), default="gpu")
        sp.add_argument("--devices", type=_positive_int, default=None, help="if given, must equal the tasks per node")
        sp.add_argument("--num-nodes", type=_positive_int, default=None, help="if given, must equal --nodes")
        sp.add_argument("--strategy", default=None, help="default: ddp when more than one device in all")
        sp.add_argument("--precision", default=None)
        sp.add_argument("--signal-lead", type=_positive_int, default=90, help="seconds of warning before the limit")
        sp.add_argument("--max-parallel", type=_positive_int, default=None, help="array tasks running at once")
        sp.add_argument("--setup", action="append", default=[], help="shell line before srun (repeatable)")
        sp.add_argument("--sbatch", action="append", default=[], help="another #SBATCH option, e.g. --qos=high")
        sp.add_argument("--assume-shared", action="store_true", help="--out is shared though /proc/mounts says not")
        sp.add_argument("--data", default=None)
        sp.add_argument("--data-dir", default=None)
        sp.add_argument("--cache-dir", default=None)
        sp.add_argument("--vocab-size", type=_positive_int, default=None)
        sp.add_argument("--max-steps", type=_positive_int, default=None)
        sp.add_argument("--max-tokens", type=_positive_int, default=None, help="tokens per side per device batch")
        sp.add_argument("--ckpt-every", type=_positive_int, default=None)
        sp.add_argument("--eval-subset", type=_positive_int, default=None)
        sp.add_argument("--wandb", action="store_true")
        sp.add_argument("--dry-run", action="store_true", help="write and print the script, submit nothing")
        sp.add_argument("--wait", action="store_true", help="block until the jobs end; exit 1 if any run failed")
        sp.set_defaults(func=cmd_slurm)

    hp = sub.add_parser("hpo", help="Optuna TPE over lr factor, warmup, dropout, label smoothing of one row")
    hp.add_argument("--row", default="base")
    hp.add_argument("--preset", default="tiny")
    hp.add_argument("--trials", type=int, default=10)
    hp.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///OUT/hpo.db)")
    hp.add_argument("--out", default="runs")
    hp.add_argument("--seed", type=int, default=0)
    hp.add_argument("--max-steps", type=_positive_int, default=None)
    hp.add_argument("--eval-subset", type=_positive_int, default=None)
    hp.set_defaults(func=cmd_hpo)

    sw = sub.add_parser("sweep", help="sweep definitions generated from ablations/")
    swsub = sw.add_subparsers(dest="sweep_command", required=True)
    ex = swsub.add_parser("export", help="write a sweep definition (to stdout without --out)")
    ex.add_argument("--wandb", action="store_true", help="a W&B sweep YAML (grid over row x seed)")
    ex.add_argument("--preset", default="tiny")
    ex.add_argument("--rows", default=None)
    ex.add_argument("--extended", action="store_true")
    ex.add_argument("--seeds", type=_positive_int, default=1)
    ex.add_argument("--out", default=None)
    ex.set_defaults(func=cmd_sweep_export)

    rp = sub.add_parser("report", help="Table 3 report tables and plots from every metrics.json under --runs")
    rp.add_argument("--runs", default="runs")
    rp.add_argument("--out", default="reports")
    rp.add_argument("--preset", default=None, help="only this preset (default: every preset found)")
    rp.set_defaults(func=cmd_report)

    a = sub.add_parser("average", help="average the last k periodic checkpoints of a run")
    a.add_argument("--run", required=True, help="run directory or its checkpoints/ directory")
    a.add_argument("--last", type=_positive_int, default=5)
    a.add_argument("--out", required=True)
    a.set_defaults(func=cmd_average)
    return p


def configure_logging(level: int) -> None:
    """Our packages log to stderr; the root logger is left alone (Lightning has its own handler, so
    a root handler would print each of its lines twice)."""
    from ablations.secrets import RedactFilter

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactFilter())
    for name in ("ablations", "lightning_modules", "sweeps", "reports", "aiayn"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # `aiayn bench` owns its flags (argparse.REMAINDER drops leading options)
        args = argparse.Namespace(func=cmd_bench, bench_args=argv[1:], verbose=False)
    else:
        try:
            args = build_parser().parse_args(argv)
        except UserError as e:
            return _fail(str(e))
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        args.func(args)
    except UserError as e:
        return _fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
