"""K Transformers of one configuration trained as one computation: a pack.

A small model's training step is hundreds of kernel launches for microseconds of arithmetic each; on a GPU the
launches, not the arithmetic, set the pace. Packing K seeds (or rows of one shape) makes the step's arithmetic K
times larger in the same launches: every parameter of `Transformer` is stacked along a new leading dimension K
(model k's tensor is `packed_param[k]`, under the same name), the activations carry the K models' batches as K
equal blocks of rows (K·B, T, d_model), and only the leaves that hold parameters change: a linear layer is one
batched matmul (model.linear), a LayerNorm normalizes all rows and applies block k's gain and bias, the embedding
looks block k's tokens up in table k. Everything between them (attention, residual blocks, the stacks, masks) is
`Transformer`'s own code, unchanged: attention's rows never mix, so seed k's numbers are its own.

Each seed keeps its own initialization (the pack is made of K models built as each would be alone), sentences
(`stack_batches` pads the K batches to one shape; padding changes no real position's numbers), dropout masks
(dropout_stream.py's `DropoutStream`: counter-based, the same as the seed trained alone with that stream), loss
normalization and Adam state (Adam is elementwise: its state for packed_param[k] is model k's). A seed whose numbers
go non-finite does not touch the others' (tests/test_packed.py). The launches of a step do not grow with K (counted
there). No Lightning here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.lightning_modules.transformer.config import EOS, PAD
from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss
from aiayn.lightning_modules.transformer.model import LearnedPositions, Transformer, linear


class PackedLinear(nn.Module):
    """K `nn.Linear`s: weight (K, out, in), bias (K, out); input (K·B, ..., in) in K blocks of rows."""

    def __init__(self, linear: nn.Linear, K: int):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().new_empty(K, *linear.weight.shape))
        self.bias = nn.Parameter(linear.bias.detach().new_empty(K, *linear.bias.shape))

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


class PackedLayerNorm(nn.Module):
    """K `nn.LayerNorm`s over the last dimension: gain and bias (K, d)."""

    def __init__(self, norm: nn.LayerNorm, K: int):
        super().__init__()
        self.eps, self.shape = norm.eps, norm.normalized_shape
        self.weight = nn.Parameter(norm.weight.detach().new_empty(K, *norm.weight.shape))
        self.bias = nn.Parameter(norm.bias.detach().new_empty(K, *norm.bias.shape))

    def forward(self, x: Tensor) -> Tensor:
        K, d = self.weight.shape
        y = F.layer_norm(x.reshape(K, -1, d), self.shape, eps=self.eps)
        return torch.addcmul(self.bias[:, None], y, self.weight[:, None]).view(x.shape)


class PackedEmbedding(nn.Module):
    """K embedding tables (K, V, d): block k's ids look up table k (one gather over the K tables laid end to end).
    No padding_idx: a padding position's embedding gets no gradient anyway (every real position's attention masks
    it, and the loss skips it), and the tied projection trains that row in both forms alike."""

    def __init__(self, embedding: nn.Embedding, K: int):
        super().__init__()
        self.weight = nn.Parameter(embedding.weight.detach().new_empty(K, *embedding.weight.shape))

    def forward(self, tokens: Tensor) -> Tensor:
        K, V, d = self.weight.shape
        offsets = torch.arange(0, K * V, V, device=tokens.device)[:, None]
        return F.embedding(tokens.reshape(K, -1) + offsets, self.weight.view(K * V, d)).view(*tokens.shape, d)


class PackedLearnedPositions(LearnedPositions):
    """Table 3 row E's learned positions, K tables (K, max_len, d)."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        w = self.embed.weight  # (K, max_len, d)
        K, T = w.shape[0], x.shape[1]
        return (x.view(K, -1, T, x.shape[2]) + w[:, None, offset : offset + T]).view(x.shape)


def pack(models: list[Transformer]) -> Transformer:
    """One `Transformer` whose parameters are `models`' stacked (K = len(models)), numerically K models: block k
    of its batch's rows is model k's. Built on the first model's structure; the models must share a config."""
    cfg = models[0].cfg
    if any(m.cfg != cfg for m in models):
        raise ValueError("a pack's models share one TransformerConfig (rows of one shape)")
    K = len(models)
    with torch.random.fork_rng(devices=[]):  # its own initialization is overwritten: draw nothing from the caller's
        packed = Transformer(cfg)
    leaves = {nn.Linear: PackedLinear, nn.LayerNorm: PackedLayerNorm, nn.Embedding: PackedEmbedding}
    for module in list(packed.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) in leaves:
                setattr(module, child_name, leaves[type(child)](child, K))
        if type(module) is LearnedPositions:  # its table is a PackedEmbedding now; it adds table k to block k
            module.__class__ = PackedLearnedPositions
    packed.K = K
    with torch.no_grad():
        states = [m.state_dict() for m in models]
        packed.load_state_dict({name: torch.stack([s[name] for s in states]) for name in states[0]})
    return packed.to(next(models[0].parameters()).device)


def unpack(packed: Transformer) -> list[dict[str, Tensor]]:
    """Each model's state dict (a plain `Transformer`'s, as its checkpoint holds it) from a pack."""
    state = packed.state_dict()
    return [{name: t[k].clone() for name, t in state.items()} for k in range(packed.K)]


def stack_batches(batches: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """K batches (src (B_k, S_k), tgt (B_k, T_k)), padded to one (B, S) and (B, T), rows in K blocks:
    (K·B, S), (K·B, T). Real positions keep their row and column, so a seed's numbers do not depend on the others'
    lengths (a shared length schedule keeps this padding small)."""
    B = max(src.shape[0] for src, _ in batches)
    S = max(src.shape[1] for src, _ in batches)
    T = max(tgt.shape[1] for _, tgt in batches)

    def pad(t: Tensor, cols: int, first: int) -> Tensor:
        out = F.pad(t, (0, cols - t.shape[1], 0, B - t.shape[0]), value=PAD)
        out[t.shape[0] :, 0] = first
        return out

    # a filler row's source is one EOS: a source of nothing attends to nothing, whose NaN would reach the block's
    # loss and gradients through the multiplication that drops it; its target, all padding, adds no loss
    return torch.cat([pad(src, S, EOS) for src, _ in batches]), torch.cat([pad(tgt, T, PAD) for _, tgt in batches])


def packed_loss(packed: Transformer, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, eps: float):
    """Each model's summed label-smoothed loss (§5.4), summed NLL and target tokens, (K,) each, of a stacked batch:
    the loss a model alone trains with (`loss.projected_label_smoothed_loss`, the projection fused into it, no
    (K·B, T, V) logits), reduced per block."""
    memory, src_mask = packed.encode(src)
    hidden = packed.decode(tgt_in, memory, src_mask)
    return projected_label_smoothed_loss(hidden, packed.embed.weight, tgt_out, eps, reduction="sum")
