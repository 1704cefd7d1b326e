"""At most one host-device synchronization per optimizer step in the training loop.

On a GPU every `.item()`, `.tolist()`, `bool()`, `int()` or `float()` of a tensor, or a Python number logged from the
step, waits for the device to
finish its queue. A CPU run cannot feel that, but it makes the same calls, so they are counted here (the data pipeline
makes none: collate counts tokens in Python): between the start of one optimizer step's batches and the next (no
validation, checkpoint or log flush in between), the training loop makes at most one of them, the step's
non-finite flag with a log step's numbers, and on one device with fused Adam none between log steps.
"""

import lightning.pytorch as pl
import pytest
import torch

from aiayn.lightning_modules.run import train as T

STEPS, SMALL = 8, {"N": 1, "d_model": 32, "d_ff": 64, "h": 2}


class Syncs(pl.Callback):
    """The number of counted calls made during each training batch and the step that follows it; None for a batch
    with a validation after it (the run validates at the stability rule's points whatever --val-every says)."""

    def __init__(self, counter: list):
        self.counter, self.per_step, self._start, self._validated = counter, [], None, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._start is not None:
            self.per_step.append(None if self._validated else self.counter[0] - self._start)
        self._start, self._validated = self.counter[0], False

    def on_validation_start(self, trainer, pl_module):
        self._validated = True


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
    opts = T.TrainOptions(
        out=str(tmp_path),
        max_steps=STEPS,
        val_every=1000,
        ckpt_every=1000,
        progress=False,
        accelerator="cpu",
        overrides=SMALL,
        max_tokens=accumulate_tokens,
        eval_subset=8,
    )
    T.train(opts, hooks=T.Hooks(callbacks=(syncs,)))
    per_batch = syncs.per_step[1:]  # the first batch sets things up
    batches_per_step = 1 if accumulate_tokens is None else 2
    steps = [per_batch[i : i + batches_per_step] for i in range(0, len(per_batch), batches_per_step)]
    per_step = [sum(step) for step in steps if None not in step]  # a step with a validation in it is left out
    assert len(per_step) >= 3 and max(per_step) <= 1, per_step


class OnDevice(torch.Tensor):
    """A tensor the training step computed, which on a GPU lives on the device: the subclass survives every op on it
    (sums, stacks, divisions, clones), so a CPU run can tell a read of it (a synchronization on a GPU) from a read of
    a number that was on the host all along (a token count, the learning rate)."""


@pytest.fixture
def device_reads(monkeypatch):
    """Counts .item(), .tolist(), bool(), int(), float() of tensors derived from the step's loss, wherever they are
    called from (ours, Lightning's logger connector, the progress bar)."""
    from aiayn.lightning_modules.run import module

    counter, inside = [0], [False]
    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        real = getattr(torch.Tensor, name)

        def wrapped(self, *a, _real=real, **kw):
            if inside[0]:  # the subclass's __torch_function__ calls the method again: one read, counted once
                return _real(self, *a, **kw)
            counter[0] += isinstance(self, OnDevice)
            inside[0] = True
            try:
                return _real(self, *a, **kw)
            finally:
                inside[0] = False

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    real_loss = module.projected_label_smoothed_loss

    def on_device(*a, **kw):
        loss, nll, rest = real_loss(*a, **kw)
        return loss.as_subclass(OnDevice), nll.as_subclass(OnDevice), rest

    monkeypatch.setattr(module, "projected_label_smoothed_loss", on_device)
    return counter


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile model"])
def test_one_sync_on_a_log_step_and_none_between_with_the_defaults_progress_bar_included(
    cache, tmp_path, device_reads, both_paths, compiled, monkeypatch
):
    """With the progress bar on (the default) and log steps inside the window (every 2 steps here), a log
    step reads the device once. Before, the bar read the logged loss at every batch end and a log step read every
    logged value: about 1.2 reads per step at the default log_every_n_steps 10, and 2-5 on a log step.

    A step between log steps reads it not at all. Its non-finite flag went to the host at every step
    (the GPU idle while the host queued Adam and the next forward); now it is copied behind the step's work, read at
    the next step, and fused Adam skips the step's update on the device meanwhile (test_reliability's
    test_a_non_finite_step_between_log_steps_...). The same with the model compiled whole (`--compile model`, the
    eager backend here: dynamo's tracing)."""
    syncs = Syncs(device_reads)
    graphed = {}
    if compiled:
        monkeypatch.setenv("AIAYN_COMPILE_BACKEND", "eager")
        graphed = {"compile": "model"}
    opts = T.TrainOptions(
        out=str(tmp_path),
        max_steps=STEPS,
        val_every=1000,
        ckpt_every=1000,
        progress=True,
        accelerator="cpu",
        overrides=SMALL,
        eval_subset=8,
        trainer={"log_every_n_steps": 2},
        **graphed,
    )
    T.train(opts, hooks=T.Hooks(callbacks=(syncs,)))
    # entry i is step i + 1; the first sets things up; a step with a validation (75%, 87.5%) after it is None
    counted = {step: n for step, n in enumerate(syncs.per_step, start=1) if step > 1 and n is not None}
    assert len(counted) >= STEPS - 4, syncs.per_step
    assert counted == {step: 1 if step % 2 == 0 else 0 for step in counted}, syncs.per_step
    logged = (tmp_path / "tiny" / "synthetic" / "base" / "seed0" / "logs" / "version_0" / "metrics.csv").read_text()
    header, *lines = logged.splitlines()
    loss = header.split(",").index("train/loss")
    assert sum(1 for line in lines if line.split(",")[loss]) == STEPS // 2  # the log steps were in the window
