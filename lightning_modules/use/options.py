"""The options of the commands that use a trained model (`aiayn translate`, `eval`, `score`, `average`, `export`):
the use room's own, as TrainOptions is the run room's (lightning_modules/run/options.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiayn.common.errors import UserError
from aiayn.common.options import LIMITS, option
from aiayn.lightning_modules.run.options import DECODE_MAX_TOKENS
from aiayn.lightning_modules.transformer.config import PAPER_DECODING


@dataclass
class ModelSource:
    """Which trained model `aiayn translate` and `aiayn eval` use, and how it decodes (the paper's beam
    settings by default). Everything it needs travels in the checkpoint: no corpus, no cache."""

    run: str | None = option(None, metavar="DIR")
    """a run directory: its checkpoints/last.ckpt (or the mean of the last K, --average)"""
    ckpt: str | None = option(None, metavar="FILE")
    """a checkpoint file instead (e.g. one written by `aiayn average`)"""
    ct2: str | None = option(None, metavar="DIR")
    """instead, a CTranslate2 model written by `aiayn export --format ctranslate2`"""
    average: int | None = option(None, positive=True, metavar="K")
    """with --run: the mean of its last K kept checkpoints (the paper's Table 2 practice)"""
    device: str = option("auto", choices=("auto", "cpu", "cuda"))
    """auto: the GPU when one is visible"""
    precision: str = option("auto", choices=("auto", "32-true", "bf16-mixed"))
    """auto: bf16 on a GPU that has it (as training), else fp32; or 32-true, bf16-mixed"""
    beam: int = option(PAPER_DECODING.beam, positive=True, at_most=LIMITS["beam"])
    """beam size (1: greedy); the paper's 4"""
    alpha: float = option(PAPER_DECODING.alpha)
    """length penalty alpha; the paper's 0.6"""
    extra_len: int = option(PAPER_DECODING.extra_len)
    """longest output = source length + this; the paper's 50"""
    max_tokens: int = option(DECODE_MAX_TOKENS, positive=True, at_most=LIMITS["tokens"])
    """source tokens per batch, padding included"""
    ct2_batching: str = option("same-length", choices=("same-length", "sorted"))
    """with --ct2: CTranslate2's batches: same-length (one source length a batch: exactly aiayn's per-sentence length
    limits) or sorted (neighbouring lengths together, each batch limited by its longest source: 1.7-2.0x faster at
    d_model 256, BENCHMARKS.md; differs only for outputs that never end)"""

    def kind(self) -> str:
        """Which model it names: "run", "ckpt" or "ct2"; a UserError unless exactly one, with what goes with it."""
        given = [name for name in ("run", "ckpt", "ct2") if getattr(self, name) is not None]
        if len(given) != 1:
            raise UserError(
                "pass exactly one of --run DIR (a run directory), --ckpt FILE (a checkpoint) and --ct2 DIR "
                "(a CTranslate2 export)"
            )
        if self.average and given[0] != "run":
            raise UserError(
                f"--average K takes the last K checkpoints of a run; pass --run DIR instead of --{given[0]}"
            )
        return given[0]


@dataclass
class TranslateOptions:
    """`aiayn translate`: sentences in, translations out, one per line."""

    model: ModelSource = field(default_factory=ModelSource)
    input: str = option("-", metavar="FILE")
    """source sentences, one per line, UTF-8 ('-': stdin)"""
    output: str | None = option(None, metavar="FILE")
    """the translations, one per line (default: stdout)"""


@dataclass
class EvalOptions:
    """`aiayn eval`: BLEU (both kinds) and perplexity of a model on a test set: files, or a split of the
    corpus the model was trained on."""

    model: ModelSource = field(default_factory=ModelSource)
    src: str | None = option(None, metavar="FILE")
    """source sentences, one per line"""
    ref: str | None = option(None, metavar="FILE")
    """their reference translations, line by line"""
    split: str | None = option(None, choices=("dev", "test"))
    """instead of --src/--ref: a split of the model's corpus (default: dev)"""
    data_dir: str | None = option(None)
    """with --split: where the corpus's files are now"""
    cache_dir: str | None = option(None)
    """with --split: the corpus cache (default: $AIAYN_CACHE, else $XDG_CACHE_HOME/aiayn, else ~/.cache/aiayn)"""


@dataclass
class ScoreOptions:
    """`aiayn score`: BLEU of any system's output against references, both kinds."""

    hyp: str = option(metavar="FILE")
    """detokenized system output, one sentence per line"""
    ref: str = option(metavar="FILE")
    """detokenized references, line by line with --hyp"""
    lang: str = option("de")
    """target language, for the Moses tokenizer of the tokenized BLEU"""
    json: bool = option(False)
    """print bleu, bleu_signature, tok_bleu, tok_bleu_label as JSON"""


@dataclass
class AverageOptions:
    """`aiayn average`: the last K periodic checkpoints of a run, averaged into one checkpoint."""

    run: str = option(metavar="DIR")
    """run directory or its checkpoints/ directory"""
    out: str = option(metavar="FILE")
    """the averaged checkpoint to write (a .ckpt file)"""
    last: int = option(5, positive=True)
    """how many of the newest periodic checkpoints"""


# CTranslate2's weight types (ctranslate2.converters ACCEPTED_MODEL_TYPES); the CPU computes in float32, int8,
# int8_float32 and, with Intel MKL, int16 (`ctranslate2.get_supported_compute_types("cpu")`); the others are for GPUs.
CT2_QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16", "int8_float16", "int8_bfloat16")


EXPORT_SKIP = ("model.ct2", "model.device", "model.max_tokens", "model.ct2_batching")  # what an export does not read


@dataclass
class ExportOptions:
    """`aiayn export`: a trained model for Hugging Face Transformers (MarianMTModel and a fast tokenizer, with a
    model card; optionally pushed to the Hub) or CTranslate2 (lightning_modules/use/export.py)."""

    model: ModelSource = field(default_factory=ModelSource)
    format: str = option("hf", choices=("hf", "ctranslate2"))
    """hf: a MarianMTModel + tokenizer directory with a model card; ctranslate2: a CTranslate2 model"""
    out: str | None = option(None, metavar="DIR")
    """the directory to write (required; new or empty; written whole or not at all)"""
    quantization: str = option("float32", choices=CT2_QUANTIZATIONS)
    """ctranslate2: the weights' type"""
    push_to_hub: str | None = option(None, metavar="REPO")
    """also upload the export to this Hugging Face Hub model repository (created if need be; the token from HF_TOKEN or
    `hf auth login`)"""
    private: bool = option(False)
    """with --push-to-hub: create the repository private"""
    license: str = option("mit")
    """the model card's license (a Hub license id; the corpus's terms may restrict it)"""
