"""What a piece of the training step moves through memory, counted without a GPU: every ATen op it dispatches, with
the bytes of the tensors it reads and writes (its inputs and outputs; a fused kernel moves less, a cache more, so
this is the eager step's traffic, an upper bound where a compiler fuses), and how often it casts a given weight.

Runs under a FakeTensorMode, so paper-sized shapes cost no compute and no memory: the fused loss of the paper's base
row (25,000 target positions, a 37,000 × 512 embedding) is counted on a laptop in a second.

    python -m aiayn.bench.traffic                      # the fused loss at the paper's shapes, bf16 autocast
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


def loss_traffic(vocab: int, d_model: int, positions: int, *, autocast: bool = True, chunk: int | None = None,
                 loss_fn=None) -> Traffic:  # fmt: skip
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=37000)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--positions", type=int, default=25000)
    ap.add_argument("--fp32", action="store_true", help="no autocast (a CPU run, or fp32 on a GPU)")
    args = ap.parse_args(argv)
    t = loss_traffic(args.vocab, args.d_model, args.positions, autocast=not args.fp32)
    print(f"fused loss, {args.positions} positions x V {args.vocab} x d_model {args.d_model}, "
          f"{'fp32' if args.fp32 else 'bf16 autocast'}: {t.dispatches} ops, {t.total_bytes / 1e9:.2f} GB read + "
          f"written, the weight cast {t.watched_casts} time(s)")  # fmt: skip
    for name, n in t.bytes.most_common(8):
        print(f"  {name}: {t.ops[name]} calls, {n / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
