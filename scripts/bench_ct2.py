"""aiayn's beam search against CTranslate2 (fp32 and int8) on CPU, in one interleaved run on the same sentences.

    python scripts/bench_ct2.py --run runs/laptop/multi30k/base/seed0 --average 5 \\
        --src ../shared/data/multi30k/val.en --ref ../shared/data/multi30k/val.de --threads 2 --json ct2.json

Exports the model (`aiayn export --format ctranslate2`, float32 and int8) into a temporary directory, then
translates every source sentence with each engine, round-robin over `--rounds` rounds (aiayn, ct2 fp32,
ct2 int8, then the next round starting one engine later), so a machine that slows down slows them alike;
sentences/s is the median over rounds of (sentences / seconds of that engine's pass). All three decode as
aiayn translate does (beam 4, α 0.6, each sentence's length + 50, batches of `--max-tokens` source tokens)
with the same number of threads; CTranslate2's length penalty is score / |Y|^α, not GNMT's (README), so its
output can differ in a few sentences: the table gives BLEU (sacreBLEU, detokenized) and the share of sentences
identical to aiayn's. Not run by the tests; needs `pip install 'aiayn[ctranslate2]'`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="a run directory (its last.ckpt, or the mean of the last --average K)")
    p.add_argument("--ckpt", help="instead, a checkpoint file")
    p.add_argument("--average", type=int, default=None, metavar="K", help="with --run: the mean of the last K")
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--ref", required=True, help="their references, line by line")
    p.add_argument("--sentences", type=int, default=None, metavar="N", help="the first N only (default: all)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported (default: 3)")
    p.add_argument("--threads", type=int, default=None, help="threads per engine (default: torch's own)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--max-tokens", type=int, default=4096, help="source tokens per batch, padding included")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results here")
    p.add_argument(
        "--batching",
        action="append",
        choices=("same-length", "sorted"),
        default=None,
        help="CTranslate2's batches (repeatable: each is an engine of its own; default: same-length)",
    )
    return p.parse_args(argv)


def engines(args, where: Path) -> dict:
    """name -> translator: aiayn's own, and its CTranslate2 exports in float32 and int8."""
    from aiayn.lightning_modules.use.ct2 import Ct2Translator
    from aiayn.lightning_modules.use.export import export
    from aiayn.lightning_modules.use.options import ExportOptions, ModelSource
    from aiayn.lightning_modules.use.translate import Translator

    source = ModelSource(
        run=args.run,
        ckpt=args.ckpt,
        average=args.average,
        device="cpu",
        beam=args.beam,
        alpha=args.alpha,
        max_tokens=args.max_tokens,
    )
    out = {"aiayn": Translator.from_options(source)}
    for quantization in ("float32", "int8"):
        path = where / f"ct2-{quantization}"
        export(ExportOptions(model=source, format="ctranslate2", out=str(path), quantization=quantization))
        for batching in args.batching:
            name = f"ct2 {'fp32' if quantization == 'float32' else quantization}" + (
                f" {batching}" if len(args.batching) > 1 else ""
            )
            out[name] = Ct2Translator(
                path,
                device="cpu",
                beam=args.beam,
                alpha=args.alpha,
                max_tokens=args.max_tokens,
                threads=args.threads,
                batching=batching,
            )
    return out


def measure(translators: dict, sources: list[str], rounds: int) -> tuple[dict, dict]:
    """Seconds per pass over `sources` for each engine (round-robin, rotated every round), and each one's output."""
    names = list(translators)
    for name in names:  # warm-up: first-call allocations and kernel choices stay out of the timings
        translators[name].translate(sources[:8])
    seconds, outputs = {n: [] for n in names}, {}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            hyps = translators[name].translate(sources)
            seconds[name].append(time.perf_counter() - start)
            outputs.setdefault(name, hyps)
    return seconds, outputs


def results(seconds: dict, outputs: dict, refs: list[str], lang: str) -> list[dict]:
    from aiayn.lightning_modules.run.bleu import bleu

    base = outputs["aiayn"]
    rows = []
    for name, times in seconds.items():
        score = bleu(outputs[name], refs, lang=lang)
        rows.append(
            {
                "engine": name,
                "sentences": len(refs),
                "sentences_per_s": len(refs) / statistics.median(times),
                "seconds": times,
                "bleu": score["bleu"],
                "bleu_signature": score["bleu_signature"],
                "identical_to_aiayn": sum(a == b for a, b in zip(outputs[name], base)) / len(base),
                "words_per_output": statistics.mean(len(h.split()) for h in outputs[name]),
            }
        )
    return rows


def table(rows: list[dict], info: dict) -> str:
    base = rows[0]["sentences_per_s"]
    lines = [
        "| engine | sentences/s | × aiayn | sacreBLEU | identical to aiayn | words per output |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['sentences_per_s']:.1f} | {r['sentences_per_s'] / base:.2f} | "
            f"{r['bleu']:.2f} | {100 * r['identical_to_aiayn']:.1f}% | "
            f"{r['words_per_output']:.1f} |"
        )
    lines.append(
        f"\nmodel {info['model_shape']}; {info['sentences']} sentences, beam {info['beam']}, "
        f"α {info['alpha']}, {info['threads']} "
        f"thread(s), median of {info['rounds']} interleaved rounds; {info['cpu']}; torch {info['torch']}, "
        f"ctranslate2 {info['ctranslate2']}; {rows[0]['bleu_signature']}"
    )
    return "\n".join(lines)


def _shape(cfg) -> str:
    return (
        f"d_model {cfg.d_model}, d_ff {cfg.d_ff}, h {cfg.h}, N {cfg.N}, vocabulary {cfg.vocab_size}, "
        f"{cfg.params():,} parameters"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.batching = args.batching or ["same-length"]
    import ctranslate2
    import torch

    from aiayn.bench.run import _cpu_name
    from aiayn.common.errors import UserError, print_error
    from aiayn.lightning_modules.use.translate import read_sentences

    try:
        sources, refs = read_sentences(args.src, "--src"), read_sentences(args.ref, "--ref")
        if len(sources) != len(refs):
            raise UserError(f"--src has {len(sources)} lines and --ref {len(refs)}; pass line-aligned files")
        sources, refs = sources[: args.sentences], refs[: args.sentences]
        if args.threads:
            torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory(prefix="bench-ct2-") as tmp:
            translators = engines(args, Path(tmp))
            seconds, outputs = measure(translators, sources, args.rounds)
    except UserError as e:
        return print_error(e)
    lang = translators["aiayn"].data.get("tgt_lang") or "de"
    rows = results(seconds, outputs, refs, lang)
    info = {
        "sentences": len(sources),
        "beam": args.beam,
        "alpha": args.alpha,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "cpu": _cpu_name(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "ctranslate2": ctranslate2.__version__,
        "model": translators["aiayn"].checkpoints,
        "model_shape": _shape(translators["aiayn"].model.cfg),
    }
    print(table(rows, info))
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
