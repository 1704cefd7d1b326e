"""The model against paper §3 and against PyTorch's own attention: numbers pinned."""

import pytest
import torch
from torch import nn

from aiayn.lightning_modules.transformer.config import PE_KINDS
from aiayn.lightning_modules.transformer.decoding import beam_search, greedy
from aiayn.lightning_modules.transformer.model import (
    Dropout,
    MultiHeadAttention,
    Residual,
    Transformer,
    TransformerConfig,
    attention,
    residual_stream,
    sinusoid_table,
)


@pytest.fixture(autouse=True)
def _through_both_paths(both_paths):
    """Every test here runs with the CPU fast paths and through the code a GPU takes (tests/conftest.py)."""


def small_cfg(**kw):
    return TransformerConfig(
        **{"N": 2, "d_model": 32, "d_ff": 64, "h": 4, "vocab_size": 50, "P_drop": 0.0, "max_len": 64, **kw}
    )


def test_sinusoid_values_at_known_positions():
    pe = sinusoid_table(64, 512)
    # PE(pos, 2i) = sin(pos / 10000^(2i/512)), PE(pos, 2i+1) = cos(same), hand-computed
    expected = {
        (0, 0): 0.0,
        (0, 1): 1.0,
        (1, 0): 0.8414709848,
        (1, 1): 0.5403023059,
        (2, 2): 0.9364147386,
        (2, 3): -0.3508951941,
        (50, 100): 0.9130465830,
        (50, 101): -0.4078552895,
    }
    for (pos, i), value in expected.items():
        assert pe[pos, i].item() == pytest.approx(value, abs=1e-6), (pos, i)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"d_model": 30, "h": 4}, "d_k"),
        ({"P_drop": 1.0}, "P_drop"),
        ({"P_drop": -0.1}, "P_drop"),
        ({"eps_ls": 1.5}, "eps_ls"),
        ({"pe": "fourier"}, "pe"),
        ({"N": 0}, "N"),
        ({"d_k": 0}, "d_k"),
        ({"pe": "rope", "d_k": 7}, "d_k"),
        ({"vocab_size": -3}, "vocab_size"),
    ],
)
def test_impossible_configs_fail_at_construction_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"invalid model config: {field} must be"):
        small_cfg(**kw)


def test_d_k_d_v_free_of_d_model_over_h():
    cfg = small_cfg(h=2, d_k=5, d_v=7)
    attn = Transformer(cfg).encoder[0].self_attn
    assert attn.w_q.weight.shape == (10, 32) and attn.w_k.weight.shape == (10, 32)
    assert attn.w_v.weight.shape == (14, 32) and attn.w_o.weight.shape == (32, 14)


def test_attention_equals_torch_multihead_attention():
    torch.manual_seed(0)
    d, h = 32, 4
    ours = MultiHeadAttention(d, h, d // h, d // h)
    ref = nn.MultiheadAttention(d, h, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        ref.out_proj.bias.copy_(ours.w_o.bias)
    x, mem = torch.randn(3, 5, d), torch.randn(3, 7, d)
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[1, 4:] = False
    got = ours(x, ours.project_kv(mem), mask=keep[:, None, None, :])
    want, _ = ref(x, mem, mem, key_padding_mask=~keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_self_attention_projects_q_k_v_in_one_matmul_with_the_same_parameters():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, 3, 5)
    x = torch.randn(2, 4, 16)
    q, k, v = attn.project_qkv(x)
    torch.testing.assert_close(q, attn.split(attn.w_q(x), 3))
    torch.testing.assert_close((k, v), attn.project_kv(x))
    torch.testing.assert_close(attn(x, causal=True), attn(x, attn.project_kv(x), causal=True))


@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
@pytest.mark.parametrize("queries,keys", [(4, 6), (40, 80), (1, 80), (80, 40)])
def test_attention_equals_the_fused_kernel_on_both_paths(mask, queries, keys):
    """Eq. 1 as plain ops (few keys or few queries, on CPU) and the fused kernel, against the math reference,
    forward and backward."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, queries, 8), torch.randn(3, 2, keys, 8), torch.randn(3, 2, keys, 5)
    keep = torch.ones(3, 1, 1, keys, dtype=torch.bool)
    keep[1, ..., keys - 2 :] = False
    m = {"bool": keep, "additive": torch.zeros(keep.shape).masked_fill_(~keep, float("-inf"))}.get(mask)
    causal = mask == "causal"
    qkv = [t.clone().requires_grad_() for t in (q, k, v)]
    got = attention(*qkv, m, causal)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=keep if m is not None else None, is_causal=causal
        )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    scores = ref[0] @ ref[1].transpose(-2, -1) / 8**0.5
    if m is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(queries, keys, dtype=torch.bool).triu(1), float("-inf"))
    (scores.softmax(-1) @ ref[2]).sum().backward()
    for a, b in zip(qkv, ref):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4)


def test_attention_is_equation_1_with_unequal_d_k_d_v():
    torch.manual_seed(1)
    attn = MultiHeadAttention(16, 2, 3, 5)
    x = torch.randn(2, 4, 16)
    q = attn.split(attn.w_q(x), 3)
    k, v = attn.project_kv(x)
    weights = torch.softmax(q @ k.transpose(-1, -2) / 3**0.5, dim=-1)  # softmax(QK^T / sqrt(d_k))
    manual = attn.w_o((weights @ v).transpose(1, 2).reshape(2, 4, 10))
    torch.testing.assert_close(attn(x, (k, v)), manual, atol=1e-5, rtol=1e-5)


def test_embeddings_shared_and_scaled():
    model = Transformer(small_cfg())
    assert model.project(torch.eye(32)).shape == (32, 50)
    torch.testing.assert_close(model.project(torch.eye(32)), model.embed.weight.T)
    model.eval()
    tok = torch.tensor([[7]])
    torch.testing.assert_close(
        model.embed_tokens(tok)[0, 0], model.embed.weight[7] * 32**0.5 + model.positions.table[0]
    )


@pytest.mark.parametrize("pe", list(PE_KINDS))
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_full_decoding_step_by_step(pe, norm_first):
    torch.manual_seed(0)
    model = Transformer(small_cfg(pe=pe, norm_first=norm_first)).eval()
    src = torch.randint(4, 50, (3, 7))
    src[0, 5:] = 0
    tgt = torch.randint(4, 50, (3, 6))
    full = torch.log_softmax(model(src, tgt), dim=-1)
    cache = model.start_cache(*model.encode(src))
    for t in range(tgt.shape[1]):
        step = model.decode_step(tgt[:, t : t + 1], cache)
        assert cache["layers"][0]["k"].shape[2] == t + 1  # the self-attention cache grows by one
        torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)


def test_beam_one_equals_greedy_and_beam_four_is_no_worse():
    torch.manual_seed(3)
    model = Transformer(small_cfg()).eval()
    src = torch.randint(4, 50, (5, 8))
    src[2, 4:] = 0
    g = greedy(model, src, bos=2, eos=3, extra_len=6)
    assert beam_search(model, src, bos=2, eos=3, beam=1, extra_len=6) == g
    assert all(len(y) <= int((s != 0).sum()) + 6 for y, s in zip(g, src))  # max length = |x| + extra


class MemoryPerHypothesis(nn.Module):
    """The model with the decoding cache of before: the encoder's keys/values copied for every hypothesis and
    selected with the hypotheses at every step (group 1)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.cfg = model, model.cfg

    def encode(self, src):
        return self.model.encode(src)

    def start_cache(self, memory, src_mask, group=1):
        cache = self.model.start_cache(memory.repeat_interleave(group, 0), src_mask.repeat_interleave(group, 0))
        return cache

    def decode_step(self, tokens, cache):
        return self.model.decode_step(tokens, cache)

    def reorder_cache(self, cache, index, sentences=None):
        self.model.reorder_cache(cache, index)


@pytest.mark.parametrize("pe", ["sinusoid", "rope"])
def test_beam_search_with_memory_per_sentence_equals_memory_per_hypothesis(pe):
    """Beam search keeps the encoder's keys/values once per sentence (queries of its K hypotheses grouped):
    the same hypotheses and scores as with a copy per hypothesis, sentences of unequal lengths leaving the
    batch at different steps."""
    torch.manual_seed(5)
    model = Transformer(small_cfg(pe=pe)).eval()
    src = torch.randint(4, 50, (6, 9))
    src[1, 3:], src[4, 6:] = 0, 0
    ours = beam_search(model, src, bos=2, eos=3, beam=4, extra_len=5)
    before = beam_search(MemoryPerHypothesis(model), src, bos=2, eos=3, beam=4, extra_len=5)
    assert ours == before and any(len(y) > 0 for y in ours)


def test_decoding_stops_at_eos():
    torch.manual_seed(0)
    model = Transformer(small_cfg()).eval()
    with torch.no_grad():  # make EOS (id 3) overwhelmingly likely: every sentence ends at once
        model.embed.weight[3] *= 50
    src = torch.randint(4, 50, (2, 5))
    assert greedy(model, src, 2, 3) == [[], []]
    assert beam_search(model, src, 2, 3, beam=4) == [[], []]


def test_dropout_drops_p_drop_of_the_elements_and_keeps_the_expectation():
    """The CPU mask (31 random bits against P_drop · 2^31): the drop rate, the 1 / (1 - p) scale, the gradient
    through the same mask, torch.manual_seed fixing it, and the identity in eval mode."""
    drop = Dropout(0.1)
    x = torch.ones(1000, 1000, requires_grad=True)
    torch.manual_seed(0)
    y = drop(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002  # 1M Bernoulli(0.1) draws: std 0.0003
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.9))
    assert abs(y.mean().item() - 1.0) < 0.003
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(x · mask)/dx = mask
    torch.manual_seed(0)
    assert torch.equal(drop(x), y)
    assert not torch.equal(drop(x), y)  # a fresh mask per call
    drop.eval()
    assert drop(x) is x
    assert Dropout(0.0)(x) is x


def test_an_empty_source_gives_a_finite_perplexity_and_a_translation():
    """A dev line with no source tokens: every key of its cross-attention is masked. The plain-ops path once gave
    NaN (softmax over -inf only) where scaled_dot_product_attention gives zeros; both give zeros now."""
    from aiayn.lightning_modules.run.evaluate import nll_sum
    from aiayn.lightning_modules.transformer.decoding import beam_search

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=20, max_len=64)).eval()
    src = torch.tensor([[5, 6, 7], [0, 0, 0]])  # the second sentence is empty: all padding
    batch = {
        "src": src,
        "tgt_in": torch.tensor([[2, 8, 9], [2, 8, 0]]),
        "tgt_out": torch.tensor([[8, 9, 3], [8, 3, 0]]),
    }
    with torch.no_grad():
        nll, n = nll_sum(model, batch)
        hyps = beam_search(model, src, 2, 3, beam=2, alpha=0.6, extra_len=3)
    assert torch.isfinite(nll) and n == 5 and len(hyps) == 2


def test_a_query_with_no_key_gets_zeros_on_the_fused_path_whatever_the_kernel(monkeypatch):
    """Some CUDA attention kernels return NaN for a query whose keys are all masked (an empty source),
    CPU's return zeros. The fused path no longer leaves it to the kernel: with a kernel that gives NaN there (as
    those CUDA ones), rows with keys are unchanged and the empty row is zeros."""
    from aiayn.lightning_modules.transformer import model as M

    real = torch.nn.functional.scaled_dot_product_attention

    def nan_where_nothing_to_attend(q, k, v, attn_mask=None, is_causal=False):
        out = real(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        empty = ~attn_mask.any(-1, keepdim=True)
        return out.masked_fill(empty, float("nan"))

    monkeypatch.setattr(M, "CPU_FAST_PATHS", False)  # the code a GPU takes
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for n in (5, 70, 70))
    mask = torch.ones(2, 1, 1, 70, dtype=torch.bool)
    mask[1] = False  # the second source is empty
    expected = real(q[:1], k[:1], v[:1], attn_mask=mask[:1])
    monkeypatch.setattr(M.F, "scaled_dot_product_attention", nan_where_nothing_to_attend)
    out = M.attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[:1], expected)


def test_beam_search_guards_an_empty_source_on_the_fused_path_whatever_the_kernel(monkeypatch):
    """Beam search's cache made the source mask an additive -inf mask that went straight to the fused
    kernel, so a kernel that gives NaN for an all-masked row (some CUDA ones) decoded an empty sentence to the
    length limit. The cache keeps the boolean mask now, which `attention` guards: on the code a GPU takes, with such
    a kernel, beam search gives what the plain path (zeros for the empty row) gives."""
    from aiayn.lightning_modules.transformer import model as M
    from aiayn.lightning_modules.transformer.decoding import beam_search

    real = torch.nn.functional.scaled_dot_product_attention

    def nan_where_nothing_to_attend(q, k, v, attn_mask=None, is_causal=False):
        out = real(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        if attn_mask is None:
            return out
        empty = (
            ~attn_mask.any(-1, keepdim=True)
            if attn_mask.dtype == torch.bool
            else (attn_mask == float("-inf")).all(-1, keepdim=True)
        )
        return out.masked_fill(empty, float("nan"))

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=20, max_len=64)).eval()
    src = torch.tensor([[5, 6, 7], [0, 0, 0], [9, 4, 0]])  # the second sentence is empty: all padding
    with torch.no_grad():
        expected = beam_search(model, src, 2, 3, beam=2, alpha=0.6, extra_len=5)  # the plain path: zeros there
        monkeypatch.setattr(M, "CPU_FAST_PATHS", False)  # the code a GPU takes
        monkeypatch.setattr(M.F, "scaled_dot_product_attention", nan_where_nothing_to_attend)
        got = beam_search(model, src, 2, 3, beam=2, alpha=0.6, extra_len=5)
    assert got == expected


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_bf16_residual_stream_is_bf16_under_autocast_and_leaves_fp32_code_unchanged(norm_first):
    """--residual-dtype bf16: under bf16 autocast every residual block hands on bf16 (and the logits stay close to
    the fp32 stream's); outside autocast (the final evaluation, beam search, export) the model is the fp32 one,
    exactly: a bf16 stream there met fp32 weights in the next matmul and the run crashed after training."""
    torch.manual_seed(0)
    plain = Transformer(small_cfg(norm_first=norm_first)).eval()
    model = Transformer(small_cfg(norm_first=norm_first)).eval()
    model.load_state_dict(plain.state_dict())
    residual_stream(model, torch.bfloat16)
    src, tgt = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 6))
    torch.testing.assert_close(model(src, tgt), plain(src, tgt), atol=0, rtol=0)  # no autocast: fp32, the same
    assert beam_search(model, src, bos=2, eos=3, beam=2, extra_len=5) == beam_search(
        plain, src, bos=2, eos=3, beam=2, extra_len=5
    )
    dtypes = []
    for m in model.modules():
        if isinstance(m, Residual):
            m.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
        reference = plain(src, tgt)
    assert dtypes and set(dtypes) == {torch.bfloat16}  # every residual block's output, in the encoder and decoder
    assert len(dtypes) == 2 * 2 + 2 * 3  # N 2: two blocks an encoder layer, three a decoder layer
    torch.testing.assert_close(logits.float(), reference.float(), atol=0.1, rtol=0.05)


def test_training_attention_gives_the_kernel_its_mask_unguarded(monkeypatch):
    """The empty-row guard (an any, an or and a fill around every masked attention call on the fused path) ran in
    training too, where no row is empty: a query that requires grad reaches scaled_dot_product_attention with its
    padding mask as it is; evaluation and decoding keep the guard."""
    from aiayn.lightning_modules.transformer import model as M

    real, seen = torch.nn.functional.scaled_dot_product_attention, []

    def recording(q, k, v, attn_mask=None, is_causal=False):
        seen.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    monkeypatch.setattr(M, "CPU_FAST_PATHS", False)  # the code a GPU takes
    monkeypatch.setattr(M.F, "scaled_dot_product_attention", recording)
    q, k, v = (torch.randn(2, 2, n, 8) for n in (5, 70, 70))
    mask = torch.ones(2, 1, 1, 70, dtype=torch.bool)
    mask[1, ..., 60:] = False  # padding
    M.attention(q.requires_grad_(), k, v, mask).sum().backward()
    assert seen[-1] is mask
    with torch.no_grad():
        M.attention(q.detach(), k, v, mask)
    assert seen[-1] is not mask and torch.equal(seen[-1], mask)  # mask | (no empty row): the guard ran
