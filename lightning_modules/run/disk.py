"""What a run's checkpoints take on disk, estimated before anything runs (`aiayn train --print-config`, `aiayn slurm
--dry-run`) from the parameter count alone: no model is built, nothing imports torch.

A full checkpoint (last.ckpt, requeue.ckpt, and the periodic stepNNNNNNN.ckpt unless --weights-only-checkpoints)
holds each parameter's fp32 weight and Adam's two fp32 moments, 12 bytes; a weights-only one 4 (mixed precision
keeps fp32 weights and moments too). Each also carries the run's tokenizer (callbacks.RunFilesInCheckpoint): a
SentencePiece BPE model is about 240 kB of normalization table and ~15 bytes per piece, and torch.save's pickle
protocol 2 writes `bytes` as latin-1 text, in which each byte >= 0x80 takes two, about 1.5 times the file
(measured: 255 kB of tokenizer -> 382 kB in the checkpoint). The rest (RNG states, loop and data-loader state,
hyper-parameters, a zip record per tensor) is a few tens of kB. Measured against real checkpoints in
tests/test_checkpoints.py (within 10%); at the paper's sizes the weights are all that counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FULL_BYTES_PER_PARAM = 12  # fp32 weight + Adam's exp_avg and exp_avg_sq
WEIGHTS_BYTES_PER_PARAM = 4
TOKENIZER_BYTES = 240_000  # a SentencePiece model's normalization table (nmt_nfkc), whatever the vocabulary
TOKENIZER_BYTES_PER_PIECE = 15
PICKLED_BYTES = 1.5  # a `bytes` object in torch.save's pickle protocol 2
OTHER_BYTES = 30_000  # RNG states, loops, hyper-parameters, per-tensor zip records


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class DiskEstimate:
    """The checkpoints one run keeps: `periodic` stepNNNNNNN.ckpt files of `periodic_bytes` each, `slim` older ones
    of `slim_bytes` (weights only, kept for averaging), and `full` whole-state files (last.ckpt; requeue.ckpt too
    under SLURM) of `full_bytes` each."""

    params: int
    full_bytes: int
    periodic_bytes: int
    periodic: int
    full: int = 1
    slim: int = 0  # older periodic ones rewritten as weights only (--keep-for-averaging beyond --keep-last)
    slim_bytes: int = 0

    @property
    def total(self) -> int:
        return self.periodic * self.periodic_bytes + self.slim * self.slim_bytes + self.full * self.full_bytes

    def describe(self) -> str:
        kind = "weights only" if self.periodic_bytes < self.full_bytes else "weights + Adam moments, fp32"
        fulls = "last.ckpt" if self.full == 1 else "last.ckpt and requeue.ckpt"
        slim = f" + {self.slim} older for averaging x {human(self.slim_bytes)} (weights only)" if self.slim else ""
        return (
            f"checkpoints: about {human(self.total)} = {self.periodic} periodic x {human(self.periodic_bytes)} "
            f"({kind}){slim} + {fulls} {self.full} x {human(self.full_bytes)} (weights + Adam moments, fp32) for "
            f"{self.params / 1e6:.3g}M parameters; a save needs room for one more file while it "
            f"writes"
        )


def checkpoint_bytes(params: int, vocab_size: int, weights_only: bool) -> int:
    """Bytes of one checkpoint of a model of `params` parameters and a `vocab_size`-piece tokenizer."""
    tokenizer = (TOKENIZER_BYTES + TOKENIZER_BYTES_PER_PIECE * vocab_size) * PICKLED_BYTES
    per_param = WEIGHTS_BYTES_PER_PARAM if weights_only else FULL_BYTES_PER_PARAM
    return int(params * per_param + tokenizer + OTHER_BYTES)


def kept_checkpoints(opts, preset) -> tuple[int, int]:
    """(whole, kept) for TrainOptions `opts`: the newest `kept` periodic checkpoints stay, the newest `whole` of them
    whole (`--keep-last`, `--keep-for-averaging`)."""
    whole = opts.keep_last or preset.keep_ckpts
    return whole, opts.keep_for_averaging or whole


def periodic_saves(steps: int, every: int | None, keep: int) -> int:
    """How many periodic checkpoints a run of `steps` keeps: one every `every` steps and one at the last step, the
    newest `keep` of them (`every` None: by wall-clock time, so `keep`)."""
    if every is None:
        return keep
    return min(keep, math.ceil(steps / every))


def checkpoint_every(opts, preset) -> tuple[int | None, float | None]:
    """(steps, minutes) between kept checkpoints, one of them None: --ckpt-every-minutes, else --ckpt-every, else the
    preset's minutes (the paper preset: every 10 minutes), else its steps."""
    if opts.ckpt_every_minutes is not None:
        return None, opts.ckpt_every_minutes
    if opts.ckpt_every is not None or preset.ckpt_every_minutes is None:
        return opts.ckpt_every or preset.ckpt_every, None
    return None, preset.ckpt_every_minutes


def weights_only(opts, preset) -> bool:
    """Whether periodic checkpoints leave the optimizer state out: --weights-only-checkpoints, or the preset's."""
    return bool(opts.weights_only_checkpoints or preset.weights_only_checkpoints)


def estimate(opts, spec, *, slurm: bool = False) -> DiskEstimate:
    """The checkpoints of the run `spec` trained with `opts` (TrainOptions); `slurm`: a requeue.ckpt besides."""
    preset = spec.preset
    params, vocab = spec.model.params(), spec.model.vocab_size
    whole, kept = kept_checkpoints(opts, preset)
    every, _ = checkpoint_every(opts, preset)
    steps = opts.max_steps or spec.train_steps
    slim_only = weights_only(opts, preset)
    # weights-only periodic files: every one of the `kept` is slim (StepCheckpoints keeps save_top_k = kept of them)
    periodic = periodic_saves(steps, every, kept if slim_only else whole)
    return DiskEstimate(
        params=params,
        full_bytes=checkpoint_bytes(params, vocab, weights_only=False),
        periodic_bytes=checkpoint_bytes(params, vocab, weights_only=slim_only),
        periodic=periodic,
        full=2 if slurm else 1,
        slim=0 if slim_only else periodic_saves(steps, every, kept) - periodic,
        slim_bytes=checkpoint_bytes(params, vocab, weights_only=True),
    )
