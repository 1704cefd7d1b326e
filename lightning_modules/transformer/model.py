"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), section 3, in plain PyTorch.

Read top to bottom against the paper: config, scaled dot-product and multi-head attention
(Eq. 1, Fig. 2, §3.2), position-wise FFN (Eq. 2, §3.3), positional encodings (§3.5), encoder and
decoder layers and stacks (§3.1, Fig. 1), tied embeddings × √d_model (§3.4), and incremental
decoding with a key/value cache. No Lightning here: training lives in `lightning_modules.run.module`.

The paper is the default. Every deviation is one named config field and is said where it acts:
`norm_first` (pre-LN instead of the paper's post-LN), `pe="none"` and `pe="rope"` (beyond the paper). The config,
`TransformerConfig`, is lightning_modules/transformer/config.py's (no torch there).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.lightning_modules.transformer.config import BOS, EOS, PAD, PE_KINDS, UNK, TransformerConfig

# The config (one flat dataclass named with the paper's symbols) and the reserved ids live beside this file,
# without torch, so that the command line and the sweeps can read configs without importing it.
__all__ = ["BOS", "EOS", "PAD", "UNK", "TransformerConfig", "Transformer"]


# --- §3.2 Attention ---------------------------------------------------------------------------


# On CPU, Eq. 1 as plain ops when the keys or the queries are few (docs/history/benchmarks.md)
PLAIN_ATTENTION_MAX_KEYS, PLAIN_ATTENTION_MAX_QUERIES = 64, 16
# The CPU fast paths (plain-ops attention, the bit-mask dropout) on or off. Off, a CPU runs exactly the code a GPU
# runs (scaled_dot_product_attention, F.dropout): how CI, which has no GPU, covers the CUDA paths
# (AIAYN_CPU_FAST_PATHS=0, or tests/conftest.py's `cuda_paths` fixture).
CPU_FAST_PATHS = os.environ.get("AIAYN_CPU_FAST_PATHS", "1") != "0"


def cpu_fast_path(t: Tensor) -> bool:
    return CPU_FAST_PATHS and t.device.type == "cpu"


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """Attention(Q, K, V) = softmax(QKᵀ / √d_k) V (Eq. 1) over heads q (B, h, T, d_k), k (B, h, S, d_k),
    v (B, h, S, d_v); `mask` broadcasts to (B, h, T, S), True = attend, or additive (0 = attend, -inf = not).

    PyTorch's `scaled_dot_product_attention`, which picks a fused kernel, except on CPU at short keys
    (≤ 64: sentence-level batches such as the tiny preset's and Multi30k's) or few queries (≤ 16: the steps of
    incremental decoding): there the formula as two batched matmuls and a softmax is faster than the CPU
    flash kernel, 1.05-1.6× forward and backward on training shapes and 2-3× for beam search's grouped
    cross-attention (single-query self-attention: about even), at the memory cost of the (T, S) weights, which
    at those sizes is small. A query whose keys are all masked (an empty source sentence) attends to nothing and
    gets zeros, on both paths: explicitly on the fused one, whose kernels disagree there (CPU's and some CUDA
    kernels give zeros, others NaN), by letting such a row attend to every key and zeroing its output afterwards
    (elementwise work on the mask, no branch and so no host sync). Not in training, where no row is empty (the data
    module drops empty pairs): a query that requires grad goes to the kernel with its mask as it is.
    """
    T, S = q.shape[-2], k.shape[-2]
    if not cpu_fast_path(q) or (S > PLAIN_ATTENTION_MAX_KEYS and T > PLAIN_ATTENTION_MAX_QUERIES):
        if mask is None or mask.dtype != torch.bool or q.requires_grad:  # training: no row is empty (below)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        empty = ~mask.any(-1, keepdim=True)  # (B, 1 or h, 1 or T, 1): queries with no key to attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty, is_causal=causal)
        return out.masked_fill(empty, 0.0)
    scores = (q @ k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)  # (B, h, T, S); in place below: a fresh tensor
    if causal:  # query i sees keys ≤ i (top-left aligned, as scaled_dot_product_attention's is_causal)
        scores.masked_fill_(torch.ones(T, S, dtype=torch.bool, device=q.device).triu_(1), -math.inf)
    if mask is None:
        return scores.softmax(-1) @ v
    scores.masked_fill_(~mask, -math.inf) if mask.dtype == torch.bool else scores.add_(mask)
    weights = scores.softmax(-1)
    if not weights.requires_grad:  # an all-masked row (an empty source) is NaN here and zeros in SDPA; training
        weights.nan_to_num_(0.0)  # never has one (the data module drops empty pairs), evaluation and decoding may
    return weights @ v


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Q and K project to h·d_k, V to h·d_v, the output from h·d_v back to d_model, so d_k and d_v are
    free of d_model / h (Table 3 rows A and B). Eq. 1 itself is `attention` below.
    """

    def __init__(self, d_model: int, h: int, d_k: int, d_v: int, attend=None):
        super().__init__()
        self.h, self.d_k, self.d_v = h, d_k, d_v
        self.attend = attend  # the positional encoding's hook on queries and keys (Positions.attend), if it has one
        self.w_q = nn.Linear(d_model, h * d_k)
        self.w_k = nn.Linear(d_model, h * d_k)
        self.w_v = nn.Linear(d_model, h * d_v)
        self.w_o = nn.Linear(h * d_v, d_model)

    def split(self, x: Tensor, d: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.h, d).transpose(1, 2)  # (B, h, T, d)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split(self.w_k(x), self.d_k), self.split(self.w_v(x), self.d_v)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K and V of self-attention in one matmul by W^Q, W^K and W^V stacked (the same parameters): one
        wider GEMM runs faster than three narrow ones on CPU (base widths: 6% of a training step,
        docs/history/benchmarks.md)."""
        w = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight], dim=-2)  # (out, in)
        b = torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias], dim=-1)
        q, k, v = F.linear(x, w, b).split([self.h * self.d_k, self.h * self.d_k, self.h * self.d_v], dim=-1)
        return self.split(q, self.d_k), self.split(k, self.d_k), self.split(v, self.d_v)

    def forward(
        self,
        x: Tensor,
        kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        pos: Tensor | None = None,
        group: int = 1,
    ) -> Tensor:
        """x (B, T, d_model) queries; kv keys/values (B, h, S, d_k|d_v), None for self-attention over x; pos: the
        positional encoding's state for self-attention (`Positions.attention_state`), given to its hook with the
        queries and keys (rotary positions); mask (B, 1, 1, S), True = attend (or additive: 0 = attend, -inf = not).

        group > 1 (beam search): each run of `group` consecutive query rows shares one row of kv and mask,
        (B / group, ...), so the K hypotheses of a sentence attend to one copy of its memory."""
        if kv is None:
            q, k, v = self.project_qkv(x)  # (B, h, T, d_k), (B, h, T, d_k), (B, h, T, d_v)
            if pos is not None:
                k = self.attend(k, pos)
        else:
            q = self.split(self.w_q(x), self.d_k)  # (B, h, T, d_k)
            k, v = kv
        if pos is not None:  # queries at their positions; given keys got theirs when projected
            q = self.attend(q, pos)
        B, _, T, _ = q.shape
        if group > 1:  # (B, h, T, d_k) -> (B/group, h, group·T, d_k): one attention call per sentence
            q = q.view(B // group, group, self.h, T, self.d_k).transpose(1, 2).reshape(B // group, self.h, -1, self.d_k)
        out = attention(q, k, v, mask, causal)  # (B, h, T, d_v)
        if group > 1:
            out = out.view(B // group, self.h, group, T, self.d_v).transpose(1, 2).reshape(B, self.h, T, self.d_v)
        return self.w_o(out.transpose(1, 2).reshape(B, T, self.h * self.d_v))


# --- §3.3 Position-wise feed-forward network -----------------------------------------------------


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Eq. 2)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.relu(self.w_1(x)))


# --- §3.5 Positional encoding ------------------------------------------------------------------


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    pos = torch.arange(max_len, dtype=torch.float64, device="cpu")[:, None]
    inv = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu") / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64, device="cpu")
    table[:, 0::2] = torch.sin(pos * inv)  # interleaved: even dimensions sin, odd dimensions cos
    table[:, 1::2] = torch.cos(pos * inv)
    return table.float()


def rope_table(max_len: int, d: int) -> Tensor:
    """Rotary angles (Su et al., 2021), beyond the paper: (max_len, d/2) as complex rotations."""
    inv = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d)
    angles = torch.arange(max_len, dtype=torch.float64, device="cpu")[:, None] * inv
    return torch.stack([angles.cos(), angles.sin()], dim=-1).float()  # (max_len, d/2, 2)


def apply_rope(x: Tensor, rot: Tensor) -> Tensor:
    """Rotate dimension pairs (2i, 2i+1) of x (B, h, T, d) by the angles of rot (T, d/2, 2)."""
    x2 = x.unflatten(-1, (-1, 2))  # (B, h, T, d/2, 2)
    cos, sin = rot[..., 0], rot[..., 1]
    a, b = x2[..., 0], x2[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).type_as(x)


class Positions(nn.Module):
    """A kind of positional information (config.PE_KINDS): what it adds to the scaled embeddings at positions
    offset.. (`forward`), and what it does to queries and keys in self-attention: `attend(x, state)`, a function of
    x (B, h, T, d_k) at the last T of the positions that `attention_state(length)` describes (None: nothing). This
    base class is `pe="none"`: no positional information (beyond the paper)."""

    attend = None  # a staticmethod (x, state) -> x, for a positional encoding that acts in attention

    def __init__(self, cfg: TransformerConfig | None = None):
        super().__init__()

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:  # (B, T, d_model)
        return x

    def attention_state(self, length: int) -> Tensor | None:
        return None

    def reset_parameters(self) -> None:
        pass


class SinusoidPositions(Positions):
    """§3.5: fixed sines and cosines, added to the embeddings."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.register_buffer("table", sinusoid_table(cfg.max_len, cfg.d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.table[offset : offset + x.shape[1]]


class LearnedPositions(Positions):
    """Table 3 row E: a learned embedding per position, added to the embeddings."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.max_len, cfg.d_model)
        self.d_model = cfg.d_model

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.embed.weight[offset : offset + x.shape[1]]

    def reset_parameters(self) -> None:
        nn.init.normal_(self.embed.weight, std=self.d_model**-0.5)


class RotaryPositions(Positions):
    """Beyond the paper: queries and keys rotated by their positions in self-attention, nothing added."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.register_buffer("table", rope_table(cfg.max_len, cfg.d_k), persistent=False)

    @staticmethod
    def attend(x: Tensor, table: Tensor) -> Tensor:
        return apply_rope(x, table[-x.shape[2] :])  # x's T positions are the last T of the table's

    def attention_state(self, length: int) -> Tensor:
        return self.table[:length]


POSITIONAL_ENCODINGS = {
    "sinusoid": SinusoidPositions,
    "learned": LearnedPositions,
    "none": Positions,
    "rope": RotaryPositions,
}
assert POSITIONAL_ENCODINGS.keys() == PE_KINDS.keys(), "every kind of config.PE_KINDS has its module here"


# --- §3.1 Encoder and decoder layers -----------------------------------------------------------


class Dropout(nn.Dropout):
    """nn.Dropout (Srivastava et al., 2014), the paper's P_drop (§5.4), with a cheaper mask on CPU.

    On CPU the mask compares 31 random bits per element from torch's own generator (`random_`, so
    `torch.manual_seed` still fixes it) with P_drop · 2^31, where `F.dropout` draws with `bernoulli_`:
    forward and backward together take about half the time (in the tiny preset's training step `bernoulli_`
    was 12%, `random_` is 7%; docs/history/benchmarks.md). The same distribution and scaling by 1 / (1 - P_drop); a
    different random stream than `F.dropout`'s. Other devices use `F.dropout` (one fused kernel on CUDA).
    """

    def forward(self, x: Tensor) -> Tensor:
        # under torch.compile, F.dropout: dynamo cannot trace the in-place random_ and broke the graph here, which
        # made each Residual.forward its own compiled frame, guarded on the sublayer it wraps
        if not self.training or self.p == 0.0 or not cpu_fast_path(x) or torch.compiler.is_compiling():
            return super().forward(x)
        bits = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()  # uniform over [0, 2^31)
        keep = (bits >= round(self.p * 2**31)).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * keep


class Residual(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))), the paper's post-LN (§3.1, §5.4).

    With norm_first (a deviation, for the `pre-LN` extended row) it is x + Dropout(Sublayer(LayerNorm(x))),
    and each stack ends with a final LayerNorm.
    """

    stream: torch.dtype | None = None  # the residual stream's dtype where it is not fp32 (`residual_stream`)

    def __init__(self, d_model: int, p_drop: float, norm_first: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.drop = Dropout(p_drop)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.norm_first:
            out = x + self.drop(sublayer(self.norm(x)))
        else:
            out = self.norm(x + self.drop(sublayer(x)))
        return to_stream(out, self.stream)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.d_k, cfg.d_v, POSITIONAL_ENCODINGS[cfg.pe].attend)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.res_attn = Residual(cfg.d_model, cfg.P_drop, cfg.norm_first)
        self.res_ffn = Residual(cfg.d_model, cfg.P_drop, cfg.norm_first)

    def forward(self, x: Tensor, mask: Tensor, pos: Tensor | None) -> Tensor:
        x = self.res_attn(x, lambda y: self.self_attn(y, mask=mask, pos=pos))
        return self.res_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, FFN; each in a residual block (§3.1)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.d_k, cfg.d_v, POSITIONAL_ENCODINGS[cfg.pe].attend)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.h, cfg.d_k, cfg.d_v)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.res_self = Residual(cfg.d_model, cfg.P_drop, cfg.norm_first)
        self.res_cross = Residual(cfg.d_model, cfg.P_drop, cfg.norm_first)
        self.res_ffn = Residual(cfg.d_model, cfg.P_drop, cfg.norm_first)

    def forward(
        self,
        y: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        src_mask: Tensor,
        pos: Tensor | None,
        cache: dict | None = None,
        group: int = 1,
    ) -> Tensor:
        """`cache`: this layer's incremental-decoding state; `group`: hypotheses per memory row (beam)."""

        def self_attend(z):
            if cache is None:  # training: the whole target at once, masked so position i sees ≤ i
                return self.self_attn(z, causal=True, pos=pos)
            # incremental decoding: the cache grows by the new position; it sees all cached ones
            k, v = self.self_attn.project_kv(z)
            if pos is not None:
                k = self.self_attn.attend(k, pos)
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v  # (B, h, t, d_k), (B, h, t, d_v)
            return self.self_attn(z, (k, v), pos=pos)

        y = self.res_self(y, self_attend)
        y = self.res_cross(y, lambda z: self.cross_attn(z, memory_kv, mask=src_mask, group=group))
        return self.res_ffn(y, self.ffn)


# --- §3.1 + §3.4 The model -------------------------------------------------------------------


class Transformer(nn.Module):
    """Encoder-decoder Transformer with one embedding matrix shared by source, target and the
    pre-softmax projection (§3.4; a joint vocabulary makes sharing possible)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD)
        self.drop = Dropout(cfg.P_drop)  # on the sums of embeddings and positional encodings (§5.4)
        self.positions = POSITIONAL_ENCODINGS[cfg.pe](cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.N))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.N))
        # pre-LN stacks need a closing norm; the paper's post-LN output is already normalized
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The paper does not state its initialization; this is tensor2tensor's and fairseq's:
        # Xavier-uniform projections, zero biases, N(0, d_model^-0.5) embeddings so that the
        # √d_model-scaled embeddings start at unit variance.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.embed.weight, std=self.cfg.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()
        self.positions.reset_parameters()

    stream: torch.dtype | None = None  # the residual stream's dtype where it is not fp32 (`residual_stream`)

    def embed_tokens(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """Embedding × √d_model (§3.4) plus the positional encoding (§3.5), then dropout."""
        T = tokens.shape[1]
        if offset + T > self.cfg.max_len:
            raise ValueError(f"sequence of {offset + T} positions exceeds max_len={self.cfg.max_len}")
        x = self.drop(self.positions(self.embed(tokens) * math.sqrt(self.cfg.d_model), offset))
        return to_stream(x, self.stream)

    def attention_positions(self, length: int) -> Tensor | None:
        """The positional encoding's state for self-attention over `length` positions (None: it acts there not)."""
        return self.positions.attention_state(length)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids → memory (B, S, d_model) and key mask (B, 1, 1, S), True = real token."""
        src_mask = (src != PAD)[:, None, None, :]
        x = self.embed_tokens(src)
        pos = self.attention_positions(src.shape[1])
        for layer in self.encoder:
            x = layer(x, src_mask, pos)
        return self.enc_norm(x), src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoder over the whole target: (B, T) → hidden states (B, T, d_model)."""
        y = self.embed_tokens(tgt_in)
        pos = self.attention_positions(tgt_in.shape[1])
        for layer in self.decoder:
            y = layer(y, layer.cross_attn.project_kv(memory), src_mask, pos)
        return self.dec_norm(y)

    def project(self, hidden: Tensor) -> Tensor:
        """Pre-softmax linear transformation, sharing the embedding matrix (§3.4): logits (…, V)."""
        return F.linear(hidden, self.embed.weight)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, src_mask = self.encode(src)
        return self.project(self.decode(tgt_in, memory, src_mask))

    # --- incremental decoding ---------------------------------------------------------------

    def start_cache(self, memory: Tensor, src_mask: Tensor, group: int = 1) -> dict:
        """Encoder-decoder keys/values are computed once per source batch and kept once per sentence: with
        `group` hypotheses per sentence (beam search), rows b·group … b·group + group - 1 of the decoder
        share sentence b's. Self-attention caches start empty and grow by one position per `decode_step`. The source
        mask stays boolean, as in training, so that `attention` guards a sentence with no source tokens on every
        path (an additive -inf mask went to the fused kernels unguarded: those that give NaN for an all-masked row
        decoded that sentence to the length limit)."""
        layers = [{"cross": layer.cross_attn.project_kv(memory)} for layer in self.decoder]
        return {"layers": layers, "src_mask": src_mask, "pos": 0, "group": group}

    def decode_step(self, tokens: Tensor, cache: dict) -> Tensor:
        """tokens (B, 1), the latest target token per hypothesis → log-probabilities (B, V)."""
        pos = cache["pos"]
        y = self.embed_tokens(tokens, offset=pos)
        state = self.attention_positions(pos + 1)
        for layer, lc in zip(self.decoder, cache["layers"]):
            y = layer(y, lc["cross"], cache["src_mask"], state, cache=lc, group=cache["group"])
        cache["pos"] = pos + 1
        return F.log_softmax(self.project(self.dec_norm(y[:, -1])).float(), dim=-1)

    @staticmethod
    def reorder_cache(cache: dict, index: Tensor, sentences: Tensor | None = None) -> None:
        """Select hypotheses (rows) in place: `index` picks the decoder rows (beam reordering, dropping
        finished ones); `sentences` picks the sentences whose memory stays (with group 1, the rows)."""
        if sentences is None and cache["group"] == 1:
            sentences = index
        if sentences is not None:
            cache["src_mask"] = cache["src_mask"].index_select(0, sentences)
        for lc in cache["layers"]:
            if sentences is not None:
                lc["cross"] = tuple(t.index_select(0, sentences) for t in lc["cross"])
            if "k" in lc:
                lc["k"], lc["v"] = lc["k"].index_select(0, index), lc["v"].index_select(0, index)


def to_stream(x: Tensor, stream: torch.dtype | None) -> Tensor:
    """`x` in the residual stream's dtype: `stream` where autocast runs (the matmuls take bf16 there), else as it is.
    Outside autocast (the final evaluation, translation, export) the weights are fp32 and so stays the stream."""
    return x if stream is None or not torch.is_autocast_enabled(x.device.type) else x.to(stream)


def residual_stream(model: Transformer, dtype: torch.dtype | None) -> None:
    """Keep the residual stream (the embeddings' output and every residual block's) in `dtype` (bf16), or in fp32
    (None: the default, the paper's). Under bf16 autocast the matmuls run in bf16 but LayerNorm returns fp32, so the
    stream, its dropout masks, adds and norms move fp32 bytes; a bf16 stream halves that elementwise traffic (a
    runtime numerics setting, not a parameter: the weights and the checkpoint are the same). Only under autocast
    (`to_stream`): code that runs the model outside it in fp32 is unchanged."""
    model.stream = dtype
    for module in model.modules():
        if isinstance(module, Residual):
            module.stream = dtype
