"""At most one host-device synchronization per optimizer step in the training loop (issue 21).

On a GPU every `.item()`, `.tolist()`, `bool()`, `int()` or `float()` of a tensor, or a Python number logged from the
step, waits for the device to
finish its queue. A CPU run cannot feel that, but it makes the same calls, so they are counted here (the data pipeline
makes none: collate counts tokens in Python): between the start of one optimizer step's batches and the next (no
validation, checkpoint or log flush in between), the training loop makes at most one of them, the step's
non-finite flag.
"""

import lightning.pytorch as pl
import pytest
import torch

from aiayn.lightning_modules import train as T

STEPS, SMALL = 8, {"N": 1, "d_model": 32, "d_ff": 64, "h": 2}


class Syncs(pl.Callback):
    """The number of counted calls made during each training batch and the step that follows it."""

    def __init__(self, counter: list):
        self.counter, self.per_step, self._start = counter, [], None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._start is not None:
            self.per_step.append(self.counter[0] - self._start)
        self._start = self.counter[0]


@pytest.fixture
def counted(monkeypatch):
    """Counts .item(), .tolist(), bool(), int(), float() of tensors and Python numbers logged with
    LightningModule.log."""
    counter = [0]
    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        real = getattr(torch.Tensor, name)

        def wrapped(self, *a, _real=real, **kw):
            counter[0] += 1
            return _real(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    real_log = pl.LightningModule.log

    def log(self, name, value, *a, **kw):
        if isinstance(value, (int, float)):
            counter[0] += 1
        return real_log(self, name, value, *a, **kw)

    monkeypatch.setattr(pl.LightningModule, "log", log)
    return counter


@pytest.mark.parametrize("accumulate_tokens", [None, 512])  # one batch per step; two accumulated batches per step
def test_at_most_one_host_device_sync_per_optimizer_step(cache, tmp_path, counted, accumulate_tokens):
    syncs = Syncs(counted)
    opts = T.TrainOptions(out=str(tmp_path), max_steps=STEPS, val_every=1000, ckpt_every=1000, progress=False,
                          accelerator="cpu", overrides=SMALL, max_tokens=accumulate_tokens, eval_subset=8)  # fmt: skip
    T.train(opts, hooks=T.Hooks(callbacks=(syncs,)))
    per_batch = syncs.per_step[1:]  # the first batch sets things up
    batches_per_step = 1 if accumulate_tokens is None else 2
    per_step = [sum(per_batch[i : i + batches_per_step]) for i in range(0, len(per_batch), batches_per_step)]
    assert len(per_step) >= 3 and max(per_step) <= 1, per_step
