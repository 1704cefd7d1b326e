"""Batches as the paper makes them (§5.1: "sentence pairs were batched together by approximate sequence length"):
`TokenBucketSampler` groups sentences of similar length into batches of at most `max_tokens` real target tokens,
shards them over DDP ranks and resumes mid-epoch; `ResumableDataLoader` saves its position in checkpoints;
`collate` pads a batch into the `src` / `tgt_in` / `tgt_out` tensors the model consumes; `release_workers` shuts
every loader's worker processes down (at the end of a run, and at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import signal
import sys
import weakref
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from aiayn.common.errors import UserError
from aiayn.lightning_modules.transformer.config import BOS, EOS, PAD

# A batch's padded tensors may hold at most this many times its budget of real target tokens: a guard for
# pathological batches (long sources with short targets), not a limit that sorted batches normally reach.
PADDED_LIMIT = 2


def batch_cost(n_sentences: int, longest_src: int, longest_tgt: int) -> int:
    """Padded positions of a batch: ``B * max(S, T + 1)``.

    S, T are the longest source / target lengths in SentencePiece tokens without specials; the source
    gets no specials, the target tensors are ``T + 1`` long (``[bos]+y`` / ``y+[eos]``). So the cost
    is the size of the larger of the two padded tensors ``src`` and ``tgt_in``.
    """
    return n_sentences * max(longest_src, longest_tgt + 1)


def derive_accumulation(target_tokens_per_step: int, max_tokens_per_batch: int, world_size: int = 1) -> int:
    """Gradient-accumulation steps so one optimizer step sees about ``target_tokens_per_step`` target tokens.

    Fairseq's ``update_freq``: ``ceil(target / (max_tokens * world_size))``, at least 1. The paper's
    ~25k target tokens per step on 8 GPUs becomes e.g. 7 batches of 4096 on one GPU.
    """
    if target_tokens_per_step <= 0 or max_tokens_per_batch <= 0 or world_size <= 0:
        raise UserError(
            f"token budgets must be positive (target={target_tokens_per_step}, "
            f"max_tokens={max_tokens_per_batch}, world_size={world_size}); "
            "pass positive --max-tokens and tokens-per-step values"
        )
    return max(1, math.ceil(target_tokens_per_step / (max_tokens_per_batch * world_size)))


def padding_stats(
    batches: Sequence[Sequence[int]],
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    pad_to: int = 1,
    square: bool = False,
) -> float:
    """Fraction of padded positions over ``src`` plus ``tgt_in`` tensors of ``batches`` (0 = no waste), their lengths
    rounded up to a multiple of ``pad_to`` (and made equal with ``square``) as collate does."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens) + 1
    real = padded = 0
    for b in batches:
        s, t = src_lens[b], tgt_lens[b]
        real += int(s.sum() + t.sum())
        S, T = round_up(int(max(s.max(), 1)), pad_to), round_up(int(t.max()), pad_to)
        padded += len(b) * (2 * max(S, T) if square else S + T)
    return 1.0 - real / padded if padded else 0.0


def batch_shapes(
    batches: Sequence[Sequence[int]],
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    pad_to: int = 1,
    square: bool = False,
) -> set[tuple[int, int, int]]:
    """The distinct (sentences, source length, target length) shapes of ``batches`` as collate pads them: what a
    compiled model or an attention plan is made for, once each."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens) + 1
    out = set()
    for b in batches:
        s, t = round_up(int(max(src_lens[b].max(), 1)), pad_to), round_up(int(tgt_lens[b].max()), pad_to)
        out.add((len(b), max(s, t), max(s, t)) if square else (len(b), s, t))
    return out


class TokenBucketSampler(Sampler[list[int]]):
    """Batch sampler: similar-length sentences in batches of at most ``max_tokens`` real target tokens.

    The budget counts what the paper counts ("batches of approximately 25000 source tokens and 25000
    target tokens"): real tokens, not padded positions; the target side, EOS included (what the loss
    normalizes by), so that an optimizer step of ``A`` batches on ``W`` devices trains on about
    ``A · W · max_tokens`` target tokens; the source side comes as the corpus gives it. Padded positions
    (:func:`batch_cost`) are kept under ``PADDED_LIMIT × max_tokens`` (sorted batches stay far below).

    Per epoch: sort by ``max(src, tgt + 1)`` (ties broken randomly per epoch when shuffling), cut
    greedily at the budget (a lone sentence over budget still forms a batch of one; the DataModule
    prevents that by requiring ``max_tokens > max_len``), shuffle batch order with ``(seed, epoch)``.

    For DDP with ``accumulate`` batches per optimizer step, the batch list is cut to a multiple of
    ``num_replicas · accumulate`` (the last batches after shuffling are dropped when ``drop_uneven``,
    so no optimizer step gets an incomplete accumulation window at the end of an epoch, and every rank gets
    the same count) and rank r takes batches ``r::num_replicas``: disjoint shares. Without ``drop_uneven``
    (dev and test) nothing is dropped or repeated: every sentence once, on one rank, the shares one batch
    apart at most. (Repeating batches to even out the shares, as DistributedSampler does, counted those
    sentences twice in the dev perplexity; validation makes no collective per batch, so uneven shares are
    fine.)

    Resumable: ``state_dict()`` = ``{"epoch", "yielded"}``; after ``load_state_dict`` iterations
    of that epoch skip the batches already yielded, until one finishes or ``set_epoch`` moves to
    another epoch. ``sampler`` points at ``self`` so Lightning's ``_set_sampler_epoch`` (which looks
    at ``batch_sampler.sampler``) calls :meth:`set_epoch` every epoch.
    """

    def __init__(
        self,
        src_lens: Sequence[int],
        tgt_lens: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_uneven: bool = True,
        accumulate: int = 1,
        static_bucket: int | None = None,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside [0, {num_replicas})")
        self.src_lens, self.tgt_lens = (
            np.asarray(src_lens, dtype=np.int64),
            np.asarray(tgt_lens, dtype=np.int64),
        )
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.num_replicas, self.rank, self.drop_uneven = num_replicas, rank, drop_uneven
        self.accumulate = accumulate
        self.static_bucket = static_bucket  # static shapes: lengths in buckets of this width, a fixed count each
        self.epoch, self.yielded, self._skip = 0, 0, 0
        self._len = len(self._rank_share(self.all_batches(0)))  # batch count is the same every epoch

    @property
    def sampler(self) -> TokenBucketSampler:
        return self

    def all_batches(self, epoch: int | None = None) -> list[list[int]]:
        """Every batch of the epoch, in (shuffled) order, before the split over ranks."""
        epoch = self.epoch if epoch is None else epoch
        key = np.maximum(self.src_lens, self.tgt_lens + 1)
        rng = np.random.default_rng([self.seed, epoch])
        tie = rng.random(len(key)) if self.shuffle else np.arange(len(key))
        order = self._sorted(key, tie)
        cuts = self._static_cuts(key, order) if self.static_bucket else self._cuts(key, order)
        if self.shuffle:
            cuts = [cuts[i] for i in rng.permutation(len(cuts))]
        return [order[a:b].tolist() for a, b in cuts]

    def _sorted(self, key, tie):
        """Sentence indices by length key, ties by `tie` (static shapes: by bucket)."""
        if self.static_bucket:
            return np.lexsort((tie, -(-key // self.static_bucket)))
        return np.lexsort((tie, key))

    def _cuts(self, key, order) -> list[tuple[int, int]]:
        """Greedy cuts of the sorted order at the budget: (start, end) positions."""
        cuts, start, real = [], 0, 0
        for pos, i in enumerate(order.tolist()):
            tgt = int(self.tgt_lens[i]) + 1  # + EOS
            longest = int(key[i])  # sorted ascending: the longest so far
            padded = (pos - start + 1) * longest
            if pos > start and (real + tgt > self.max_tokens or padded > PADDED_LIMIT * self.max_tokens):
                cuts.append((start, pos))
                start, real = pos, 0
            real += tgt
        if start < len(order):
            cuts.append((start, len(order)))
        return cuts

    def _static_cuts(self, key, order) -> list[tuple[int, int]]:
        """Static shapes (`static_bucket` K): each sentence's longer side, rounded up to a multiple of K, is its
        bucket L; a bucket's batches hold a fixed count of sentences (its last one fewer), and collate pads both
        sides to L (`collate(..., square_to=K)`), so an epoch has at most two shapes per bucket: a compiled model, or
        a CUDA graph, is made for each once. The count fills the budget with real tokens, as the dynamic batches do:
        max_tokens over the bucket's mean real target tokens (EOS included), so a step carries the experiment's
        tokens whatever the padding costs; at most PADDED_LIMIT x max_tokens padded positions, as theirs."""
        bucket = (-(-key // self.static_bucket) * self.static_bucket)[order]
        real = (self.tgt_lens + 1)[order]
        cuts = []
        for length in np.unique(bucket).tolist():
            first, last = np.searchsorted(bucket, length, "left"), np.searchsorted(bucket, length, "right")
            fill = self.max_tokens / float(real[first:last].mean())
            size = max(1, min(int(fill), int(PADDED_LIMIT * self.max_tokens) // length))
            cuts += [(a, min(a + size, last)) for a in range(int(first), int(last), size)]
        return cuts

    def _rank_share(self, batches: list[list[int]]) -> list[list[int]]:
        n = len(batches)
        if self.drop_uneven:
            batches = batches[: n - n % (self.num_replicas * self.accumulate)]
        elif n < self.num_replicas:
            # a dev set of fewer batches than ranks: every rank still needs one, or it skips validation and the
            # others wait for it in the epoch's gather (DDP crashed there); an empty batch collates to one row of
            # padding, which counts no token
            batches = batches + [[] for _ in range(self.num_replicas - n)]
        return batches[self.rank :: self.num_replicas]

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._skip = epoch, 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[list[int]]:
        # The order is fixed at iter() time (like DistributedSampler). The resume skip stays until an
        # epoch is finished or changed: a multi-worker DataLoader calls iter() twice when it starts.
        batches = self._rank_share(self.all_batches())
        self.yielded = self._skip
        return self._count(batches[self._skip :], self.epoch)

    def _count(self, batches: list[list[int]], epoch: int) -> Iterator[list[int]]:
        for b in batches:
            self.yielded += 1
            yield b
        if self.epoch == epoch:
            self._skip = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.yielded, self._skip = (
            int(state["epoch"]),
            int(state["yielded"]),
            int(state["yielded"]),
        )


# Loader workers forked from the trainer, as torch's DataLoader does by default on Linux up to Python 3.13. Python
# 3.14 defaults to the forkserver, and so does a sweep's trainer, a forkserver child (sweeps/backends/local.py): there
# each worker started a fresh interpreter that imported torch (a sweep's run of 2 tiny steps with 2 workers took 22-24 s
# against 1.3-1.6 s forked, on 2 quiet cores: BENCHMARKS.md), and none inherited the mask stop_signals_held sets.
# Elsewhere (macOS, where fork is unsafe) the platform's default.
WORKER_START = "fork" if sys.platform == "linux" else None


class ResumableDataLoader(DataLoader):
    """DataLoader whose ``state_dict`` is the batch sampler's position, counted in *consumed* batches.

    Lightning saves/restores ``state_dict``/``load_state_dict`` of the DataLoader object itself (it is
    ``_Stateful``), not of its batch sampler, so this class forwards. Counting here rather than in
    the sampler matters with workers: they pull indices from the sampler ahead of consumption.
    """

    def __init__(self, *args, **kwargs) -> None:
        if kwargs.get("num_workers", 0) > 0:
            kwargs.setdefault("multiprocessing_context", WORKER_START)
        super().__init__(*args, **kwargs)
        self._consumed = 0
        _LOADERS.add(self)

    def __iter__(self):
        # Lazy: Lightning calls iter() before set_epoch() at the start of a fit, so the real iterator
        # (and the sampler's order) is created at the first next(), after set_epoch.
        return _CountingIter(self)

    def _start(self):
        sampler = self.batch_sampler
        self._consumed, self._epoch = sampler._skip, sampler.epoch  # _skip: consumed before a resume
        with stop_signals_held():  # the workers this may fork start with them held (see stop_signals_held)
            return super().__iter__()

    def state_dict(self) -> dict:
        return {"epoch": getattr(self, "_epoch", self.batch_sampler.epoch), "yielded": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state)
        self._consumed, self._epoch = int(state["yielded"]), int(state["epoch"])


_LOADERS: weakref.WeakSet[ResumableDataLoader] = weakref.WeakSet()

# the signals meant for the trainer that also reach its loader workers (its process group's, SLURM's warning)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@contextlib.contextmanager
def stop_signals_held():
    """Hold STOP_SIGNALS back in this thread while it starts loader workers: a forked worker inherits the mask, and
    its worker_init_fn (datamodule.worker_signals) lets them through once its own handlers are in. A signal to the
    group that landed between the fork and those handlers met torch's worker handler, which ends a worker on a
    signal not sent by its parent: the trainer then failed with "DataLoader worker is killed by signal" half-way
    through making its iterator, whose other workers no one shut down, and multiprocessing's exit waited on them
    forever. Held, the signal waits: in the worker for its handlers, in the trainer until its workers are up."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def release_workers() -> None:
    """Shut down the worker processes of every loader made in this process, now.

    Persistent workers live as long as their loader, and torch stops them at exit only where memory is pinned; the
    rest it leaves to multiprocessing's exit handler, which sends each worker one SIGTERM and joins it without a
    timeout. A worker ignores its first SIGTERM (data/datamodule.py `worker_signals`: a signal to the process group
    is the trainer's to act on), so that join would wait forever. Here each worker is told to stop through its index
    queue, as torch does when an iterator is deleted, and joined; called at the end of every run and, registered
    after torch's own exit hooks, before them at exit."""
    for loader in list(_LOADERS):
        iterator = loader.__dict__.get("_iterator")
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        loader._iterator = None


atexit.register(release_workers)  # runs before torch's and multiprocessing's exit hooks (registered earlier)


class _CountingIter:
    """Iterator over a :class:`ResumableDataLoader` that starts it lazily and counts consumed batches."""

    def __init__(self, loader: ResumableDataLoader) -> None:
        self.loader, self.inner = loader, None

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self):
        if self.inner is None:
            self.inner = self.loader._start()
        batch = next(self.inner)
        self.loader._consumed += 1
        return batch


# --------------------------------------------------------------------------------------------------
# Collation
# --------------------------------------------------------------------------------------------------


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def collate(items: Sequence[tuple[int, torch.Tensor, torch.Tensor]], pad_to: int = 1, square: bool = False) -> dict:
    """Pad a list of ``(idx, src_ids, tgt_ids)`` into the batch dict the model consumes.

    ``src`` (B,S), ``tgt_in`` = [bos]+y and ``tgt_out`` = y+[eos] (B,T+1), all long and padded with 0;
    ``idx`` (B,) indexes the split (reference lookup for BLEU); ``n_*_tokens`` count non-pad positions.
    ``pad_to``: S and T+1 rounded up to a multiple of it (length buckets: shapes repeat, for compiled kernels);
    ``square``: both sides padded to the longer one's bucket (the static shapes of the sampler's `static_bucket`).
    Padded positions are masked as any padding is.
    """
    # vectorized (one masked copy per tensor, not a loop over sentences): collation runs once per batch in
    # the training process, and at the tiny preset's batch sizes a per-sentence loop costs ~3% of a step
    if not items:  # a rank's filler batch (TokenBucketSampler._rank_share): one row of padding, no token, index -1
        empty = torch.full((1, pad_to), PAD, dtype=torch.long)
        tgt_in = empty.clone()
        tgt_in[0, 0] = BOS
        return {
            "src": empty.clone(),
            "tgt_in": tgt_in,
            "tgt_out": empty.clone(),
            "idx": torch.tensor([-1], dtype=torch.long),
            "n_src_tokens": 0,
            "n_tgt_tokens": 0,
        }
    b = len(items)
    src_lens, tgt_lens = [len(x[1]) for x in items], [len(x[2]) for x in items]  # host numbers: no tensor read
    src_len, tgt_len = torch.tensor(src_lens, dtype=torch.long), torch.tensor(tgt_lens, dtype=torch.long)
    s, t = round_up(max(max(src_lens), 1), pad_to), round_up(max(tgt_lens) + 1, pad_to)
    if square:
        s = t = max(s, t)
    src = torch.full((b, s), PAD, dtype=torch.long)
    tgt_in = torch.full((b, t), PAD, dtype=torch.long)
    tgt_out = torch.full((b, t), PAD, dtype=torch.long)
    src[torch.arange(s) < src_len[:, None]] = torch.cat([torch.as_tensor(x[1], dtype=torch.long) for x in items])
    ys = torch.cat([torch.as_tensor(x[2], dtype=torch.long) for x in items])
    in_y = torch.arange(t) < tgt_len[:, None]  # (b, t): the positions of y in tgt_out
    tgt_out[in_y] = ys
    tgt_out[torch.arange(b), tgt_len] = EOS
    tgt_in[:, 0] = BOS
    tgt_in[:, 1:][in_y[:, :-1]] = ys
    return {
        "src": src,
        "tgt_in": tgt_in,
        "tgt_out": tgt_out,
        "idx": torch.tensor([x[0] for x in items], dtype=torch.long),
        "n_src_tokens": sum(src_lens),
        "n_tgt_tokens": sum(tgt_lens) + b,
    }
