"""Data pipeline: parallel text -> joint SentencePiece BPE -> cached ids -> token-bucket batches.

Pipeline (each stage is cached on disk under ``cache_dir`` and written atomically, so reruns and racing
processes are cheap and harmless; the loser of a race just overwrites an identical file):

1. :func:`resolve_corpus` gives a directory holding ``{train,dev,test}.{SRC,TGT}`` (plain or ``.gz``):
   the synthetic corpus, Multi30k (local or downloaded), WMT14 en-de (local or Hugging Face
   ``datasets``), or user ``files``.
2. :func:`train_spm` trains one joint BPE model on source+target training text (pad=0 unk=1 bos=2
   eos=3), keyed by corpus identity and vocabulary size (:func:`spm_cache_prefix`).
3. :func:`encode_split` encodes each split once into a ``.pt`` file (flat int32 ids + offsets).
4. :class:`TokenBucketSampler` groups sentences of similar length into batches of at most
   ``max_tokens`` real target tokens, shards them over DDP ranks and can resume mid-epoch.
5. :func:`collate` pads a batch into ``src``/``tgt_in``/``tgt_out`` tensors.

:class:`TranslationDataModule` wires these together for Lightning. With several devices the Trainer
must be built with ``use_distributed_sampler=False``: the sampler shards by rank itself, and Lightning
cannot inject a ``DistributedSampler`` into a custom batch sampler.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import math
import os
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from aiayn.ablations.presets import CORPORA
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_open, atomic_symlink, atomic_torch_save, sha256_file
from aiayn.lightning_modules.model import BOS, EOS, PAD, UNK

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"
# Our split name -> file stem in the multi30k GitHub repository.
MULTI30K_REMOTE = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
SPM_INPUT_SENTENCES = 2_000_000
SPM_SEED = 1234
_CACHE_VERSION = "1"  # bump to invalidate every SPM / encoded cache after a format change


# --------------------------------------------------------------------------------------------------
# Small file helpers
# --------------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$AIAYN_CACHE`` if set, else ``~/.cache/aiayn``."""
    return Path(os.environ.get("AIAYN_CACHE") or "~/.cache/aiayn").expanduser()


def _atomic_write_lines(path: Path, lines: Sequence[str]) -> None:
    with atomic_open(path) as f:
        for line in lines:
            f.write(line.replace("\n", " ") + "\n")  # one sentence per line, always


def find_split_file(data_dir: Path, split: str, lang: str) -> Path | None:
    """``data_dir/split.lang`` or ``data_dir/split.lang.gz`` (plain wins), else None."""
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    return None


def _files_identity(paths: Sequence[Path]) -> str:
    """Cheap content identity: basename, size and mtime of each file (stat follows symlinks).

    Hashing the bytes of WMT14 (~1.4 GB) on every run would cost seconds; a changed or re-downloaded
    file changes size or mtime, and a false miss only means one retraining.
    """
    h = hashlib.sha1(_CACHE_VERSION.encode())
    for p in paths:
        st = os.stat(p)
        h.update(f"{Path(p).name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:12]


# --------------------------------------------------------------------------------------------------
# 1. Reading parallel text
# --------------------------------------------------------------------------------------------------


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path} ({e}); check the file or pass --data-dir with valid files") from e
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline does not start another sentence
    out = []
    for i, line in enumerate(lines, start=1):
        try:
            out.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise UserError(
                f"{path} line {i} is not valid UTF-8 ({e.reason}); re-encode the file as UTF-8 (e.g. iconv -t utf-8)"
            ) from e
    if not out:
        raise UserError(f"{path} is empty; provide a non-empty file with one sentence per line")
    return out


def read_parallel(
    data_dir: str | Path, split: str, src_lang: str = "en", tgt_lang: str = "de"
) -> tuple[list[str], list[str]]:
    """Read ``SPLIT.SRC`` / ``SPLIT.TGT`` (plain or ``.gz``) from ``data_dir``; one sentence per line.

    Only line terminators are stripped. Every problem is a one-line :class:`UserError`.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(
            f"corpus directory {data_dir} does not exist; pass --data-dir pointing at an existing directory"
        )
    texts = []
    for lang in (src_lang, tgt_lang):
        path = find_split_file(data_dir, split, lang)
        if path is None:
            raise UserError(
                f"corpus directory {data_dir} has no file {split}.{lang} (expected {split}.{src_lang}/"
                f"{split}.{tgt_lang}, plain or .gz); pass --data-dir pointing at a directory with "
                "train/dev/test files"
            )
        texts.append((path, _read_lines(path)))
    (sp, src), (tp, tgt) = texts
    if len(src) != len(tgt):
        raise UserError(
            f"{sp} has {len(src)} lines but {tp} has {len(tgt)}; the files must be line-aligned "
            "translations (same number of lines)"
        )
    return src, tgt


# --------------------------------------------------------------------------------------------------
# 2. Corpora
# --------------------------------------------------------------------------------------------------


def _check_en_de(name: str, src_lang: str, tgt_lang: str) -> None:
    if {src_lang, tgt_lang} != {"en", "de"}:
        raise UserError(
            f"corpus {name} is English-German but languages {src_lang}->{tgt_lang} were asked for; "
            "use --src-lang/--tgt-lang en/de (either direction) or --corpus files"
        )


def _require_layout(data_dir: Path, splits: Sequence[str], src_lang: str, tgt_lang: str) -> None:
    if not data_dir.is_dir():
        raise UserError(
            f"corpus directory {data_dir} does not exist; pass --data-dir pointing at an existing directory"
        )
    for split in splits:
        for lang in (src_lang, tgt_lang):
            if find_split_file(data_dir, split, lang) is None:
                raise UserError(
                    f"corpus directory {data_dir} has no file {split}.{lang} (expected {split}.{src_lang}/"
                    f"{split}.{tgt_lang}, plain or .gz); pass --data-dir pointing at a directory with "
                    "train/dev/test files"
                )


def _link_multi30k_dir(data_dir: Path, cache_dir: Path, src_lang: str, tgt_lang: str) -> Path:
    """Expose a local Multi30k directory (``val`` as dev, test optional) in the train/dev/test layout.

    Symlinks in the cache keep the user's directory untouched and avoid copying data.
    """
    data_dir = data_dir.expanduser().resolve()
    _require_layout(data_dir, ["train"], src_lang, tgt_lang)
    dev_name = next((n for n in ("dev", "val") if find_split_file(data_dir, n, src_lang)), None)
    if dev_name is None or find_split_file(data_dir, dev_name, tgt_lang) is None:
        raise UserError(
            f"multi30k directory {data_dir} has no dev split (dev.{src_lang}/dev.{tgt_lang} or "
            f"val.{src_lang}/val.{tgt_lang}); pass --data-dir pointing at a directory with train and val "
            "files"
        )
    test_name = "test"
    if find_split_file(data_dir, "test", src_lang) is None or find_split_file(data_dir, "test", tgt_lang) is None:
        log.warning("multi30k directory %s has no test split; using the %s split as test", data_dir, dev_name)
        test_name = dev_name
    key = hashlib.sha1(str(data_dir).encode()).hexdigest()[:12]
    out = cache_dir / "corpora" / f"multi30k-local-{key}"
    out.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("dev", dev_name), ("test", test_name)):
        for lang in (src_lang, tgt_lang):
            src = find_split_file(data_dir, name, lang)
            suffix = ".gz" if src.name.endswith(".gz") else ""
            for stale in (out / f"{split}.{lang}", out / f"{split}.{lang}.gz"):
                if stale.is_symlink() and stale.name != f"{split}.{lang}{suffix}":
                    stale.unlink(missing_ok=True)  # the user's file switched between plain and .gz
            atomic_symlink(src, out / f"{split}.{lang}{suffix}")
    return out


def _download(url: str, dest: Path) -> None:
    """`url` into `dest`, whole or not at all. A server that closes early can leave a short body that a
    reader of the stream takes for the end, so the length is checked against Content-Length and a .gz
    file must decompress before it is renamed into place (the files are small: kept in memory)."""
    with urllib.request.urlopen(url, timeout=60) as r:
        data = r.read()
        expected = r.headers.get("Content-Length")
    if expected is not None and len(data) != int(expected):
        raise OSError(f"incomplete download: {len(data)} of {expected} bytes")
    if dest.name.endswith(".gz"):
        try:
            gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise OSError(f"incomplete download: not a whole gzip file ({e})") from e
    with atomic_open(dest, "wb") as f:
        f.write(data)


def _download_multi30k(cache_dir: Path) -> Path:
    out = cache_dir / "corpora" / "multi30k"
    for split, remote in MULTI30K_REMOTE.items():
        for lang in ("en", "de"):
            dest = out / f"{split}.{lang}.gz"
            if dest.is_file():
                continue
            url = MULTI30K_URL.format(name=remote, lang=lang)
            log.info("downloading %s", url)
            try:
                _download(url, dest)
            except (OSError, http.client.HTTPException) as e:  # URLError, HTTPError; IncompleteRead
                raise UserError(
                    f"could not download Multi30k from {url} ({e}); pass --data-dir pointing at a local "
                    "Multi30k copy (train/val/test .en/.de files)"
                ) from e
    return out


def _export_wmt14(cache_dir: Path) -> Path:
    out = cache_dir / "corpora" / "wmt14-de-en"
    if all((out / f"{s}.{lang}").is_file() for s in SPLITS for lang in ("en", "de")):
        return out
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise UserError(
            "corpus wmt14 without --data-dir needs the Hugging Face datasets package; "
            "pip install aiayn[online] or pass --data-dir with train/dev/test .en/.de files"
        ) from e
    log.info("exporting WMT14 de-en from Hugging Face datasets into %s", out)
    ds = load_dataset("wmt14", "de-en")
    for split, hf_split in (("train", "train"), ("dev", "validation"), ("test", "test")):
        pairs = ds[hf_split]["translation"]
        for lang in ("en", "de"):
            _atomic_write_lines(out / f"{split}.{lang}", [p[lang] for p in pairs])
    return out


def resolve_corpus(
    name: str,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    src_lang: str = "en",
    tgt_lang: str = "de",
) -> Path:
    """Return a directory with ``{train,dev,test}.{src_lang,tgt_lang}`` files (plain or ``.gz``).

    ``synthetic`` is generated, ``multi30k`` is a local copy (``val`` accepted as dev, missing test ->
    dev with a warning) or downloaded, ``wmt14`` is a local copy or exported from ``datasets``, and
    ``files`` is ``data_dir`` as is.
    """
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    data_dir = Path(data_dir).expanduser() if data_dir is not None else None
    if name not in CORPORA:
        raise UserError(f"unknown corpus {name!r}; use --data with one of {', '.join(CORPORA)}")
    if name == "synthetic":
        _check_en_de(name, src_lang, tgt_lang)
        from aiayn.lightning_modules.synthetic import write_corpus  # lazy: only this corpus needs it

        return Path(write_corpus(cache_dir / "corpora" / "synthetic-seed1234", seed=1234))
    if name == "multi30k":
        _check_en_de(name, src_lang, tgt_lang)
        if data_dir is not None:
            return _link_multi30k_dir(data_dir, cache_dir, src_lang, tgt_lang)
        return _download_multi30k(cache_dir)
    if name == "wmt14" and data_dir is None:
        _check_en_de(name, src_lang, tgt_lang)
        return _export_wmt14(cache_dir)
    if data_dir is None:
        raise UserError(f"corpus {name} needs --data-dir pointing at a directory with train/dev/test files")
    _require_layout(data_dir, SPLITS, src_lang, tgt_lang)
    return data_dir


# --------------------------------------------------------------------------------------------------
# 3. SentencePiece
# --------------------------------------------------------------------------------------------------


def spm_cache_prefix(
    cache_dir: Path, corpus: str, corpus_dir: Path, src_lang: str, tgt_lang: str, vocab_size: int
) -> Path:
    """``cache_dir/spm/CORPUS-SRCTGT-vVOCAB-HASH`` where HASH is the train files' stat identity."""
    files = [find_split_file(corpus_dir, "train", lang) for lang in (src_lang, tgt_lang)]
    return Path(cache_dir) / "spm" / f"{corpus}-{src_lang}{tgt_lang}-v{vocab_size}-{_files_identity(files)}"


def _subsample(lines: list[str], n: int, seed: int) -> list[str]:
    # Our own seeded sample keeps the model reproducible independent of SentencePiece's RNG.
    if len(lines) <= n:
        return lines
    keep = np.sort(np.random.default_rng(seed).choice(len(lines), size=n, replace=False))
    return [lines[i] for i in keep]


def train_spm(
    train_src: Sequence[str],
    train_tgt: Sequence[str],
    vocab_size: int,
    model_prefix: str | Path,
    num_threads: int | None = None,
) -> Path:
    """Train (or reuse) a joint BPE model on source+target text; returns ``model_prefix.model``.

    Special ids: pad=0, unk=1, bos=2, eos=3. The result is cached at ``model_prefix``: an existing
    ``.model``+``.vocab`` pair is reused. Training happens under a temporary prefix and both files are
    moved into place with ``os.replace`` (``.vocab`` first, so ``.model`` marks completion).
    A corpus too small for ``vocab_size`` raises :class:`UserError`; we keep the hard vocabulary
    limit so every run reports the vocabulary it asked for.
    """
    import sentencepiece as spm

    prefix = Path(model_prefix)
    model, vocab = prefix.with_name(prefix.name + ".model"), prefix.with_name(prefix.name + ".vocab")
    if model.is_file() and vocab.is_file():
        log.info("reusing SentencePiece model %s", model)
        return model
    prefix.parent.mkdir(parents=True, exist_ok=True)
    text = _subsample([*train_src, *train_tgt], SPM_INPUT_SENTENCES, SPM_SEED)
    tmp_dir = Path(tempfile.mkdtemp(prefix=".spm-", dir=prefix.parent))
    tmp_prefix = tmp_dir / prefix.name
    spm.set_random_generator_seed(SPM_SEED)
    start = time.perf_counter()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(text), model_prefix=str(tmp_prefix), vocab_size=vocab_size,
            model_type="bpe", character_coverage=1.0, pad_id=PAD, unk_id=UNK, bos_id=BOS,
            eos_id=EOS, input_sentence_size=SPM_INPUT_SENTENCES, shuffle_input_sentence=True,
            num_threads=num_threads or min(os.cpu_count() or 1, 16), minloglevel=2,
        )  # fmt: skip
        os.replace(tmp_prefix.with_name(prefix.name + ".vocab"), vocab)
        os.replace(tmp_prefix.with_name(prefix.name + ".model"), model)
    except RuntimeError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"SentencePiece cannot build a {vocab_size}-piece vocabulary from this training text ({msg}); "
            "pass a smaller --vocab-size"
        ) from e
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    log.info("trained SentencePiece model %s in %.1fs", model, time.perf_counter() - start)
    return model


def load_spm(model_path: str | Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model_path))


# --------------------------------------------------------------------------------------------------
# 4. Encoded-data cache
# --------------------------------------------------------------------------------------------------


def _pack(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat int32 ids + int64 offsets (``offsets[i]:offsets[i+1]`` is sentence i): compact, fast to load."""
    lens = torch.tensor([len(x) for x in ids], dtype=torch.int64)
    offsets = torch.zeros(len(ids) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=offsets[1:])
    flat = torch.tensor([t for x in ids for t in x], dtype=torch.int32)
    return flat, offsets


def encoded_cache_path(cache_dir: Path, spm_model: Path, corpus_dir: Path, split: str, src: str, tgt: str) -> Path:
    """``cache_dir/encoded/SPMSTEM-SPLIT-HASH.pt``: keyed by the SPM model and the split files' identity.
    A model from outside the cache (a run's ``tokenizer.model``, ``--tokenizer``) is named by its
    content's hash instead, as its file name says nothing."""
    files = [find_split_file(corpus_dir, split, lang) for lang in (src, tgt)]
    spm_model = Path(spm_model)
    stem = spm_model.stem if spm_model.parent == Path(cache_dir) / "spm" else f"tok-{sha256_file(spm_model)[:16]}"
    return Path(cache_dir) / "encoded" / f"{stem}-{split}-{_files_identity(files)}.pt"


def encode_split(sp, corpus_dir: Path, split: str, src_lang: str, tgt_lang: str, out: Path) -> dict:
    """Encode one split with ``sp`` (cached at ``out``); returns {src,tgt: (flat, offsets)}."""
    if out.is_file():
        return torch.load(out, weights_only=True)
    src, tgt = read_parallel(corpus_dir, split, src_lang, tgt_lang)
    start = time.perf_counter()
    data = {"src": _pack(sp.encode(src)), "tgt": _pack(sp.encode(tgt))}
    atomic_torch_save(data, out)
    log.info("encoded %s (%d pairs) in %.1fs -> %s", split, len(src), time.perf_counter() - start, out)
    return data


class EncodedPairs(Dataset):
    """Sentence pairs as views into flat id tensors; ``keep`` maps dataset position -> split index."""

    def __init__(self, data: dict, keep: torch.Tensor, max_len: int | None = None) -> None:
        (self.src_flat, self.src_off), (self.tgt_flat, self.tgt_off) = data["src"], data["tgt"]
        self.keep = keep
        self.max_len = max_len  # truncation length for dev/test (None: no truncation)
        lens = lambda off: (off[1:] - off[:-1])[keep]
        self.src_lens = lens(self.src_off).clamp(max=max_len or 2**62).numpy()
        self.tgt_lens = lens(self.tgt_off).clamp(max=max_len or 2**62).numpy()

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        j = int(self.keep[i])
        src = self.src_flat[self.src_off[j] : self.src_off[j + 1]][: self.max_len]
        tgt = self.tgt_flat[self.tgt_off[j] : self.tgt_off[j + 1]][: self.max_len]
        return j, src, tgt


# --------------------------------------------------------------------------------------------------
# 5. Token-bucket batching
# --------------------------------------------------------------------------------------------------


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


def padding_stats(batches: Sequence[Sequence[int]], src_lens: Sequence[int], tgt_lens: Sequence[int]) -> float:
    """Fraction of padded positions over ``src`` plus ``tgt_in`` tensors of ``batches`` (0 = no waste)."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens) + 1
    real = padded = 0
    for b in batches:
        s, t = src_lens[b], tgt_lens[b]
        real += int(s.sum() + t.sum())
        padded += len(b) * int(s.max() + t.max())
    return 1.0 - real / padded if padded else 0.0


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
    so no optimizer step gets an incomplete accumulation window at the end of an epoch; otherwise the
    first ones are repeated up to a multiple of ``num_replicas``) and rank r takes batches
    ``r::num_replicas``: disjoint shares, same count on every rank.

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
        order = np.lexsort((tie, key))
        batches, start, real = [], 0, 0
        for pos, i in enumerate(order.tolist()):
            tgt = int(self.tgt_lens[i]) + 1  # + EOS
            longest = int(key[i])  # sorted ascending: the longest so far
            padded = (pos - start + 1) * longest
            if pos > start and (real + tgt > self.max_tokens or padded > PADDED_LIMIT * self.max_tokens):
                batches.append(order[start:pos].tolist())
                start, real = pos, 0
            real += tgt
        if start < len(order):
            batches.append(order[start:].tolist())
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _rank_share(self, batches: list[list[int]]) -> list[list[int]]:
        n = len(batches)
        if self.drop_uneven:
            batches = batches[: n - n % (self.num_replicas * self.accumulate)]
        elif n % self.num_replicas:
            batches = batches + batches[: self.num_replicas - n % self.num_replicas]
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


class ResumableDataLoader(DataLoader):
    """DataLoader whose ``state_dict`` is the batch sampler's position, counted in *consumed* batches.

    Lightning saves/restores ``state_dict``/``load_state_dict`` of the DataLoader object itself (it is
    ``_Stateful``), not of its batch sampler, so this class forwards. Counting here rather than in
    the sampler matters with workers: they pull indices from the sampler ahead of consumption.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._consumed = 0

    def __iter__(self):
        # Lazy: Lightning calls iter() before set_epoch() at the start of a fit, so the real iterator
        # (and the sampler's order) is created at the first next(), after set_epoch.
        return _CountingIter(self)

    def _start(self):
        sampler = self.batch_sampler
        self._consumed, self._epoch = sampler._skip, sampler.epoch  # _skip: consumed before a resume
        return super().__iter__()

    def state_dict(self) -> dict:
        return {"epoch": getattr(self, "_epoch", self.batch_sampler.epoch), "yielded": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state)
        self._consumed, self._epoch = int(state["yielded"]), int(state["epoch"])


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
# 6. Collation
# --------------------------------------------------------------------------------------------------


def collate(items: Sequence[tuple[int, torch.Tensor, torch.Tensor]]) -> dict:
    """Pad a list of ``(idx, src_ids, tgt_ids)`` into the batch dict the model consumes.

    ``src`` (B,S), ``tgt_in`` = [bos]+y and ``tgt_out`` = y+[eos] (B,T+1), all long and padded with 0;
    ``idx`` (B,) indexes the split (reference lookup for BLEU); ``n_*_tokens`` count non-pad positions.
    """
    # vectorized (one masked copy per tensor, not a loop over sentences): collation runs once per batch in
    # the training process, and at the tiny preset's batch sizes a per-sentence loop costs ~3% of a step
    b = len(items)
    src_len = torch.tensor([len(x[1]) for x in items], dtype=torch.long)
    tgt_len = torch.tensor([len(x[2]) for x in items], dtype=torch.long)
    s, t = max(int(src_len.max()), 1), int(tgt_len.max()) + 1
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
        "n_src_tokens": int(src_len.sum()),
        "n_tgt_tokens": int(tgt_len.sum()) + b,
    }


# --------------------------------------------------------------------------------------------------
# 7. DataModule
# --------------------------------------------------------------------------------------------------


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
        # Plain strings in hparams: Path objects would break weights_only checkpoint loading.
        data_dir = str(data_dir) if data_dir is not None else None
        cache_dir = str(cache_dir) if cache_dir is not None else None
        tokenizer = str(tokenizer) if tokenizer is not None else None
        self.save_hyperparameters()
        self.corpus, self.data_dir = corpus, data_dir
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.requested_vocab_size, self.max_tokens = vocab_size, max_tokens
        self.src_lang, self.tgt_lang, self.seed = src_lang, tgt_lang, seed
        self.dev_subset, self.max_len, self.num_workers = dev_subset, max_len, num_workers
        self.accumulate = accumulate
        self.train_pairs = train_pairs  # a data-limited regime: the first K training pairs (the tokenizer: all)
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
        corpus_dir = resolve_corpus(self.corpus, self.data_dir, self.cache_dir, self.src_lang, self.tgt_lang)
        if self.tokenizer is not None:
            self.tokenizer_model = self._check_tokenizer(self.tokenizer)
            return corpus_dir, self.tokenizer_model
        prefix = spm_cache_prefix(
            self.cache_dir, self.corpus, corpus_dir, self.src_lang, self.tgt_lang, self.requested_vocab_size
        )
        if not prefix.with_name(prefix.name + ".model").is_file():
            for split in ("dev", "test"):  # small: check them before minutes of tokenizer training
                read_parallel(corpus_dir, split, self.src_lang, self.tgt_lang)
            src, tgt = read_parallel(corpus_dir, "train", self.src_lang, self.tgt_lang)
            train_spm(src, tgt, self.requested_vocab_size, prefix)
        self.tokenizer_model = prefix.with_name(prefix.name + ".model")
        return corpus_dir, self.tokenizer_model

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
            return EncodedPairs(data, keep, max_len=self.max_len)
        src_len = data["src"][1][1:] - data["src"][1][:-1]
        tgt_len = data["tgt"][1][1:] - data["tgt"][1][:-1]
        ok = (src_len <= self.max_len) & (tgt_len <= self.max_len) & (src_len > 0) & (tgt_len > 0)
        dropped = n - int(ok.sum())
        if dropped:
            log.info("dropped %d of %d train pairs (empty or longer than %d tokens)", dropped, n, self.max_len)
        return EncodedPairs(data, keep[ok])

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
            corpus_dir = self._corpus_dir or resolve_corpus(
                self.corpus, self.data_dir, self.cache_dir, self.src_lang, self.tgt_lang
            )
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
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> ResumableDataLoader:
        return self._loader("train")

    def val_dataloader(self) -> ResumableDataLoader:
        return self._loader("dev")

    def test_dataloader(self) -> ResumableDataLoader:
        return self._loader("test")

    def padding_fraction(self, split: str = "train") -> float:
        """Padding waste of the current epoch's batches of ``split`` (all ranks together)."""
        s = self._samplers[split]
        return padding_stats(s.all_batches(), s.src_lens, s.tgt_lens)
