"""The LightningDataModule: corpus → joint SentencePiece BPE → cached ids → token-bucket batches.

Each stage is its own module in lightning_modules/data/: corpora.py (the corpora and reading them), tokenizer.py
(SentencePiece and the encoded cache), batching.py (the token-bucket sampler, the resumable loader, collation).
`TranslationDataModule` wires them together for Lightning. With several devices the Trainer must be built with
`use_distributed_sampler=False`: the sampler shards by rank itself, and Lightning cannot inject a
`DistributedSampler` into a custom batch sampler."""

from __future__ import annotations

import functools
import logging
import signal
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl
import torch

from aiayn.common.errors import UserError
from aiayn.lightning_modules.data.batching import (
    STOP_SIGNALS,
    ResumableDataLoader,
    TokenBucketSampler,
    batch_shapes,
    collate,
    padding_stats,
)
from aiayn.lightning_modules.data.corpora import SPLITS, parallel_text, read_parallel, resolve_corpus
from aiayn.lightning_modules.data.plan import DataIdentity, DataPlan
from aiayn.lightning_modules.data.tokenizer import (
    EncodedPairs,
    encode_split,
    encoded_cache_path,
    load_spm,
    spm_cache_prefix,
    train_spm,
)
from aiayn.lightning_modules.transformer.config import BOS, EOS, PAD, UNK

log = logging.getLogger(__name__)

# re-exported for the modules that build batches the way training does (translate, bench)
__all__ = ["DataIdentity", "DataPlan", "TranslationDataModule", "collate", "derive_accumulation"]
from aiayn.lightning_modules.data.batching import derive_accumulation  # noqa: E402


def _stop_on_the_second(signum, frame) -> None:
    signal.signal(signum, signal.SIG_DFL)  # the next one ends the worker (multiprocessing's terminate at exit)


def worker_signals(worker_id: int) -> None:
    """A DataLoader worker outlives the signals meant for its trainer.

    - SLURM's warning signal (callbacks.REQUEUE_SIGNAL, SIGUSR1), ignored: `#SBATCH --signal=USR1@90` without `B:`
      goes to every process of the job step, the loader's workers included; the trainer checkpoints and requeues on
      it, and a worker started by a forkserver or spawn (Python 3.14's default start method) does not inherit the
      trainer's handler, so its default action, terminate, would kill it and the step with it.
    - The first SIGTERM or SIGINT, ignored: sent to the whole process group (a scheduler's time limit or
      preemption, `timeout`, Ctrl-C) it killed the workers too, and torch's SIGCHLD handler raised "DataLoader
      worker (pid ...) is killed by signal" wherever the trainer was, so a run the signal should have stopped in
      one line ended in a chain of tracebacks. The trainer stops on its own copy and shuts its workers down through
      their queues (batching.release_workers, at the end of a run and at exit: multiprocessing's exit handler sends
      only one SIGTERM); a second signal ends the worker.

    The worker starts with these signals held (batching.stop_signals_held) and lets them through once its handlers
    are in: one sent while it started is then the first it ignores."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop_on_the_second)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class TranslationDataModule(pl.LightningDataModule):
    """Corpus -> SPM -> cached ids -> token-bucket DataLoaders (see the module docstring), built from one `DataPlan`
    (data/plan.py): `plan.identity` (also `data`) says which tokens, the rest how they are batched.

    Train pairs with more than ``max_len`` tokens on either side are dropped (count logged); dev/test
    pairs are truncated to ``max_len`` instead so every reference is scored.
    """

    def __init__(self, plan: DataPlan) -> None:
        super().__init__()
        # No Lightning hyper-parameters: the data identity a checkpoint keeps is config.json's (RunConfig.data).
        self.plan, self.data = plan, plan.identity
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = PAD, BOS, EOS, UNK
        self.sp = None
        self.tokenizer_model: Path | None = None  # the model in use, known after prepare_data/setup
        self._corpus_dir: Path | None = None
        self._encoded: dict[str, dict] = {}
        self._datasets: dict[str, EncodedPairs] = {}
        self._samplers: dict[str, TokenBucketSampler] = {}
        self._text: dict[str, tuple[list[str], list[str]]] = {}

    # -- preparation ---------------------------------------------------------------------------------

    def _prepare(self) -> tuple[Path, Path]:
        """Corpus dir and SPM model, creating whatever is not cached yet (idempotent). With `tokenizer`,
        that model is used as it is (a resumed run keeps its own, `--tokenizer` shares one)."""
        corpus_dir = self._resolve()
        if self.plan.tokenizer is not None:
            self.tokenizer_model = self._check_tokenizer(self.plan.tokenizer)
            return corpus_dir, self.tokenizer_model
        d = self.data
        prefix = spm_cache_prefix(self.plan.cache_dir, d.corpus, corpus_dir, d.src_lang, d.tgt_lang, d.vocab_size)
        if not prefix.with_name(prefix.name + ".model").is_file():
            for split in ("dev", "test"):  # small: check them before minutes of tokenizer training
                read_parallel(corpus_dir, split, d.src_lang, d.tgt_lang)
            src, tgt = parallel_text(corpus_dir, "train", d.src_lang, d.tgt_lang)  # a dataset: read in place
            train_spm(src, tgt, d.vocab_size, prefix)
        self.tokenizer_model = prefix.with_name(prefix.name + ".model")
        return corpus_dir, self.tokenizer_model

    def _resolve(self):
        """The corpus: a directory of files, or a Hugging Face dataset read where `datasets` keeps it."""
        d = self.data
        return resolve_corpus(d.corpus, d.data_dir, self.plan.cache_dir, d.src_lang, d.tgt_lang)

    def _check_tokenizer(self, path: Path) -> Path:
        if not path.is_file():
            raise UserError(f"tokenizer {path} does not exist; pass --tokenizer with a SentencePiece .model file")
        try:
            sp = load_spm(path)
        except Exception as e:  # SentencePiece raises OSError or RuntimeError on a file of another kind
            raise UserError(
                f"tokenizer {path} is not a SentencePiece model ({type(e).__name__}); pass a .model file"
            ) from None
        ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
        if ids != (PAD, UNK, BOS, EOS):
            raise UserError(
                f"tokenizer {path} has special ids {ids} (pad, unk, bos, eos), not ({PAD}, {UNK}, "
                f"{BOS}, {EOS}); use a tokenizer trained by aiayn"
            )
        if sp.get_piece_size() != self.data.vocab_size:
            raise UserError(
                f"tokenizer {path} has {sp.get_piece_size()} pieces but the run asks for a vocabulary "
                f"of {self.data.vocab_size}; pass --vocab-size {sp.get_piece_size()}"
            )
        return path

    def _encoded_split(self, sp, corpus_dir: Path, model: Path, split: str) -> dict:
        d = self.data
        out = encoded_cache_path(self.plan.cache_dir, model, corpus_dir, split, d.src_lang, d.tgt_lang)
        return encode_split(sp, corpus_dir, split, d.src_lang, d.tgt_lang, out)

    def prepare_data(self) -> None:
        """Once per node: corpus files, SPM model and encoded caches."""
        corpus_dir, model = self._prepare()
        sp = load_spm(model)
        for split in SPLITS:
            self._encoded_split(sp, corpus_dir, model, split)

    def setup(self, stage: str | None = None) -> None:
        """Load SPM and encoded splits (building any missing cache) and build the samplers."""
        if self.sp is not None:
            return
        self._corpus_dir, model = self._prepare()
        self.sp = load_spm(model)
        for split in SPLITS:
            self._encoded[split] = self._encoded_split(self.sp, self._corpus_dir, model, split)
            self._datasets[split] = self._make_dataset(split)
        world, rank, p = *self._world(), self.plan
        for split in SPLITS:
            ds = self._datasets[split]
            train = split == "train"
            self._samplers[split] = TokenBucketSampler(
                ds.src_lens,
                ds.tgt_lens,
                p.max_tokens,
                shuffle=train,
                seed=p.seed,
                num_replicas=world,
                rank=rank,
                drop_uneven=train,
                accumulate=p.accumulate if train else 1,
                static_bucket=p.pad_to if p.static_shapes else None,
            )

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        connector = getattr(trainer, "_accelerator_connector", None)
        if trainer.world_size > 1 and getattr(connector, "use_distributed_sampler", False):
            # Lightning would try to inject a DistributedSampler into our batch sampler and fail.
            raise RuntimeError(
                "TranslationDataModule shards batches per rank itself; build the Trainer with "
                "use_distributed_sampler=False"
            )
        return trainer.world_size, trainer.global_rank

    def _make_dataset(self, split: str) -> EncodedPairs:
        data = self._encoded[split]
        n, d = len(data["src"][1]) - 1, self.data
        if split == "dev" and self.plan.dev_subset is not None:
            n = min(n, self.plan.dev_subset)  # the first K sentences: cheap, stable validation decoding
        if split == "train" and d.train_pairs is not None:  # a data-limited regime (the tokenizer saw them all)
            if d.train_pairs > n:
                raise UserError(
                    f"--train-pairs {d.train_pairs} is more than the corpus's {n} training pairs; pass at most {n}"
                )
            n = d.train_pairs
        keep = torch.arange(n)
        if split != "train":
            return EncodedPairs(data, keep, max_len=d.max_len, source_eos=d.source_eos)
        src_len = (data["src"][1][1:] - data["src"][1][:-1])[:n]
        tgt_len = (data["tgt"][1][1:] - data["tgt"][1][:-1])[:n]
        ok = (src_len <= d.max_len) & (tgt_len <= d.max_len) & (src_len > 0) & (tgt_len > 0)
        dropped = n - int(ok.sum())
        if dropped:
            log.info("dropped %d of %d train pairs (empty or longer than %d tokens)", dropped, n, d.max_len)
        return EncodedPairs(data, keep[ok], source_eos=d.source_eos)

    # -- vocabulary ----------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Actual SentencePiece vocabulary size (== requested for BPE; the request before setup)."""
        return self.sp.get_piece_size() if self.sp is not None else self.data.vocab_size

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self._need_sp().encode(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` up to the first eos, ignoring pad and bos."""
        out = []
        for i in (int(x) for x in ids):
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(i)
        return self._need_sp().decode(out)

    def _need_sp(self):
        if self.sp is None:
            raise RuntimeError("TranslationDataModule.setup() must run before encode/decode")
        return self.sp

    # -- raw text ------------------------------------------------------------------------------------

    def _raw(self, split: str) -> tuple[list[str], list[str]]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split not in self._text:
            corpus_dir = self._corpus_dir or self._resolve()
            src, tgt = read_parallel(corpus_dir, split, self.data.src_lang, self.data.tgt_lang)
            if split == "dev" and self.plan.dev_subset is not None:
                src, tgt = src[: self.plan.dev_subset], tgt[: self.plan.dev_subset]
            self._text[split] = (src, tgt)
        return self._text[split]

    def references(self, split: str) -> list[str]:
        """Raw target sentences of ``split`` (``dev`` limited to ``dev_subset``); index with batch ``idx``."""
        return self._raw(split)[1]

    def sources(self, split: str) -> list[str]:
        """Raw source sentences of ``split`` (``dev`` limited to ``dev_subset``)."""
        return self._raw(split)[0]

    # -- loaders -------------------------------------------------------------------------------------

    def _loader(self, split: str) -> ResumableDataLoader:
        if split not in self._samplers:
            raise RuntimeError("TranslationDataModule.setup() must run before the dataloaders")
        return ResumableDataLoader(
            self._datasets[split],
            batch_sampler=self._samplers[split],
            collate_fn=functools.partial(collate, pad_to=self.plan.pad_to, square=self.plan.static_shapes),
            num_workers=self.plan.num_workers,
            persistent_workers=self.plan.num_workers > 0,
            pin_memory=self.plan.pin_memory,
            worker_init_fn=worker_signals,
        )

    def train_dataloader(self) -> ResumableDataLoader:
        return self._loader("train")

    def val_dataloader(self) -> ResumableDataLoader:
        return self._loader("dev")

    def test_dataloader(self) -> ResumableDataLoader:
        return self._loader("test")

    def train_shapes(self) -> set[tuple[int, int, int]]:
        """The distinct (sentences, source length, target length) shapes an epoch of training batches has on this
        rank, as collate pads them: what a compiled model makes a graph for, once each."""
        s = self._samplers["train"]
        batches = s._rank_share(s.all_batches(0))
        return batch_shapes(batches, s.src_lens, s.tgt_lens, pad_to=self.plan.pad_to, square=self.plan.static_shapes)

    def train_shape_count(self) -> int:
        return len(self.train_shapes())

    def padding_fraction(self, split: str = "train") -> float:
        """Padding waste of the current epoch's batches of ``split`` (all ranks together)."""
        s = self._samplers[split]
        return padding_stats(s.all_batches(), s.src_lens, s.tgt_lens)
