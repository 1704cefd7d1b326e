"""What a piece of the training step moves through memory, counted without a GPU: every ATen op it dispatches, with
the bytes of the tensors it reads and writes (its inputs and outputs; a fused kernel moves less, a cache more, so
this is the eager step's traffic, an upper bound where a compiler fuses), and how often it casts a given weight.

Runs under a FakeTensorMode, so paper-sized shapes cost no compute and no memory: the fused loss of the paper's base
row (25,000 target positions, a 37,000 × 512 embedding) is counted on a laptop in a second.

    python -m aiayn.bench.traffic                      # the fused loss at the paper's shapes, bf16 autocast
    python -m aiayn.bench.traffic --step               # the whole step (forward, loss, backward) by kind of op
    python -m aiayn.bench.traffic --step --residual bf16   # the same with a bf16 residual stream
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _nbytes(x) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


@dataclass
class Traffic:
    ops: Counter = field(default_factory=Counter)  # op name -> calls (views and metadata queries left out)
    bytes: Counter = field(default_factory=Counter)  # op name -> bytes read + written
    watched_casts: int = 0  # dtype casts (aten._to_copy) of the watched tensor itself (the weight)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    @property
    def dispatches(self) -> int:
        return sum(self.ops.values())


def _moves_data(func, out) -> bool:
    """Whether an op reads and writes memory: not a view (its result aliases an input and nothing is written) nor a
    query that returns no tensor (device, size, ...)."""
    outs, _ = tree_flatten(out)
    if not any(isinstance(x, torch.Tensor) for x in outs):
        return False
    schema = func._schema
    aliased = any(r.alias_info is not None for r in schema.returns)
    return not aliased or schema.is_mutable


class CountTraffic(TorchDispatchMode):
    """Counts each dispatched op's calls and bytes (`Traffic`), and the casts of `watch` (a tensor) itself."""

    def __init__(self, watch: torch.Tensor | None = None) -> None:
        super().__init__()
        self.traffic, self.watch = Traffic(), watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not _moves_data(func, out):
            return out
        name = str(func.overloadpacket.__name__)
        ins, _ = tree_flatten((args, kwargs or {}))
        outs, _ = tree_flatten(out)
        t = self.traffic
        t.ops[name] += 1
        t.bytes[name] += sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))
        if name == "_to_copy" and self.watch is not None and args and args[0] is self.watch:
            t.watched_casts += 1
        return out


def loss_traffic(
    vocab: int, d_model: int, positions: int, *, autocast: bool = True, chunk: int | None = None, loss_fn=None
) -> Traffic:
    """The traffic of one forward (with its gradients, which the fused loss computes there) of the fused projection and
    label-smoothed loss: `positions` target positions of `d_model` hidden states against a `vocab` × `d_model` fp32
    embedding, under CPU bf16 autocast (as Lightning's bf16-mixed, cast cache off) or in fp32; on fake tensors.
    `loss_fn`: the function to count (default: aiayn's projected_label_smoothed_loss)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss

    loss_fn = loss_fn or projected_label_smoothed_loss
    with FakeTensorMode():
        hidden = torch.empty(positions, d_model, requires_grad=True)
        weight = torch.empty(vocab, d_model, requires_grad=True)
        target = torch.ones(positions, dtype=torch.long)
        with CountTraffic(watch=weight) as counter:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast, cache_enabled=False):
                loss_fn(hidden, weight, target, 0.1, chunk=chunk, reduction="sum")
    return counter.traffic


# Kinds of op in a training step, by ATen name: the GEMMs, fused attention (its kernels read Q, K, V and write O;
# they never hold the (T, S) scores), and everything else: elementwise and reductions (dropout, residual adds,
# LayerNorm, the loss's passes over the logits, casts, the embedding gather and its gradient's scatter)
GEMM_OPS = ("mm", "bmm", "addmm", "linear", "matmul", "_scaled_mm", "baddbmm", "addbmm")


def kind_of(name: str) -> str:
    if name in GEMM_OPS:
        return "gemm"
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return "attention"
    return "elementwise"


def step_traffic(cfg, tokens: int, seq_len: int, *, residual: str = "fp32") -> dict[str, Traffic]:
    """Bytes read and written by one training step of `cfg` (forward, fused loss, backward; the optimizer apart) on
    `tokens` target and as many source tokens in sentences of `seq_len`, under bf16 autocast, on the code a GPU runs
    (scaled_dot_product_attention, F.dropout), by kind of op (`kind_of`); on fake tensors. `residual`: the residual
    stream's dtype (model.residual_stream)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from aiayn.lightning_modules.transformer import model as M
    from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss

    fast, M.CPU_FAST_PATHS = M.CPU_FAST_PATHS, False
    try:
        with FakeTensorMode():
            model = M.Transformer(cfg)
            if residual == "bf16":
                M.residual_stream(model, torch.bfloat16)
            b = max(1, tokens // seq_len)
            src = torch.ones(b, seq_len, dtype=torch.long)
            tgt = torch.ones(b, seq_len, dtype=torch.long)
            with CountTraffic() as counter:
                with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                    memory, mask = model.encode(src)
                    hidden = model.decode(tgt, memory, mask)
                    loss, _, _ = projected_label_smoothed_loss(
                        hidden, model.embed.weight, tgt, cfg.eps_ls, reduction="sum"
                    )
                loss.backward()
    finally:
        M.CPU_FAST_PATHS = fast
    out = {k: Traffic() for k in ("gemm", "attention", "elementwise")}
    t = counter.traffic
    for name, n in t.ops.items():
        out[kind_of(name)].ops[name] += n
        out[kind_of(name)].bytes[name] += t.bytes[name]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=37000)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--positions", type=int, default=25000)
    ap.add_argument("--fp32", action="store_true", help="no autocast (a CPU run, or fp32 on a GPU)")
    ap.add_argument("--step", action="store_true", help="the whole training step of the paper's base row, by kind")
    ap.add_argument("--seq-len", type=int, default=28, help="sentence length (WMT14's mean, about 28 tokens)")
    ap.add_argument("--residual", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args(argv)
    if args.step:
        from aiayn.lightning_modules.run.spec import resolve

        cfg = resolve("base", "paper").model
        kinds = step_traffic(cfg, args.positions, args.seq_len, residual=args.residual)
        total = sum(k.total_bytes for k in kinds.values())
        print(
            f"paper base step, {args.positions} + {args.positions} tokens in sentences of {args.seq_len}, bf16 "
            f"autocast, {args.residual} residual stream: {total / 1e9:.1f} GB read + written, "
            f"{sum(k.dispatches for k in kinds.values())} ops"
        )
        for kind, k in kinds.items():
            top = ", ".join(f"{n} {b / 1e9:.1f}" for n, b in k.bytes.most_common(6))
            print(f"  {kind}: {k.total_bytes / 1e9:.1f} GB in {k.dispatches} ops ({top})")
        return
    t = loss_traffic(args.vocab, args.d_model, args.positions, autocast=not args.fp32)
    print(
        f"fused loss, {args.positions} positions x V {args.vocab} x d_model {args.d_model}, "
        f"{'fp32' if args.fp32 else 'bf16 autocast'}: {t.dispatches} ops, {t.total_bytes / 1e9:.2f} GB read + "
        f"written, the weight cast {t.watched_casts} time(s)"
    )
    for name, n in t.bytes.most_common(8):
        print(f"  {name}: {t.ops[name]} calls, {n / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
