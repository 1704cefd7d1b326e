"""Presets: Table 3 at a chosen scale, by one rule applied to every row.

Rule: widths (d_model, d_ff, d_k, d_v) × `width`, depth N × `depth` (rounded, at least 1), heads,
P_drop, eps_ls and pe unchanged; every row trains `train_steps` × (row's paper steps / base's
paper steps), so `big` trains 3× as long, as in the paper. Each row thus keeps its relation to base.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from aiayn.ablations.table import PAPER_BASE, Row, get_row, load_rows
from aiayn.common.errors import UserError

# The corpora a run can train on (`--data`); each preset names its own.
CORPORA = ("synthetic", "multi30k", "wmt14", "files")


@dataclass(frozen=True)
class Preset:
    name: str
    corpus: str
    vocab_size: int  # joint SentencePiece BPE vocabulary
    width: float  # factor on d_model, d_ff, d_k, d_v
    depth: float  # factor on N
    train_steps: int  # optimizer steps for base; other rows scale with the paper's steps
    # real target tokens (EOS included, padding not) per optimizer step, all devices together: the paper's
    # "approximately 25000 source tokens and 25000 target tokens"; the source side comes as the corpus gives it
    tokens_per_step: int
    max_tokens: int  # real target tokens in one batch on one device; accumulation makes up the rest
    warmup: int  # the schedule's warmup_steps (paper: 4000)
    lr_factor: float  # multiplies the paper's schedule (1.0 = the paper)
    dev_subset: int | None  # dev sentences beam-decoded for val/bleu during training (final eval: all)
    val_every: int  # optimizer steps between validations
    ckpt_every: int  # optimizer steps between kept checkpoints
    description: str
    sweep_jobs: int = 1  # `aiayn table3` runs this many training processes at once (CPU presets: 2)
    keep_ckpts: int = 20  # enough for the paper's "average the last 5 / last 20"
    max_len: int = 256  # training sentences longer than this (in tokens) are dropped

    def rule(self) -> str:
        return (
            f"d_model, d_ff, d_k, d_v x {self.width:g}; N x {self.depth:.3g} (rounded, >= 1); h, P_drop, eps_ls, "
            f"pe unchanged; {self.train_steps} steps (x3 for big, as in the paper); "
            f"{self.tokens_per_step} real target tokens per step; learning rate x {self.lr_factor:g} of the paper's "
            f"schedule with warmup {self.warmup}; vocabulary {self.vocab_size}"
        )


PRESETS = {
    p.name: p
    for p in (
        Preset(
            name="paper", corpus="wmt14", vocab_size=37000, width=1.0, depth=1.0, train_steps=100_000,
            tokens_per_step=25_000, max_tokens=25_000, warmup=4000, lr_factor=1.0, dev_subset=500,
            val_every=5000, ckpt_every=1000,
            description="the paper: WMT14 En-De, paper sizes, 25k+25k tokens per step, 100k steps (300k big)",
        ),
        Preset(
            name="small", corpus="multi30k", vocab_size=8000, width=0.5, depth=0.5, train_steps=6000,
            tokens_per_step=8192, max_tokens=8192, warmup=1000, lr_factor=1.0, dev_subset=200,
            val_every=1000, ckpt_every=500,
            description="Multi30k En-De on one GPU: half width, half depth",
        ),
        Preset(
            name="tiny", corpus="synthetic", vocab_size=1000, width=0.25, depth=1 / 3, train_steps=225,
            tokens_per_step=1024, max_tokens=1024, warmup=200, lr_factor=0.5, dev_subset=50,
            val_every=50, ckpt_every=50, sweep_jobs=2,
            description="the built-in synthetic corpus on a laptop CPU, the whole table in 15 minutes on 2 cores: "
            "quarter width, a third of the depth, half the paper's learning rate (at d_model 128 the paper's "
            "d_model^-0.5 schedule peaks too high to learn within a few hundred steps), two runs at a time",
        ),
        Preset(
            name="laptop", corpus="multi30k", vocab_size=8000, width=0.25, depth=1 / 3, train_steps=7000,
            tokens_per_step=1024, max_tokens=1024, warmup=200, lr_factor=0.5, dev_subset=200,
            val_every=500, ckpt_every=250, sweep_jobs=2,
            description="Multi30k En-De on a laptop CPU: the tiny preset's model and schedule at 8000 BPE "
            "vocabulary, 7000 steps; the base row, then `aiayn eval --average 5`, in under 30 minutes on 2 cores",
        ),
    )
}  # fmt: skip


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def scale(row: Row, preset: Preset) -> dict:
    """The row's knobs at the preset's scale (the module docstring's rule)."""
    k = dict(row.knobs)
    for name in ("d_model", "d_ff", "d_k", "d_v"):
        k[name] = max(1, round(k[name] * preset.width))
    k["N"] = max(1, round(k["N"] * preset.depth))
    paper_base_steps = load_rows()["base"].knobs["train_steps"]
    k["train_steps"] = round(preset.train_steps * k["train_steps"] / paper_base_steps)
    return k


def resolve(row_name: str, preset_name: str, tables: tuple[str, ...] = ()) -> dict:
    """Everything that defines a run of `row` at `preset` except corpus-dependent vocabulary facts
    (`tables`: the user's own table files, `--table`, where the row may be)."""
    row, preset = get_row(row_name, tables), get_preset(preset_name)
    return {
        "row": row.row,
        "group": row.group,
        **scale(row, preset),
        "paper_ppl": row.paper_ppl,
        "paper_bleu": row.paper_bleu,
        "paper_params_m": row.paper_params_m,
        "preset": preset.name,
        "corpus": preset.corpus,
        "vocab_size": preset.vocab_size,
        "deviations": deviations(row),
    }


def deviations(row: Row) -> list[str]:
    """Where this row leaves the paper's recipe (beyond Table 3's own variations)."""
    out = []
    if row.knobs["norm_first"] != PAPER_BASE["norm_first"]:
        out.append("pre-LN residuals (paper: post-LN)")
    if row.knobs["pe"] in ("none", "rope"):
        out.append(f"positional encoding {row.knobs['pe']} (paper: sinusoid or learned)")
    return out


def preset_dict(preset: Preset) -> dict:
    return asdict(preset) | {"rule": preset.rule()}
