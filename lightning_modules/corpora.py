"""Corpora: parallel text on disk as `{train,dev,test}.{SRC,TGT}` (plain or `.gz`), from a registry of kinds.

`resolve_corpus(name, ...)` gives the directory of a corpus by name (`--data`): the built-in synthetic corpus
(generated), Multi30k (a local copy, or downloaded), WMT14 En-De (a local copy, or exported from Hugging Face
`datasets`), or the user's `files`. Each kind is a `Corpus` in `CORPORA`; a new corpus is one class and one line
there. Every problem with a user's files is a one-line UserError naming the file and the fix.
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
from pathlib import Path
from typing import ClassVar

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_open, atomic_symlink

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


class Corpus(ABC):
    """A kind of corpus: where its `{train,dev,test}.{SRC,TGT}` files are (made, downloaded or linked if need be)."""

    name: ClassVar[str]
    en_de: ClassVar[bool] = True  # English-German only (either direction)

    def directory(self, data_dir: Path | None, cache_dir: Path, src_lang: str, tgt_lang: str) -> Path:
        if self.en_de:
            _check_en_de(self.name, src_lang, tgt_lang)
        return self.find(data_dir, cache_dir, src_lang, tgt_lang)

    @abstractmethod
    def find(self, data_dir: Path | None, cache_dir: Path, src_lang: str, tgt_lang: str) -> Path: ...


class Synthetic(Corpus):
    """The built-in English -> German-like corpus (lightning_modules/synthetic.py), generated once into the cache."""

    name = "synthetic"

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path:
        from aiayn.lightning_modules.synthetic import write_corpus  # lazy: only this corpus needs it

        return Path(write_corpus(cache_dir / "corpora" / "synthetic-seed1234", seed=1234))


class Multi30k(Corpus):
    """Multi30k En-De: a local copy (`val` accepted as dev, a missing test -> dev with a warning), or downloaded."""

    name = "multi30k"

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path:
        if data_dir is not None:
            return _link_multi30k_dir(data_dir, cache_dir, src_lang, tgt_lang)
        return _download_multi30k(cache_dir)


class WMT14(Corpus):
    """WMT14 En-De, the paper's: a local copy, or exported from Hugging Face `datasets`."""

    name = "wmt14"

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path:
        if data_dir is None:
            return _export_wmt14(cache_dir)
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


CORPORA: dict[str, Corpus] = {c.name: c for c in (Synthetic(), Multi30k(), WMT14(), Files())}


def resolve_corpus(
    name: str,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    src_lang: str = "en",
    tgt_lang: str = "de",
) -> Path:
    """A directory with `{train,dev,test}.{src_lang,tgt_lang}` files (plain or `.gz`) of the corpus `name`."""
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    data_dir = Path(data_dir).expanduser() if data_dir is not None else None
    if name not in CORPORA:
        raise UserError(f"unknown corpus {name!r}; use --data with one of {', '.join(CORPORA)}")
    return CORPORA[name].directory(data_dir, cache_dir, src_lang, tgt_lang)
