"""A trained model for other runtimes (`aiayn export`): Hugging Face's `MarianMTModel` + `MarianTokenizer`, and
CTranslate2 through its own converter.

Marian is the paper's Transformer (post-LN, ReLU, one embedding matrix shared by source, target and the
pre-softmax projection and scaled by √d_model, biases on Q/K/V, sinusoidal positions), with one difference of
layout: §3.5 interleaves the sinusoids (dimension 2i is sin, 2i+1 cos of frequency i), Marian puts every sin
first and every cos after (`MarianSinusoidalPositionalEmbedding`). That is a permutation P of the model
dimension, so the export permutes every tensor that faces d_model by the same P: the embedding's columns, the
input dimension of W^Q, W^K, W^V and W_1, the output dimension (and bias) of W^O and W_2, each LayerNorm's
weight and bias. Every hidden state of the exported model is then ours permuted by P, attention scores and
the FFN's inner activations are unchanged (sums over d_model are permutation-invariant), and the logits are
equal. P is read off the two position tables (`sinusoid_permutation`), not assumed.

What Marian cannot express is refused before anything is written (`unsupported`): positions other than the
sinusoids (learned, rotary, none), pre-LN, heads whose d_k or d_v is not d_model / h.

CTranslate2's converter for Marian (`MarianMTLoader`) assumes the original Marian toolkit's conventions, which
ours are not: the decoder starting from a zero embedding, and a `<pad>` that Transformers appended at the end
of the vocabulary, whose row it drops. `_Ct2Loader` is its parent, `BartLoader` (the same weight mapping:
Marian is BART's layout), with Marian's two settings (post-LN, no LayerNorm on the embeddings): the decoder
starts from BOS's embedding, as ours, and every row is kept.

The export directory also carries `aiayn.json` (the model config, the corpus identity, the decoding settings,
the checkpoints it came from) and a README.md saying how to call it.
"""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.ablations.knobs import KNOBS
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_directory, check_new_directory, sha256_bytes
from aiayn.common.secrets import redact
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.transformer.config import PE_KINDS
from aiayn.lightning_modules.transformer.model import BOS, EOS, PAD, UNK, Transformer, TransformerConfig, sinusoid_table
from aiayn.lightning_modules.use.options import CT2_QUANTIZATIONS, ExportOptions

if TYPE_CHECKING:
    from aiayn.lightning_modules.run.rundir import RunConfig

log = logging.getLogger(__name__)

EXPORT_FILE = "aiayn.json"  # what aiayn knows about an export (and `aiayn translate --ct2` reads)
CT2_TOKENIZER = "tokenizer.model"  # the SentencePiece model inside a CTranslate2 export
NEVER_GENERATED = [PAD, UNK, BOS]  # as decoding.NEVER_GENERATED: suppressed at every step


def require(package: str, extra: str, what: str):
    """The imported package, or a UserError naming the extra that installs it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise UserError(
            f"{what} needs the Python package {package}, which is not installed; install it with "
            f"pip install 'aiayn[{extra}]'"
        ) from None


# --- what Marian can express -----------------------------------------------------------------------


def unsupported(cfg: TransformerConfig) -> list[str]:
    """What in `cfg` MarianMTModel cannot express (empty: exportable)."""
    reasons = []
    if not PE_KINDS[cfg.pe].marian:
        marian = " or ".join(k for k, v in PE_KINDS.items() if v.marian)
        reasons.append(f"pe={cfg.pe} ({PE_KINDS[cfg.pe].note}), where Marian has pe={marian} only")
    if cfg.h * cfg.d_k != cfg.d_model or cfg.h * cfg.d_v != cfg.d_model:
        reasons.append(
            f"d_k={cfg.d_k} d_v={cfg.d_v} with h={cfg.h} and d_model={cfg.d_model}, where Marian's heads "
            f"are d_model / h = {cfg.d_model / cfg.h:g} wide"
        )
    for name, knob in KNOBS.items():  # a knob beyond the paper's table: Marian has the paper's value only
        if knob.kind == "model" and knob.paper is not None and getattr(cfg, name) != knob.paper:
            reasons.append(
                f"{name}={knob.cell(getattr(cfg, name))} ({knob.help}), where Marian has the paper's "
                f"{name}={knob.cell(knob.paper)} only"
            )
    return reasons


def marian_config(cfg: TransformerConfig, **overrides):
    """A `MarianConfig` of the same model: post-LN (Marian has no other), ReLU, dropout only where aiayn has it,
    one embedding matrix for source, target and output × √d_model, PAD 0, BOS as the decoder's start, EOS 3,
    `max_position_embeddings` = max_len, no final-logits bias."""
    from transformers import MarianConfig

    values = dict(
        vocab_size=cfg.vocab_size,
        decoder_vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.N,
        decoder_layers=cfg.N,
        encoder_attention_heads=cfg.h,
        decoder_attention_heads=cfg.h,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function="relu",
        dropout=cfg.P_drop,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=cfg.max_len,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=EOS,
        init_std=cfg.d_model**-0.5,
    )
    return MarianConfig(**(values | overrides))


# --- the weights -------------------------------------------------------------------------------------


def sinusoid_permutation(ours: Tensor, theirs: Tensor, atol: float = 1e-5) -> Tensor:
    """P with theirs[:, k] == ours[:, P[k]]: for each column of Marian's position table, the column of ours that
    holds the same sinusoid. A ValueError unless that is a permutation under which the tables agree."""
    if ours.shape != theirs.shape:
        raise ValueError(f"position tables of shapes {tuple(ours.shape)} and {tuple(theirs.shape)}")
    distance = torch.cdist(theirs.T.double(), ours.T.double())  # (d_model, d_model): column to column
    perm = distance.argmin(dim=1)
    if not torch.equal(perm.sort().values, torch.arange(ours.shape[1], device=perm.device)):
        raise ValueError("Marian's position table is not a permutation of the paper's")
    worst = float((theirs.double() - ours.double()[:, perm]).abs().max())
    if worst > atol:
        raise ValueError(f"Marian's position table differs from the paper's permuted by up to {worst:.3g}")
    return perm


def marian_state(model: Transformer, perm: Tensor) -> dict[str, Tensor]:
    """The parameters of `model` under MarianMTModel's names, permuted by `perm` along d_model (module docstring)."""
    out = {"model.shared.weight": model.embed.weight[:, perm]}

    def linear_in(name, linear):  # reads d_model: permute its input columns
        out[f"{name}.weight"], out[f"{name}.bias"] = linear.weight[:, perm], linear.bias

    def linear_out(name, linear):  # writes d_model: permute its output rows and bias
        out[f"{name}.weight"], out[f"{name}.bias"] = linear.weight[perm], linear.bias[perm]

    def norm(name, ln):
        out[f"{name}.weight"], out[f"{name}.bias"] = ln.weight[perm], ln.bias[perm]

    def attention(name, mha):
        for theirs, ours in (("q_proj", mha.w_q), ("k_proj", mha.w_k), ("v_proj", mha.w_v)):
            linear_in(f"{name}.{theirs}", ours)
        linear_out(f"{name}.out_proj", mha.w_o)

    def ffn(name, layer):
        linear_in(f"{name}.fc1", layer.ffn.w_1)
        linear_out(f"{name}.fc2", layer.ffn.w_2)
        norm(f"{name}.final_layer_norm", layer.res_ffn.norm)

    for i, layer in enumerate(model.encoder):
        name = f"model.encoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attn)
        norm(f"{name}.self_attn_layer_norm", layer.res_attn.norm)
        ffn(name, layer)
    for i, layer in enumerate(model.decoder):
        name = f"model.decoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attn)
        norm(f"{name}.self_attn_layer_norm", layer.res_self.norm)
        attention(f"{name}.encoder_attn", layer.cross_attn)
        norm(f"{name}.encoder_attn_layer_norm", layer.res_cross.norm)
        ffn(name, layer)
    return {k: v.detach().float().cpu().contiguous() for k, v in out.items()}


def to_marian(model: Transformer):
    """`model` as a MarianMTModel (eval mode, fp32) that computes the same logits."""
    from transformers import MarianMTModel

    cfg = model.cfg
    reasons = unsupported(cfg)
    if reasons:
        raise ValueError("; ".join(reasons))
    hf = MarianMTModel(marian_config(cfg)).eval()
    table = hf.model.encoder.embed_positions.weight.detach()  # the table this transformers version computes
    perm = sinusoid_permutation(sinusoid_table(cfg.max_len, cfg.d_model), table)
    state = marian_state(model, perm.to(model.embed.weight.device))
    expected = set(hf.state_dict())
    tied = {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    computed = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight", "final_logits_bias"}
    missing, unexpected = expected - set(state) - tied - computed, set(state) - expected
    if missing or unexpected:  # a transformers version that names things otherwise
        raise ValueError(
            f"MarianMTModel's parameters differ from the mapping: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    with torch.no_grad():
        params = dict(hf.named_parameters(remove_duplicate=False)) | dict(hf.named_buffers())
        for name, value in state.items():
            params[name].copy_(value)
        hf.final_logits_bias.zero_()
    if hf.lm_head.weight.data_ptr() != hf.model.shared.weight.data_ptr():
        raise ValueError("MarianMTModel did not tie its output projection to the shared embedding")
    return hf


# --- the tokenizer and the generation settings ------------------------------------------------------


def write_marian_files(proto: bytes, where: Path) -> dict[str, int]:
    """MarianTokenizer's files: our joint SentencePiece model as source.spm and target.spm, and vocab.json mapping
    each piece to its id (ids are ours: pad 0, unk 1, <s> 2, </s> 3). Returns the vocabulary."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    for name in ("source.spm", "target.spm"):
        (where / name).write_bytes(proto)
    (where / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    return vocab


def write_marian_tokenizer(proto: bytes, where: Path, cfg: TransformerConfig, data: dict):
    """MarianTokenizer's files (`write_marian_files`) and its config; returns the tokenizer.

    MarianTokenizer appends </s> to every source (Marian's models were trained so; transformers has no setting that
    turns it off): what aiayn trains with (`--source-eos`, the default), so its default call gives
    aiayn's translations; a model trained without it (`data.source_eos` false: older runs) is
    encoded with `add_special_tokens=False`.
    `clean_up_tokenization_spaces` is off: aiayn's output is SentencePiece's decoding as it is (it would join " ."
    to ".")."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    sp = spm.SentencePieceProcessor(model_proto=proto)
    write_marian_files(proto, where)
    tokenizer = MarianTokenizer(
        str(where / "source.spm"),
        str(where / "target.spm"),
        str(where / "vocab.json"),
        source_lang=data.get("src_lang"),
        target_lang=data.get("tgt_lang"),
        unk_token=sp.id_to_piece(UNK),
        eos_token=sp.id_to_piece(EOS),
        pad_token=sp.id_to_piece(PAD),
        bos_token=sp.id_to_piece(BOS),
        model_max_length=cfg.max_len,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.save_pretrained(str(where))
    return tokenizer


def write_fast_tokenizer(proto: bytes, where: Path, cfg: TransformerConfig, source_eos: bool = True):
    """Our joint SentencePiece model as a Transformers fast tokenizer (tokenizer.json, read by AutoTokenizer): the
    same pieces and ids as SentencePiece's own encoding (transformers' SpmConverter builds it from the model file:
    its normalizer, whitespace handling and BPE merges ranked by piece score), with `</s>` appended to a source where
    the model was trained so (`source_eos`, as MarianTokenizer always does) and none where it was not: the defaults
    give aiayn's translations either way. Returns the tokenizer."""
    import sentencepiece as spm
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

    sp = spm.SentencePieceProcessor(model_proto=proto)
    spec = import_protobuf().ModelProto()
    spec.ParseFromString(proto)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    built = SpmConverter.build_tokenizer_from_spm_proto(spec, vocab)
    eos = sp.id_to_piece(EOS)
    if source_eos:
        built.post_processor = TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, EOS)]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=built,
        unk_token=sp.id_to_piece(UNK),
        eos_token=sp.id_to_piece(EOS),
        pad_token=sp.id_to_piece(PAD),
        bos_token=sp.id_to_piece(BOS),
        model_max_length=cfg.max_len,
        clean_up_tokenization_spaces=False,
    )
    probe = ["A man rides a bike.", "Ein Mann fährt Fahrrad.", "  two  spaces  "]
    if [tokenizer(x).input_ids for x in probe] != [sp.encode(x) + [EOS] * source_eos for x in probe]:
        raise UserError(
            "this SentencePiece model cannot be expressed as a Transformers fast tokenizer here (its "
            "pieces differ); export with --format ctranslate2"
        )
    tokenizer.save_pretrained(str(where))
    return tokenizer


def generation_config(cfg: TransformerConfig, beam: int, alpha: float):
    """Transformers' generation defaults closest to aiayn's decoding: beam 4, α 0.6, stop once `beam`
    hypotheses have ended (fairseq's rule, aiayn's), PAD, UNK and BOS never generated, EOS forced at the length
    limit. Differences that remain: Transformers' length penalty is score / |Y|^α, GNMT's (aiayn's)
    score / ((5 + |Y|) / 6)^α; its length limit is one per batch (`max_new_tokens`; aiayn's is each source's
    length + 50); its forced EOS costs nothing, aiayn's its real log-probability."""
    from transformers import GenerationConfig

    search = dict(num_beams=beam, length_penalty=alpha, early_stopping=True) if beam > 1 else dict(num_beams=1)
    return GenerationConfig(
        **search,
        max_length=cfg.max_len,
        decoder_start_token_id=BOS,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        forced_eos_token_id=EOS,
        suppress_tokens=NEVER_GENERATED,
    )


# --- writing --------------------------------------------------------------------------------------


def write_hf(
    model: Transformer, proto: bytes, where: Path, *, data: dict, beam: int, alpha: float, tokenizer: str = "fast"
) -> None:
    """MarianMTModel (config.json, model.safetensors, generation_config.json) and its tokenizer into `where`: the
    fast tokenizer AutoTokenizer loads (`tokenizer="fast"`, what `aiayn export` publishes: tokenizer.json, with
    MarianTokenizer's source.spm, target.spm and vocab.json beside it, so that `MarianTokenizer.from_pretrained`
    loads the same directory, as it loads Helsinki-NLP's), or MarianTokenizer's files alone with its own config
    (`"marian"`, what CTranslate2's converter reads)."""
    hf = to_marian(model)
    hf.generation_config = generation_config(model.cfg, beam, alpha)
    hf.save_pretrained(str(where))
    if tokenizer == "fast":
        write_fast_tokenizer(proto, where, model.cfg, bool(data.get("source_eos")))
        write_marian_files(proto, where)
    else:
        write_marian_tokenizer(proto, where, model.cfg, data)


def ct2_converter(hf_dir: Path):
    """A ctranslate2 Converter (its `_load` is the method every converter implements) that reads our HF export
    with BartLoader's mapping and Marian's settings, without MarianMTLoader's two assumptions (module
    docstring). Built here: ctranslate2 is optional."""
    from ctranslate2.converters import Converter
    from ctranslate2.converters.transformers import BartLoader
    from transformers import MarianMTModel, MarianTokenizer

    class AiaynMarianLoader(BartLoader):
        @property
        def architecture_name(self):
            return "MarianMTModel"

        def get_model_spec(self, model):
            # MarianMTLoader's settings, which BartLoader reads: post-LN, no LayerNorm on the embeddings
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return super().get_model_spec(model)

    class AiaynMarianConverter(Converter):
        def _load(self):
            model = MarianMTModel.from_pretrained(str(hf_dir))  # float32, as config.json says
            return AiaynMarianLoader()(model, MarianTokenizer.from_pretrained(str(hf_dir)))

    return AiaynMarianConverter()


def write_ct2(model: Transformer, proto: bytes, where: Path, *, data: dict, quantization: str) -> None:
    """A CTranslate2 model directory (model.bin, config.json, shared_vocabulary.json) converted from the HF
    export, plus our SentencePiece model (tokenizer.model) to tokenize with."""
    with tempfile.TemporaryDirectory(prefix=".hf-", dir=where.parent) as tmp:
        hf_dir = Path(tmp) / "hf"
        hf_dir.mkdir()
        write_hf(model, proto, hf_dir, data=data, beam=4, alpha=0.6, tokenizer="marian")
        converted = Path(tmp) / "ct2"
        ct2_converter(hf_dir).convert(str(converted), quantization=quantization)
        for file in converted.iterdir():
            shutil.move(str(file), where / file.name)
    (where / CT2_TOKENIZER).write_bytes(proto)


def _aiayn_version() -> str:
    """aiayn.__version__, read as aiayn/__init__.py reads it: importing `aiayn` here would close an import cycle
    (aiayn -> ct2 -> export -> aiayn; tests/test_layers.py)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiayn")
    except PackageNotFoundError:
        return "0+unknown"


def export_record(
    fmt: str, model: Transformer, proto: bytes, *, data, checkpoints, beam, alpha, extra_len, quantization=None
) -> dict:
    record = {
        "format": fmt,
        "aiayn_version": _aiayn_version(),
        "model_cfg": model.cfg.to_dict(),
        "data": data,
        "tokenizer_sha256": sha256_bytes(proto),
        "checkpoints": list(checkpoints),
        "decoding": {"beam": beam, "alpha": alpha, "extra_len": extra_len},
    }
    if quantization:
        record["quantization"] = quantization
    return record


def export(opts: ExportOptions) -> Path:
    """`aiayn export`: the model of `opts.model` in `opts.format` at `opts.out`, written atomically. Every
    refusal (a non-empty --out, no checkpoint, a row Marian cannot express, a missing package) comes before
    anything is written."""
    from aiayn.lightning_modules.use.translate import Translator

    if not opts.out:
        raise UserError("pass --out DIR, the directory to write")
    if opts.model.kind() == "ct2":
        raise UserError("--ct2 names an exported model; export from --run DIR or --ckpt FILE")
    if opts.format not in ("hf", "ctranslate2"):
        raise UserError(f"--format {opts.format}: unknown; pass hf or ctranslate2")
    if opts.quantization not in CT2_QUANTIZATIONS:
        raise UserError(f"--quantization {opts.quantization}: unknown; pass one of {', '.join(CT2_QUANTIZATIONS)}")
    if opts.format == "hf" and opts.quantization != "float32":
        raise UserError(
            "--quantization is CTranslate2's; the hf export is float32: drop it or pass --format ctranslate2"
        )
    out = Path(opts.out)
    check_new_directory(out, "--out")
    what = f"aiayn export --format {opts.format}"
    for package in ("transformers", "safetensors"):
        require(package, "hf", what)
    if opts.format == "ctranslate2":
        require("ctranslate2", "ctranslate2", what)
    translator = Translator.from_options(replace(opts.model, device="cpu"))
    model, source = translator.model, opts.model.run or opts.model.ckpt
    reasons = unsupported(model.cfg)
    if reasons:
        raise UserError(
            f"the model of {source} cannot be exported to {opts.format}: {'; '.join(reasons)}; export "
            f"a row with the paper's sinusoids, post-LN and d_k = d_v = d_model / h"
        )
    proto = translator.tokenizer_proto
    record = export_record(
        opts.format,
        model,
        proto,
        data=translator.data,
        checkpoints=translator.checkpoints,
        beam=translator.beam,
        alpha=translator.alpha,
        extra_len=translator.extra_len,
        quantization=opts.quantization if opts.format == "ctranslate2" else None,
    )
    record["run"] = run_summary(translator.run_config, opts.model.run)
    with atomic_directory(out, "--out") as tmp:
        if opts.format == "hf":
            write_hf(model, proto, tmp, data=translator.data, beam=translator.beam, alpha=translator.alpha)
        else:
            write_ct2(model, proto, tmp, data=translator.data, quantization=opts.quantization)
        (tmp / EXPORT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(model_card(opts.format, record, opts.license), encoding="utf-8")
    log.info("exported %s to %s (%s)", source, out, opts.format)
    if opts.push_to_hub:
        push(out, opts.push_to_hub, private=opts.private)
    return out


def run_summary(config: RunConfig | None, run_dir: str | None) -> dict:
    """What the model card says of the run: its Table 3 row, preset and deviations (from the config the checkpoint
    carries), and its dev results (from the run directory's metrics.json, where there is one)."""
    spec = config.spec if config is not None else None
    out = {
        "row": spec and spec.row,
        "preset": spec and spec.preset.name,
        "corpus": spec and spec.corpus.name,
        "deviations": [d.text for d in spec.deviations] if spec else [],
        "paper": asdict(spec.paper) if spec else None,
    }
    if run_dir:
        from aiayn.lightning_modules.run.rundir import RunDir

        metrics = RunDir(Path(run_dir)).read_metrics()
        if metrics is not None and metrics.completed:
            out.update(
                dev_bleu=metrics.dev_bleu,
                dev_bleu_signature=metrics.dev_bleu_signature,
                dev_ppl=metrics.dev_ppl,
                dev_sentences=metrics.dev_sentences,
                steps=metrics.steps,
                commit=metrics.commit,
            )
    return out


def push(folder: Path, repo: str, *, private: bool = False) -> None:
    """Upload an export to the Hugging Face Hub model repository `repo` (created if it does not exist), through
    huggingface_hub; any refusal (no token, no access, no network) is one line."""
    hub = require("huggingface_hub", "hf", "aiayn export --push-to-hub")
    api = hub.HfApi()
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo, folder_path=str(folder), repo_type="model", commit_message="aiayn export"
        )
    except Exception as e:  # HfHubHTTPError, an OSError of the network, a missing token
        reason = redact(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        raise UserError(
            f"could not push {folder} to the Hub repository {repo} ({reason}); the export is written "
            f"there: log in (`hf auth login` or HF_TOKEN) and push it again with huggingface_hub, or "
            f"rerun with a new --out"
        ) from None
    log.info("pushed %s to https://huggingface.co/%s (%s)", folder, repo, getattr(info, "commit_url", "") or "")


# --- the export's README: a model card -------------------------------------------------------------


def model_card(fmt: str, record: dict, license: str = "mit") -> str:
    """README.md of an export: Hub metadata (languages, license, datasets, the dev BLEU with its sacreBLEU
    signature as a model-index result) through huggingface_hub's ModelCardData, then how to use it, the Table 3 row
    it is, and where it leaves the paper."""
    body = readme(fmt, record)
    try:
        from huggingface_hub import EvalResult, ModelCardData
    except ImportError:  # the card's text is all a CTranslate2 user needs
        return body
    run, data = record.get("run") or {}, record.get("data") or {}
    langs = [x for x in (data.get("src_lang"), data.get("tgt_lang")) if x]
    corpus = run.get("corpus") or data.get("corpus") or ""
    dataset = CorpusRef.recorded(corpus).hub_dataset if corpus else None
    results = None
    if run.get("dev_bleu") is not None:
        results = [
            EvalResult(
                task_type="translation",
                task_name=f"Translation {'-'.join(langs)}",
                dataset_type=dataset or corpus or "unknown",
                dataset_name=corpus or "unknown",
                dataset_split="dev",
                metric_type="bleu",
                metric_value=run["dev_bleu"],
                metric_name="sacreBLEU (dev, beam search)",
                metric_config=run.get("dev_bleu_signature"),
            )
        ]
    card = ModelCardData(
        language=langs or None,
        license=license,
        library_name="transformers" if fmt == "hf" else "ctranslate2",
        pipeline_tag="translation",
        tags=["translation", "marian", "aiayn", "attention-is-all-you-need"],
        datasets=[dataset] if dataset else None,
        metrics=["bleu"],
        model_name=f"aiayn-{run.get('row') or 'model'}",
        eval_results=results,
    )
    return f"---\n{card.to_yaml()}\n---\n\n{body}"


def readme(fmt: str, record: dict) -> str:
    cfg, dec = record["model_cfg"], record["decoding"]
    run = record.get("run") or {}
    langs = f"{record['data'].get('src_lang') or 'source'} → {record['data'].get('tgt_lang') or 'target'}"
    head = (
        f"# aiayn model ({langs}), exported for {'Hugging Face Transformers' if fmt == 'hf' else 'CTranslate2'}\n\n"
        f"A Transformer (Vaswani et al., 2017) trained with aiayn {record['aiayn_version']}: N={cfg['N']}, "
        f"d_model={cfg['d_model']}, d_ff={cfg['d_ff']}, h={cfg['h']}, a joint SentencePiece vocabulary of "
        f"{cfg['vocab_size']}, at most {cfg['max_len']} tokens a sentence. From: {', '.join(record['checkpoints'])}. "
        f"`aiayn.json` records the model config, the corpus and the decoding settings.\n\n"
    )
    if run.get("row"):
        head += (
            f"**Table 3 row {run['row']}** at aiayn's preset `{run.get('preset')}` (corpus `{run.get('corpus')}`)"
            + (f", trained {run['steps']} steps" if run.get("steps") else "")
            + ". "
        )
        if run.get("dev_bleu") is not None:
            head += (
                f"Dev BLEU {run['dev_bleu']:.2f} (sacreBLEU `{run.get('dev_bleu_signature')}`, beam search, "
                f"{run.get('dev_sentences')} sentences), dev perplexity {run.get('dev_ppl')}"
                + (f"; from commit `{run['commit'][:12]}`" if run.get("commit") else "")
                + ". "
            )
        deviations = run.get("deviations") or []
        head += (
            "Where it leaves the paper: " + "; ".join(deviations) + ".\n\n"
            if deviations
            else "It follows the paper's recipe for its row at this scale.\n\n"
        )
    eos = bool(record["data"].get("source_eos"))
    if fmt == "hf":
        return head + _README_HF.format(
            beam=dec["beam"],
            alpha=dec["alpha"],
            extra=dec["extra_len"] + 2,
            eos=_README_HF_EOS if eos else _README_HF_NO_EOS,
        )
    if not eos:
        head += (
            "**The source gets no `</s>`.** The model was trained on sources without an end-of-sentence token, "
            "so encode sources without one, as below.\n\n"
        )
    return head + _README_CT2.format(
        beam=dec["beam"],
        alpha=dec["alpha"],
        extra=dec["extra_len"],
        quantization=record.get("quantization"),
        source=' + ["</s>"]' if eos else "",
    )


_README_HF = """\
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("THIS_DIRECTORY_OR_REPO")
    model = AutoModelForSeq2SeqLM.from_pretrained("THIS_DIRECTORY_OR_REPO")
    batch = tokenizer(["A man rides a bike."], padding=True, return_tensors="pt")
    out = model.generate(**batch, max_length=batch.input_ids.shape[1] + {extra})
    tokenizer.batch_decode(out, skip_special_tokens=True)

Transformers 5 has no `pipeline("translation")` (nor `text2text-generation`): call `generate` as above. The
tokenizer (`tokenizer.json`) encodes exactly as aiayn's SentencePiece model{eos} The model is a `MarianMTModel`
(post-LN, ReLU, shared embeddings × √d_model, sinusoidal positions; aiayn's weights with the model dimension permuted
from the paper's interleaved sinusoids to Marian's sin-then-cos layout, which computes the same logits), its weights
in `model.safetensors`.

`generation_config.json` holds aiayn's decoding as far as Transformers can express it: beam {beam}, length
penalty {alpha}, stop once {beam} hypotheses have ended (`early_stopping=True`), `<pad>`, `<unk>` and `<s>` never
generated, `</s>` forced at the length limit. Transformers' length penalty divides a hypothesis's
log-probability by |Y|^α where aiayn (GNMT) divides by ((5 + |Y|) / 6)^α, so a few sentences end differently
(with `length_penalty=0` both rank by log-probability alone and agree). aiayn limits each sentence to its source
length + 50 tokens (its `</s>` counted where it has one, as the tokenizer counts it); `max_length` above is the
batch's longest source + {extra} (50, the final `</s>` and the decoder's start token `<s>`), so batch sentences of one
length together to limit each as aiayn does. A blank line has no tokens to
translate: skip it.
"""
_README_HF_EOS = """ and, as aiayn trained, appends `</s>` to every source: its
defaults give aiayn's translations. `MarianTokenizer.from_pretrained` loads this directory too (`source.spm`,
`target.spm`, `vocab.json`: the same SentencePiece model and ids) and encodes the same: its default call gives
aiayn's translations as well."""
_README_HF_NO_EOS = """ and, as this model was trained (before aiayn appended `</s>` to
sources), appends no `</s>` to a source: its defaults give aiayn's translations. `MarianTokenizer.from_pretrained`
loads this directory too (`source.spm`, `target.spm`, `vocab.json`: the same SentencePiece model and ids), but
appends `</s>` to every source, and transformers has no setting that turns that off: with it, call
`tokenizer(texts, add_special_tokens=False, ...)` to get aiayn's translations."""
_README_CT2 = """\
    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file="THIS_DIRECTORY/tokenizer.model")
    translator = ctranslate2.Translator("THIS_DIRECTORY", device="cpu")
    source = [sp.encode(s, out_type=str){source} for s in ["A man rides a bike."]]
    results = translator.translate_batch(source, beam_size={beam}, length_penalty={alpha}, disable_unk=True,
                                         suppress_sequences=[["<pad>"], ["<s>"]],
                                         max_decoding_length=max(map(len, source)) + {extra})
    [sp.decode(r.hypotheses[0]) for r in results]

or, with aiayn installed: `aiayn translate --ct2 THIS_DIRECTORY < in.txt > out.txt` (the same settings, each
sentence limited to its source length + 50 tokens). Weights: {quantization}. CTranslate2's length penalty divides
a hypothesis's log-probability by |Y|^α where aiayn (GNMT) divides by ((5 + |Y|) / 6)^α, so a few sentences end
differently than with `aiayn translate --run`.
"""
