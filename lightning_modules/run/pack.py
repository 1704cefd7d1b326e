"""K seeds of one row trained as one pack: one process, one optimizer step for K models whose weights are
stacked (transformer/packed.py), each seed a run of its own on disk. `aiayn train --pack-seeds 0,1,2`.

What each seed keeps, as it would alone:
- its run directory, config.json, tokenizer.model, metrics.json, dev.hyp and dev.ref, through train.py's own plan,
  prepare, evaluation and record;
- its initialization (seeded as `aiayn train --seed S` seeds it) and its sentences (its own data module: each
  batch's sentences are drawn by its seed);
- its dropout masks: the counter stream's, the same as `aiayn train --seed S --dropout-rng counter` draws, which is
  what its config.json records, so `aiayn train --config RUN/config.json` trains that seed alone to the same numbers
  (tests/test_packed.py holds the two equal);
- its loss normalization (its own target tokens) and Adam state (Adam is elementwise: its slice is its state);
- its curve, logs/version_N/metrics.csv as a run's CSVLogger writes it (train/loss, train/nll, lr, tokens per step;
  val/ppl and val/nll at the run's validations and the stability rule's, ablations/stability.py);
- its divergence: a seed whose loss goes non-finite is that seed's result (metrics.json "diverged" at that step; its
  last.ckpt holds its weights from before the step) and the others train on; no operation mixes seeds.

What the seeds share: the learning-rate schedule and step count, the validation steps, the epoch's length (the K
loaders advance together), the wall time, one host-to-device copy a step (the K batches are stacked on the host,
`PackData.on_before_batch_transfer`), and the pack's checkpoint
(ROW/pack-seedA-seedB-.../checkpoints: what a killed pack resumes from; at the end each seed's checkpoints/last.ckpt
holds its own weights and config, for translate, export and averaging). Each seed draws its own batch order, as
separate runs do, static shapes or not, so the replicates share no random factor; `--batch-order-seed S` gives every
seed one order instead, a named deviation (each step's batches then span the same lengths, filled with each seed's
own sentences, so the stacked step pads little: each seed's own order computes about 1.6x the positions, 1.3x with
static shapes, tests/test_pack_runs.py; the seeds then share their length schedule, whose effect on their spread
no test has measured).

Not packed (refused in one line): val/bleu during training, several devices, loggers other than csv and tensorboard.

`--compile` compiles the packed model as a run alone's (transformer/compiled.py; the counter stream's keys are a
tensor filled each step, so a step is not a new graph); with `--static-shapes` a step's stacked shape is the largest
sentence count and length among its seeds' static batches (a bounded set), and `--compile graphs` compiles the pack
once for all of them and replays each as CUDA graphs: the packed static-shape step captured, for a GPU whose small
steps are launch-bound.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import CombinedLoader
from lightning.pytorch.utilities.exceptions import SIGTERMException

from aiayn.ablations import stability
from aiayn.ablations.table import MAX_SEED
from aiayn.common.errors import UserError
from aiayn.common.files import UnsafeFile, atomic_torch_save, load_torch_file, remove_stale_temps
from aiayn.common.secrets import redact_obj
from aiayn.lightning_modules.data.batching import release_workers
from aiayn.lightning_modules.run import disk
from aiayn.lightning_modules.run import loggers as run_loggers
from aiayn.lightning_modules.run.callbacks import AtomicCheckpointIO, RoomForShapes, RunFilesInCheckpoint, progress_bar
from aiayn.lightning_modules.run.devices import data_workers, prepare_matmuls, residual_stream_dtype, uses_cuda
from aiayn.lightning_modules.run.module import TranslationModule, paper_optimizer
from aiayn.lightning_modules.run.options import TRAINER_DEFAULTS, TrainOptions
from aiayn.lightning_modules.run.rundir import PACK_STATE, RunMetrics
from aiayn.lightning_modules.run.spec import RunSpec, spec_of
from aiayn.lightning_modules.run.train import (
    Hooks,
    Plan,
    _val_bleu_sentences,
    evaluate_run,
    finished,
    plan,
    prepare,
    record,
    train,
    validations,
)
from aiayn.lightning_modules.transformer.compiled import compile_model
from aiayn.lightning_modules.transformer.dropout_stream import DropoutStream, counter_dropout
from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig, residual_stream
from aiayn.lightning_modules.transformer.packed import pack, packed_loss, stack_batches, unpack

log = logging.getLogger(__name__)


MAX_PACK = 16  # seeds one pack trains at most (its folder is named by them: within a file name's 255 bytes)


def pack_seeds(text: str) -> tuple[int, ...]:
    """--pack-seeds "0,1,2" as seeds, or one line naming what is wrong: each seed as --seed takes it (0 to MAX_SEED),
    at most MAX_PACK of them."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        seeds = ()
    if len(seeds) < 2 or len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) > MAX_SEED:
        raise UserError(
            f"--pack-seeds {text[:80]!r}: give two or more different seeds from 0 to {MAX_SEED}, separated by commas "
            "(e.g. 0,1,2)"
        )
    if len(seeds) > MAX_PACK:
        raise UserError(f"--pack-seeds names {len(seeds)} seeds; a pack trains at most {MAX_PACK}: split them")
    return seeds


def seed_options(opts: TrainOptions, seed: int, seeds: tuple[int, ...]) -> TrainOptions:
    """One seed of the pack `seeds`, its options as its config.json records them: the seed alone with the counter
    stream and its batch order, which train it to the numbers it has in the pack. Each seed takes its own order, as
    separate runs do, static shapes or not, so that the pack's replicates share no random factor (the report's tests
    rest on their spread); with --batch-order-seed they share that seed's (less padding, a shared length schedule)."""
    order = seed if opts.batch_order_seed is None else opts.batch_order_seed
    return replace(opts, seed=seed, pack_seeds=None, dropout_rng="counter", batch_order_seed=order)


def pack_workers(workers: int, seeds: int) -> int:
    """Loader workers for each of a pack's `seeds` loaders: the pack's `workers` (--num-workers, or the device's
    default) shared among them, at least one each where any are asked for; a pack of 8 on a GPU's default of 4 had
    32 loader processes (8 packs at once: 256 on a 16-core node), it has 8."""
    return math.ceil(workers / seeds) if workers > 0 else 0


def check_packable(opts: TrainOptions, spec: RunSpec, flag: str = "--pack-seeds") -> None:
    """What a pack cannot do, in one line each, before anything is prepared (`flag`: the option that asked)."""
    if (opts.trainer or {}).get("gradient_clip_val"):
        raise UserError(
            f"{flag} with --trainer gradient_clip_val: clipping would take the norm of the pack's seeds together, "
            "coupling them; drop gradient_clip_val (the paper clips nothing), or train the seeds apart"
        )
    if opts.world_size > 1:
        raise UserError(f"{flag} trains its seeds on one device; drop --devices/--num-nodes, or {flag}")
    if n := _val_bleu_sentences(opts, spec.preset):
        asked = (
            f"preset {spec.preset.name} decodes {n}"
            if opts.val_bleu_sentences is None
            else f"--val-bleu-sentences {n} was asked"
        )
        raise UserError(
            f"{flag} validates perplexity only (beam search for val/bleu is per model); pass "
            f"--val-bleu-sentences 0 ({asked}), the final evaluation scores BLEU either way"
        )
    other = [name for name in run_loggers.of(opts) if name not in ("csv", "tensorboard")]
    if other:
        raise UserError(
            f"{flag} writes each seed's curve to its run directory's CSV; --logger {other[0]} is not "
            f"packed: drop it, or {flag}"
        )


class PackData(pl.LightningDataModule):
    """The K seeds' data modules, their training batches together (one list per step, seed k's at k); the dev set is
    the first's (every seed's is the same)."""

    def __init__(self, dms: list) -> None:
        super().__init__()
        self.dms = dms

    def setup(self, stage: str | None = None) -> None:
        for dm in self.dms:
            dm.setup(stage)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """The K seeds' training batches stacked on the host, before Lightning moves them: one copy of each stacked
        tensor to the device a step, not K (and K pads and a concatenation there); the token counts stay host
        numbers, as collate counted them."""
        if not isinstance(batch, list):  # a dev batch: one seed's
            return batch
        src, tgt_in = stack_batches([(b["src"], b["tgt_in"]) for b in batch])
        _, tgt_out = stack_batches([(b["src"], b["tgt_out"]) for b in batch])
        counts = [(b["n_src_tokens"], b["n_tgt_tokens"]) for b in batch]
        return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "counts": counts}

    def train_dataloader(self) -> CombinedLoader:
        # each loader is resumable (its position is in the pack's checkpoint); min_size: an epoch ends with the
        # shortest seed's, and every seed's sampler starts its next epoch
        return CombinedLoader([dm.train_dataloader() for dm in self.dms], mode="min_size")

    def train_shape_count(self) -> int:
        """How many stacked batch shapes training can have: a step's is the largest sentence count and lengths among
        its seeds' batches, so where the seeds draw their own orders, any of their sentence counts with any of their
        lengths (a bound: with static shapes a few buckets' worth); where they share one order, their shapes."""
        shapes = set().union(*(dm.train_shapes() for dm in self.dms))
        if len({dm.plan.order_seed for dm in self.dms}) == 1:
            return len(shapes)
        counts, sources, targets = ({shape[i] for shape in shapes} for i in range(3))
        lengths = len(sources) if self.dms[0].plan.static_shapes else len(sources) * len(targets)  # square: S = T
        return len(counts) * lengths


class PackModule(pl.LightningModule):
    """K Transformers of one config trained as one computation; `TranslationModule`'s loss, normalization, schedule
    and curve, per seed."""

    def __init__(
        self,
        cfg: TransformerConfig,
        seeds: tuple[int, ...],
        warmup: int,
        lr_factor: float,
        val_steps: frozenset[int] = frozenset(),
    ):
        super().__init__()
        self.cfg, self.seeds, self.warmup, self.lr_factor, self.val_steps = cfg, seeds, warmup, lr_factor, val_steps
        models = []
        for seed in seeds:  # each seed's initialization, drawn as `aiayn train --seed S` draws it
            pl.seed_everything(seed, workers=True, verbose=False)
            models.append(Transformer(cfg))
        self.model = pack(models)
        self.stream = DropoutStream(list(seeds))
        counter_dropout(self.model, self.stream)
        K = len(seeds)
        self.trained = [{"steps": 0, "src_tokens": 0, "tgt_tokens": 0} for _ in seeds]
        self.total_tokens = [0] * K  # source + target tokens trained on, this attempt
        self.diverged: dict[int, tuple[int, str]] = {}  # seed index -> (optimizer step, what went non-finite)
        self.curves: list = [None] * K  # each seed's CSVLogger (train_pack sets them)
        self._frozen: dict[int, list[torch.Tensor]] = {}  # a diverged seed's weights from before its step
        self._window = [[0, 0] for _ in seeds]
        self._sums: torch.Tensor | None = None  # (K, 2): summed loss and NLL since the last optimizer step
        self._alive: torch.Tensor | None = None  # (K,) bool on the device; None: to be made
        self._micro = 0
        self._validated = -1
        self._dev = None  # the dev set's loader

    def alive(self) -> torch.Tensor:
        if self._alive is None or self._alive.device != self.device:
            self._alive = torch.tensor([k not in self.diverged for k in range(len(self.seeds))], device=self.device)
        return self._alive

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        t = self.trainer  # the batch's place in the run, as TranslationModule counts it for the counter stream
        self.stream.to(self.device).step = t.global_step * t.accumulate_grad_batches + self._micro
        self._micro += 1
        loss, nll, _ = packed_loss(self.model, batch["src"], batch["tgt_in"], batch["tgt_out"], self.cfg.eps_ls)
        for k, (n_src, n_tgt) in enumerate(batch["counts"]):  # counted by collate, on the host
            self._window[k][0] += n_src
            self._window[k][1] += n_tgt
            self.total_tokens[k] += n_src + n_tgt
        sums = torch.stack([loss.detach(), nll.detach()], 1)
        self._sums = sums if self._sums is None else self._sums + sums
        return torch.where(self.alive(), loss, 0.0).sum()  # seeds' parameters are apart: each gets its own gradient

    def on_before_optimizer_step(self, optimizer) -> None:
        """Each seed's update normalized by its own target tokens; a seed whose loss is not finite stops here (its
        weights kept from before this step); one host-device synchronization per step."""
        K, windows, self._window = len(self.seeds), self._window, [[0, 0] for _ in self.seeds]
        sums, self._sums, self._micro = self._sums, None, 0
        step = self.trainer.global_step + 1
        every = self.trainer.log_every_n_steps
        log_now = bool(every) and step % every == 0  # the steps whose logs Lightning writes for a run alone
        payload = [torch.isfinite(sums).all(1).to(torch.float64)]
        if log_now:
            payload.append(sums.to(torch.float64).flatten())
        values = torch.cat(payload).tolist()  # the step's one synchronization
        params = list(self.parameters())
        for k in range(K):
            if k not in self.diverged and not values[k]:
                self.diverged[k] = (step, f"loss {float(sums[k, 0])} at optimizer step {step}")
                self._frozen[k] = [p.detach()[k].clone() for p in params]
                self._alive = None
                log.warning("seed %d of the pack diverged: %s; the others train on", self.seeds[k], self.diverged[k][1])
        accumulate = self.trainer.accumulate_grad_batches
        scale = [0.0 if k in self.diverged else accumulate / max(windows[k][1], 1) for k in range(K)]
        scale = torch.tensor(scale, device=self.device)
        dead = ~self.alive()
        for p in params:
            if p.grad is not None:
                shape = (K,) + (1,) * (p.grad.dim() - 1)
                p.grad.mul_(scale.view(shape))
                if self.diverged:  # NaN x 0 is NaN: a dead seed's gradient is set to 0
                    p.grad.masked_fill_(dead.view(shape), 0.0)
        for k in range(K):
            if k not in self.diverged:
                self.trained[k]["steps"] += 1
                self.trained[k]["src_tokens"] += windows[k][0]
                self.trained[k]["tgt_tokens"] += windows[k][1]
        if len(self.diverged) == K:
            self.trainer.should_stop = True
        if log_now:
            lr = float(optimizer.param_groups[0]["lr"])
            for k in range(K):
                if k not in self.diverged and self.curves[k] is not None:
                    loss_sum, nll_sum = values[K + 2 * k], values[K + 2 * k + 1]
                    n = max(windows[k][1], 1)
                    self.curves[k].log_metrics(
                        {
                            "epoch": self.trainer.current_epoch,
                            "lr": lr,
                            "train/loss": loss_sum / n,
                            "train/nll": nll_sum / n,
                            "train/src_tokens_per_step": float(windows[k][0]),
                            "train/tgt_tokens_per_step": float(windows[k][1]),
                        },
                        step=step - 1,
                    )

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        with torch.no_grad():  # Adam moves a seed with a zero gradient by its momentum: a diverged seed is put back
            for k, saved in self._frozen.items():
                for p, value in zip(self.parameters(), saved):
                    p[k].copy_(value)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step = self.trainer.global_step
        if step in self.val_steps and step != self._validated:
            self._validated = step
            self.validate_seeds(step)

    @torch.no_grad()
    def validate_seeds(self, step: int) -> None:
        """Each living seed's dev perplexity (teacher-forced, as TranslationModule's validation), logged at step - 1
        as Lightning logs a validation after `step` optimizer steps."""
        K, was = len(self.seeds), self.model.training
        self.model.eval()
        nll = torch.zeros(K, dtype=torch.float64, device=self.device)
        n = torch.zeros(K, dtype=torch.float64, device=self.device)
        with self.trainer.precision_plugin.forward_context():
            if self._dev is None:  # made once: a loader's workers start with it
                self._dev = self.trainer.datamodule.dms[0].val_dataloader()
            for b in self._dev:
                src, tgt_in, tgt_out = (b[key].to(self.device).repeat(K, 1) for key in ("src", "tgt_in", "tgt_out"))
                _, nll_k, n_k = packed_loss(self.model, src, tgt_in, tgt_out, 0.0)
                nll += nll_k.double()
                n += n_k.double()
        self.model.train(was)
        for k, value in enumerate((nll / n.clamp(min=1)).tolist()):
            if k not in self.diverged and self.curves[k] is not None:
                self.curves[k].log_metrics(
                    {"epoch": self.trainer.current_epoch, "val/nll": value, "val/ppl": math.exp(value)}, step=step - 1
                )
                self.curves[k].save()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[PACK_STATE] = {
            "seeds": list(self.seeds),
            "trained": self.trained,
            "diverged": {str(k): list(v) for k, v in self.diverged.items()},
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint[PACK_STATE]
        if list(state["seeds"]) != list(self.seeds):
            raise UserError(f"the pack's checkpoint holds seeds {state['seeds']}, not {list(self.seeds)}")
        self.trained = [dict(t) for t in state["trained"]]
        self.diverged = {int(k): (int(v[0]), str(v[1])) for k, v in state["diverged"].items()}
        weights = checkpoint["state_dict"]
        names = [f"model.{name}" for name, _ in self.model.named_parameters()]
        self._frozen = {k: [weights[name][k].clone() for name in names] for k in self.diverged}
        self._alive = None

    def configure_optimizers(self):
        return paper_optimizer(self.parameters(), self.cfg.d_model, self.warmup, self.lr_factor)


def pack_resume(where: Path, seeds: tuple[int, ...], steps: int) -> Path | None:
    """The pack's last.ckpt to resume from, read with a run's checks (one line each, nothing half-done): a pack folder
    that is a file, a pickled checkpoint (no code runs), an unreadable or truncated one, one that is not a pack's or
    another pack's, one that trained more steps than asked (a run cannot be shortened). The temporary files a kill
    left in its checkpoints are removed first; None where it has none."""
    if where.exists() and not where.is_dir():
        raise UserError(f"pack folder {where} is not a folder; move it away and run again")
    checkpoints = where / "checkpoints"
    if checkpoints.is_dir():
        remove_stale_temps(checkpoints)
    last = checkpoints / "last.ckpt"
    if not last.is_file():
        return None
    try:
        state = load_torch_file(last, map_location="cpu", mmap=True)
    except UnsafeFile as e:
        raise UserError(f"cannot resume the pack from checkpoint {e}") from None
    except Exception as e:
        raise UserError(
            f"the pack's checkpoint {last} is unreadable ({type(e).__name__}); move it out of {checkpoints} to train "
            "the pack from step 0"
        ) from None
    pack = state.get(PACK_STATE) if isinstance(state, dict) else None
    if not isinstance(pack, dict) or "seeds" not in pack or "optimizer_states" not in state:
        raise UserError(
            f"{last} is not a pack's whole checkpoint (a run's, or weights only); move it out of {checkpoints} to "
            "train the pack from step 0"
        )
    if list(pack["seeds"]) != list(seeds):
        raise UserError(
            f"{last} holds the pack of seeds {pack['seeds']}, not {list(seeds)}; pass --pack-seeds "
            f"{','.join(map(str, pack['seeds']))}, or move it away"
        )
    trained = int(state.get("global_step", 0))
    if trained > steps:
        raise UserError(
            f"the pack in {where} already trained {trained} steps, and this command asks for {steps} (--max-steps): "
            "a run cannot be shortened; pass another --out for a shorter look, or drop --max-steps"
        )
    return last


def pack_dir(p: Plan, seeds: tuple[int, ...]) -> Path:
    """ROW/pack-seedA-seedB-...: beside the seeds' run directories, which `OutDir.run_dirs` (seed*) does not list."""
    return p.run.path.parent / ("pack-" + "-".join(f"seed{s}" for s in seeds))


def train_pack(opts: TrainOptions, spec: RunSpec | None = None, hooks: Hooks | None = None) -> list[RunMetrics]:
    """Train `--pack-seeds`' seeds of one row as one pack to completion (or resume it), evaluate each and record each;
    each seed's metrics, in the order given. A seed already completed at these steps is not trained again."""
    started, hooks = time.perf_counter(), hooks or Hooks()
    spec = spec or spec_of(opts)
    seeds = pack_seeds(opts.pack_seeds)
    if opts.seed not in (0, seeds[0]):  # a sweep's pack carries its first seed; another is a seed said twice
        raise UserError(f"--seed {opts.seed} beside --pack-seeds: the pack's seeds are --pack-seeds'; drop --seed")
    check_packable(opts, spec)
    workers = pack_workers(data_workers(opts.num_workers, opts.accelerator), len(seeds))
    each = {s: replace(seed_options(opts, s, seeds), num_workers=workers) for s in seeds}
    plans = {s: plan(each[s], spec) for s in seeds}
    locks = [prepare(plans[s]) for s in seeds]  # noqa: F841 (held, not used)
    done = {s: m for s in seeds if (m := finished(plans[s])) is not None}
    todo = tuple(s for s in seeds if s not in done)
    for s in todo:  # a pack starts its seeds at step 0, or resumes them from its own checkpoint
        begun = plans[s].run.resume_checkpoint()
        if begun is not None:
            raise UserError(
                f"seed {s} has a checkpoint of its own to resume ({begun}): a pack would train it again "
                f"from step 0; finish it alone (--seed {s}), or leave it out of --pack-seeds"
            )
    if not todo:
        return [done[s] for s in seeds]
    first = plans[todo[0]]
    # a seed of a pack already begun (its record lost, or a kill between the seeds' evaluations) resumes with its
    # whole pack from the pack's checkpoint, not from step 0 in a pack of its own; the done seeds are not recorded again
    members = seeds if done and (pack_dir(first, seeds) / "checkpoints" / "last.ckpt").exists() else todo
    prepare_matmuls(opts.accelerator, opts.matmul_precision)
    steps = first.config.train.steps
    every, extra = validations(opts, spec.preset, steps)
    cuda = uses_cuda(opts.accelerator)
    module = PackModule(
        spec.model,
        members,
        **first.config.schedule,
        val_steps=frozenset(stability.regular(steps, every)) | frozenset(extra),
    )
    residual_stream(module.model, residual_stream_dtype(opts.residual_dtype, first.config.train.precision))
    share = compile_model(module.model, opts.compile, dynamic=not first.dm.plan.static_shapes, cuda=cuda)
    where = pack_dir(first, members)
    resume = pack_resume(where, members, steps)  # before anything is made in it
    trainer = pack_trainer(opts, first, where, share)
    for k, s in enumerate(members):
        if s in todo:
            p = plans[s]
            p.run.write_config(p.config)
            p.run.write_tokenizer(p.dm.tokenizer_model)
            module.curves[k] = CSVLogger(p.run.path, name=p.run.logs.name, version=p.run.next_log_version())
    log.info(
        "%s: seeds %s as one pack (%s)%s%s",
        spec.row,
        ", ".join(map(str, members)),
        where,
        f", resuming from {resume}" if resume else "",
        f"; seeds {', '.join(map(str, done))} done, not recorded again" if members != todo else "",
    )
    t0 = time.perf_counter()
    try:
        trainer.fit(
            module,
            datamodule=PackData([plans[s].dm for s in members]),
            ckpt_path=str(resume) if resume else None,
            weights_only=True,
        )
    except SIGTERMException:
        _stopped(spec.row, members, trainer, "SIGTERM")
    except SystemExit as e:
        if e.code != 1:
            raise
        _stopped(spec.row, members, trainer, "SIGINT")
    except Exception as e:
        for s in todo:
            plans[s].run.write_metrics(plans[s].config, "failed", kind=hooks.kind, error=f"{type(e).__name__}: {e}")
        raise
    train_time = time.perf_counter() - t0
    states = unpack(module.model)
    results = dict(done)
    for k, s in enumerate(members):
        if s not in todo:
            continue
        p, curve = plans[s], module.curves[k]
        curve.save()
        curve.finalize("success")
        p.train_time = train_time
        seed_module = TranslationModule(spec.model, **p.config.schedule)
        seed_module.model.load_state_dict(states[k])
        seed_module.trained, seed_module.total_tokens = module.trained[k], module.total_tokens[k]
        step = module.diverged[k][0] - 1 if k in module.diverged else trainer.global_step
        seed_checkpoint(p, seed_module, step, where)
        if k in module.diverged:
            at, error = module.diverged[k]
            results[s] = p.run.write_metrics(p.config, "diverged", kind=hooks.kind, diverged_at_step=at, error=error)
            continue
        evaluating = time.perf_counter()
        result = evaluate_run(trainer, seed_module, p, each[s])
        result["eval_time_s"] = time.perf_counter() - evaluating
        result["wall_time_s"] = time.perf_counter() - started
        results[s] = record(trainer, seed_module, p, each[s], hooks, result)
    return [results[s] for s in seeds]


def train_runs(opts: TrainOptions, spec: RunSpec | None = None) -> list[RunMetrics]:
    """What `aiayn train` trains: the pack of --pack-seeds, else the one run (nothing on a DDP rank other than 0,
    or when the run was checkpointed for a SLURM requeue)."""
    if opts.pack_seeds:
        try:
            return train_pack(opts, spec)
        finally:
            release_workers()  # the K seeds' loaders and the dev loader
    metrics = train(opts, spec)
    return [metrics] if metrics is not None else []


def _stopped(row: str, seeds: tuple[int, ...], trainer: pl.Trainer, name: str):
    import signal

    log.warning(
        "%s seeds %s (one pack) stopped by %s at step %d; the pack's checkpoints are kept and the same command "
        "resumes it",
        row,
        ", ".join(map(str, seeds)),
        name,
        trainer.global_step,
    )
    raise SystemExit(128 + signal.Signals[name]) from None


def seed_checkpoint(p: Plan, module: TranslationModule, step: int, where: Path) -> Path:
    """A seed's checkpoints/last.ckpt in `aiayn train`'s layout, weights only (the optimizer's state is the pack's):
    its config and tokenizer embedded, so translate, export and averaging take it as any run's."""
    ckpt = {
        "state_dict": module.state_dict(),
        "global_step": step,
        "epoch": 0,
        "aiayn_trained": module.trained,
        PACK_STATE: {"pack": where.name},
    }
    RunFilesInCheckpoint(lambda: redact_obj(p.config.to_dict()), lambda: p.dm.tokenizer_model).on_save_checkpoint(
        None, module, ckpt
    )
    return atomic_torch_save(ckpt, p.run.last_checkpoint)


def pack_trainer(opts: TrainOptions, first: Plan, where: Path, share: int = 0) -> pl.Trainer:
    """The pack's Trainer: one device, its checkpoints (the whole pack: weights, Adam state, data positions) in
    `where`, every --ckpt-every steps or minutes as a run's; no logger (each seed's curve is its own). `share`:
    compile_model's (with static shapes, room for every shape once the data is set up)."""
    room = [RoomForShapes(share)] if share and first.dm.plan.static_shapes else []
    every_steps, every_minutes = disk.checkpoint_every(opts, first.preset)
    ckpt = ModelCheckpoint(
        dirpath=where / "checkpoints",
        filename="step{step:07d}",
        auto_insert_metric_name=False,
        every_n_train_steps=every_steps,
        save_top_k=1,
        monitor="step",
        mode="max",
        save_last=True,
        train_time_interval=timedelta(minutes=every_minutes) if every_minutes else None,
    )
    return pl.Trainer(
        accelerator=opts.accelerator,
        devices=1,
        precision=first.config.train.precision,
        max_steps=first.config.train.steps,
        accumulate_grad_batches=first.config.train.accumulate,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[ckpt, *room, *(progress_bar() if opts.progress else [])],
        plugins=[AtomicCheckpointIO()],
        logger=False,
        default_root_dir=where,
        enable_progress_bar=opts.progress,
        enable_model_summary=False,
        deterministic=opts.accelerator == "cpu",
        use_distributed_sampler=False,
        **{**TRAINER_DEFAULTS, **opts.trainer},
    )
