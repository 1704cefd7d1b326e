"""Corpora: parallel text as `{train,dev,test}.{SRC,TGT}` files (plain or `.gz`) or a Hugging Face dataset, from a
registry of kinds.

`CorpusRef.parse(name)` is `--data` parsed once, the value every layer carries; `resolve_corpus(ref, ...)` gives the
corpus: the built-in synthetic corpus (generated), Multi30k (a local copy, or downloaded), WMT14 En-De (a local copy,
or the Hub's wmt/wmt14 de-en), the user's `files`, or any Hugging Face dataset, `hf:NAME[:CONFIG]`
(lightning_modules/data/hf_corpus.py). What it gives is a directory of files (a `Path`) or a dataset read where
`datasets` keeps it (an `HFText`); `read_parallel`, `parallel_text` and `split_identity` read either. Each kind is a
`Corpus` in `CORPORA`; a new corpus is one class and one line there.
Every problem with a user's files is a one-line UserError naming the file and the fix.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_open, atomic_symlink
from aiayn.common.names import check_name
from aiayn.common.text import NotUTF8, utf8_lines
from aiayn.lightning_modules.data.hf_corpus import PREFIX, HFRef, HFText, is_hf, open_dataset, parse_splits

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"
# Our split name -> file stem in the multi30k GitHub repository.
MULTI30K_REMOTE = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
CACHE_VERSION = "1"  # bump to invalidate every SPM / encoded cache after a format change


def default_cache_dir() -> Path:
    """``$AIAYN_CACHE`` if set, else ``$XDG_CACHE_HOME/aiayn`` (the XDG base directory convention; a relative
    XDG_CACHE_HOME is ignored, as the convention says), else ``~/.cache/aiayn``."""
    if os.environ.get("AIAYN_CACHE"):
        return Path(os.environ["AIAYN_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "aiayn"
    return Path("~/.cache/aiayn").expanduser()


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
    h = hashlib.sha1(CACHE_VERSION.encode())
    for p in paths:
        st = os.stat(p)
        h.update(f"{Path(p).name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:12]


# --------------------------------------------------------------------------------------------------
# Reading parallel text
# --------------------------------------------------------------------------------------------------


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path} ({e}); check the file or pass --data-dir with valid files") from e
    try:
        out = utf8_lines(raw)
    except NotUTF8 as e:
        raise UserError(
            f"{path} line {e.line} is not valid UTF-8 ({e.reason}); re-encode the file as UTF-8 (e.g. iconv -t utf-8)"
        ) from None
    if not out:
        raise UserError(f"{path} is empty; provide a non-empty file with one sentence per line")
    if not any(line.strip() for line in out):  # a dev set of blank lines scored BLEU 0 over empty references
        raise UserError(
            f"{path} holds {len(out)} blank line(s) and no sentence; provide a file with one sentence per line"
        )
    return out


def read_parallel(
    data_dir: str | Path | HFText, split: str, src_lang: str = "en", tgt_lang: str = "de"
) -> tuple[list[str], list[str]]:
    """Read ``SPLIT.SRC`` / ``SPLIT.TGT`` (plain or ``.gz``) from ``data_dir``; one sentence per line (or the
    split of a Hugging Face dataset, whole).

    Only line terminators are stripped. Every problem is a one-line :class:`UserError`.
    """
    if isinstance(data_dir, HFText):
        src, tgt = data_dir.pair(split, src_lang, tgt_lang)
        return list(src), list(tgt)
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


def parallel_text(corpus: str | Path | HFText, split: str, src_lang: str, tgt_lang: str) -> tuple[Sequence, Sequence]:
    """The sentences of a split as sequences: lists for files, a dataset's Arrow files read in slices (never a copy
    of the text) for a Hugging Face dataset. Training the tokenizer and encoding read them this way."""
    if isinstance(corpus, HFText):
        return corpus.pair(split, src_lang, tgt_lang)
    return read_parallel(corpus, split, src_lang, tgt_lang)


def split_identity(corpus: str | Path | HFText, split: str, src_lang: str, tgt_lang: str) -> str:
    """A cheap identity of a split's text, for the tokenizer's and the encoded cache's keys."""
    if isinstance(corpus, HFText):
        return corpus.identity(split, src_lang, tgt_lang)
    return _files_identity([find_split_file(Path(corpus), split, lang) for lang in (src_lang, tgt_lang)])


# --------------------------------------------------------------------------------------------------
# The corpora
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


WMT14_HF = HFRef("wmt/wmt14", "de-en")  # the Hub's WMT14: newstest2013 is its validation split, 2014 its test


def _wmt14_from_the_hub(cache_dir: Path, src_lang: str, tgt_lang: str) -> HFText:
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise UserError(
            "corpus wmt14 without --data-dir needs the Hugging Face datasets package; pip install "
            "'aiayn[datasets]' or pass --data-dir with train/dev/test .en/.de files"
        ) from None
    old = cache_dir / "corpora" / "wmt14-de-en"
    if old.is_dir():
        log.info(
            "%s holds the text files an earlier aiayn exported WMT14 to; they are no longer read (the Hugging "
            "Face cache is): delete it to free the space",
            old,
        )
    return open_dataset(WMT14_HF, cache_dir, src_lang, tgt_lang)


class Corpus(ABC):
    """A kind of corpus: where its `{train,dev,test}.{SRC,TGT}` files are (made, downloaded or linked if need be), or
    the Hugging Face dataset it is read from."""

    name: ClassVar[str]
    en_de: ClassVar[bool] = True  # English-German only (either direction)

    def directory(self, data_dir: Path | None, cache_dir: Path, src_lang: str, tgt_lang: str) -> Path | HFText:
        if self.en_de:
            _check_en_de(self.name, src_lang, tgt_lang)
        return self.find(data_dir, cache_dir, src_lang, tgt_lang)

    @abstractmethod
    def find(self, data_dir: Path | None, cache_dir: Path, src_lang: str, tgt_lang: str) -> Path | HFText: ...


class Synthetic(Corpus):
    """The built-in English -> German-like corpus (lightning_modules/data/synthetic.py), generated once into the cache:
    `synthetic`, sentences of 5-10 words; `synthetic-20` and `synthetic-40`, the same grammar and lexicon with
    sentences of 5-20 and 5-40 words (more clauses, so more dependencies per sentence and longer ones)."""

    name = "synthetic"

    def __init__(self, max_words: int | None = None):
        self.max_words = max_words  # None: the generator's default (synthetic.MAX_WORDS)
        if max_words is not None:
            self.name = f"synthetic-{max_words}"

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path:
        from aiayn.lightning_modules.data import synthetic  # lazy: only this corpus needs it

        words = self.max_words or synthetic.MAX_WORDS
        suffix = "" if self.max_words is None else f"-w{words}"
        return Path(
            synthetic.write_corpus(cache_dir / "corpora" / f"synthetic-seed1234{suffix}", seed=1234, max_words=words)
        )


class Multi30k(Corpus):
    """Multi30k En-De: a local copy (`val` accepted as dev, a missing test -> dev with a warning), or downloaded."""

    name = "multi30k"

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path:
        if data_dir is not None:
            return _link_multi30k_dir(data_dir, cache_dir, src_lang, tgt_lang)
        return _download_multi30k(cache_dir)


class WMT14(Corpus):
    """WMT14 En-De, the paper's: a local copy, or the Hub's wmt/wmt14 de-en read in place (hf:wmt/wmt14:de-en with
    the corpus name wmt14, so that its run directories stay where they were)."""

    name = "wmt14"

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path | HFText:
        if data_dir is None:
            return _wmt14_from_the_hub(cache_dir, src_lang, tgt_lang)
        _require_layout(data_dir, SPLITS, src_lang, tgt_lang)
        return data_dir


class Files(Corpus):
    """The user's own files, in `--data-dir`, any languages."""

    name = "files"
    en_de = False

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path:
        if data_dir is None:
            raise UserError(f"corpus {self.name} needs --data-dir pointing at a directory with train/dev/test files")
        _require_layout(data_dir, SPLITS, src_lang, tgt_lang)
        return data_dir


CORPORA: dict[str, Corpus] = {
    c.name: c for c in (Synthetic(), Synthetic(max_words=20), Synthetic(max_words=40), Multi30k(), WMT14(), Files())
}


HF_CORPUS = "hf:NAME[:CONFIG] (a Hugging Face dataset)"
COMPLETIONS = (*CORPORA, PREFIX)  # what --data completes to in a shell
HUB_DATASETS = {"wmt14": "wmt/wmt14", "multi30k": "bentrevett/multi30k"}  # our corpus names -> the Hub's
FOUND = "found"  # CorpusRef.source of a recorded corpus this aiayn does not know (CorpusRef.recorded)


@dataclass(frozen=True)
class CorpusRef:
    """A corpus as every layer carries it, parsed once (`CorpusRef.parse(--data, --hf-splits)`): `name` as runs
    record it (a built-in name, or hf:NAME[:CONFIG] with a local NAME made absolute: a run is the same from any
    directory), `dirname` its one path component (run directories, sweep keys, cache files: hf:wmt/wmt14:de-en is
    hf-wmt--wmt14-de-en), `source` the kind that reads it (a CORPORA name, or "hf"), `splits` --hf-splits (a Hugging
    Face dataset's only). `str()` is the name, as records and messages spell it."""

    name: str
    dirname: str
    source: str
    splits: str | None = None

    @classmethod
    def parse(cls, text: str, splits: str | None = None) -> CorpusRef:
        """`--data` (and `--hf-splits`) as a corpus; an unknown name, a name that is not one safe path component (a
        config with a slash, a record's "../.."), or splits for a corpus of files: a one-line UserError."""
        if is_hf(text):
            ref = HFRef.parse(text)
            parse_splits(splits)
            return cls(str(ref), check_name("corpus", ref.dirname()), "hf", splits)
        if text not in CORPORA:
            raise UserError(f"unknown corpus {text!r}; use --data with one of {', '.join(CORPORA)}, or {HF_CORPUS}")
        if splits is not None:
            raise UserError(f"--hf-splits is for --data hf:NAME, not corpus {text}; drop --hf-splits")
        return cls(text, check_name("corpus", text), text)

    @classmethod
    def recorded(cls, name: str, splits: str | None = None) -> CorpusRef:
        """A corpus as a record or a folder names it: parsed, or, where this aiayn does not know the name (a Hugging
        Face dataset's folder name, which does not give back its name; a corpus since removed), standing for
        itself (a run of it is still read and reported; training on it says to pass --data); a name that is not one
        safe path component is still a UserError."""
        try:
            return cls.parse(name, splits)
        except UserError:
            return cls(name, check_name("corpus", name), FOUND)

    def __str__(self) -> str:
        return self.name

    def with_splits(self, splits: str | None) -> CorpusRef:
        """The same corpus read by other --hf-splits (checked as `parse` checks them)."""
        return CorpusRef.parse(self.name, splits) if self.source != FOUND else self

    @property
    def is_hf(self) -> bool:
        return self.source == "hf"

    @property
    def hub_dataset(self) -> str | None:
        """The Hub's id of this corpus (a model card's `datasets`): the Hub's copy of a built-in one, or the dataset
        hf:NAME names; None for a local dataset and the corpora the Hub does not hold."""
        if self.is_hf:
            ref = HFRef.parse(self.name)
            return None if ref.local else ref.name
        return HUB_DATASETS.get(self.name)

    def check_data_dir(self, data_dir: str | Path | None) -> None:
        """--data-dir is for corpora of files: with a Hugging Face dataset it is refused before any work."""
        if self.is_hf and data_dir is not None:
            raise UserError(
                f"--data-dir is for corpora of files; --data {self} names its dataset (a local one as "
                f"hf:/path/to/it): drop --data-dir"
            )


def resolve_corpus(
    corpus: CorpusRef,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    src_lang: str = "en",
    tgt_lang: str = "de",
) -> Path | HFText:
    """The corpus: a directory with `{train,dev,test}.{src_lang,tgt_lang}` files (plain or `.gz`), or, for
    hf:NAME[:CONFIG] and wmt14 without `data_dir`, a Hugging Face dataset (read by `corpus.splits`)."""
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    data_dir = Path(data_dir).expanduser() if data_dir is not None else None
    corpus.check_data_dir(data_dir)
    if corpus.is_hf:
        return open_dataset(HFRef.parse(corpus.name), cache_dir, src_lang, tgt_lang, corpus.splits)
    if corpus.source not in CORPORA:
        raise UserError(
            f"corpus {corpus} is not one this aiayn knows; pass --data with one of {', '.join(CORPORA)}, or {HF_CORPUS}"
        )
    return CORPORA[corpus.source].directory(data_dir, cache_dir, src_lang, tgt_lang)
