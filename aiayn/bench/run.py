"""`aiayn bench`: training and beam-search speed of aiayn's Transformer, side by side with peers.

For one set of model dimensions, vocabulary, token batch and precision it measures

- training: source+target non-pad tokens/s over timed optimizer steps (forward, label-smoothed loss,
  backward, fused Adam step, the same for every implementation) after warm-up, and the step's peak
  memory (CUDA: `max_memory_allocated`; CPU: peak resident set size above the level before the step,
  sampled every millisecond by a thread in a separate, untimed step, after glibc's `malloc_trim`
  returned freed memory, so approximate);
- decoding: beam search (beam 4) sentences/s on a fixed set of source sentences, every
  implementation run to the same maximum output length (see `_zero_eos_row`);
- with `--peers`, the same for `torch.nn.Transformer` in a thin wrapper with aiayn's embeddings,
  sinusoids, tying and dropout placement (`TorchTransformerPeer`), decoded by aiayn's own beam
  search without a key/value cache (nn.Transformer has none: every step recomputes the whole
  prefix, which is how nn.Transformer users decode), and Hugging Face `MarianMTModel` from a
  matching `MarianConfig` (no pretrained weights) decoded by its `generate`.

Implementations are measured round-robin (aiayn, torch, marian, aiayn, ...) over `--trials` rounds
and medians are reported, so a noisy machine slows them alike. On CUDA the step runs under bf16
autocast with no host synchronization inside the timed steps, and the model FLOPs of a step on its real tokens
(`model_flops`: `flops_per_step` counted analytically, padding excluded, as `aiayn doctor` counts them) give TFLOP/s
and MFU against the device's bf16 dense peak; the FLOPs computed on the padded positions are recorded beside them.
`--padding` adds the padding waste of the token-bucket batches on the synthetic corpus and, with
`--multi30k-dir`, on Multi30k.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import logging
import math
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.bench import BenchOptions
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_text, check_writable_file
from aiayn.lightning_modules.transformer.compiled import resolve_compile
from aiayn.lightning_modules.transformer.decoding import beam_search
from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss
from aiayn.lightning_modules.transformer.model import (
    BOS,
    EOS,
    PAD,
    Transformer,
    TransformerConfig,
    residual_stream,
    sinusoid_table,
)
from aiayn.lightning_modules.use.export import marian_config

log = logging.getLogger(__name__)

IMPLS = ("aiayn", "torch_nn_transformer", "hf_marian")

# bf16 dense (no sparsity) tensor-core peaks in TFLOP/s, from the vendors' data sheets
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0}


# --- configurations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    name: str
    model: TransformerConfig
    tokens_per_side: int  # padded positions per side in the training batch
    seq_len: int  # padded length of the training batch's sentences
    note: str


def bench_config(name: str, device: str, layers: int | None = None, tokens: int | None = None) -> BenchConfig:
    """`evidence`: the evidence preset's base row (the evidence tables' model); `tiny`: the tiny preset's base row;
    `laptop`: the laptop preset's base row (the tiny model at vocabulary 8000, Multi30k's); `base`: the paper's base
    widths, vocabulary 8000, 2 layers per stack on CPU (6 on CUDA) to keep CPU runs short; `paper`: the paper's base
    row at 37000 vocabulary, 25k+25k tokens."""
    from aiayn.lightning_modules.run.spec import resolve

    if name == "evidence":  # the evidence table's size (d_model 32), sentences of 5-20 words
        cfg, tok, T, note = resolve("base", "evidence").model, 1024, 24, "evidence preset, base row"
    elif name == "tiny":
        cfg, tok, T, note = resolve("base", "tiny").model, 1024, 32, "tiny preset, base row"
    elif name == "laptop":
        cfg, tok, T, note = resolve("base", "laptop").model, 1024, 32, "laptop preset, base row (vocabulary 8000)"
    elif name == "base":
        n = 6 if device == "cuda" else 2
        cfg = resolve("base", "paper", overrides={"N": n}, vocab_size=8000).model
        tok, T, note = 2048 if device == "cpu" else 8192, 32, f"paper base widths, N={n}, vocabulary 8000"
    elif name == "paper":
        cfg, tok, T, note = resolve("base", "paper").model, 25000, 40, "paper base row, vocabulary 37000"
    else:
        raise ValueError(f"unknown bench config {name!r}; choose evidence, tiny, laptop, base or paper")
    if layers is not None:
        cfg = TransformerConfig.from_dict(cfg.to_dict() | {"N": layers})
        note += f" (N overridden to {layers})"
    return BenchConfig(name, cfg, tokens or tok, T, note)


def training_batch(cfg: TransformerConfig, tokens_per_side: int, seq_len: int, seed: int = 0) -> dict:
    """A fixed batch like the token-bucket sampler's: B = tokens/seq_len sentences whose source and
    target lengths are drawn uniformly from [0.8·T, T], padded to T (about 10% padding)."""
    g = torch.Generator().manual_seed(seed)
    B = max(1, tokens_per_side // seq_len)
    lo = max(2, int(0.8 * seq_len))

    def side(length):
        lens = torch.randint(lo, length + 1, (B,), generator=g, device="cpu")
        ids = torch.randint(4, cfg.vocab_size, (B, length), generator=g, device="cpu")
        return ids.masked_fill(torch.arange(length, device="cpu")[None, :] >= lens[:, None], PAD)

    src, tgt = side(seq_len), side(seq_len + 1)  # target with BOS … EOS: input and output shifted by one
    tgt[:, 0] = BOS
    tgt_in, tgt_out = tgt[:, :-1].clone(), tgt[:, 1:].clone()
    return {
        "src": src,
        "tgt_in": tgt_in,
        "tgt_out": tgt_out,
        "n_src_tokens": int((src != PAD).sum()),
        "n_tgt_tokens": int((tgt_out != PAD).sum()),
    }


def decode_sources(cfg: TransformerConfig, n: int, src_len: int, device: torch.device, seed: int = 1) -> Tensor:
    """n source sentences of exactly src_len tokens (no padding, so every implementation's length
    limit, src_len + extra, is the same for every sentence), on `device` (drawn on the CPU: the same on any)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, cfg.vocab_size, (n, src_len), generator=g, device="cpu").to(device)


# --- FLOPs ----------------------------------------------------------------------------------------


def flops_per_step(cfg: TransformerConfig, src_tokens: int, tgt_tokens: int, src_len: int, tgt_len: int) -> float:
    """Model FLOPs of one training step (forward + backward), counted analytically.

    `src_tokens`/`tgt_tokens` are the positions computed (padded, B·S and B·T); `src_len`/`tgt_len` the
    padded lengths that each query attends over. A matmul of an (m × k) by a (k × n) matrix costs 2·m·k·n.
    Forward, per position:
    - encoder layer: projections 2·(2·d·h·d_k + 2·d·h·d_v) (Q, K, V, O), FFN 2·(2·d·d_ff);
      attention QKᵀ and AV: 2·S·h·(d_k + d_v);
    - decoder layer: self-attention as the encoder's over T (the causal square counted whole, as dense
      kernels compute it), cross-attention Q and O per target position and K, V per source position
      (2·d·h·d_k + 2·d·h·d_v each side), its QKᵀ/AV over S, FFN;
    - output projection 2·d·V per target position (embedding lookups, layer norms, softmax, the loss
      and the optimizer are not matmuls and not counted).
    Backward is twice the forward (gradients with respect to both inputs of every matmul): step = 3 × forward.
    """
    d, h, dk, dv, ff, N, V = cfg.d_model, cfg.h, cfg.d_k, cfg.d_v, cfg.d_ff, cfg.N, cfg.vocab_size
    qo = 2 * (d * h * dk + h * dv * d)  # Q and output projections, per query position
    kv = 2 * (d * h * dk + d * h * dv)  # K and V projections, per key position
    ffn = 2 * 2 * d * ff
    attn = lambda keys: 2 * keys * h * (dk + dv)  # QKᵀ and AV per query position
    enc = N * src_tokens * (qo + kv + ffn + attn(src_len))
    dec = N * (tgt_tokens * (qo + kv + attn(tgt_len) + qo + attn(src_len) + ffn) + src_tokens * kv)
    out = tgt_tokens * 2 * d * V
    return 3.0 * (enc + dec + out)


def model_flops(cfg: TransformerConfig, batch: dict) -> float:
    """Model FLOPs of one training step on a batch's real tokens (padding excluded, as MFU counts useful work): the
    one definition of MFU's numerator, for the bench and `aiayn doctor` alike. `flops_per_step` with the real source
    and target tokens as positions, each attending over its side's mean real length."""
    B = batch["src"].shape[0]
    n_src, n_tgt = batch["n_src_tokens"], batch["n_tgt_tokens"]
    return flops_per_step(cfg, n_src, n_tgt, n_src / B, n_tgt / B)


def peak_bf16_tflops(device_name: str) -> float | None:
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in device_name:
            return PEAK_BF16_TFLOPS[key]
    return None


# --- peers ----------------------------------------------------------------------------------------


class TorchTransformerPeer(nn.Module):
    """`torch.nn.Transformer` with aiayn's surroundings: one embedding shared by source, target and the
    output projection, × √d_model, interleaved sinusoids, dropout on embedding sums and sub-layer outputs.

    Built to do the same work: post-LN, ReLU, no final stack norms (nn.Transformer adds them by default;
    the paper's post-LN output is already normalized), and nn.Transformer's extra dropouts on attention
    probabilities and the FFN's hidden layer switched off (the paper has neither). With that its parameter
    count equals aiayn's exactly. It has no key/value cache: `decode_step` reruns the decoder over the whole
    prefix, which is how nn.Transformer is decoded; the interface is aiayn's, so aiayn's beam search drives it.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD)
        self.register_buffer("pe_table", sinusoid_table(cfg.max_len, d), persistent=False)
        self.drop = nn.Dropout(cfg.P_drop)
        enc_layer = nn.TransformerEncoderLayer(d, cfg.h, cfg.d_ff, cfg.P_drop, "relu", batch_first=True)
        dec_layer = nn.TransformerDecoderLayer(d, cfg.h, cfg.d_ff, cfg.P_drop, "relu", batch_first=True)
        encoder = nn.TransformerEncoder(enc_layer, cfg.N, norm=None, enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(dec_layer, cfg.N, norm=None)
        self.transformer = nn.Transformer(
            d,
            cfg.h,
            cfg.N,
            cfg.N,
            cfg.d_ff,
            cfg.P_drop,
            "relu",
            custom_encoder=encoder,
            custom_decoder=decoder,
            batch_first=True,
            norm_first=False,
        )
        for layer in [*encoder.layers, *decoder.layers]:
            layer.dropout = nn.Identity()  # FFN hidden-layer dropout: not in the paper
            for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = 0.0  # attention-probability dropout: not in the paper
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()

    def _embed(self, tokens: Tensor) -> Tensor:
        return self.drop(self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.pe_table[: tokens.shape[1]])

    def _decode(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
        T = tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt_in.device, dtype=memory.dtype)
        y = self.transformer.decoder(
            self._embed(tgt_in), memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=src_pad
        )
        return F.linear(y, self.embed.weight)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, src_pad = self.encode(src)
        return self._decode(tgt_in, memory, src_pad)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        src_pad = src == PAD  # nn.Transformer's convention: True = padding
        return self.transformer.encoder(self._embed(src), src_key_padding_mask=src_pad), src_pad

    def start_cache(self, memory: Tensor, src_pad: Tensor, group: int = 1) -> dict:
        memory, src_pad = memory.repeat_interleave(group, 0), src_pad.repeat_interleave(group, 0)  # per hypothesis
        return {"memory": memory, "src_pad": src_pad, "prefix": memory.new_empty(memory.shape[0], 0, dtype=torch.long)}

    def decode_step(self, tokens: Tensor, cache: dict) -> Tensor:
        cache["prefix"] = prefix = torch.cat([cache["prefix"], tokens], dim=1)  # (B, t): the whole prefix again
        logits = self._decode(prefix, cache["memory"], cache["src_pad"])[:, -1]
        return F.log_softmax(logits.float(), dim=-1)

    @staticmethod
    def reorder_cache(cache: dict, index: Tensor, sentences: Tensor | None = None) -> None:
        for key in ("memory", "src_pad", "prefix"):
            cache[key] = cache[key].index_select(0, index)


def build_marian(cfg: TransformerConfig):
    from transformers import MarianMTModel

    if cfg.d_k * cfg.h != cfg.d_model or cfg.d_v * cfg.h != cfg.d_model:
        raise ValueError("MarianMTModel needs d_k = d_v = d_model / h")
    return MarianMTModel._from_config(marian_config(cfg), attn_implementation="sdpa")


def _zero_eos_row(model: nn.Module, impl: str) -> None:
    """Untrained models end sentences at random; zeroing EOS's (tied) embedding row gives EOS the logit 0,
    far below the top 2·beam of a vocabulary's N(0, σ) logits, so every implementation decodes every
    sentence to the same length limit (the worst case, and the same work for all)."""
    weight = model.get_input_embeddings().weight if impl == "hf_marian" else model.embed.weight
    with torch.no_grad():
        weight[EOS].zero_()


def build(impl: str, cfg: TransformerConfig, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if impl == "aiayn":
        model = Transformer(cfg)
    elif impl == "torch_nn_transformer":
        model = TorchTransformerPeer(cfg)
    elif impl == "hf_marian":
        model = build_marian(cfg)
    else:
        raise ValueError(impl)
    _zero_eos_row(model, impl)
    return model


def trainable_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --- measurement ----------------------------------------------------------------------------------


def _logits(impl: str, model: nn.Module, batch: dict) -> Tensor:
    if impl == "hf_marian":
        out = model(
            input_ids=batch["src"], attention_mask=(batch["src"] != PAD).long(), decoder_input_ids=batch["tgt_in"]
        )
        return out.logits
    return model(batch["src"], batch["tgt_in"])


class Trainer:
    """One implementation's training step: forward, label-smoothed loss (ε_ls of the config), backward, Adam.

    Every implementation gets the same optimizer, Adam with `fused=True`: what aiayn trains with and what
    Hugging Face's Trainer defaults to on torch >= 2.8 (`adamw_torch_fused`; AdamW at weight decay 0 is Adam)."""

    def __init__(
        self,
        impl: str,
        model: nn.Module,
        cfg: TransformerConfig,
        batch: dict,
        device: torch.device,
    ):
        self.impl, self.model, self.cfg, self.device = impl, model, cfg, device
        self.batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        b = self.batch
        with self.autocast:
            if self.impl == "aiayn":  # aiayn's training_step: projection and loss fused, no (B, T, V) logits
                memory, src_mask = self.model.encode(b["src"])
                hidden = self.model.decode(b["tgt_in"], memory, src_mask)
                weight, eps = self.model.embed.weight, self.cfg.eps_ls
                loss, _, _ = projected_label_smoothed_loss(hidden, weight, b["tgt_out"], eps)
            else:  # a peer's user: logits, then PyTorch's own label-smoothed cross-entropy
                logits = _logits(self.impl, self.model, b).flatten(0, 1)
                loss = F.cross_entropy(
                    logits.float(), b["tgt_out"].flatten(), ignore_index=PAD, label_smoothing=self.cfg.eps_ls
                )
        loss.backward()  # no .item(): nothing here waits for the device
        self.opt.step()

    def timed(self, steps: int) -> float:
        return time_steps(self.step, self.device, steps)


def time_steps(step: Callable[[], None], device: torch.device, steps: int) -> float:
    """Seconds per call of `step` over `steps` calls, synchronizing the device only before and after."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / steps


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def decode(impl: str, model: nn.Module, sources: Tensor, batch: int, beam: int, extra: int, alpha: float) -> int:
    """Beam-search every source in batches; returns the number of sentences decoded."""
    model.eval()
    try:
        for i in range(0, sources.shape[0], batch):
            src = sources[i : i + batch]
            if impl == "hf_marian":
                # aiayn decodes src_len + extra tokens then forces EOS: src_len + extra + 1 decoder steps
                model.generate(
                    input_ids=src,
                    attention_mask=torch.ones_like(src),
                    num_beams=beam,
                    do_sample=False,
                    max_new_tokens=src.shape[1] + extra + 1,
                    length_penalty=alpha,
                    early_stopping=True,
                    num_return_sequences=1,
                    decoder_start_token_id=BOS,
                    eos_token_id=EOS,
                    pad_token_id=PAD,
                    forced_eos_token_id=EOS,
                    use_cache=True,
                )
            else:
                beam_search(model, src, BOS, EOS, beam=beam, alpha=alpha, extra_len=extra)
    finally:
        model.train()
    return sources.shape[0]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _trim_heap() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory_mb(fn, device: torch.device) -> float:
    """Peak memory of one call of fn above the level before it: CUDA max_memory_allocated, CPU sampled RSS."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    if not os.path.exists("/proc/self/statm"):  # not Linux: whole-process peak, an upper bound
        fn()
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _trim_heap()
    base, peak, stop = _rss_bytes(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()
    peak[0] = max(peak[0], _rss_bytes())
    return max(0, peak[0] - base) / 2**20


def padding_report(multi30k_dir: str | None, cache_dir: str | None) -> list[dict]:
    """Padding waste of the token-bucket batches of the training split (one epoch's batches)."""
    from aiayn.lightning_modules.data.batching import batch_shapes, padding_stats
    from aiayn.lightning_modules.data.corpora import CorpusRef
    from aiayn.lightning_modules.data.datamodule import DataIdentity, DataPlan, TranslationDataModule

    setups = [("synthetic", None, 1000, 1024)]
    if multi30k_dir:
        setups += [("multi30k", multi30k_dir, 8000, 8192), ("multi30k", multi30k_dir, 8000, 4096)]
    out = []
    for corpus, data_dir, vocab, max_tokens in setups:
        log.info("padding: %s, vocabulary %d, max_tokens %d", corpus, vocab, max_tokens)
        identity = DataIdentity(CorpusRef.parse(corpus), data_dir, vocab)
        dm = TranslationDataModule(DataPlan(identity, cache_dir, max_tokens))
        dm.setup("fit")
        s = dm._samplers["train"]
        for pad_to, static in PAD_TO:
            s.static_bucket = pad_to if static else None
            batches = s.all_batches()
            frac = padding_stats(batches, s.src_lens, s.tgt_lens, pad_to, square=static)
            shapes = len(batch_shapes(batches, s.src_lens, s.tgt_lens, pad_to, square=static))
            real = sum(int(s.tgt_lens[b].sum()) + len(b) for b in batches) / len(batches)
            out.append(
                {
                    "corpus": corpus,
                    "vocab_size": vocab,
                    "max_tokens": max_tokens,
                    "pad_to": pad_to,
                    "static_shapes": static,
                    "padding_fraction": frac,
                    "batches": len(batches),
                    "distinct_shapes": shapes,
                    "real_target_tokens_per_batch": real,
                }
            )
            log.info(
                "padding: %s max_tokens %d, pad to %d%s: %.2f%% padded positions, %d distinct shapes in %d batches",
                corpus,
                max_tokens,
                pad_to,
                ", static shapes" if static else "",
                100 * frac,
                shapes,
                len(batches),
            )
        s.static_bucket = None
    return out


# --padding: no buckets; the length buckets of --pad-to 8 and 16; the static shapes of --static-shapes with them
PAD_TO = ((1, False), (8, False), (16, False), (8, True), (16, True))


def resolve_residual(asked: str, cuda: bool) -> str:
    """--residual-dtype as the bench's step runs it: auto is bf16 on a CUDA device (its step runs bf16 autocast, where
    `aiayn train`'s default keeps a bf16 stream), fp32 on a CPU (fp32, no autocast)."""
    return ("bf16" if cuda else "fp32") if asked == "auto" else asked


def run(args: BenchOptions) -> list[dict]:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    bc = bench_config(args.size, device.type, args.layers, args.tokens)
    cfg = bc.model
    impls = list(IMPLS if args.peers else IMPLS[:1])
    if args.peers:
        try:
            import transformers

            transformers.logging.set_verbosity_error()
        except ImportError:
            log.warning("transformers is not installed: hf_marian skipped (pip install 'aiayn[bench]')")
            impls.remove("hf_marian")
    batch = training_batch(cfg, bc.tokens_per_side, bc.seq_len)
    sources = decode_sources(cfg, args.decode_sentences, args.decode_src_len, device)
    B, S = batch["src"].shape
    T = batch["tgt_in"].shape[1]
    flops, computed = model_flops(cfg, batch), flops_per_step(cfg, B * S, B * T, S, T)
    label = device_name(device)
    peak = peak_bf16_tflops(label) if device.type == "cuda" else None
    log.info("config %s: %s; batch %d×%d, %s, %d threads", bc.name, bc.note, B, S, label, torch.get_num_threads())

    models = {impl: build(impl, cfg).to(device) for impl in impls}
    cuda = device.type == "cuda"
    residual = resolve_residual(args.residual_dtype, cuda)
    if residual == "bf16":  # before compiling: the stream's casts are in the traced code
        residual_stream(models["aiayn"], torch.bfloat16)
    compiled = resolve_compile(args.compile, cuda)
    if compiled != "none":
        from aiayn.lightning_modules.transformer.compiled import compile_model

        # as `aiayn train` compiles by default (no --static-shapes): for symbolic shapes, the first batch's compile
        # serving every length; decoding runs eager (compiled code runs only where autograd records)
        compile_model(models["aiayn"], compiled, dynamic=True, cuda=cuda)
    trainers = {i: Trainer(i, models[i], cfg, batch, device) for i in impls}
    tokens = batch["n_src_tokens"] + batch["n_tgt_tokens"]
    step_s: dict[str, list[float]] = {impl: [] for impl in impls}
    dec_s: dict[str, list[float]] = {impl: [] for impl in impls}
    mem: dict[str, float] = {}
    for impl in impls:  # warm-up (allocator, kernels, Adam state), then one untimed step for memory
        for _ in range(args.warmup):
            trainers[impl].step()
        mem[impl] = peak_memory_mb(trainers[impl].step, device)
        params = trainable_params(models[impl])
        log.info("%s: warm, %s params, training step peak memory %.0f MB", impl, params, mem[impl])
        decode(impl, models[impl], sources[: min(2, len(sources))], args.decode_batch, args.beam, 2, args.alpha)
    for trial in range(args.trials):  # round robin: a slow spell of the machine hits every implementation
        for impl in impls:
            s = trainers[impl].timed(args.steps)
            step_s[impl].append(s)
            log.info("trial %d %s: training %.3f s/step, %.0f tokens/s", trial + 1, impl, s, tokens / s)
        for impl in impls:
            _sync(device)
            t0 = time.perf_counter()
            n = decode(impl, models[impl], sources, args.decode_batch, args.beam, args.decode_extra, args.alpha)
            _sync(device)
            dec_s[impl].append(time.perf_counter() - t0)
            log.info("trial %d %s: decoding %.2f sentences/s", trial + 1, impl, n / dec_s[impl][-1])

    results = []
    for impl in impls:
        s, d = statistics.median(step_s[impl]), statistics.median(dec_s[impl])
        r = {
            "impl": impl,
            "config": bc.name,
            "config_note": bc.note,
            "model": cfg.to_dict(),
            "device": device.type,
            "device_name": label,
            "threads": torch.get_num_threads(),
            "precision": "bf16-mixed" if device.type == "cuda" else "fp32",
            "residual_dtype": residual if impl == "aiayn" else "fp32",
            "torch": torch.__version__,
            "params": trainable_params(models[impl]),
            "batch_sentences": B,
            "batch_padded_positions_per_side": B * S,
            "batch_tokens": tokens,
            "trials": args.trials,
            "steps_per_trial": args.steps,
            "train_step_s": s,
            "train_tokens_per_s": tokens / s,
            "peak_mem_mb": mem[impl],
            "decode_sentences": len(sources),
            "decode_src_len": args.decode_src_len,
            "decode_max_len": args.decode_src_len + args.decode_extra,
            "beam": args.beam,
            "alpha": args.alpha,
            "decode_sentences_per_s": len(sources) / d,
            "model_flops_per_step": flops,
            "padded_flops_per_step": computed,
            "achieved_tflops": flops / s / 1e12,
            "compile": compiled if impl == "aiayn" else "none",
            "compile_shapes": "dynamic" if impl == "aiayn" and compiled != "none" else None,
        }
        if impl == "aiayn" and compiled != "none":  # what dynamo made: graphs, and any function it gave up on
            from torch._dynamo.utils import counters

            r["graphs_compiled"] = int(counters["stats"]["unique_graphs"])
            r["recompile_limit_hit"] = sum(v for k, v in counters["unimplemented"].items() if "recompile limit" in k)
        if peak:
            r["peak_bf16_tflops"] = peak
            r["mfu"] = flops / s / 1e12 / peak
        results.append(r)
    if args.profile:  # after the timed trials, so that the profiler's overhead is in no timing
        from aiayn.bench.profile import profile_steps

        if args.json:  # the timed figures first: a call's limit that cuts the profile loses only the profile
            atomic_write_text(args.json, json.dumps(results, indent=2) + "\n")
        results[0]["profile"] = profile_steps(trainers["aiayn"].step, device, args.steps)
    if args.padding:
        pad = padding_report(args.multi30k_dir, args.cache_dir)
        for r in results:
            r["padding"] = pad
    return results


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model and cores: what a figure is labelled with."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"cpu ({os.cpu_count()} cores)"


def table(results: list[dict]) -> str:
    base = results[0]
    lines = [
        "| implementation | train tokens/s | × aiayn | step s | peak MB | decode sent/s | × aiayn | params |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['impl']} | {r['train_tokens_per_s']:.0f} "
            f"| {r['train_tokens_per_s'] / base['train_tokens_per_s']:.2f} "
            f"| {r['train_step_s']:.3f} | {r['peak_mem_mb']:.0f} | {r['decode_sentences_per_s']:.2f} "
            f"| {r['decode_sentences_per_s'] / base['decode_sentences_per_s']:.2f} | {r['params']:,} |"
        )
    r = base
    lines.append(
        f"\nmodel FLOPs per training step {r['model_flops_per_step'] / 1e9:.1f} GFLOP on its real tokens "
        f"({r['padded_flops_per_step'] / 1e9:.1f} computed with the padding); "
        f"aiayn {r['achieved_tflops'] * 1e3:.1f} "
        f"GFLOP/s" + (f", MFU {100 * r['mfu']:.1f}% of {r['peak_bf16_tflops']:.0f} TFLOP/s bf16" if "mfu" in r else "")
    )
    if "profile" in r:
        from aiayn.bench.profile import profile_text

        lines.append(profile_text(r["impl"], r["profile"]))
    for p in r.get("padding", []):
        lines.append(
            f"padding {p['corpus']} (max_tokens {p['max_tokens']}, lengths to a multiple of {p['pad_to']}"
            f"{', static shapes' if p['static_shapes'] else ''}): {100 * p['padding_fraction']:.2f}%, "
            f"{p['distinct_shapes']} distinct shapes in {p['batches']} batches, "
            f"{p['real_target_tokens_per_batch']:.0f} real target tokens a batch"
        )
    return "\n".join(lines)


def resolve_device(opts: BenchOptions) -> str:
    """--device: auto is cuda when available; cuda without a visible device is a user error, and so is a bf16
    residual stream without CUDA (the bench's step runs bf16 autocast on CUDA only: on a CPU it is fp32, and the
    flag would change nothing)."""
    device = opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is available; use --device cpu")
    if opts.residual_dtype == "bf16" and device != "cuda":
        why = "bf16 autocast, which the bench runs on CUDA only"
        raise UserError(
            f"--residual-dtype bf16 keeps the residual stream in bf16 under {why}, and this bench runs on {device} in "
            "fp32; drop --residual-dtype"
        )
    return device


def bench_main(opts: BenchOptions, bench, show) -> int:
    """Run `bench(opts)` on the resolved device, print `show(results)`, and write the results to --json (checked
    writable before anything is measured): each bench's main."""
    if opts.json:
        check_writable_file(opts.json, "--json")
    results = bench(dataclasses.replace(opts, device=resolve_device(opts)))
    print(show(results))
    if opts.json:
        atomic_write_text(opts.json, json.dumps(results, indent=2) + "\n")
    return 0


def main(opts: BenchOptions) -> int:
    if opts.trainer_sizes:
        raise UserError("--trainer-size is for --trainer; pass --size SIZE for the implementations' bench")
    return bench_main(opts, run, table)
