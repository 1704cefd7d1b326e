"""Dropout masks by counter, for packed runs (lightning_modules/transformer/packed.py): beyond the paper's training,
whose masks come from its framework's generator. A model's `Dropout` modules (model.py) draw from a stream once
`counter_dropout` sets one on them; without it they draw from torch's generator, as the paper's did.
No Lightning here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.lightning_modules.transformer.model import Dropout


class DropoutStream:
    """Dropout masks drawn by counter instead of torch's generator (beyond the paper's training, whose masks come from
    its framework's generator): element (b, t, j) of site `site`'s input at micro-step `step` is kept by a hash of
    (seed, step, site, b, t, j), so a run's masks are a function of its seed and its step alone. What packed runs
    need (lightning_modules/transformer/packed.py): K seeds in one computation keep each its own masks, the same
    as that seed trained alone with this stream, in a number of launches that does not grow with K; and a resumed
    run draws the masks it would have drawn. Set on a model by `counter_dropout`; the trainer advances `step`, which
    makes the step's keys (one per seed and site, `keys`) on the device in place: the masks' one input that changes
    from step to step is a tensor, so a compiled step is one graph for every step (tests/test_packed.py).

    The hash is a 32-bit integer mixer (Mueller's `((x >> 16) ^ x) * 0x45d9f3b`, kept in int64 so that no product
    overflows) folded over the coordinates; a site's input is (K·B, T, d_model), K = len(seeds) blocks of rows."""

    MIX, MASK = 0x45D9F3B, 0xFFFFFFFF

    def __init__(self, seeds: list[int], step: int = 0):
        self.seeds, cpu = list(seeds), torch.device("cpu")  # made on the host; `to` moves them
        self._seeds = torch.tensor(self.seeds, dtype=torch.int64, device=cpu) & self.MASK  # (K,)
        self._sites = torch.arange(0, device=cpu)  # site numbers (`counter_dropout` sets them)
        self._step = torch.zeros((), dtype=torch.int64, device=cpu)
        self.keys = torch.zeros(len(self.seeds), 0, dtype=torch.int64, device=cpu)  # (K, sites): the step's keys
        self.step = step

    @property
    def step(self) -> int:
        return self._value

    @step.setter
    def step(self, step: int) -> None:
        """The micro-step's keys, made on the keys' device in place: no host-device copy or synchronization, and a
        compiled step (or a CUDA graph) reads the same tensor every step."""
        self._value = step
        self._step.fill_(step & self.MASK)
        self.keys.copy_(self.mix(self._seeds[:, None] ^ self.mix(self.mix(self._step) ^ self._sites)))

    def sites(self, count: int) -> None:
        """Number `count` sites (0 .. count - 1) and make their keys for the current step."""
        self._sites = torch.arange(count, device=self.keys.device)
        self.keys = self.keys.new_zeros(len(self.seeds), count)
        self.step = self._value

    def to(self, device: torch.device) -> DropoutStream:
        """The stream's tensors on `device` (nothing done where they are there already)."""
        if self.keys.device != device:
            self._seeds, self._sites, self._step, self.keys = (
                t.to(device) for t in (self._seeds, self._sites, self._step, self.keys)
            )
        return self

    @classmethod
    def mix(cls, x):
        """A bijection of [0, 2^32) that scatters its bits: int64 tensors or Python ints."""
        x = (((x >> 16) ^ x) * cls.MIX) & cls.MASK
        x = (((x >> 16) ^ x) * cls.MIX) & cls.MASK
        return (x >> 16) ^ x

    def keep(self, x: Tensor, site: int, p: float) -> Tensor:
        """The scaled keep-mask (1 / (1 - p) or 0) of `x` (K·B, T, d) at `site` and the current step."""
        K = len(self.seeds)
        B, T, d = x.shape[0] // K, x.shape[1], x.shape[2]
        self.to(x.device)  # a caller that compiles the model moves the stream first (a no-op here then)
        if site >= self.keys.shape[1]:  # a stream used without `counter_dropout`: its sites as they come
            self.sites(site + 1)
        rows = torch.arange(B, device=x.device).view(1, B, 1, 1) * 2**16 + torch.arange(T, device=x.device).view(T, 1)
        h = self.mix(self.keys[:, site].view(K, 1, 1, 1) ^ rows)  # a hash per (seed, b, t): t < 2^16, b < 2^16
        h = self.mix(h ^ torch.arange(d, device=x.device))
        return (h >= round(p * 2**32)).to(x.dtype).mul_(1.0 / (1.0 - p)).view(K * B, T, d)


def counter_dropout(model: nn.Module, stream: DropoutStream | None) -> None:
    """Draw every dropout mask of `model` from `stream` (None: torch's generator again, the default). Sites are
    numbered in module order, so a model and its packed form (packed.py) number theirs alike."""
    sites = [m for m in model.modules() if isinstance(m, Dropout)]
    for site, module in enumerate(sites):
        module.stream, module.site = stream, site
    if stream is not None:
        stream.sites(len(sites))
