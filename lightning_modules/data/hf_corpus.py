"""A Hugging Face dataset as a corpus (`--data hf:NAME[:CONFIG]`), read where `datasets` keeps it: no text is
copied into aiayn's cache.

NAME is a dataset on the Hugging Face Hub (`hf:wmt/wmt14:de-en`, `hf:wmt/wmt16:de-en`), or one on this machine when
it starts with `/`, `./`, `../` or `~`: a DatasetDict saved with `save_to_disk`, or a directory of data files
(parquet, json, csv) that `datasets.load_dataset` reads. A name cannot hold a colon (the one before CONFIG).

Its splits become ours (train, dev, test) by name: train, then validation (or dev, or valid), then test, unless
`--hf-splits train=…,dev=…,test=…` says otherwise. Each sentence pair is either a `translation` column of
{language: text} (the layout of the Hub's WMT datasets) or two columns named by the languages; `--src-lang` and
`--tgt-lang` pick them.

How it is read without a second copy: `datasets` keeps a dataset as memory-mapped Arrow files in its own cache (or,
for a saved one, in its directory); `ArrowText` reads one language of a split from them in slices, when the
tokenizer is trained (a seeded sample of rows, taken by index) and when the split is encoded to ids (aiayn's
encoded cache: token ids, not text). For a Hub dataset aiayn's cache keeps only a pointer, `hf/NAME.json`, naming
the Arrow files `datasets` made, so that later runs open them directly: with no network and no Hub lookup (which
`load_dataset` makes on every call, and which without a network retries for half a minute before it gives up).
The pointer is dropped when a file it names is gone. Newlines inside a sentence become spaces, as when the text
was exported to files (dev.hyp/dev.ref are one sentence per line).

Nothing here imports `datasets`, pyarrow or torch at import time.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json, read_json

log = logging.getLogger(__name__)

PREFIX = "hf:"
OURS = ("train", "dev", "test")
DEFAULT_SPLITS = {"train": ("train",), "dev": ("validation", "dev", "valid"), "test": ("test",)}
IDENTITY_VERSION = "1"  # bump to invalidate the tokenizers and encodings made from Hugging Face datasets
SLICE = 100_000  # rows read at once


def is_hf(name: str | None) -> bool:
    return bool(name) and name.startswith(PREFIX)


@dataclass(frozen=True)
class HFRef:
    """What `--data hf:NAME[:CONFIG]` names; a local NAME is kept as an absolute path (the run's identity)."""

    name: str
    config: str | None = None

    @classmethod
    def parse(cls, text: str) -> HFRef:
        name, _, config = text[len(PREFIX) :].partition(":")
        if not name:
            raise UserError(
                f"--data {text} names no dataset; pass --data hf:NAME[:CONFIG] (e.g. hf:wmt/wmt14:de-en) "
                f"or hf:/path/to/a/dataset saved with save_to_disk"
            )
        if _is_path(name):
            name = str(Path(name).expanduser().resolve())
        return cls(name, config or None)

    @property
    def local(self) -> bool:
        return _is_path(self.name)

    def __str__(self) -> str:
        return PREFIX + self.name + (f":{self.config}" if self.config else "")

    def dirname(self) -> str:
        """One path component (run directories, cache files): hf-ORG--NAME[-CONFIG], as the Hub's own cache names
        datasets; a local dataset by its directory's name and a hash of its path."""
        if self.local:
            base = f"local-{Path(self.name).name}-{hashlib.sha1(self.name.encode()).hexdigest()[:8]}"
        else:
            base = self.name.replace("/", "--")
        return "hf-" + base + (f"-{self.config}" if self.config else "")


def _is_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..")


def parse_splits(text: str | None) -> dict[str, str]:
    """`--hf-splits train=train,dev=validation,test=test` as {ours: theirs} (only the ones given)."""
    out = {}
    for item in text.split(",") if text else ():
        ours, eq, theirs = item.strip().partition("=")
        if not eq or not theirs.strip() or ours.strip() not in OURS:
            raise UserError(
                f"--hf-splits {text!r}: expected OURS=THEIRS for OURS in train, dev, test, "
                f"comma-separated; e.g. --hf-splits train=train,dev=validation,test=test"
            )
        out[ours.strip()] = theirs.strip()
    return out


def _datasets():
    try:
        import datasets
    except ImportError:
        raise UserError(
            "--data hf:… needs the Hugging Face datasets package, which is not installed; pip install 'aiayn[datasets]'"
        ) from None
    return datasets


class ArrowText(Sequence):
    """One language of one split, read from the dataset's Arrow files in slices of rows (`take`: rows by index)."""

    def __init__(self, dataset, column: str, field: str | None, where: str) -> None:
        self.dataset = dataset.with_format("arrow")  # rows as pyarrow tables: no Python objects per row
        self.column, self.field, self.where = column, field, where

    def __len__(self) -> int:
        return self.dataset.num_rows

    def _strings(self, table, first: int) -> list[str]:
        import pyarrow.compute as pc

        values = table.column(self.column)
        if self.field is not None:
            values = pc.struct_field(values, self.field)
        out = values.to_pylist()
        if None in out:
            row = first + out.index(None)
            raise UserError(
                f"{self.where} row {row} has no {self.field or self.column!r} text; fix the dataset or "
                f"pass --hf-splits naming other splits"
            )
        return [s.replace("\n", " ") for s in out]

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return self._strings(self.dataset[start:stop], start)
        i = range(len(self))[i]  # IndexError as a list's
        return self._strings(self.dataset[i : i + 1], i)[0]

    def take(self, rows: Sequence[int]) -> list[str]:
        """The sentences of `rows`, in that order, read in one pass over the files."""
        return self._strings(self.dataset[[int(r) for r in rows]], 0) if len(rows) else []

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), SLICE):
            yield from self[start : start + SLICE]


@dataclass
class HFText:
    """A Hugging Face dataset's splits, as our train, dev and test (see the module docstring)."""

    ref: HFRef
    splits: dict  # ours -> (their split's name, its Dataset)
    columns: dict  # language -> (column, field or None)

    def text(self, split: str, lang: str) -> ArrowText:
        theirs, dataset = self.splits[split]
        column, field = self.columns[lang]
        return ArrowText(dataset, column, field, f"Hugging Face dataset {self.ref} split {theirs!r}")

    def pair(self, split: str, src_lang: str, tgt_lang: str) -> tuple[ArrowText, ArrowText]:
        for lang in (src_lang, tgt_lang):
            if lang not in self.columns:
                raise UserError(
                    f"Hugging Face dataset {self.ref} has no {lang!r} text (its languages: "
                    f"{', '.join(self.columns)}); pass --src-lang/--tgt-lang among them"
                )
        src, tgt = self.text(split, src_lang), self.text(split, tgt_lang)
        if not len(src):
            raise UserError(f"{src.where} is empty; pass --hf-splits naming a split with sentence pairs")
        return src, tgt

    def identity(self, split: str, src_lang: str, tgt_lang: str) -> str:
        """A cheap content identity of one split (cache keys): the name, size and mtime of each of its Arrow
        files, as for a corpus of files; a dataset without files (held in memory) by its fingerprint."""
        theirs, dataset = self.splits[split]
        h = hashlib.sha1(
            f"{IDENTITY_VERSION}:{self.ref}:{theirs}:{self.columns[src_lang]}:{self.columns[tgt_lang]};".encode()
        )
        files = [f["filename"] for f in dataset.cache_files]
        for name in files:
            st = os.stat(name)
            h.update(f"{Path(name).name}:{st.st_size}:{st.st_mtime_ns};".encode())
        if not files:
            h.update(f"{getattr(dataset, '_fingerprint', '')}:{dataset.num_rows}".encode())
        return h.hexdigest()[:12]


def open_dataset(ref: HFRef, cache_dir: Path, src_lang: str, tgt_lang: str, splits: str | None = None) -> HFText:
    """The dataset `ref` names, its splits mapped to ours and its language columns found; every problem (no such
    dataset here and no network, a missing split or language) is a one-line UserError with the fix."""
    given = parse_splits(splits)
    found = _load(ref, cache_dir)
    mapped = {}
    for ours in OURS:
        wanted = (given[ours],) if ours in given else DEFAULT_SPLITS[ours]
        theirs = next((name for name in wanted if name in found), None)
        if theirs is None:
            raise UserError(
                f"Hugging Face dataset {ref} has no split {' or '.join(map(repr, wanted))} for our {ours} "
                f"split (its splits: {', '.join(found)}); pass --hf-splits "
                f"{ours}=ONE_OF_THEM"
            )
        mapped[ours] = (theirs, found[theirs])
    return HFText(ref, mapped, _columns(ref, mapped["train"][1], src_lang, tgt_lang))


def _columns(ref: HFRef, dataset, src_lang: str, tgt_lang: str) -> dict:
    """language -> (column, field): the fields of a `translation` column, or columns named by language."""
    features = dataset.features
    translation = features.get("translation")
    if translation is not None:
        langs = getattr(translation, "languages", None) or (list(translation) if isinstance(translation, dict) else [])
        columns = {lang: ("translation", lang) for lang in langs}
    else:
        columns = {name: (name, None) for name in features if name in (src_lang, tgt_lang)}
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in columns]
    if missing:
        have = (
            f"its languages: {', '.join(columns)}" if translation is not None else f"its columns: {', '.join(features)}"
        )
        raise UserError(
            f"Hugging Face dataset {ref} has no {missing[0]!r} text ({have}); pass --src-lang/--tgt-lang "
            f"among them, or use a dataset with a translation column"
        )
    return columns


def _load(ref: HFRef, cache_dir: Path) -> dict:
    """{their split name: Dataset}."""
    datasets = _datasets()
    if ref.local:
        return _load_local(ref, datasets)
    pointer = Path(cache_dir) / "hf" / f"{ref.dirname()}.json"
    found = _from_pointer(pointer, datasets)
    if found is not None:
        return found
    try:
        loaded = datasets.load_dataset(ref.name, ref.config)
    except Exception as e:  # no network and not cached, no such dataset or config: the library's own words
        why = " ".join(str(e).split())[:300] or type(e).__name__
        config = f" (config {ref.config})" if ref.config else ""
        raise UserError(
            f"Hugging Face dataset {ref.name}{config} cannot be loaded ({type(e).__name__}: {why}); check "
            f"the name and config on the Hub, and download it once where there is network (it stays in "
            f"the Hugging Face cache; HF_HUB_OFFLINE=1 then skips the network), or pass --data "
            f"hf:/path/to/a/copy saved with save_to_disk"
        ) from None
    files = {split: [f["filename"] for f in ds.cache_files] for split, ds in loaded.items()}
    if all(files.values()):
        atomic_write_json(pointer, {"dataset": str(ref), "splits": files})
    return dict(loaded)


def _from_pointer(pointer: Path, datasets) -> dict | None:
    """The Arrow files an earlier run found, opened directly; None when there is no pointer or a file is gone."""
    try:
        files = read_json(pointer)["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(Path(f).is_file() for names in files.values() for f in names):
        log.info("%s names Arrow files that are gone (the Hugging Face cache was cleared): loading again", pointer)
        return None
    return {
        split: datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in names])
        for split, names in files.items()
    }


def _load_local(ref: HFRef, datasets) -> dict:
    path = Path(ref.name)
    if not path.is_dir():
        raise UserError(
            f"--data {ref}: no directory {path}; pass --data hf:PATH of a dataset saved with "
            f"save_to_disk, or of a directory of parquet/json/csv files"
        )
    if (path / "state.json").is_file():
        raise UserError(
            f"--data {ref}: {path} holds one split (a Dataset); save a DatasetDict of train, validation "
            f"and test splits with save_to_disk"
        )
    if (path / "dataset_dict.json").is_file() and ref.config:
        raise UserError(
            f"--data {ref}: {path} is a dataset saved with save_to_disk, which has no configs; drop "
            f":{ref.config} (pass --data hf:{path})"
        )
    try:
        if (path / "dataset_dict.json").is_file():
            return dict(datasets.load_from_disk(str(path)))
        return dict(datasets.load_dataset(str(path), ref.config))
    except Exception as e:
        why = " ".join(str(e).split())[:300] or type(e).__name__
        raise UserError(
            f"--data {ref}: {path} is not a dataset that datasets can read ({type(e).__name__}: {why}); "
            f"pass a DatasetDict saved with save_to_disk, or a directory of parquet/json/csv "
            f"files"
        ) from None
