"""`aiayn bench`: training and decoding speed of aiayn's model beside peer implementations (aiayn/bench/run.py);
with `--trainer`, Lightning's training loop beside the bare training step (aiayn/bench/trainer.py).

A tool above the layers (it builds models of every kind and times them), so it sits beside the command line, not in
the one-run layer. This module holds its options only, without torch, for the command line's parsers.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.common.errors import UserError
from aiayn.common.options import LIMITS, option, yaml_values
from aiayn.lightning_modules.transformer.config import PAPER_DECODING

BENCH_SIZES = ("evidence", "tiny", "laptop", "base", "paper")


@dataclass
class BenchOptions:
    """What `aiayn bench` measures (aiayn/bench/run.py): one model's training and decoding speed."""

    size: str = option("tiny", choices=BENCH_SIZES)
    """the model's size (`--config` is a YAML file of these options, as everywhere)"""
    device: str = option("auto", choices=("auto", "cpu", "cuda"))
    """auto: cuda when available"""
    peers: bool = option(False)
    """also torch.nn.Transformer and transformers' MarianMTModel"""
    json: str | None = option(None)
    """write the results here, one object per implementation (--trainer: per config)"""
    layers: int | None = option(None, positive=True)
    """override N (layers per stack)"""
    tokens: int | None = option(None, positive=True)
    """padded positions per side in the training batch"""
    steps: int = option(3, positive=True)
    """timed optimizer steps per trial"""
    warmup: int = option(2)
    """untimed steps before the first trial"""
    trials: int = option(5, positive=True)
    """round-robin rounds; medians are reported"""
    decode_sentences: int = option(32, positive=True)
    """sentences decoded per trial"""
    decode_batch: int = option(16, positive=True)
    """sentences per beam-search batch"""
    decode_src_len: int = option(20, positive=True)
    """source length of the decoded sentences"""
    decode_extra: int = option(20)
    """maximum output length = source length + this"""
    beam: int = option(PAPER_DECODING.beam, positive=True, at_most=LIMITS["beam"])
    """beam size"""
    alpha: float = option(PAPER_DECODING.alpha)
    """length penalty (aiayn: GNMT's; Marian: score/len^alpha)"""
    threads: int | None = option(None, positive=True)
    """torch.set_num_threads (default: torch's own)"""
    padding: bool = option(False)
    """also the padding waste of token-bucket batches"""
    profile: bool = option(False)
    """also profile aiayn's training step (torch.profiler, --steps steps): launches a step, the top kernels, the
    device's idle time between them"""
    compile: str = option("auto", choices=("auto", "none", "layers", "model"))
    """torch.compile aiayn's model as `aiayn train --compile` does, with the same symbolic shapes (auto: the model whole
    on a CUDA device, eager on a CPU, as training's default)"""
    residual_dtype: str = option("auto", choices=("auto", "fp32", "bf16"))
    """aiayn's residual stream under the bench's bf16 autocast (a CUDA device), as `aiayn train --residual-dtype` keeps
    it: auto (bf16 on a CUDA device, as training's default under bf16-mixed; fp32 on a CPU), fp32 (autocast's) or
    bf16"""
    multi30k_dir: str | None = option(None)
    """Multi30k files for --padding (train.en.gz, ...)"""
    cache_dir: str | None = option(None)
    """tokenizer/encoded-data cache for --padding"""
    trainer: bool = option(False)
    """instead: Lightning's Trainer + TranslationModule beside the bare training step, on the same batches (tokens/s of
    each and their ratio, per size; aiayn/bench/trainer.py says what each side includes)"""
    trainer_sizes: tuple[str, ...] = option((), flag="--trainer-size", metavar="SIZE")
    """with --trainer: a model size to measure (repeatable; default: tiny and laptop)"""

    @classmethod
    def config_layer(cls, path: str, prog: str = "aiayn bench", skip=()) -> tuple[dict, None]:
        """One `--config FILE` (aiayn.common.commands): a YAML file of these options. A size given there (the
        model's size was bench's --config in older releases) is answered with --size."""
        if path in BENCH_SIZES:
            raise UserError(f"--config {path}: --config is a YAML file of options; the model's size is --size {path}")
        return yaml_values(cls, path, prog, skip=skip), None
