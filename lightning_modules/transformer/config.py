"""The model's config: one flat dataclass named with the paper's symbols (Table 3's columns), the positional
encodings there are, and the exact parameter count of a config, all without torch, so that the command line,
the sweep driver (which orders its queue by cost) and the reports can use them without importing it.

The model itself is `model.Transformer` (paper §3); this is what it is built from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

# The reserved ids of the one joint vocabulary (§3.4); the data pipeline's SentencePiece model is trained with
# exactly these (lightning_modules/data/tokenizer.py), and decoding starts at BOS and stops at EOS.
PAD, UNK, BOS, EOS = 0, 1, 2, 3


@dataclass(frozen=True)
class PositionalEncoding:
    """A kind of positional information (§3.5 and Table 3 row E), said once: `paper`, whether the paper ran it (any
    other is a deviation, listed among a run's deviations); `params(cfg)`, the parameters it adds to the model;
    `requires(cfg)`, what it needs of the config, as (field, what it must be) or None; `marian`, whether
    MarianMTModel has it (`aiayn export`). Its module is `model.POSITIONAL_ENCODINGS[name]`."""

    name: str
    paper: bool
    note: str
    params: Callable[[TransformerConfig], int] = lambda cfg: 0
    requires: Callable[[TransformerConfig], tuple[str, str] | None] = lambda cfg: None
    marian: bool = False


PE_KINDS = {
    p.name: p
    for p in (
        PositionalEncoding(
            "sinusoid",
            True,
            "sines and cosines of the position (§3.5), the paper's default",
            marian=True,
            requires=lambda c: None if c.d_model % 2 == 0 else ("d_model", "even for the sinusoid positional encoding"),
        ),
        PositionalEncoding(
            "learned", True, "a learned embedding per position (Table 3 row E)", params=lambda c: c.max_len * c.d_model
        ),
        PositionalEncoding("none", False, "no positional information at all"),
        PositionalEncoding(
            "rope",
            False,
            "rotary position embedding in self-attention (Su et al., 2021)",
            requires=lambda c: None if c.d_k % 2 == 0 else ("d_k", "even for rotary positional encoding"),
        ),
    )
}


@dataclass(frozen=True)
class TransformerConfig:
    """One flat config, named with the paper's symbols (Table 3 columns)."""

    N: int = 6  # layers in each of the encoder and decoder stacks
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    d_k: int | None = None  # None: d_model / h, as in the paper; free otherwise (Table 3 rows A, B)
    d_v: int | None = None
    P_drop: float = 0.1
    eps_ls: float = 0.1
    pe: str = "sinusoid"  # a key of PE_KINDS
    norm_first: bool = False  # False: the paper's post-LN, LayerNorm(x + Dropout(Sublayer(x)))
    vocab_size: int = 37000  # one joint source/target vocabulary (§5.1)
    max_len: int = 1024  # longest sequence the positional encoding covers

    def __post_init__(self):
        for name in ("N", "d_model", "d_ff", "h", "vocab_size", "max_len"):
            _require(isinstance(getattr(self, name), int) and getattr(self, name) > 0, name, "a positive integer")
        for name in ("d_k", "d_v"):  # None: d_model / h, as in the paper
            if getattr(self, name) is None:
                _require(
                    self.d_model % self.h == 0,
                    name,
                    f"set explicitly: d_model={self.d_model} is not divisible by h={self.h}",
                )
                object.__setattr__(self, name, self.d_model // self.h)
        for name in ("d_k", "d_v"):
            _require(isinstance(getattr(self, name), int) and getattr(self, name) > 0, name, "a positive integer")
        for name in ("P_drop", "eps_ls"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and 0.0 <= value < 1.0, name, f"in [0, 1), got {value!r}")
        _require(self.pe in PE_KINDS, "pe", f"one of {', '.join(PE_KINDS)}, got {self.pe!r}")
        need = PE_KINDS[self.pe].requires(self)
        if need is not None:
            _require(False, *need)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TransformerConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def params(self) -> int:
        """The exact number of parameters of `model.Transformer(self)`, counted from the shapes (tested against
        the model's own count for every row at every preset): no model is built to count them."""
        d, h = self.d_model, self.h
        attention = 2 * (d * h * self.d_k + h * self.d_k) + (d * h * self.d_v + h * self.d_v) + (h * self.d_v * d + d)
        ffn = d * self.d_ff + self.d_ff + self.d_ff * d + d
        norm = 2 * d
        encoder = attention + ffn + 2 * norm
        decoder = 2 * attention + ffn + 3 * norm
        total = self.vocab_size * d + self.N * (encoder + decoder)  # one embedding, shared (§3.4)
        total += PE_KINDS[self.pe].params(self)
        if self.norm_first:  # the final LayerNorm of each stack
            total += 2 * norm
        return total


@dataclass(frozen=True)
class Decoding:
    """How a model translates (transformer/decoding.py): beam size (1: greedy), the length penalty α of
    lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), and the longest output, source length + `extra_len`."""

    beam: int = 4
    alpha: float = 0.6
    extra_len: int = 50


PAPER_DECODING = Decoding()  # §6.1: beam 4, α 0.6, source length + 50, early termination


def _require(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise ValueError(f"invalid model config: {field} must be {what}")
