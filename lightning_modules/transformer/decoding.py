"""Greedy and beam-search decoding with the model's key/value cache (paper §6.1).

Beam search as in the paper: beam 4, length penalty lp(Y) = ((5 + |Y|) / 6)^α with α = 0.6
(Wu et al., 2016), maximum output length = source length + 50, and early termination: a sentence
stops once it has `beam` finished hypotheses (fairseq's rule), and the batch stops when every
sentence has stopped. Finished sentences leave the batch, so long tails do not cost the batch.
At the length limit every hypothesis ends with EOS, which costs its real log-probability (fairseq
masks every other token; a free EOS would favour hypotheses that run to the limit). PAD, BOS and UNK
are never generated (their log-probabilities are -inf at every step, greedy and beam alike).

Written by hand because neither PyTorch nor Lightning ships a seq2seq beam search; the
bookkeeping follows fairseq's SequenceGenerator (top 2·beam candidates, EOS among the top `beam`
finishes a hypothesis, the best `beam` non-EOS candidates stay alive).

Any model with `Transformer`'s decoding interface works here (`encode`, `start_cache(memory, mask,
group)`, `decode_step`, `reorder_cache(cache, rows, sentences)`, `cfg.max_len`); `aiayn bench` drives its
torch.nn.Transformer peer with it. Beam search keeps the encoder's keys/values once per sentence
(`group` = beam) and selects them only when a sentence leaves the batch, not at every step; the
bookkeeping is batched tensor work, and only finished hypotheses reach Python.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.lightning_modules.transformer.config import PAPER_DECODING, Decoding
from aiayn.lightning_modules.transformer.model import BOS, PAD, UNK, Transformer

NEVER_GENERATED = (PAD, BOS, UNK)


def max_output_lengths(src: Tensor, extra: int, cap: int) -> Tensor:
    """Source length + `extra` per sentence, capped by what the positional encoding covers."""
    return ((src != PAD).sum(1) + extra).clamp(max=cap - 1)


@torch.no_grad()
def greedy(
    model: Transformer, src: Tensor, bos: int, eos: int, extra_len: int = PAPER_DECODING.extra_len
) -> list[list[int]]:
    """Argmax decoding; returns token ids per sentence without BOS/EOS."""
    B = src.shape[0]
    limits = max_output_lengths(src, extra_len, model.cfg.max_len)
    memory, src_mask = model.encode(src)
    cache = model.start_cache(memory, src_mask)
    tokens = torch.full((B, 1), bos, dtype=torch.long, device=src.device)
    out = [[] for _ in range(B)]
    alive = torch.arange(B, device=src.device)
    for step in range(int(limits.max())):
        logp = model.decode_step(tokens, cache)
        logp[:, NEVER_GENERATED] = float("-inf")
        nxt = logp.argmax(-1)
        nxt = torch.where(limits[alive] <= step, torch.full_like(nxt, eos), nxt)  # length cap: end here
        for i, tok in zip(alive.tolist(), nxt.tolist()):
            if tok != eos:
                out[i].append(tok)
        keep = (nxt != eos).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        if keep.numel() < alive.numel():
            model.reorder_cache(cache, keep)
            alive, nxt = alive[keep], nxt[keep]
        tokens = nxt[:, None]
    return out


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the EOS token."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    bos: int,
    eos: int,
    beam: int = PAPER_DECODING.beam,
    alpha: float = PAPER_DECODING.alpha,
    extra_len: int = PAPER_DECODING.extra_len,
) -> list[list[int]]:
    """Batched beam search; returns the best hypothesis per sentence (ids without BOS/EOS)."""
    B, K, dev = src.shape[0], beam, src.device
    limits = max_output_lengths(src, extra_len, model.cfg.max_len)
    memory, src_mask = model.encode(src)
    cache = model.start_cache(memory, src_mask, group=K)  # the memory once per sentence, not per hypothesis

    sent = torch.arange(B, device=dev)  # which sentence each active block of K rows belongs to
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    hyps = torch.full((B * K, 1), bos, dtype=torch.long, device=dev)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    n_finished = torch.zeros(B, dtype=torch.long, device=dev)  # len(finished[b]), without a Python loop

    for step in range(int(limits.max()) + 1):
        n = sent.numel()
        logp = model.decode_step(hyps[:, -1:], cache)  # (n·K, V)
        V = logp.shape[-1]
        logp[:, NEVER_GENERATED] = float("-inf")
        at_limit = limits[sent] <= step
        if bool(at_limit.any()):  # at the limit only EOS, at its real log-probability
            rows = at_limit.repeat_interleave(K).nonzero().squeeze(1)
            eos_logp = logp[rows, eos]
            logp[rows] = float("-inf")
            logp[rows, eos] = eos_logp
        cand = (scores.view(n * K, 1) + logp).view(n, K * V)
        top_scores, top_idx = cand.topk(2 * K, dim=1)  # (n, 2K)
        top_beam, top_tok = top_idx // V, top_idx % V
        is_eos = top_tok == eos

        # EOS among the best K candidates finishes a hypothesis (normalized by its length penalty); only these
        # few events reach Python.
        ends = is_eos[:, :K] & (top_scores[:, :K] > float("-inf"))
        if bool(ends.any()):
            penalty = length_penalty(step + 1, alpha)
            for r, c in ends.nonzero().tolist():
                b = int(sent[r])
                if len(finished[b]) < K:
                    score = float(top_scores[r, c]) / penalty
                    finished[b].append((score, hyps[r * K + int(top_beam[r, c]), 1:].tolist()))
                    n_finished[b] += 1

        # The best K non-EOS candidates stay alive.
        alive_scores = top_scores.masked_fill(is_eos, float("-inf"))
        keep_scores, keep_pos = alive_scores.topk(K, dim=1)  # (n, K)
        keep_rows = (torch.arange(n, device=dev)[:, None] * K + top_beam.gather(1, keep_pos)).view(-1)
        keep_tok = top_tok.gather(1, keep_pos).view(-1)

        done = n_finished[sent] >= K
        if bool(done.all()):
            break
        live = None
        if bool(done.any()):  # drop finished sentences from the batch
            live = (~done).nonzero().squeeze(1)
            live_rows = (live[:, None] * K + torch.arange(K, device=dev)).view(-1)
            keep_rows, keep_tok, keep_scores = keep_rows[live_rows], keep_tok[live_rows], keep_scores[live]
            sent = sent[live]
        model.reorder_cache(cache, keep_rows, sentences=live)
        hyps = torch.cat([hyps[keep_rows], keep_tok[:, None]], dim=1)
        scores = keep_scores

    return [max(f, key=lambda t: t[0])[1] if f else [] for f in finished]


def translate_batch(model: Transformer, src: Tensor, bos: int, eos: int, decoding: Decoding = PAPER_DECODING) -> list:
    """Token ids of the translations of `src` (B, S): beam search, or greedy search for beam 1."""
    if decoding.beam <= 1:
        return greedy(model, src, bos, eos, extra_len=decoding.extra_len)
    return beam_search(model, src, bos, eos, beam=decoding.beam, alpha=decoding.alpha, extra_len=decoding.extra_len)
