"""`aiayn bench --pack K`: K seeds' training steps as one pack (lightning_modules/transformer/packed.py) against the
same K models stepped one after another in one process, on the same batches.

Each seed has its own batch (`run.training_batch` with the seed's number: the same shape, other sentences), its own
initialization and Adam state; both sides draw dropout masks from the counter stream (`DropoutStream`), so both do
the same arithmetic; a third side, "separate, torch's dropout", is the separate models with the default masks from
torch's generator (what `aiayn train` runs today). Each side runs its own training path: the separate models the
trainer's (encode, decode, `projected_label_smoothed_loss`, no logits), the pack `packed_loss` (the same fused loss,
K blocks at once). bf16 autocast on CUDA, as the bench's other steps. Timing as `run.py`'s: untimed warm-up steps,
then `trials` interleaved rounds of `steps` steps each (the device synchronized at both ends of a round), medians
reported, as seed-steps per second (one call of any side is K seed-steps). Launches per step:
`profile.profile_steps` (CUDA kernels, or a CPU's leaf ATen operators) over `steps` steps of each side.

With `--compile HOW` a fourth side, "packed, compiled": the same pack compiled as `aiayn train --pack-seeds ...
--compile HOW --static-shapes` compiles it (transformer/compiled.py; the bench's batches have one shape), with
`graphs` its step replayed as CUDA graphs on a CUDA device (Adam fused, as training has it): what the packed
static-shape step costs captured. Its compilation falls in the untimed warm-up steps.
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from aiayn.bench import BenchOptions
from aiayn.bench.profile import profile_steps
from aiayn.bench.run import bench_config, bench_main, device_name, time_steps, training_batch
from aiayn.common.errors import UserError
from aiayn.lightning_modules.transformer.compiled import compile_model
from aiayn.lightning_modules.transformer.dropout_stream import DropoutStream, counter_dropout
from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss
from aiayn.lightning_modules.transformer.model import Transformer
from aiayn.lightning_modules.transformer.packed import pack, packed_loss, stack_batches


def adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


def sides(cfg, batches: list[dict], device: torch.device, how: str = "none"):
    """The three steps (separate, packed, separate with torch's dropout), each a function of no arguments, and with
    `how` other than none the pack compiled as `--compile HOW` compiles it."""
    amp = (lambda: torch.autocast("cuda", torch.bfloat16)) if device.type == "cuda" else contextlib.nullcontext
    K = len(batches)
    models = []
    for k in range(K):
        torch.manual_seed(k)
        models.append(Transformer(cfg).to(device).train())
    packed = pack(models).train()
    counter_dropout(packed, DropoutStream(list(range(K))))
    streams = [DropoutStream([k]) for k in range(K)]
    on = [{name: t.to(device) if isinstance(t, torch.Tensor) else t for name, t in b.items()} for b in batches]
    opts = [adam(m.parameters()) for m in models]

    def separate(counter: bool = True) -> None:
        for model, opt, b, stream in zip(models, opts, on, streams):
            counter_dropout(model, stream if counter else None)
            opt.zero_grad(set_to_none=True)
            with amp():
                memory, src_mask = model.encode(b["src"])
                hidden = model.decode(b["tgt_in"], memory, src_mask)
                loss, _, _ = projected_label_smoothed_loss(hidden, model.embed.weight, b["tgt_out"], cfg.eps_ls)
            loss.backward()
            opt.step()

    src, tgt_in = stack_batches([(b["src"], b["tgt_in"]) for b in on])
    _, tgt_out = stack_batches([(b["src"], b["tgt_out"]) for b in on])
    packed_opt = adam(packed.parameters())

    def packed_step(model=packed, opt=packed_opt) -> None:
        opt.zero_grad(set_to_none=True)
        with amp():
            loss, _, n = packed_loss(model, src, tgt_in, tgt_out, cfg.eps_ls)
        (loss / n).sum().backward()
        opt.step()

    out = {"separate": separate, "packed": packed_step, "separate, torch's dropout": lambda: separate(False)}
    if how != "none":  # nothing has stepped yet: the same initial weights as the others
        compiled = pack(models).train()
        counter_dropout(compiled, DropoutStream(list(range(K))).to(device))
        cuda = device.type == "cuda"
        compile_model(compiled, how, dynamic=False, shapes=1, cuda=cuda)  # the bench's one shape
        opt = adam(compiled.parameters())
        out["packed, compiled"] = lambda: packed_step(compiled, opt)
    return out


def run(opts: BenchOptions) -> dict:
    device = torch.device(opts.device)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    bc = bench_config(opts.size, opts.device, opts.layers, opts.tokens)
    K = opts.pack
    batches = [training_batch(bc.model, bc.tokens_per_side, bc.seq_len, seed=k) for k in range(K)]
    steps = sides(bc.model, batches, device, opts.compile)
    for step in steps.values():
        for _ in range(max(1, opts.warmup)):  # Adam's state made: every step after is alike
            step()
    rounds = {name: [] for name in steps}
    for _ in range(opts.trials):
        for name, step in steps.items():
            rounds[name].append(time_steps(step, device, opts.steps))
    out = {
        "size": bc.name,
        "note": bc.note,
        "K": K,
        "device": device_name(device),
        "steps": opts.steps,
        "trials": opts.trials,
        "tokens_per_side": bc.tokens_per_side,
        "compile": opts.compile,
    }
    for name, step in steps.items():
        s = statistics.median(rounds[name])
        out[name] = {
            "step_s": s,
            "seed_steps_per_s": K / s,
            "launches_per_step": profile_steps(step, device, opts.steps)["launches_per_step"],
        }
    out["speedup"] = out["packed"]["seed_steps_per_s"] / out["separate"]["seed_steps_per_s"]
    if "packed, compiled" in out:
        out["compiled_speedup"] = out["packed, compiled"]["seed_steps_per_s"] / out["separate"]["seed_steps_per_s"]
    return out


def text(r: dict) -> str:
    lines = [
        f"{r['K']} seeds of the {r['size']} size ({r['note']}, {r['tokens_per_side']} padded positions a side "
        f"each) on {r['device']}, medians of {r['trials']} rounds of {r['steps']} steps",
        "| side | seed-steps/s | one call (K seed-steps), ms | launches a call |",
        "| --- | --- | --- | --- |",
    ]
    for name in ("separate", "packed", "separate, torch's dropout", "packed, compiled"):
        if name not in r:
            continue
        s = r[name]
        ms, launches = 1e3 * s["step_s"], s["launches_per_step"]
        lines.append(f"| {name} | {s['seed_steps_per_s']:.1f} | {ms:.1f} | {launches:.0f} |")
    lines.append(f"packed / separate: {r['speedup']:.2f}x")
    if "compiled_speedup" in r:
        lines.append(f"packed, --compile {r['compile']} / separate: {r['compiled_speedup']:.2f}x")
    return "\n".join(lines)


def main(opts: BenchOptions) -> int:
    if opts.peers or opts.padding or opts.trainer_sizes:
        raise UserError(
            "--pack compares a pack with its seeds stepped apart only; drop --peers, --padding and --trainer-size"
        )
    return bench_main(opts, run, text)
