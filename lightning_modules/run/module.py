"""The training system (Lightning): loss, optimizer, schedule, metrics. The model is `model.Transformer`.

Paper §5.3-§5.4: Adam(β1=0.9, β2=0.98, ε=1e-9), lrate = d_model^-0.5 · min(step^-0.5,
step · warmup_steps^-1.5) stepped per optimizer step, label smoothing ε_ls. `lr_factor` multiplies
the schedule (1.0 = the paper; tensor2tensor calls it learning_rate).

Loss normalization, as fairseq's trainer and tensor2tensor do it: the gradient of an optimizer step is that
of the label-smoothed loss summed over every target token of the update (all its accumulated batches, all
devices) divided by the number of those tokens, so each token weighs the same whether the update came from
one batch on 8 GPUs or 8 accumulated batches on one. Each batch returns its summed loss; Lightning divides it
by the accumulation count A and DDP averages the ranks' gradients, so before the optimizer step the
gradients are multiplied by A · W / (the update's target tokens, one all-reduce of the counts).
"""

from __future__ import annotations

import math
import time

import lightning.pytorch as pl
import torch
from torch import Tensor

from aiayn.lightning_modules.run.evaluate import bleu, nll_sum
from aiayn.lightning_modules.transformer.config import PAPER_DECODING, Decoding
from aiayn.lightning_modules.transformer.decoding import translate_batch
from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss
from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's learning rate at optimizer step `step` (1-based)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


class Diverged(Exception):
    """The training loss became NaN or inf at optimizer step `step` (1-based): a result (status "diverged"), not a
    crash. That step's update is never applied or saved (raised before it, or, where its flag was read a step late,
    with the update skipped on the device: TranslationModule._defer), so last.ckpt keeps the last finite state."""

    def __init__(self, step: int, loss: float) -> None:
        here = f"loss {loss}"  # with several ranks the flag is any rank's: this rank's loss may be finite
        what = here if not math.isfinite(loss) else f"loss not finite on another rank (this rank's {loss:.4g})"
        super().__init__(f"{what} at optimizer step {step}")
        self.step, self.loss = step, loss


def _named(sums: Tensor) -> float:
    """The number a Diverged names: the step's first non-finite sum (loss, then NLL) of this rank, else its loss
    (finite: another rank's was not)."""
    values = sums.tolist()
    return next((v for v in values if not math.isfinite(v)), values[0])


class TranslationModule(pl.LightningModule):
    """Trains a Transformer on batches from `data.TranslationDataModule`."""

    def __init__(
        self,
        cfg: TransformerConfig,
        warmup: int = 4000,
        lr_factor: float = 1.0,
        beam: int = PAPER_DECODING.beam,
        alpha: float = PAPER_DECODING.alpha,
        val_bleu_sentences: int | None = None,
    ):
        """Validation scores the whole dev set's perplexity (teacher-forced: cheap, and smooth enough to judge
        convergence by) and beam-decodes the first `val_bleu_sentences` dev sentences for val/bleu (None or 0:
        no BLEU during training; the final evaluation decodes the whole dev set either way).

        No Lightning hyper-parameters: a checkpoint holds the run's config once, typed, as config.json wrote it
        (`checkpoint["aiayn"]`, callbacks.RunFilesInCheckpoint; read back with checkpoints.run_config), and the
        loggers get that config (callbacks.LogRunConfig)."""
        super().__init__()
        if not isinstance(cfg, TransformerConfig):
            raise TypeError(f"TranslationModule takes a TransformerConfig, not {type(cfg).__name__}")
        self.cfg = cfg
        self.warmup, self.lr_factor, self.val_bleu_sentences = warmup, lr_factor, val_bleu_sentences
        self.decoding = Decoding(beam, alpha)
        self.model = Transformer(self.cfg)
        self._t_last: float | None = None
        self._tokens_last = 0
        self.total_tokens = 0  # source + target non-pad tokens trained on by this rank
        self._window = [0, 0]  # real source, target tokens of this rank's batches since the last optimizer step
        self._sums: Tensor | None = None  # this rank's summed loss and NLL since the last optimizer step (device)
        # over the whole run (all ranks, kept in checkpoints): optimizer steps and their real tokens
        self.trained = {"steps": 0, "src_tokens": 0, "tgt_tokens": 0}
        # seconds of training steps (validations not counted) over every attempt, kept in the checkpoint: a run
        # re-recorded from its last checkpoint, or resumed, reports its whole training time and throughput, not the
        # seconds of its last attempt
        self.train_seconds, self._clock = 0.0, None
        self._trained_on_device: Tensor | None = None  # with several ranks: their reduced counts, not yet host's
        self.step_flags: dict = {}  # this rank's flags for the step (RequeueOnSignal's "requeue"), reduced with counts
        self.step_decisions: dict = {}  # the flags of the step, reduced over the ranks
        self._val: dict = {}
        self._pending: tuple | None = None  # a step whose non-finite flag is on its way to the host (`_defer`)
        self._flag_host: Tensor | None = None  # where it lands (pinned memory on a GPU's host)
        self._copied = None  # a CUDA event recorded after the copy

    @classmethod
    def from_checkpoint(cls, path, map_location="cpu") -> TranslationModule:
        """The module a checkpoint of `aiayn train` holds: built from the run config the checkpoint carries (once,
        typed: RunConfig.from_checkpoint), its weights loaded, read weights-only."""
        from aiayn.lightning_modules.run.rundir import load_raw, run_config

        ckpt = load_raw(path)
        config = run_config(ckpt, path)
        module = cls(config.spec.model, **config.schedule)
        module.load_state_dict(ckpt["state_dict"])
        return module.to(map_location) if map_location is not None else module

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, **kwargs):
        """Lightning's way in, as Lightning users write it: `TranslationModule.load_from_checkpoint(path)`. The module
        keeps no hyper-parameters (the checkpoint's run config is its one config), so this is `from_checkpoint`."""
        if hparams_file is not None or kwargs:
            raise TypeError(
                "TranslationModule.load_from_checkpoint builds the module from the run config its "
                "checkpoint carries; it takes no hparams_file or keyword arguments"
            )
        return cls.from_checkpoint(checkpoint_path, map_location)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        # = label_smoothed_loss(self.model(src, tgt_in), ...) without materializing (B, T, V) logits
        memory, src_mask = self.model.encode(batch["src"])
        hidden = self.model.decode(batch["tgt_in"], memory, src_mask)
        loss, nll, _ = projected_label_smoothed_loss(
            hidden, self.model.embed.weight, batch["tgt_out"], self.cfg.eps_ls, reduction="sum"
        )
        n_src, n_tgt = batch["n_src_tokens"], batch["n_tgt_tokens"]  # counted by collate, on the host
        self.total_tokens += n_src + n_tgt
        self._window[0] += n_src
        self._window[1] += n_tgt
        sums = torch.stack([loss.detach(), nll.detach()])
        self._sums = sums if self._sums is None else self._sums + sums
        return loss  # summed: on_before_optimizer_step divides the update's gradient by its target tokens

    def on_before_optimizer_step(self, optimizer) -> None:
        """Once per optimizer step: normalize the update by its real target tokens (see the module docstring), count
        them, and stop a run whose loss is not finite (`Diverged`, with that step's update not applied or saved).

        At most one host-device synchronization per step, with every default on (the progress bar, a log step): the
        token counts come from the host (collate counts them); with several ranks they, the non-finite flag and the
        ranks' other flags (`step_flags`: a SLURM requeue signal, a SIGTERM) are summed by one all-reduce
        (torch.distributed's own: Lightning's `strategy.reduce` puts a barrier before it); then one transfer brings
        the flags to the host, and on a log step the step's loss sums and token totals with them, so that what is
        logged (and what the progress bar shows between log steps) is host numbers, which Lightning reads without
        waiting on the device.

        With fused Adam, a step that is not a log step makes no synchronization at all (`_defer`): its flags go to
        the host behind the step's queue and are read at the next step (`_settle`), while the device trains on; the
        step's update is skipped on the device if the loss was not finite (on any rank: the reduced flag), through
        fused Adam's `found_inf`, as a gradient scaler skips an overflowed step. So a non-finite step still changes
        no weight, Adam moment or step count, `Diverged` names it one step later, and with several ranks their
        other flags (requeue, SIGTERM) are decided one step later, on every rank alike."""
        settled = self._settle()  # the previous step's flags, if deferred: Diverged for that step, before this update
        if getattr(optimizer, "found_inf", None) is not None:
            optimizer.found_inf = None  # the last step's skip flag: this step's is set by `_defer`, or none is
        (n_src, n_tgt), self._window = self._window, [0, 0]
        sums, self._sums = self._sums, None
        world, grads = self.trainer.world_size, [p.grad for p in self.parameters() if p.grad is not None]
        step = self.trainer.global_step + 1
        every = self.trainer.log_every_n_steps
        log_now = bool(every) and (step % every == 0 or step >= (self.trainer.max_steps or 0) > 0)
        diverged = (~torch.isfinite(sums).all()).to(torch.float64).reshape(1)  # on the device
        others, self.step_flags = dict(self.step_flags), {}  # on the host
        if world > 1:  # counts and host flags through pinned memory (no wait), then one all-reduce with the device's
            cuda = self.device.type == "cuda"
            host = torch.tensor(
                [n_src, n_tgt, *map(float, others.values())], dtype=torch.float64, device="cpu", pin_memory=cuda
            )
            packed = torch.cat([host.to(self.device, non_blocking=cuda), diverged])
            torch.distributed.all_reduce(packed, op=torch.distributed.ReduceOp.SUM)  # the step's one collective
            scale = (self.trainer.accumulate_grad_batches * world / packed[1].clamp(min=1)).float()
            torch._foreach_mul_(grads, scale)
            totals = packed[:2]
            self._trained_on_device = totals if self._trained_on_device is None else self._trained_on_device + totals
            flags, names = packed[2:], list(others)  # the ranks' flags, then diverged
        else:
            torch._foreach_mul_(grads, self.trainer.accumulate_grad_batches / max(n_tgt, 1))
            self.trained["src_tokens"] += n_src
            self.trained["tgt_tokens"] += n_tgt
            flags, names = diverged, None  # one rank: its own flags are decided on the host
        self.trained["steps"] += 1
        if not log_now and self._defer(optimizer, step, flags, sums, names):
            now = dict.fromkeys(others, False) if names is not None else others  # reduced flags: next step
            self.step_decisions = {**now, **settled, "diverged": False}
            return
        payload = [flags]  # what the step's one transfer brings to the host
        if log_now:
            payload.append(sums.detach().to(torch.float64))
            if world > 1:
                payload.append(packed[:2])
        values = torch.cat(payload).tolist()  # the step's one synchronization
        decisions = self._decisions(values[: flags.numel()], names)
        rest = values[flags.numel() :]
        self.step_decisions = {**others, **{k: v or settled.get(k, False) for k, v in decisions.items()}}
        if decisions["diverged"]:
            raise Diverged(step, _named(sums))
        if log_now:
            tokens = rest[2:4] if world > 1 else [float(n_src), float(n_tgt)]
            self._log_step(rest[0], rest[1], max(n_tgt, 1), tokens)

    @staticmethod
    def _decisions(flags: list[float], names: list[str] | None) -> dict:
        """The step's decisions from its flags as read: with several ranks (`names`: the host flags' names) the
        reduced flags, any rank's counting, then diverged; with one rank diverged alone."""
        if names is None:
            return {"diverged": flags[0] > 0}
        return {**dict(zip(names, (x > 0 for x in flags[:-1]))), "diverged": flags[-1] > 0}

    def _defer(self, optimizer, step: int, flags: Tensor, sums: Tensor, names: list[str] | None) -> bool:
        """Leave the step's flags on the device, where the optimizer acts on the non-finite one (the last): fused
        Adam skips its update where `found_inf` is 1 (torch.optim.Adam reads the attribute at each step, as
        GradScaler sets it), and the flags are copied to pinned host memory behind the step's work (no wait), for
        `_settle` to read. False (the flags read now) where the update cannot be skipped on the device: another
        optimizer (foreach Adam), or a gradient scaler that owns `found_inf`."""
        if not (isinstance(optimizer, torch.optim.Adam) and optimizer.defaults.get("fused")):
            return False
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return False
        optimizer.found_inf = (flags[-1] > 0).to(torch.float32)  # a 0-dim float32 tensor, as a gradient scaler's
        cuda = flags.device.type == "cuda"
        if self._flag_host is None or self._flag_host.shape != flags.shape:
            self._flag_host = torch.zeros(flags.shape, dtype=flags.dtype, device="cpu", pin_memory=cuda)
        self._flag_host.copy_(flags, non_blocking=cuda)
        if cuda:
            self._copied = self._copied or torch.cuda.Event()  # re-recorded each step: `_settle` waited on the last
            self._copied.record()
        self._pending = (step, sums, names)
        return True

    def _settle(self) -> dict:
        """Read the deferred flags of the last step (`_defer`), if any: Diverged for that step (its update was
        skipped on the device), else its decisions (with several ranks: requeue, SIGTERM), also merged into
        `step_decisions` for the callbacks that read them. Called at the next step, and before anything reads or
        saves the state that step left: validation, a checkpoint, the end of training. The host waits only for
        the copy, which was queued a step ago."""
        if self._pending is None:
            return {}
        (step, sums, names), self._pending = self._pending, None
        if self._copied is not None:
            self._copied.synchronize()
        decided = self._decisions(self._flag_host.tolist(), names)  # host numbers: the copy has landed
        if decided.pop("diverged"):
            raise Diverged(step, _named(sums))
        self.step_decisions = {**self.step_decisions, **decided}
        return decided

    def on_train_start(self) -> None:
        self._pending = None
        self._clock = time.perf_counter()

    def _fold_time(self) -> float:
        """`train_seconds` brought up to now (while training), and returned."""
        if self._clock is not None:
            now = time.perf_counter()
            self.train_seconds += now - self._clock
            self._clock = now
        return self.train_seconds

    def on_validation_start(self) -> None:
        self._settle()
        self._fold_time()  # validation is not training: its seconds are the run's wall time, not train_seconds
        self._clock = None

    def on_validation_end(self) -> None:
        if not self.trainer.sanity_checking:
            self._clock = time.perf_counter()

    def on_train_end(self) -> None:
        self._settle()
        self._fold_time()
        self._clock = None

    def _log_step(self, loss_sum: float, nll_sum: float, n_tgt: int, tokens: list[float]) -> None:
        """The step's curves, on the steps whose logs Lightning writes (every `log_every_n_steps`), as host numbers in
        CPU tensors (Lightning keeps a logged tensor where it is; a Python number it would copy to the device): loss
        and NLL per target token of this rank, real tokens per step (all ranks), the learning rate, tokens/s since
        the last log (this rank)."""
        now = time.perf_counter()
        values = {
            "train/loss": loss_sum / n_tgt,
            "train/nll": nll_sum / n_tgt,
            "train/src_tokens_per_step": tokens[0],
            "train/tgt_tokens_per_step": tokens[1],
            "lr": float(self.optimizers().param_groups[0]["lr"]),
        }
        if self._t_last is not None:
            values["train/tokens_per_s"] = (self.total_tokens - self._tokens_last) / (now - self._t_last)
        self._t_last, self._tokens_last = now, self.total_tokens
        for name, value in values.items():
            self.log(
                name,
                torch.tensor(value, dtype=torch.float32, device="cpu"),
                batch_size=1,
                prog_bar=name in ("train/loss", "lr", "train/tokens_per_s"),
                rank_zero_only=name.startswith("train/") and "tokens_per_step" in name,
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self._settle()  # a step whose update was skipped is never saved as taken: Diverged first
        checkpoint["aiayn_trained"] = self.trained_counts()
        checkpoint["aiayn_train_seconds"] = self._fold_time()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.trained = dict(checkpoint.get("aiayn_trained", self.trained))
        self.train_seconds = float(checkpoint.get("aiayn_train_seconds", 0.0))
        self._trained_on_device = None

    def trained_counts(self) -> dict:
        """Optimizer steps and real tokens over the whole run (all ranks), brought to the host: at checkpoints and at
        the end, not every step."""
        if self._trained_on_device is not None:
            src, tgt = (int(x) for x in self._trained_on_device.tolist())
            self.trained = {
                **self.trained,
                "src_tokens": self.trained["src_tokens"] + src,
                "tgt_tokens": self.trained["tgt_tokens"] + tgt,
            }
            self._trained_on_device = None
        return dict(self.trained)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        nll, n = nll_sum(self.model, batch)
        v = self._val
        v["nll"] = v.get("nll", 0.0) + float(nll)
        v["n"] = v.get("n", 0) + n
        k = self.val_bleu_sentences
        if k:  # beam search on this batch's sentences among the first k of the dev set
            pick = ((batch["idx"] >= 0) & (batch["idx"] < k)).nonzero().squeeze(1)  # -1: a rank's filler row
            if len(pick):
                dm = self.trainer.datamodule
                src = batch["src"].index_select(0, pick)
                out = translate_batch(self.model, src, dm.bos_id, dm.eos_id, self.decoding)
                idx = batch["idx"].index_select(0, pick).tolist()
                v.setdefault("hyps", {}).update(zip(idx, (dm.decode(ids) for ids in out)))

    def on_validation_epoch_end(self) -> None:
        v, self._val = self._val, {}
        parts = [v]
        if self.trainer.world_size > 1:  # every rank decoded its own share of the dev set
            parts = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(parts, v)
        nll, n = sum(p.get("nll", 0.0) for p in parts), sum(p.get("n", 0) for p in parts)
        self.log("val/ppl", math.exp(nll / max(n, 1)), prog_bar=True, rank_zero_only=True)
        self.log("val/nll", nll / max(n, 1), rank_zero_only=True)
        if self.val_bleu_sentences and not self.trainer.sanity_checking:
            hyps = {i: h for p in parts for i, h in p.get("hyps", {}).items()}
            refs = self.trainer.datamodule.references("dev")
            order = sorted(hyps)
            score = bleu([hyps[i] for i in order], [refs[i] for i in order], lang=self.trainer.datamodule.data.tgt_lang)
            self.log("val/bleu", score["bleu"], prog_bar=True, rank_zero_only=True)

    def configure_optimizers(self):
        return paper_optimizer(self.parameters(), self.cfg.d_model, self.warmup, self.lr_factor)


def paper_optimizer(params, d_model: int, warmup: int, factor: float) -> dict:
    """§5.3's Adam and schedule, stepped per optimizer step, as Lightning's configure_optimizers returns them."""
    params = list(params)
    # fused: one kernel for all parameters instead of a loop over them (on CPU 6.3 -> 1.1 ms per tiny-preset step,
    # BENCHMARKS.md; on a GPU a few launches a step, graphed model or not); the loop's update up to float rounding
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    opt = torch.optim.Adam(params, lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=fused or None)
    # LambdaLR counts scheduler steps from 0; the paper's step number is that + 1.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: noam_lr(s + 1, d_model, warmup, factor))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
