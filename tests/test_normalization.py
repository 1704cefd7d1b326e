"""One optimizer step = one loss normalized by the update's real target tokens, however the update is split
(accumulated batches, DDP ranks: tests/test_ddp.py); whole accumulation windows; the schedule stepped per
optimizer step; batches sized in real target tokens so that an update trains on the preset's tokens."""

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from aiayn.ablations.presets import get_preset
from aiayn.lightning_modules.data import batching as B
from aiayn.lightning_modules.data import datamodule as D
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.module import TranslationModule, noam_lr
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.spec import resolve
from aiayn.lightning_modules.run.train import build_datamodule
from aiayn.lightning_modules.transformer.config import TransformerConfig

CFG = {"N": 1, "d_model": 16, "d_ff": 32, "h": 2, "vocab_size": 30, "P_drop": 0.0, "max_len": 64}


class Recording(TranslationModule):
    """Records the gradients the optimizer gets and the learning rate of every training batch."""

    def __init__(self, vocab_size: int = 30):
        super().__init__(TransformerConfig(**{**CFG, "vocab_size": vocab_size}), warmup=4)
        self.grads: list[list[torch.Tensor]] = []
        self.lrs: list[float] = []

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.optimizers().param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)

    def on_before_optimizer_step(self, optimizer):
        super().on_before_optimizer_step(optimizer)
        self.grads.append([p.grad.clone() for p in self.parameters()])


def items(n: int, lo: int, hi: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    length = lambda: int(torch.randint(lo, hi + 1, (), generator=g))
    return [
        (i, torch.randint(4, 30, (length(),), generator=g), torch.randint(4, 30, (length(),), generator=g))
        for i in range(n)
    ]


def fit(batches: list[dict], accumulate: int, steps: int, vocab_size: int = 30) -> Recording:
    torch.manual_seed(0)  # the same initial weights every time
    module = Recording(vocab_size)
    trainer = pl.Trainer(
        max_steps=steps,
        max_epochs=1,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(module, DataLoader(batches, batch_size=None, shuffle=False))
    return module


def test_two_unequal_accumulated_batches_give_the_gradients_of_one_batch_of_their_union():
    small, large = items(2, 2, 4, seed=1), items(6, 7, 12, seed=2)  # 2 short and 6 long sentences
    a, b = B.collate(small), B.collate(large)
    assert b["n_tgt_tokens"] > 4 * a["n_tgt_tokens"]  # very unequal: per-batch means would weigh them wrongly
    accumulated = fit([a, b], accumulate=2, steps=1)
    union = fit([B.collate(small + large)], accumulate=1, steps=1)
    assert len(accumulated.grads) == len(union.grads) == 1
    for g_acc, g_union in zip(accumulated.grads[0], union.grads[0]):
        torch.testing.assert_close(g_acc, g_union, atol=1e-6, rtol=0)
    assert (
        accumulated.trained
        == union.trained
        == {
            "steps": 1,
            "src_tokens": a["n_src_tokens"] + b["n_src_tokens"],
            "tgt_tokens": a["n_tgt_tokens"] + b["n_tgt_tokens"],
        }
    )


def test_the_trainer_steps_the_schedule_per_optimizer_step_under_accumulation():
    batches = [B.collate(items(3, 3, 6, seed=s)) for s in range(6)]
    module = fit(batches, accumulate=2, steps=3)
    assert module.trainer.global_step == 3 and len(module.grads) == 3
    want = [noam_lr(step, CFG["d_model"], 4) for step in (1, 1, 2, 2, 3, 3)]  # both batches of a step: its rate
    assert module.lrs == pytest.approx(want, rel=1e-12)
    assert module.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 3


@pytest.mark.parametrize("replicas, accumulate", [(1, 3), (2, 2), (3, 4)])
def test_every_optimizer_step_gets_a_whole_accumulation_window(replicas, accumulate):
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(1, 30, (2000,), generator=g), torch.randint(1, 30, (2000,), generator=g)
    total = len(B.TokenBucketSampler(src, tgt, 300, seed=1).all_batches())
    shares = [
        B.TokenBucketSampler(src, tgt, 300, seed=1, num_replicas=replicas, rank=r, accumulate=accumulate)
        for r in range(replicas)
    ]
    for s in shares:
        assert len(s) % accumulate == 0 and len(list(s)) == len(s)
    assert total - replicas * accumulate < replicas * len(shares[0]) <= total  # only the remainder is dropped


def test_an_epoch_of_the_datamodule_is_whole_optimizer_steps(tmp_path):
    from test_data import _corpus

    root = _corpus(tmp_path / "corpus", sizes=(400, 20, 20))
    identity = D.DataIdentity(CorpusRef.parse("files"), str(root), 150, max_len=48)
    dm = D.TranslationDataModule(D.DataPlan(identity, tmp_path / "cache", max_tokens=300, accumulate=3))
    dm.setup("fit")
    n = len(dm.train_dataloader())
    module = fit(
        list(dm.train_dataloader()), accumulate=3, steps=10**6, vocab_size=150
    )  # one pass over the epoch's batches
    assert n % 3 == 0 and module.trainer.global_step == n // 3 == len(module.grads)


@pytest.mark.parametrize("world, max_tokens", [(1, None), (2, None), (1, 512)])
def test_an_update_trains_on_the_presets_real_target_tokens(world, max_tokens, cache):
    """The tiny preset: 1024 real target tokens per optimizer step (EOS included), within 3%, however it is
    split (1 device; 2 devices of 512; 2 accumulated batches of 512)."""
    preset = get_preset("tiny")
    opts = TrainOptions(devices=world, max_tokens=max_tokens)
    dm = build_datamodule(opts, resolve("base", preset))
    dm.setup("fit")
    sampler = dm._samplers["train"]
    tgt = sampler.tgt_lens + 1
    batches = sampler._rank_share(sampler.all_batches()) if world == 1 else sampler.all_batches()
    per_batch = [int(tgt[b].sum()) for b in batches]
    per_update = dm.plan.accumulate * world
    updates = [sum(per_batch[i : i + per_update]) for i in range(0, len(per_batch) - per_update + 1, per_update)]
    assert dm.plan.max_tokens * per_update == preset.tokens_per_step
    assert max(per_batch) <= dm.plan.max_tokens
    mean = sum(updates) / len(updates)
    assert 0.97 * preset.tokens_per_step <= mean <= preset.tokens_per_step, mean


def test_batches_are_cut_at_the_budget_in_real_target_tokens_not_padded_positions():
    """Multi30k-like lengths (targets 0.8-1.3 x sources): a budget of padded positions would leave batches 5%
    short of it in real target tokens; cut in real target tokens, they fall short only by the sentence that
    did not fit."""
    from test_data import _lengths

    src, tgt = _lengths()
    s = B.TokenBucketSampler(src, tgt, max_tokens=1024, shuffle=False)
    batches = s.all_batches()[:-1]  # the epoch's last batch takes what is left
    real = [sum(tgt[i] + 1 for i in b) for b in batches]
    assert max(real) <= 1024 and sum(real) / len(real) >= 0.98 * 1024
    assert max(B.batch_cost(len(b), max(src[i] for i in b), max(tgt[i] for i in b)) for b in batches) <= 2 * 1024
