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
from aiayn.common.names import RULE, is_name
from aiayn.lightning_modules.data.batching import (
    ResumableDataLoader,
    TokenBucketSampler,
    batch_shapes,
    collate,
    padding_stats,
)
from aiayn.lightning_modules.data.corpora import SPLITS, default_cache_dir, parallel_text, read_parallel, resolve_corpus
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
__all__ = ["TranslationDataModule", "collate", "derive_accumulation"]
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
      one line ended in a chain of tracebacks (issue 42). The trainer stops on its own copy and shuts its workers
      down; a second one ends the worker as before."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop_on_the_second)


class TranslationDataModule(pl.LightningDataModule):
    """Corpus -> SPM -> cached ids -> token-bucket DataLoaders (see the module docstring).

    Train pairs with more than ``max_len`` tokens on either side are dropped (count logged); dev/test
    pairs are truncated to ``max_len`` instead so every reference is scored. ``max_tokens`` is real target
    tokens per device and per batch; it must exceed ``max_len`` so every sentence fits in a batch.
    ``accumulate`` (batches per optimizer step) makes each rank's training batches per epoch a multiple of
    it, so that every optimizer step has a whole accumulation window.
    """

    def __init__(
        self,
        corpus: str = "synthetic",
        data_dir: str | Path | None = None,
        cache_dir: str | Path | None = None,
        vocab_size: int = 8000,
        max_tokens: int = 4096,
        src_lang: str = "en",
        tgt_lang: str = "de",
        seed: int = 0,
        dev_subset: int | None = None,
        max_len: int = 256,
        num_workers: int = 0,
        accumulate: int = 1,
        tokenizer: str | Path | None = None,
        train_pairs: int | None = None,
        pin_memory: bool = False,
        splits: str | None = None,
        pad_to: int = 1,
        static_shapes: bool = False,
        source_eos: bool = True,
    ) -> None:
        super().__init__()
        if max_tokens <= max_len:
            raise UserError(
                f"--max-tokens {max_tokens} must be larger than the preset's max_len {max_len} so that a sentence of "
                "max_len tokens plus bos/eos fits in a batch; raise --max-tokens"
            )
        if dev_subset is not None and dev_subset <= 0:
            raise UserError(f"--dev-subset must be positive, got {dev_subset}; pass a positive count or omit it")
        if train_pairs is not None and train_pairs <= 0:
            raise UserError(f"--train-pairs must be positive, got {train_pairs}; pass a positive count or omit it")
        for flag, lang in (("--src-lang", src_lang), ("--tgt-lang", tgt_lang)):
            if not is_name(lang):  # it names the tokenizer's cache file: 'd/../../x' wrote outside the cache
                raise UserError(f"{flag} {lang!r} is not a language code ({RULE}); pass the suffix of the corpus "
                                "files, e.g. de")  # fmt: skip
        # No Lightning hyper-parameters: the data identity a checkpoint keeps is config.json's (RunConfig.data).
        data_dir = str(data_dir) if data_dir is not None else None
        self.corpus, self.data_dir = corpus, data_dir
        self.splits = splits  # --hf-splits: which of a Hugging Face dataset's splits are train, dev, test
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.requested_vocab_size, self.max_tokens = vocab_size, max_tokens
        self.src_lang, self.tgt_lang, self.seed = src_lang, tgt_lang, seed
        self.dev_subset, self.max_len, self.num_workers = dev_subset, max_len, num_workers
        self.accumulate = accumulate
        self.train_pairs = train_pairs  # a data-limited regime: the first K training pairs (the tokenizer: all)
        self.pin_memory = pin_memory  # page-locked batches for a GPU's asynchronous copies (not a CPU run's)
        self.pad_to = pad_to  # batch lengths rounded up to a multiple of it (length buckets; 1: none)
        self.static_shapes = static_shapes  # a fixed number of sentences per length bucket, both sides padded to it
        self.source_eos = source_eos  # every source ends with </s>, as the paper's models (tokenizer.EncodedPairs)
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = PAD, BOS, EOS, UNK
        self.sp = None
        self.tokenizer = Path(tokenizer) if tokenizer else None  # a SentencePiece model to use instead of training one
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
        if self.tokenizer is not None:
            self.tokenizer_model = self._check_tokenizer(self.tokenizer)
            return corpus_dir, self.tokenizer_model
        prefix = spm_cache_prefix(
            self.cache_dir, self.corpus, corpus_dir, self.src_lang, self.tgt_lang, self.requested_vocab_size
        )
        if not prefix.with_name(prefix.name + ".model").is_file():
            for split in ("dev", "test"):  # small: check them before minutes of tokenizer training
                read_parallel(corpus_dir, split, self.src_lang, self.tgt_lang)
            src, tgt = parallel_text(corpus_dir, "train", self.src_lang, self.tgt_lang)  # a dataset: read in place
            train_spm(src, tgt, self.requested_vocab_size, prefix)
        self.tokenizer_model = prefix.with_name(prefix.name + ".model")
        return corpus_dir, self.tokenizer_model

    def _resolve(self):
        """The corpus: a directory of files, or a Hugging Face dataset read where `datasets` keeps it."""
        return resolve_corpus(self.corpus, self.data_dir, self.cache_dir, self.src_lang, self.tgt_lang, self.splits)

    def _check_tokenizer(self, path: Path) -> Path:
        if not path.is_file():
            raise UserError(f"tokenizer {path} does not exist; pass --tokenizer with a SentencePiece .model file")
        try:
            sp = load_spm(path)
        except Exception as e:  # SentencePiece raises OSError or RuntimeError on a file of another kind
            raise UserError(f"tokenizer {path} is not a SentencePiece model ({type(e).__name__}); pass a .model "
                            f"file") from None  # fmt: skip
        ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
        if ids != (PAD, UNK, BOS, EOS):
            raise UserError(f"tokenizer {path} has special ids {ids} (pad, unk, bos, eos), not ({PAD}, {UNK}, "
                            f"{BOS}, {EOS}); use a tokenizer trained by aiayn")  # fmt: skip
        if sp.get_piece_size() != self.requested_vocab_size:
            raise UserError(f"tokenizer {path} has {sp.get_piece_size()} pieces but the run asks for a vocabulary "
                            f"of {self.requested_vocab_size}; pass --vocab-size {sp.get_piece_size()}")  # fmt: skip
        return path

    def _encoded_split(self, sp, corpus_dir: Path, model: Path, split: str) -> dict:
        out = encoded_cache_path(self.cache_dir, model, corpus_dir, split, self.src_lang, self.tgt_lang)
        return encode_split(sp, corpus_dir, split, self.src_lang, self.tgt_lang, out)

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
        world, rank = self._world()
        for split in SPLITS:
            ds = self._datasets[split]
            train = split == "train"
            self._samplers[split] = TokenBucketSampler(
                ds.src_lens, ds.tgt_lens, self.max_tokens, shuffle=train, seed=self.seed,
                num_replicas=world, rank=rank, drop_uneven=train, accumulate=self.accumulate if train else 1,
                static_bucket=self.pad_to if self.static_shapes else None,
            )  # fmt: skip

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
        n = len(data["src"][1]) - 1
        if split == "dev" and self.dev_subset is not None:
            n = min(n, self.dev_subset)  # the first K sentences: cheap, stable validation decoding
        if split == "train" and self.train_pairs is not None:
            if self.train_pairs > n:
                raise UserError(f"--train-pairs {self.train_pairs} is more than the corpus's {n} training pairs; "
                                f"pass at most {n}")  # fmt: skip
            n = self.train_pairs
        keep = torch.arange(n)
        if split != "train":
            return EncodedPairs(data, keep, max_len=self.max_len, source_eos=self.source_eos)
        src_len = (data["src"][1][1:] - data["src"][1][:-1])[:n]
        tgt_len = (data["tgt"][1][1:] - data["tgt"][1][:-1])[:n]
        ok = (src_len <= self.max_len) & (tgt_len <= self.max_len) & (src_len > 0) & (tgt_len > 0)
        dropped = n - int(ok.sum())
        if dropped:
            log.info("dropped %d of %d train pairs (empty or longer than %d tokens)", dropped, n, self.max_len)
        return EncodedPairs(data, keep[ok], source_eos=self.source_eos)

    # -- vocabulary ----------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Actual SentencePiece vocabulary size (== requested for BPE; the request before setup)."""
        return self.sp.get_piece_size() if self.sp is not None else self.requested_vocab_size

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
            src, tgt = read_parallel(corpus_dir, split, self.src_lang, self.tgt_lang)
            if split == "dev" and self.dev_subset is not None:
                src, tgt = src[: self.dev_subset], tgt[: self.dev_subset]
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
            collate_fn=functools.partial(collate, pad_to=self.pad_to, square=self.static_shapes),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pin_memory,
            worker_init_fn=worker_signals,
        )

    def train_dataloader(self) -> ResumableDataLoader:
        return self._loader("train")

    def val_dataloader(self) -> ResumableDataLoader:
        return self._loader("dev")

    def test_dataloader(self) -> ResumableDataLoader:
        return self._loader("test")

    def train_shape_count(self) -> int:
        """How many distinct (sentences, source length, target length) shapes an epoch of training batches has on this
        rank, as collate pads them: what a compiled model makes a graph for, once each."""
        s = self._samplers["train"]
        return len(batch_shapes(s._rank_share(s.all_batches(0)), s.src_lens, s.tgt_lens, pad_to=self.pad_to,
                                square=self.static_shapes))  # fmt: skip

    def padding_fraction(self, split: str = "train") -> float:
        """Padding waste of the current epoch's batches of ``split`` (all ranks together)."""
        s = self._samplers[split]
        return padding_stats(s.all_batches(), s.src_lens, s.tgt_lens)
