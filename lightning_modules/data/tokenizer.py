"""The joint SentencePiece BPE model (§5.1: one vocabulary shared by source and target) and a corpus encoded
with it, both cached on disk under the cache directory and written atomically, so reruns and racing processes are
cheap and harmless (the loser of a race overwrites an identical file).

- `train_spm` trains one BPE model on the source and target training text (pad=0 unk=1 bos=2 eos=3), keyed by the
  corpus's identity and the vocabulary size (`spm_cache_prefix`).
- `encode_split` encodes each split once into a `.pt` file (flat int32 ids + offsets), a slice of sentences at a
  time; `EncodedPairs` is the dataset of sentence pairs over it.

A corpus is a directory of files or a Hugging Face dataset (lightning_modules/data/corpora.py); both are read as
sequences of sentences (`corpora.parallel_text`), a dataset's from its Arrow files in slices, never copied.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_torch_save, sha256_file
from aiayn.lightning_modules.data.corpora import CorpusRef, parallel_text, split_identity
from aiayn.lightning_modules.transformer.config import BOS, EOS, PAD, UNK

log = logging.getLogger(__name__)

SPM_INPUT_SENTENCES = 2_000_000
SPM_SEED = 1234
ENCODE_SLICE = 100_000  # sentences encoded at once (a Hugging Face split is read a slice at a time)


def spm_cache_prefix(
    cache_dir: Path, corpus: CorpusRef, corpus_dir, src_lang: str, tgt_lang: str, vocab_size: int
) -> Path:
    """``cache_dir/spm/CORPUS-SRCTGT-vVOCAB-HASH`` where HASH is the train split's identity (its files' stat, or its
    Arrow files' for a Hugging Face dataset)."""
    train = split_identity(corpus_dir, "train", src_lang, tgt_lang)
    return Path(cache_dir) / "spm" / f"{corpus.dirname}-{src_lang}{tgt_lang}-v{vocab_size}-{train}"


def _take(lines: Sequence[str], rows) -> list[str]:
    """`lines[i] for i in rows`; a Hugging Face split reads them in one pass (corpora.parallel_text)."""
    take = getattr(lines, "take", None)
    return take(rows) if take is not None else [lines[i] for i in rows]


def _subsample(src: Sequence[str], tgt: Sequence[str], n: int, seed: int):
    """`n` sentences of source and target text together (all of it when it has no more), in corpus order.
    Our own seeded sample keeps the model reproducible independent of SentencePiece's RNG; it picks positions in
    the source sentences followed by the target ones, without joining them (a large corpus is not held twice)."""
    total = len(src) + len(tgt)
    if total <= n:
        return itertools.chain(src, tgt)
    keep = np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False))
    cut = int(np.searchsorted(keep, len(src)))
    return _take(src, keep[:cut]) + _take(tgt, keep[cut:] - len(src))


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
    text = _subsample(train_src, train_tgt, SPM_INPUT_SENTENCES, SPM_SEED)
    tmp_dir = Path(tempfile.mkdtemp(prefix=".spm-", dir=prefix.parent))
    tmp_prefix = tmp_dir / prefix.name
    spm.set_random_generator_seed(SPM_SEED)
    start = time.perf_counter()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(text),
            model_prefix=str(tmp_prefix),
            vocab_size=vocab_size,
            model_type="bpe",
            character_coverage=1.0,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            input_sentence_size=SPM_INPUT_SENTENCES,
            shuffle_input_sentence=True,
            num_threads=num_threads or min(os.cpu_count() or 1, 16),
            minloglevel=2,
        )
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


def segmentation_sha256(model_path: str | Path) -> str:
    """A fingerprint of how a SentencePiece model segments: every piece with its id, score and kind (unknown,
    control, unused, byte, normal), in id order. The model file's own bytes also hold the options it was trained
    with, among them a temporary path, so two trainings that segment alike differ there; this does not."""
    import hashlib

    try:
        sp = load_spm(model_path)
    except Exception as e:  # SentencePiece raises OSError or RuntimeError on a file of another kind
        raise UserError(
            f"tokenizer {model_path} is not a SentencePiece model ({type(e).__name__}); pass a .model file"
        ) from None
    h = hashlib.sha256()
    for i in range(sp.get_piece_size()):
        kind = (
            "u"
            if sp.is_unknown(i)
            else "c"
            if sp.is_control(i)
            else "x"
            if sp.is_unused(i)
            else "b"
            if sp.is_byte(i)
            else "n"
        )
        h.update(f"{sp.id_to_piece(i)}\t{sp.get_score(i)!r}\t{kind}\n".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# The encoded-data cache
# --------------------------------------------------------------------------------------------------


def _pack(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat int32 ids + int64 offsets (``offsets[i]:offsets[i+1]`` is sentence i): compact, fast to load."""
    lens = torch.tensor([len(x) for x in ids], dtype=torch.int64)
    offsets = torch.zeros(len(ids) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=offsets[1:])
    flat = torch.tensor([t for x in ids for t in x], dtype=torch.int32)
    return flat, offsets


def encoded_cache_path(cache_dir: Path, spm_model: Path, corpus_dir, split: str, src: str, tgt: str) -> Path:
    """``cache_dir/encoded/SPMSTEM-SPLIT-HASH.pt``: keyed by the SPM model and the split's identity (its files', or
    its Arrow files'). A model from outside the cache (a run's ``tokenizer.model``, ``--tokenizer``) is named by its
    content's hash instead, as its file name says nothing."""
    spm_model = Path(spm_model)
    stem = spm_model.stem if spm_model.parent == Path(cache_dir) / "spm" else f"tok-{sha256_file(spm_model)[:16]}"
    return Path(cache_dir) / "encoded" / f"{stem}-{split}-{split_identity(corpus_dir, split, src, tgt)}.pt"


def _encode(sp, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """`_pack(sp.encode(sentences))`, a slice at a time: the ids of a whole WMT14 as Python lists would take GBs."""
    flats, lens = [], []
    for start in range(0, len(sentences), ENCODE_SLICE):
        ids = sp.encode(list(sentences[start : start + ENCODE_SLICE]))
        flat, offsets = _pack(ids)
        flats.append(flat)
        lens.append(offsets[1:] - offsets[:-1])
    if not flats:
        return _pack([])
    lengths = torch.cat(lens)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return torch.cat(flats), offsets


def encode_split(sp, corpus_dir, split: str, src_lang: str, tgt_lang: str, out: Path) -> dict:
    """Encode one split with ``sp`` (cached at ``out``); returns {src,tgt: (flat, offsets)}."""
    if out.is_file():
        cached = _read_encoded(out)
        if cached is not None:
            return cached
    src, tgt = parallel_text(corpus_dir, split, src_lang, tgt_lang)
    start = time.perf_counter()
    data = {"src": _encode(sp, src), "tgt": _encode(sp, tgt)}
    atomic_torch_save(data, out)
    log.info("encoded %s (%d pairs) in %.1fs -> %s", split, len(src), time.perf_counter() - start, out)
    return data


def _read_encoded(path: Path) -> dict | None:
    """A cached encoding, or None (with a warning) where the file is not one: a cache is derived data, so a garbled
    entry (a crash mid-copy, a disk error, another program's file) is encoded again, not a traceback."""
    try:
        data = torch.load(path, weights_only=True)
    except Exception as e:  # UnpicklingError, a truncated zip's RuntimeError, EOFError, ...
        why = type(e).__name__
    else:
        pairs = [data.get(side) for side in ("src", "tgt")] if isinstance(data, dict) else [None]
        if all(
            isinstance(p, tuple | list) and len(p) == 2 and all(isinstance(t, torch.Tensor) for t in p) for p in pairs
        ):
            return data
        why = "not an encoded split"
    log.warning("cached encoding %s is unreadable (%s); encoding the split again", path, why)
    return None


class EncodedPairs(Dataset):
    """Sentence pairs as views into flat id tensors; ``keep`` maps dataset position -> split index.

    ``source_eos``: each source ends with ``</s>`` (EOS), as tensor2tensor, fairseq and Marian feed their encoders
    and as MarianTokenizer encodes every source (the paper's models; `--source-eos`); the length of a source counts
    it. Without it (older aiayn's runs, which record none), the source is its pieces alone."""

    def __init__(self, data: dict, keep: torch.Tensor, max_len: int | None = None, source_eos: bool = False) -> None:
        (self.src_flat, src_off), (self.tgt_flat, tgt_off) = data["src"], data["tgt"]
        # positions as numpy integers: a lookup reads no tensor (at every item, for every batch)
        self.keep, self.src_off, self.tgt_off = keep.numpy(), src_off.numpy(), tgt_off.numpy()
        self.max_len = max_len  # truncation length for dev/test (None: no truncation)
        self.source_eos = source_eos
        lens = lambda off: (off[1:] - off[:-1])[keep]
        self.src_lens = lens(src_off).clamp(max=max_len or 2**62).numpy() + int(source_eos)
        self.tgt_lens = lens(tgt_off).clamp(max=max_len or 2**62).numpy()

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        j = int(self.keep[i])
        src = self.src_flat[self.src_off[j] : self.src_off[j + 1]][: self.max_len]
        tgt = self.tgt_flat[self.tgt_off[j] : self.tgt_off[j + 1]][: self.max_len]
        if self.source_eos:
            src = torch.cat([src, src.new_tensor([EOS])])
        return j, src, tgt
