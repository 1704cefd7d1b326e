"""Translate with a trained model, anywhere: the Python API behind `aiayn translate` and `aiayn eval`.

    from aiayn import Translator

    translator = Translator.from_run("runs/tiny/synthetic/base/seed0", device="auto")
    translator.translate(["The dog sees the cat.", "Today the small boy sleeps in the garden."])

A checkpoint carries its model config and its tokenizer (callbacks.RunFilesInCheckpoint), so this
needs neither the corpus nor the cache nor Lightning's Trainer: a run directory (or one checkpoint)
copied to another machine translates there. The tokenizer used is always the checkpoint's own.

Decoding is the paper's (§6.1): beam 4, length penalty α = 0.6, at most source length + 50 tokens;
each is a parameter. Sentences are sorted by length and batched by a budget of source tokens
(padding included), so a file of any length decodes in memory-bounded batches; the output keeps the
input's order. An empty (or blank) line translates to an empty line, so the output stays line-aligned.
A sentence longer than the model's positional encoding covers (`max_len`, counted in tokens) is
refused with one line naming it, rather than cut: a truncated source gives a wrong translation that
looks right.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.common.errors import UserError
from aiayn.common.text import NotUTF8, utf8_lines
from aiayn.lightning_modules.run.bleu import bleu
from aiayn.lightning_modules.run.devices import autocast, resolve_precision
from aiayn.lightning_modules.run.evaluate import nll_sum
from aiayn.lightning_modules.run.options import DECODE_MAX_TOKENS
from aiayn.lightning_modules.run.rundir import RunConfig, RunDir
from aiayn.lightning_modules.transformer.config import PAPER_DECODING
from aiayn.lightning_modules.transformer.decoding import beam_search, greedy
from aiayn.lightning_modules.transformer.model import BOS, EOS, PAD, Transformer
from aiayn.lightning_modules.use.checkpoints import averaged, embedded_tokenizer, last_checkpoints, load_raw, run_config
from aiayn.lightning_modules.use.options import ModelSource


def pick_device(device: str) -> torch.device:
    """`auto`: the GPU when one is visible, else the CPU; `cuda` without a GPU is a UserError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.split(":")[0] == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {device}: no CUDA device is visible here; pass --device cpu or auto")
        return torch.device(device)
    raise UserError(f"--device {device}: unknown device; pass auto, cpu or cuda")


def read_sentences(path: str, what: str = "input") -> list[str]:
    """One sentence per line of a UTF-8 file ('-': stdin); a line that is not UTF-8 is a UserError
    naming it. Only line terminators are stripped."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise UserError(
            f"cannot read {what} {path} ({e.strerror or e}); pass a UTF-8 text file, one sentence per line"
        ) from None
    name = "stdin" if path == "-" else path
    try:
        return utf8_lines(raw)
    except NotUTF8 as e:
        raise UserError(
            f"{what} {name} line {e.line} is not valid UTF-8 ({e.reason}); re-encode it as UTF-8 (e.g. iconv -t utf-8)"
        ) from None


def _tokenizer(ckpt: dict, path: Path) -> bytes:
    """The SentencePiece model a checkpoint carries (checked against its recorded sha256)."""
    data = embedded_tokenizer(ckpt, path)
    if data is None:
        raise UserError(
            f"checkpoint {path} carries no tokenizer; pass a checkpoint from a run directory's "
            "checkpoints/ (aiayn train puts the tokenizer in each)"
        )
    return data


def _model(ckpt: dict, path: Path, config: RunConfig) -> Transformer:
    """The Transformer of a checkpoint, built from its own run config (no Lightning module needed)."""
    model = Transformer(config.spec.model)
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"checkpoint {path} does not match its own config ({str(e).splitlines()[0]})") from e
    return model


class Translator:
    """A trained model with its tokenizer and decoding settings; `translate` turns sentences into
    translations. Build one with `from_run` or `from_checkpoint`."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: bytes,
        *,
        device: str = "auto",
        beam: int = PAPER_DECODING.beam,
        alpha: float = PAPER_DECODING.alpha,
        extra_len: int = PAPER_DECODING.extra_len,
        max_tokens: int = DECODE_MAX_TOKENS,
        max_len: int | None = None,
        checkpoints: Sequence[str] = (),
        data: dict | None = None,
        precision: str = "auto",
    ) -> None:
        import sentencepiece as spm

        self.device = pick_device(device)
        # on a GPU, decode in bf16 where the GPU has it (as training ran), fp32 elsewhere
        self.precision = resolve_precision(precision, "cuda" if self.device.type == "cuda" else "cpu")
        self.model = model.to(self.device).eval()
        self.sp = spm.SentencePieceProcessor(model_proto=tokenizer)
        if self.sp.get_piece_size() != model.cfg.vocab_size:
            raise UserError(
                f"the tokenizer has {self.sp.get_piece_size()} pieces but the model's vocabulary is "
                f"{model.cfg.vocab_size}; use the tokenizer the model was trained with"
            )
        if beam < 1 or max_tokens < 1 or extra_len < 0:
            raise UserError(
                f"beam {beam}, max_tokens {max_tokens}, extra_len {extra_len}: beam and max_tokens must "
                f"be positive, extra_len not negative"
            )
        self.beam, self.alpha, self.extra_len, self.max_tokens = beam, alpha, extra_len, max_tokens
        self.max_len = max_len or model.cfg.max_len  # references are cut here for perplexity, as in training
        self.checkpoints = list(checkpoints)
        self.data = dict(data or {})  # the corpus identity the model was trained on (for `eval --split`)
        # sources end with </s> where the model was trained so (config.json's data.source_eos; absent: without)
        self.source_eos = bool(self.data.get("source_eos", False))
        self.tokenizer_proto = tokenizer  # the SentencePiece model's bytes (`aiayn export` copies them)
        self.run_config: RunConfig | None = None  # the run's config.json as its checkpoint carries it (`aiayn export`)

    # ---- loading

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "auto", **kw):
        """A checkpoint file (`last.ckpt`, `stepNNNNNNN.ckpt`, an averaged one); alone is enough."""
        return cls._load([Path(path)], device, kw)

    @classmethod
    def from_run(cls, path: str | Path, *, device: str = "auto", average: int | None = None, **kw) -> Translator:
        """A run directory: its `checkpoints/last.ckpt`, or the mean of its last `average` kept
        checkpoints (the paper averages the last 5, §6.1)."""
        run = RunDir(Path(path))
        if not run.path.is_dir():
            raise UserError(f"run directory {run.path} does not exist; pass --run OUT/PRESET/CORPUS/ROW/seedN")
        if average:
            paths = last_checkpoints(run.path, average, "--average")
        elif run.last_checkpoint.is_file():
            paths = [run.last_checkpoint]
        else:
            raise UserError(f"run directory {run.path} has no checkpoints/last.ckpt; train it first or pass --ckpt")
        return cls._load(paths, device, kw)

    @classmethod
    def from_options(cls, opts: ModelSource) -> Translator:
        """What `aiayn translate`, `aiayn eval` and `aiayn export` load: `--run DIR` or `--ckpt FILE` (a CTranslate2
        export, `--ct2 DIR`, is ct2.Ct2Translator's)."""
        if opts.kind() == "ct2":
            raise UserError("--ct2 DIR is a CTranslate2 model; load it with aiayn.Ct2Translator")
        kw = dict(
            device=opts.device,
            beam=opts.beam,
            alpha=opts.alpha,
            extra_len=opts.extra_len,
            max_tokens=opts.max_tokens,
            precision=opts.precision,
        )
        if opts.run:
            return cls.from_run(opts.run, average=opts.average, **kw)
        return cls.from_checkpoint(opts.ckpt, **kw)

    @classmethod
    def _load(cls, paths: list[Path], device: str, kw: dict) -> Translator:
        ckpt = load_raw(paths[0]) if len(paths) == 1 else averaged(paths, "--average")
        config = run_config(ckpt, paths[-1])
        model = _model(ckpt, paths[-1], config)
        proto = _tokenizer(ckpt, paths[-1])
        translator = cls(
            model,
            proto,
            device=device,
            max_len=config.data.max_len,
            checkpoints=[str(p) for p in paths],
            data=config.data.to_dict(),
            **kw,
        )
        translator.run_config = config  # config.json, as the checkpoint carries it
        return translator

    # ---- translating

    def encode(self, sentences: Sequence[str], name: str = "sentence") -> list[list[int]]:
        """Token ids per sentence ([] for a blank one), ending with </s> where the model was trained so; a sentence
        longer than the model's max_len is a UserError naming it (`name` N, 1-based)."""
        eos = int(self.source_eos)
        ids = encode_checked(self.sp, sentences, self.model.cfg.max_len, eos, name)
        return [x + [EOS] if x and eos else x for x in ids]

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        return token_batches(lengths, self.max_tokens)

    def _pad(self, rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long, device=self.device)

    @torch.no_grad()
    def translate(
        self, sentences: Sequence[str], *, beam: int | None = None, alpha: float | None = None, name: str = "sentence"
    ) -> list[str]:
        """The translation of each sentence, in order ("" for a blank one)."""
        return [self.sp.decode(h) for h in self.translate_ids(sentences, beam=beam, alpha=alpha, name=name)]

    @torch.no_grad()
    def translate_ids(
        self, sentences: Sequence[str], *, beam: int | None = None, alpha: float | None = None, name: str = "sentence"
    ) -> list[list[int]]:
        """The token ids of each sentence's translation, without BOS and EOS ([] for a blank one)."""
        beam, alpha = beam or self.beam, self.alpha if alpha is None else alpha
        ids = self.encode(sentences, name)
        out = [[] for _ in ids]
        for batch in self._batches([len(x) for x in ids]):
            src = self._pad([ids[i] for i in batch])
            with autocast(self.device, self.precision):
                if beam == 1:
                    hyps = greedy(self.model, src, BOS, EOS, extra_len=self.extra_len)
                else:
                    hyps = beam_search(self.model, src, BOS, EOS, beam=beam, alpha=alpha, extra_len=self.extra_len)
            for i, h in zip(batch, hyps):
                out[i] = [t for t in h if t not in (PAD, BOS, EOS)]
        return out

    @torch.no_grad()
    def perplexity(self, sources: Sequence[str], references: Sequence[str]) -> float:
        """Per-token perplexity of the references given the sources (teacher forcing, EOS included),
        both cut at the max_len the model was evaluated with in training, as its dev perplexity. Pairs
        with an empty source are left out."""
        cut = self.max_len
        src = [x[:cut] + ([EOS] if x and self.source_eos else []) for x in self.sp.encode(list(sources))]
        tgt = [y[:cut] for y in self.sp.encode(list(references))]
        total, count = 0.0, 0
        # a pair with an empty source has nothing to attend to: left out, as its translation is empty
        for batch in self._batches([max(len(src[i]), len(tgt[i]) + 1) if src[i] else 0 for i in range(len(src))]):
            s = self._pad([src[i] for i in batch])
            tgt_in = self._pad([[BOS] + tgt[i] for i in batch])
            tgt_out = self._pad([tgt[i] + [EOS] for i in batch])
            with autocast(self.device, self.precision):
                nll, n = nll_sum(self.model, {"src": s, "tgt_in": tgt_in, "tgt_out": tgt_out})
            total, count = total + float(nll), count + n
        return math.exp(total / max(count, 1))

    def evaluate(self, sources: Sequence[str], references: Sequence[str], name: str = "sentence") -> dict:
        """Both BLEUs (sacreBLEU with its signature; the paper's tokenized kind, labelled) and the
        perplexity of the references, with the settings used."""
        return evaluation(self, sources, references, name, params=self.model.cfg.params())


def encode_checked(sp, sentences: Sequence[str], max_len: int, eos: int, name: str, out_type=int) -> list[list]:
    """SentencePiece tokens per sentence ([] for a blank one); a sentence longer than the model's `max_len`
    positions less the `eos` (0 or 1) the source ends with is a UserError naming it (`name` N, 1-based)."""
    cap = max_len - eos
    tokens = [sp.encode(s, out_type=out_type) if s.strip() else [] for s in sentences]
    for i, x in enumerate(tokens, start=1):
        if len(x) > cap:
            why = f"the model's {max_len} positions less the </s> it ends with" if eos else "the model's maximum"
            raise UserError(
                f"{name} {i} has {len(x)} tokens, more than the {cap} of {why}; split it into shorter sentences"
            )
    return tokens


def token_batches(lengths: list[int], max_tokens: int, same_length: bool = False) -> list[list[int]]:
    """Indices of the non-empty sentences, longest first, in batches of at most `max_tokens` padded
    positions (a sentence longer than the budget is a batch of its own); with `same_length`, each batch holds
    sentences of one length only."""
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        full = (len(current) + 1) * lengths[current[0]] > max_tokens if current else False
        if current and (full or (same_length and lengths[i] != lengths[current[0]])):
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def evaluation(translator, sources: Sequence[str], references: Sequence[str], name: str, params: int) -> dict:
    """`translator.evaluate` of either engine (Translator, ct2.Ct2Translator): both BLEUs, the perplexity of the
    references, the settings used."""
    if len(sources) != len(references):
        raise UserError(
            f"{len(sources)} sources but {len(references)} references; the files must be "
            f"line-aligned (same number of lines)"
        )
    if not sources:
        raise UserError("no sentences to evaluate; pass non-empty --src and --ref files")
    hyps = translator.translate(sources, name=name)
    return {
        **bleu(hyps, list(references), lang=translator.data.get("tgt_lang") or "de"),
        "ppl": translator.perplexity(sources, references),
        "n_sentences": len(sources),
        "params": params,
        "beam": translator.beam,
        "alpha": translator.alpha,
        "extra_len": translator.extra_len,
        "checkpoints": translator.checkpoints,
        "device": str(translator.device),
    }


def split_of(data: dict, split: str, data_dir: str | None = None, cache_dir: str | None = None) -> tuple[list, list]:
    """Sources and references of a split of the corpus a model was trained on (`data`: the corpus
    identity its checkpoint records); `data_dir` where the corpus's files are now, if they moved."""
    from aiayn.lightning_modules.data.corpora import (  # lazily: translating needs no corpus
        CorpusRef,
        read_parallel,
        resolve_corpus,
    )

    if not data.get("corpus"):
        raise UserError("the checkpoint does not name its corpus; pass --src FILE --ref FILE instead of --split")
    src_lang, tgt_lang = data.get("src_lang", "en"), data.get("tgt_lang", "de")
    corpus = CorpusRef.parse(data["corpus"], data.get("splits"))  # the record's, parsed once
    corpus_dir = resolve_corpus(corpus, data_dir or data.get("data_dir"), cache_dir, src_lang, tgt_lang)
    return read_parallel(corpus_dir, split, src_lang, tgt_lang)
