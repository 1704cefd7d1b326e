"""The commands that use a trained model, each one function of its options: `aiayn eval` (`evaluate_test_set`),
`aiayn score` (`score_files`), `aiayn translate` (`translate_file`) and `aiayn average` (`average_last`). The command
line only parses and prints; every check of the inputs happens here, before a model is loaded or a file written."""

from __future__ import annotations

import sys

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text, check_writable_file
from aiayn.lightning_modules.use.options import AverageOptions, EvalOptions, ScoreOptions, TranslateOptions


def evaluate_test_set(opts: EvalOptions) -> dict:
    """BLEU and perplexity of a model on --src/--ref files or a split of its corpus (dev by default), with what the
    test set was."""
    from aiayn.lightning_modules.use.ct2 import load_translator
    from aiayn.lightning_modules.use.translate import read_sentences, split_of

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
    return {**test_set, **translator.evaluate(sources, refs, name="--src line")}


def score_files(opts: ScoreOptions) -> dict:
    """sacreBLEU and the paper's tokenized BLEU of line-aligned hypothesis and reference files."""
    from aiayn.lightning_modules.run.bleu import bleu
    from aiayn.lightning_modules.use.translate import read_sentences

    hyps, refs = read_sentences(opts.hyp, "--hyp"), read_sentences(opts.ref, "--ref")
    if len(hyps) != len(refs) or not refs:
        raise UserError(
            f"--hyp {opts.hyp} has {len(hyps)} lines and --ref {opts.ref} has {len(refs)}; pass "
            "line-aligned, non-empty files (one sentence per line)"
        )
    return {**bleu(hyps, refs, lang=opts.lang), "n_sentences": len(refs)}


def score_text(result: dict) -> str:
    """`aiayn score`'s two lines: sacreBLEU with its signature, then the tokenized BLEU with its label."""
    return (
        f"BLEU {result['bleu']:.2f} ({result['bleu_signature']})\n"
        f"tokenized BLEU {result['tok_bleu']:.2f} ({result['tok_bleu_label']})"
    )


def translate_file(opts: TranslateOptions) -> None:
    """Translate --input (a file or stdin) into --output (written atomically) or stdout; the input is read and
    checked whole before anything is decoded or written."""
    from aiayn.lightning_modules.use.ct2 import load_translator
    from aiayn.lightning_modules.use.translate import read_sentences

    if opts.output:
        check_writable_file(opts.output, "--output")
    lines = read_sentences(opts.input)
    translator = load_translator(opts.model)
    text = "".join(line + "\n" for line in translator.translate(lines, name="input line"))
    if opts.output:
        atomic_write_text(opts.output, text)
    else:
        sys.stdout.write(text)


def average_last(opts: AverageOptions) -> str:
    """Average the last `opts.last` periodic checkpoints of `opts.run` into `opts.out`; what was averaged, in one
    line."""
    from aiayn.lightning_modules.use.checkpoints import average, last_checkpoints

    check_writable_file(opts.out, "--out")
    chosen = last_checkpoints(opts.run, opts.last)
    written = average(chosen, opts.out)
    return f"averaged {len(chosen)} checkpoints ({chosen[0].name} .. {chosen[-1].name}) into {written}"
