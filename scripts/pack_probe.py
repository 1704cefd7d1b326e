"""Does packing K seeds into one computation pay on this machine? A probe for issue 42's packed runs, before building
them: K models of one row stacked (torch.func.stack_module_state) and trained as one vmapped step with one Adam over
the stacked parameters (Adam is elementwise: K models' own Adams), against one model's step alone, on the same batch.

    python scripts/pack_probe.py --size evidence --threads 1 --k 4 8
    python scripts/pack_probe.py --size evidence --threads 2 --k 8

Prints ms per step alone, ms per packed step, and ms per seed-step packed (the packed step / K), medians over
alternating trials, and the operators each step runs (aiayn/bench/profile.py: what a GPU would launch as kernels).

Two parts of the model do not run under vmap today, and the probe stands them in on both sides
alike (so the comparison is like for like, and neither is what training runs): the fused projected loss (a
torch.autograd.Function without `setup_context`, which functorch requires) is replaced by logits and PyTorch's
label-smoothed cross-entropy; the CPU attention path (in-place `nan_to_num_` on the softmax's output, which
autograd refuses under vmap) by scaled_dot_product_attention. Dropout is off (P_drop 0): vmap's
randomness="different" refuses the model's in-place dropout on an unbatched tensor.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import stack_module_state, vmap
from torch.nn.utils.stateless import _reparametrize_module

import aiayn.lightning_modules.transformer.model as M
from aiayn.bench.run import training_batch
from aiayn.lightning_modules.run.spec import resolve


def loss_of(model, src, tgt_in, tgt_out):
    memory, mask = model.encode(src)
    logits = model.decode(tgt_in, memory, mask) @ model.embed.weight.t()
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=M.PAD, label_smoothing=0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="evidence", help="a preset whose base row is the model (default: evidence)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8], help="seeds per pack")
    ap.add_argument("--tokens", type=int, default=1024, help="padded positions per side (evidence: 1024)")
    ap.add_argument("--steps", type=int, default=10, help="steps per trial")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    M.cpu_fast_path = lambda q: False  # see the module docstring
    cfg = M.TransformerConfig.from_dict(resolve("base", args.size).model.to_dict() | {"P_drop": 0.0})
    b = training_batch(cfg, args.tokens, 24)

    torch.manual_seed(0)
    alone = M.Transformer(cfg)
    alone_opt = torch.optim.Adam(alone.parameters(), lr=1e-4)

    def step_alone():
        alone_opt.zero_grad()
        loss_of(alone, b["src"], b["tgt_in"], b["tgt_out"]).backward()
        alone_opt.step()

    steps = {"alone": step_alone}
    for k in args.k:
        models = [M.Transformer(cfg) for _ in range(k)]
        params, buffers = stack_module_state(models)
        skeleton = copy.deepcopy(models[0]).to("meta")
        stacked = {name: p.detach().requires_grad_() for name, p in params.items()}
        opt = torch.optim.Adam(stacked.values(), lr=1e-4)
        batch = [b[key].expand(k, *b[key].shape) for key in ("src", "tgt_in", "tgt_out")]

        def one(p, bu, src, tgt_in, tgt_out, skeleton=skeleton):
            with _reparametrize_module(skeleton, {**p, **bu}):
                return loss_of(skeleton, src, tgt_in, tgt_out)

        packed = vmap(one, randomness="same")

        def step_packed(opt=opt, packed=packed, stacked=stacked, buffers=buffers, batch=batch):
            opt.zero_grad()
            packed(stacked, buffers, *batch).sum().backward()  # each seed's loss: its own gradients
            opt.step()

        steps[f"K={k}"] = step_packed
    for step in steps.values():  # warm: Adam's state, the allocator
        for _ in range(2):
            step()
    times = {name: [] for name in steps}
    for _ in range(args.trials):  # alternating: a slow spell of the machine hits every side
        for name, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - t0) / args.steps)
    from aiayn.bench.profile import profile_steps

    launches = {name: profile_steps(step, torch.device("cpu"), 1)["launches_per_step"] for name, step in steps.items()}
    base = statistics.median(times["alone"])
    print(
        f"{args.size} base row, {args.tokens} positions a side, {args.threads} thread(s): "
        f"alone {base * 1e3:.1f} ms/step, {launches['alone']:.0f} leaf ATen operators a step"
    )
    for k in args.k:
        t = statistics.median(times[f"K={k}"])
        print(
            f"  K={k}: {t * 1e3:.1f} ms a packed step, {t / k * 1e3:.1f} ms a seed-step: "
            f"{base / (t / k):.2f}x alone's; {launches[f'K={k}']:.0f} leaf ATen operators a packed step"
        )


if __name__ == "__main__":
    main()
