"""A pack's loss, forward and backward, as the fused loss (`projected_label_smoothed_loss` over K blocks, what
`packed_loss` runs) against the materialized logits it replaced (logits (K·B·T, V), log_softmax, autograd through
them), at the evidence preset's shapes (1024 target positions a seed, V 1000, d_model 32) on a CPU.

    python scripts/pack_loss_bench.py --threads 1 --k 4 8

Interleaved rounds of 5 calls each, medians in ms a call (BENCHMARKS.md, "A pack's loss, fused").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from aiayn.lightning_modules.transformer.config import PAD
from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss


def sides(K: int, N: int = 1024, V: int = 1000, d: int = 32, eps: float = 0.1):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(K * 32, N // 32, d, generator=g)
    weight = torch.randn(K, V, d, generator=g)
    target = torch.randint(4, V, (K * 32, N // 32), generator=g)
    target[torch.rand(target.shape, generator=g) < 0.2] = PAD

    def materialized():
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logits = torch.bmm(h.reshape(K, -1, d), w.mT).view(*h.shape[:-1], V)
        logp = F.log_softmax(logits.float(), dim=-1)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        loss = ((1.0 - eps) * nll + eps * -logp.mean(dim=-1)) * (target != PAD).float()
        loss.view(K, -1).sum(1).sum().backward()

    def fused():
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        projected_label_smoothed_loss(h, w, target, eps, reduction="sum")[0].sum().backward()

    return {"materialized": materialized, "fused": fused}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for K in args.k:
        fns = sides(K)
        times = {name: [] for name in fns}
        for fn in fns.values():
            fn()  # warm-up
        for _ in range(args.rounds):
            for name, fn in fns.items():
                start = time.perf_counter()
                for _ in range(5):
                    fn()
                times[name].append((time.perf_counter() - start) / 5 * 1e3)
        m, f = (statistics.median(times[name]) for name in ("materialized", "fused"))
        print(f"threads {args.threads} K {K}: materialized {m:.1f} ms, fused {f:.1f} ms a call: {m / f:.2f}x")


if __name__ == "__main__":
    main()
