"""`aiayn bench --trainer`: Lightning's training loop beside the bare training step, on the same batches.

What it answers: how much of the bare step's speed survives when the same step runs inside `pl.Trainer.fit` with
`TranslationModule`, as every `aiayn train` does (the target: the Trainer at 85% or more of the bare step
at the tiny and laptop configs). Both sides train a model of the same config, with the same initial weights, on the
same pre-built batch (`run.training_batch`), already on the device for both: the host-to-device copy of a real
run's batches is in neither side.

- **bare** (`BareStep`): exactly the arithmetic of one optimizer step of `TranslationModule`, called directly:
  zero the gradients; encode, decode, `projected_label_smoothed_loss(..., reduction="sum")` (bf16 autocast on
  CUDA, as the bench's other steps); backward; the per-step normalization (`torch._foreach_mul_` of every gradient
  by 1 / the batch's real target tokens, a host number); the module's own fused Adam step and its learning-rate
  schedule step (`TranslationModule.configure_optimizers()`). Nothing waits for the device inside it.
- **trainer**: `pl.Trainer.fit(TranslationModule, train_dataloaders=...)` over a DataLoader that yields that same
  batch `warmup + trials · steps` times; `max_steps` of that, no validation, no checkpointing, no logger, no
  progress bar, no model summary; precision bf16-mixed on CUDA (Lightning's `torch.autocast(..., cache_enabled=False)`)
  and 32-true on CPU; the callback every `aiayn train` run has besides checkpoints and loggers (`RNGStates`, as
  `train.build_trainer` adds it). So it includes everything the module and Lightning do per step that the bare
  step does not: the loop, its hooks and progress counters, moving the batch (a no-op for device tensors), the
  closure, `training_step`'s token counting and loss sums, `on_before_optimizer_step`'s non-finite check (the
  step's one host-device sync) and its logs every `log_every_n_steps`, and the RNG states' capture and restore.

Timing: each side warms up `warmup` untimed optimizer steps, then `trials` rounds, interleaved (bare, trainer,
bare, trainer, ...): the bare side's rounds are `run.Trainer.timed`-like (synchronize, `steps` steps, synchronize);
the trainer side is one `fit` of `warmup + trials · steps` steps, timed by a callback from the end of one optimizer
step to the end of the step `steps` later (each window is `steps` whole iterations of the loop, the device
synchronized at both ends), and the bare rounds run inside that callback, between two windows, outside both
windows. Medians over the rounds are reported, as tokens/s of real (non-pad) source + target tokens.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from aiayn.bench import BenchOptions
from aiayn.bench.run import _sync, bench_config, bench_main, device_name, time_steps, training_batch
from aiayn.common.errors import UserError
from aiayn.lightning_modules.run.callbacks import RNGStates
from aiayn.lightning_modules.run.module import TranslationModule
from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss

log = logging.getLogger(__name__)

TRAINER_CONFIGS = ("tiny", "laptop")
TARGET_RATIO = 0.85  # the Trainer at 85% of the bare step or better, at tiny and laptop


def on_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


class SameBatch(Dataset):
    """`n` items, each the same pre-built batch (a DataLoader with batch_size=None yields them as they are)."""

    def __init__(self, batch: dict, n: int):
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return self.batch


def _as_is(item):
    return item


def batch_loader(batch: dict, n: int) -> DataLoader:
    """A DataLoader that yields `batch` n times, untouched (no collation, no workers, no pinning)."""
    return DataLoader(SameBatch(batch, n), batch_size=None, collate_fn=_as_is, num_workers=0)


def lightning_trainer(
    device: torch.device, max_steps: int, callbacks: list, root_dir: str, precision: str | None = None
) -> pl.Trainer:
    """The Trainer of the comparison: `train.build_trainer`'s loop without validation, checkpoints, loggers,
    progress bar or model summary (see the module docstring); precision by default bf16-mixed on CUDA, else 32-true."""
    return pl.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision=precision or ("bf16-mixed" if device.type == "cuda" else "32-true"),
        max_steps=max_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[RNGStates(), *callbacks],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        log_every_n_steps=10,
        default_root_dir=root_dir,
    )


class BareStep:
    """One optimizer step of `TranslationModule` without Lightning (see the module docstring for what it holds)."""

    def __init__(self, module: TranslationModule, batch: dict, device: torch.device):
        self.module = module.to(device)
        self.model, self.eps = module.model, module.cfg.eps_ls
        conf = module.configure_optimizers()  # the module's own fused Adam and schedule
        self.opt, self.sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
        self.batch, self.device = on_device(batch, device), device
        self.inv_tokens = 1.0 / max(batch["n_tgt_tokens"], 1)
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
        self.steps = 0

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        b = self.batch
        with self.autocast:
            memory, src_mask = self.model.encode(b["src"])
            hidden = self.model.decode(b["tgt_in"], memory, src_mask)
            loss, _, _ = projected_label_smoothed_loss(
                hidden, self.model.embed.weight, b["tgt_out"], self.eps, reduction="sum"
            )
        loss.backward()
        torch._foreach_mul_([p.grad for p in self.module.parameters() if p.grad is not None], self.inv_tokens)
        self.opt.step()
        self.sched.step()
        self.steps += 1

    def timed(self, steps: int) -> float:
        return time_steps(self.step, self.device, steps)


class Windows(pl.Callback):
    """Times the Trainer in windows of `steps` optimizer steps after `warmup` steps, and calls `between()` (a bare
    round) before each window, outside it."""

    def __init__(self, warmup: int, steps: int, trials: int, device: torch.device, between):
        self.warmup, self.steps, self.trials, self.device, self.between = warmup, steps, trials, device, between
        self.seconds: list[float] = []  # per step, one entry per window
        self._t0: float | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        done = trainer.global_step  # optimizer steps taken, this batch's included
        if done < self.warmup or (done - self.warmup) % self.steps:
            return
        _sync(self.device)
        now = time.perf_counter()
        if self._t0 is not None:
            self.seconds.append((now - self._t0) / self.steps)
        if len(self.seconds) < self.trials:
            self.between()
            _sync(self.device)
            self._t0 = time.perf_counter()


def measure(name: str, args: BenchOptions, device: torch.device) -> dict:
    """The trainer and the bare step of bench config `name`, interleaved (see the module docstring)."""
    try:
        bc = bench_config(name, device.type, args.layers, args.tokens)
    except ValueError as e:
        raise UserError(f"--trainer-size {name}: {e}") from None
    cfg = bc.model
    batch = training_batch(cfg, bc.tokens_per_side, bc.seq_len)
    tokens = batch["n_src_tokens"] + batch["n_tgt_tokens"]
    torch.manual_seed(0)
    bare = BareStep(TranslationModule(cfg), batch, device)
    torch.manual_seed(0)
    module = TranslationModule(cfg)  # the same initial weights as the bare side's
    for _ in range(args.warmup):
        bare.step()
    bare_s: list[float] = []
    max_steps = args.warmup + args.trials * args.steps
    windows = Windows(args.warmup, args.steps, args.trials, device, lambda: bare_s.append(bare.timed(args.steps)))
    B, S = batch["src"].shape
    log.info("trainer vs bare, config %s: %s; batch %d×%d on %s", bc.name, bc.note, B, S, device)
    with tempfile.TemporaryDirectory(prefix="aiayn-bench-") as root:
        trainer = lightning_trainer(device, max_steps, [windows], root)
        trainer.fit(module, train_dataloaders=batch_loader(on_device(batch, device), max_steps))
    if len(windows.seconds) != args.trials or len(bare_s) != args.trials:
        raise RuntimeError(f"expected {args.trials} rounds per side, got {len(windows.seconds)} and {len(bare_s)}")
    trainer_s, bare_med = statistics.median(windows.seconds), statistics.median(bare_s)
    for i, (t, b) in enumerate(zip(windows.seconds, bare_s)):
        log.info("round %d: trainer %.4f s/step, bare %.4f s/step", i + 1, t, b)
    return {
        "config": bc.name,
        "config_note": bc.note,
        "model": cfg.to_dict(),
        "device": device.type,
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "precision": "bf16-mixed" if device.type == "cuda" else "fp32",
        "torch": torch.__version__,
        "lightning": pl.__version__,
        "batch_sentences": B,
        "batch_padded_positions_per_side": B * S,
        "batch_tokens": tokens,
        "warmup": args.warmup,
        "trials": args.trials,
        "steps_per_trial": args.steps,
        "trainer_step_s": trainer_s,
        "bare_step_s": bare_med,
        "trainer_tokens_per_s": tokens / trainer_s,
        "bare_tokens_per_s": tokens / bare_med,
        "ratio": bare_med / trainer_s,  # trainer tokens/s ÷ bare tokens/s
        "target_ratio": TARGET_RATIO,
        "trainer_step_s_trials": windows.seconds,
        "bare_step_s_trials": bare_s,
        # what really ran: the module's optimizer steps (counted in its on_before_optimizer_step) and the loop's
        "trainer_optimizer_steps": module.trained["steps"],
        "trainer_global_step": trainer.global_step,
        "bare_optimizer_steps": bare.steps,
    }


def run_trainer(args: BenchOptions) -> list[dict]:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    return [measure(name, args, device) for name in (args.trainer_sizes or TRAINER_CONFIGS)]


def trainer_table(results: list[dict]) -> str:
    lines = [
        "| config | trainer tokens/s | bare tokens/s | trainer / bare | trainer ms/step | bare ms/step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['config']} | {r['trainer_tokens_per_s']:.0f} | {r['bare_tokens_per_s']:.0f} | {r['ratio']:.2f} "
            f"| {1e3 * r['trainer_step_s']:.1f} | {1e3 * r['bare_step_s']:.1f} |"
        )
    r = results[0]
    lines.append(
        f"\n{r['device_name']}, {r['precision']}; medians of {r['trials']} interleaved rounds of "
        f"{r['steps_per_trial']} steps after {r['warmup']} warm-up steps; target: trainer / bare >= {TARGET_RATIO:.2f}"
    )
    return "\n".join(lines)


def main(opts: BenchOptions) -> int:
    if opts.peers or opts.padding:
        raise UserError("--trainer compares aiayn's Trainer with its bare step only; drop --peers and --padding")
    return bench_main(opts, run_trainer, trainer_table)
