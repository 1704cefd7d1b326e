"""Translate with a CTranslate2 export (`aiayn export --format ctranslate2`): the same interface as
`translate.Translator` (`translate`, `perplexity`, `evaluate`), behind `aiayn translate --ct2 DIR` and
`aiayn eval --ct2 DIR`.

    from aiayn import Ct2Translator

    translator = Ct2Translator("exports/base-ct2", device="cpu")
    translator.translate(["A man rides a bike."])

The export directory carries the model, our SentencePiece model (`tokenizer.model`) and `aiayn.json` (the
model config, the corpus identity, the decoding settings). Decoding is aiayn's where CTranslate2 can express it:
beam 4, sentences batched by source length so each is limited to its own length + 50 tokens, stop once `beam`
hypotheses have ended (patience 1), `<pad>`, `<unk>` and `<s>` never generated, the source with `</s>` where the
model was trained so (without it for earlier runs), the output SentencePiece-decoded as aiayn does. CTranslate2's
length penalty is score / |Y|^α, not GNMT's score / ((5 + |Y|) / 6)^α; at the length limit a hypothesis ends
without paying for its EOS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.common.errors import UserError
from aiayn.common.files import read_json, sha256_bytes
from aiayn.lightning_modules.run.options import DECODE_MAX_TOKENS
from aiayn.lightning_modules.transformer.model import BOS, EOS, PAD, TransformerConfig
from aiayn.lightning_modules.use.export import CT2_TOKENIZER, EXPORT_FILE, require
from aiayn.lightning_modules.use.options import ModelSource
from aiayn.lightning_modules.use.translate import Translator, encode_checked, evaluation, pick_device, token_batches


def read_export(path: Path, fmt: str) -> dict:
    """`aiayn.json` of an export directory of format `fmt`; a UserError for anything else."""
    if not path.is_dir():
        raise UserError(f"{path} is not a directory; pass the directory that `aiayn export --format {fmt}` wrote")
    try:
        record = read_json(path / EXPORT_FILE, 1 << 20)
    except (OSError, ValueError):
        raise UserError(
            f"{path} has no readable {EXPORT_FILE}: it is not an aiayn export; write one with "
            f"`aiayn export --format {fmt}`"
        ) from None
    if record.get("format") != fmt:
        raise UserError(
            f"{path} is an export of format {record.get('format')}, not {fmt}; pass one that `aiayn "
            f"export --format {fmt}` wrote"
        )
    return record


BATCHINGS = ("same-length", "sorted")


class Ct2Translator:
    """A CTranslate2 export with its tokenizer and decoding settings (module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        beam: int | None = None,
        alpha: float | None = None,
        extra_len: int | None = None,
        max_tokens: int = DECODE_MAX_TOKENS,
        compute_type: str = "default",
        threads: int | None = None,
        batching: str = "same-length",
    ) -> None:
        import sentencepiece as spm

        if batching not in BATCHINGS:
            raise UserError(f"batching {batching!r}: one of {', '.join(BATCHINGS)}")
        self.batching = batching
        path = Path(path)
        record = read_export(path, "ctranslate2")
        ctranslate2 = require("ctranslate2", "ctranslate2", f"the CTranslate2 model {path}")
        proto = (path / CT2_TOKENIZER).read_bytes()
        if sha256_bytes(proto) != record.get("tokenizer_sha256"):
            raise UserError(f"{path / CT2_TOKENIZER} is not the tokenizer the model was exported with; export it again")
        self.cfg = TransformerConfig.from_dict(record["model_cfg"])
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        decoding = record.get("decoding", {})
        self.beam = beam or decoding.get("beam", 4)
        self.alpha = decoding.get("alpha", 0.6) if alpha is None else alpha
        self.extra_len = decoding.get("extra_len", 50) if extra_len is None else extra_len
        if self.beam < 1 or max_tokens < 1 or self.extra_len < 0:
            raise UserError(
                f"beam {self.beam}, max_tokens {max_tokens}, extra_len {self.extra_len}: beam and "
                f"max_tokens must be positive, extra_len not negative"
            )
        self.max_tokens = max_tokens
        self.device = pick_device(device)
        # as many threads as torch uses (CTranslate2's default, 4, oversubscribes a 2-core machine: OpenMP's
        # spinning threads made a busy one 100x slower)
        threads = threads or torch.get_num_threads()
        self.model = ctranslate2.Translator(
            str(path),
            device=self.device.type,
            compute_type=compute_type,
            intra_threads=threads if self.device.type == "cpu" else 1,
        )
        self.data = dict(record.get("data") or {})
        self.max_len = self.data.get("max_len") or self.cfg.max_len
        # sources end with </s> where the model was trained so (its config.json's data.source_eos)
        self._eos = [self.sp.id_to_piece(EOS)] if self.data.get("source_eos") else []
        self.checkpoints = [str(path)]
        self.quantization = record.get("quantization")
        self._never = [[self.sp.id_to_piece(PAD)], [self.sp.id_to_piece(BOS)]]  # and UNK: disable_unk

    @classmethod
    def from_options(cls, opts: ModelSource) -> Ct2Translator:
        return cls(
            opts.ct2,
            device=opts.device,
            beam=opts.beam,
            alpha=opts.alpha,
            extra_len=opts.extra_len,
            max_tokens=opts.max_tokens,
            batching=opts.ct2_batching,
        )

    def translate(
        self, sentences: Sequence[str], *, beam: int | None = None, alpha: float | None = None, name: str = "sentence"
    ) -> list[str]:
        """The translation of each sentence, in order ("" for a blank one)."""
        beam, alpha = beam or self.beam, self.alpha if alpha is None else alpha
        pieces = encode_checked(self.sp, sentences, self.cfg.max_len, len(self._eos), name, out_type=str)
        pieces = [p + self._eos if p else p for p in pieces]
        out = [""] * len(pieces)
        # same-length: one source length per batch, since CTranslate2's length limit is per batch and aiayn's per
        # sentence (exactly aiayn's limits, at the cost of small batches); sorted: sentences of neighbouring
        # lengths together, each batch limited by its longest source (a shorter sentence may run longer than
        # aiayn would let it, only where it reaches the limit: a model that never ends)
        same = self.batching == "same-length"
        for batch in token_batches([len(p) for p in pieces], self.max_tokens, same_length=same):
            limit = min(max(len(pieces[i]) for i in batch) + self.extra_len, self.cfg.max_len - 1)
            results = self.model.translate_batch(
                [pieces[i] for i in batch],
                beam_size=beam,
                length_penalty=alpha,
                patience=1,
                disable_unk=True,
                suppress_sequences=self._never,
                max_decoding_length=limit,
                max_input_length=0,
            )
            for i, result in zip(batch, results):
                out[i] = self.sp.decode(result.hypotheses[0])
        return out

    def perplexity(self, sources: Sequence[str], references: Sequence[str]) -> float:
        """Per-token perplexity of the references (EOS included) given the sources, both cut at the max_len of
        training, as `Translator.perplexity`; pairs with an empty source are left out."""
        cut = self.max_len
        src = [x[:cut] + self._eos if x else x for x in self.sp.encode(list(sources), out_type=str)]
        tgt = [y[:cut] for y in self.sp.encode(list(references), out_type=str)]
        keep = [i for i in range(len(src)) if src[i]]
        total, count = 0.0, 0
        for batch in token_batches([max(len(src[i]), len(tgt[i]) + 1) for i in keep], self.max_tokens):
            rows = [keep[j] for j in batch]
            scored = self.model.score_batch([src[i] for i in rows], [tgt[i] for i in rows], max_input_length=0)
            for result in scored:
                total -= sum(result.log_probs)
                count += len(result.log_probs)
        return math.exp(total / max(count, 1))

    def evaluate(self, sources: Sequence[str], references: Sequence[str], name: str = "sentence") -> dict:
        """Both BLEUs and the perplexity of the references, with the settings used (as `Translator.evaluate`)."""
        result = evaluation(self, sources, references, name, params=self.cfg.params())
        return result | {"engine": "ctranslate2", "quantization": self.quantization}


def load_translator(opts: ModelSource) -> Translator | Ct2Translator:
    """The translator that `--run DIR`, `--ckpt FILE` or `--ct2 DIR` names."""
    if opts.kind() == "ct2":
        return Ct2Translator.from_options(opts)
    return Translator.from_options(opts)
