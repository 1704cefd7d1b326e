"""The one typed value a data module is built from: `DataPlan`, which tokens a model sees (`DataIdentity`, recorded in
config.json and in every checkpoint) and how they are cached, batched and loaded. The flags a user sets are checked
here, once, when the plan is made: one line naming the flag and the fix."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.names import RULE, is_name
from aiayn.lightning_modules.data.corpora import CorpusRef, default_cache_dir


@dataclass(frozen=True)
class DataIdentity:
    """What fixes which tokens a model sees: the corpus (with its --hf-splits), where its files are, the vocabulary,
    the languages, the length limit, a data-limited regime's first K training pairs, and whether every source ends
    with </s> (--source-eos, the paper's convention; a config.json without it is one of aiayn's earlier runs,
    without)."""

    corpus: CorpusRef
    data_dir: str | None = None
    vocab_size: int = 8000
    src_lang: str = "en"
    tgt_lang: str = "de"
    max_len: int = 256
    train_pairs: int | None = None
    source_eos: bool = True

    def __post_init__(self) -> None:
        if self.train_pairs is not None and self.train_pairs <= 0:
            raise UserError(f"--train-pairs must be positive, got {self.train_pairs}; pass a positive count or omit it")
        for flag, lang in (("--src-lang", self.src_lang), ("--tgt-lang", self.tgt_lang)):
            if not is_name(lang):  # it names the tokenizer's cache file: 'd/../../x' wrote outside the cache
                raise UserError(
                    f"{flag} {lang!r} is not a language code ({RULE}); pass the suffix of the corpus files, e.g. de"
                )
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", str(self.data_dir))

    def to_dict(self) -> dict:
        """As config.json and checkpoints spell it, in the layout they always had: the corpus by its name, its
        splits beside it."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source_eos"}
        return {**d, "corpus": self.corpus.name, "splits": self.corpus.splits, "source_eos": self.source_eos}

    @classmethod
    def from_dict(cls, d: dict) -> DataIdentity:
        """A recorded identity (unknown keys ignored: a later aiayn may add some); its corpus parsed once, here."""
        if not isinstance(d, dict) or "corpus" not in d:
            raise ValueError("missing field(s) corpus")
        known = {f.name: d[f.name] for f in fields(cls) if f.name not in ("corpus", "source_eos") and f.name in d}
        try:
            corpus = CorpusRef.recorded(d["corpus"], d.get("splits"))
            return cls(corpus, **known, source_eos=bool(d.get("source_eos", False)))
        except UserError as e:  # a value this aiayn refuses as a flag: the file is not one it can read
            raise ValueError(str(e)) from None


@dataclass(frozen=True)
class DataPlan:
    """Everything a `TranslationDataModule` is built from. `max_tokens`: real target tokens per device and per batch
    (more than `max_len`, so that every sentence fits in a batch); `accumulate`: batches per optimizer step (each
    rank's training batches per epoch a multiple of it); `dev_subset`: the first K dev sentences; `pin_memory`:
    page-locked batches for a GPU's asynchronous copies; `pad_to`: batch lengths rounded up to a multiple of it;
    `static_shapes`: a fixed number of sentences per length bucket, both sides padded to it; `tokenizer`: a
    SentencePiece model to use instead of training one; `cache_dir`: None for the default
    (corpora.default_cache_dir)."""

    identity: DataIdentity
    cache_dir: Path | None = None
    max_tokens: int = 4096
    accumulate: int = 1
    seed: int = 0
    dev_subset: int | None = None
    num_workers: int = 0
    pin_memory: bool = False
    pad_to: int = 1
    static_shapes: bool = False
    tokenizer: Path | None = None

    def __post_init__(self) -> None:
        if self.max_tokens <= self.identity.max_len:
            raise UserError(
                f"--max-tokens {self.max_tokens} must be larger than the preset's max_len "
                f"{self.identity.max_len} so that a sentence of max_len tokens plus bos/eos fits in a "
                "batch; raise --max-tokens"
            )
        if self.dev_subset is not None and self.dev_subset <= 0:
            raise UserError(f"--dev-subset must be positive, got {self.dev_subset}; pass a positive count or omit it")
        cache = Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()
        object.__setattr__(self, "cache_dir", cache)
        object.__setattr__(self, "tokenizer", Path(self.tokenizer) if self.tokenizer else None)
