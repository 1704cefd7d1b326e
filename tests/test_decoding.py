"""Beam search against known answers: a scripted model (a fixed transition table over a small vocabulary)
decoded by `beam_search`/`greedy` and by an exhaustive search over every output up to the length limit,
scored as the paper scores them (sum of log-probabilities, the final EOS's included, over the GNMT length
penalty ((5 + |Y|) / 6)^α with |Y| counting EOS)."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from aiayn.lightning_modules.transformer.decoding import beam_search, greedy, length_penalty
from aiayn.lightning_modules.transformer.model import BOS, EOS, PAD, UNK


@pytest.fixture(autouse=True)
def _through_both_paths(both_paths):
    """Every test here runs with the CPU fast paths and through the code a GPU takes (tests/conftest.py)."""


V = 8
A, B, C, D = 4, 5, 6, 7  # the real tokens; 0-3 are PAD, UNK, BOS, EOS
REAL = (A, B, C, D)


class Scripted:
    """log p(next | previous token, sentence) from a table: `table[s, prev]` for a source whose first token is
    `s`. Implements the decoding interface of `model.Transformer` (encode, start_cache, decode_step,
    reorder_cache, cfg.max_len)."""

    def __init__(self, logits: torch.Tensor):
        self.table = torch.log_softmax(logits, dim=-1)  # (V, V, V): source type, previous token, next token
        self.cfg = SimpleNamespace(max_len=512)

    def encode(self, src):
        return src[:, 0].clone(), src != PAD

    def start_cache(self, memory, src_mask, group=1):
        return {"type": memory.repeat_interleave(group)}  # one row per hypothesis

    def reorder_cache(self, cache, index, sentences=None):
        cache["type"] = cache["type"][index]

    def decode_step(self, tokens, cache):
        return self.table[cache["type"], tokens[:, -1]].clone()

    def score(self, src_type: int, ys: tuple, alpha: float) -> float:
        """The paper's score of output `ys` followed by EOS."""
        prev, total = BOS, 0.0
        for y in (*ys, EOS):
            total += float(self.table[src_type, prev, y])
            prev = y
        return total / length_penalty(len(ys) + 1, alpha)

    def exhaustive(self, src: list[int], limit_extra: int, alpha: float) -> list[int]:
        """The best output over every sequence of real tokens of length 0 .. |x| + extra."""
        outputs = (ys for k in range(len(src) + limit_extra + 1) for ys in itertools.product(REAL, repeat=k))
        return list(max(outputs, key=lambda ys: self.score(src[0], ys, alpha)))


def table(rows: dict, default: float = 0.0) -> torch.Tensor:
    """Logits (V, V, V): `rows[(s, prev)] = {token: logit}`, every other entry `default`; one source type per row."""
    t = torch.full((V, V, V), float(default))
    for (s, prev), logits in rows.items():
        for tok, value in logits.items():
            t[s, prev, tok] = value
    return t


def decode(model, srcs: list[list[int]], extra: int, beam: int = 4, alpha: float = 0.6):
    width = max(map(len, srcs))
    src = torch.tensor([x + [PAD] * (width - len(x)) for x in srcs])
    if beam == 1:
        return greedy(model, src, BOS, EOS, extra_len=extra)
    return beam_search(model, src, BOS, EOS, beam=beam, alpha=alpha, extra_len=extra)


def test_beam_four_finds_the_exhaustive_optimum_where_greedy_does_not():
    # From BOS, A is likelier than B, but after A every continuation is mediocre; after B, EOS is near certain.
    model = Scripted(
        table(
            {
                (A, BOS): {A: 3.0, B: 2.8, EOS: -5},
                (A, A): {A: 1.0, B: 1.0, C: 1.0, D: 1.0, EOS: 0.5},
                (A, B): {EOS: 6.0},
            },
            default=-5,
        )
    )
    best = model.exhaustive([A], 3, 0.6)
    assert best == [B]
    assert decode(model, [[A]], 3) == [best]
    assert decode(model, [[A]], 3, beam=1) != [best]


def test_length_penalty_alpha_zero_and_point_six_pick_different_winners():
    # Stop at once (p(EOS | BOS) = 0.37) or say A B first (0.6 · 0.75 · 0.75 = 0.34, but three tokens long).
    p = {
        (A, BOS): {EOS: 0.37, A: 0.6, B: 0.01, C: 0.01, D: 0.01},
        (A, A): {B: 0.75, EOS: 0.01, A: 0.08, C: 0.08, D: 0.08},
        (A, B): {EOS: 0.75, A: 0.01, B: 0.08, C: 0.08, D: 0.08},
        (A, C): {C: 0.5, D: 0.5},
        (A, D): {C: 0.5, D: 0.5},
    }
    model = Scripted(table({k: {t: float(torch.tensor(v).log()) for t, v in d.items()} for k, d in p.items()}, -9))
    winners = {}
    for alpha in (0.0, 0.6):
        winners[alpha] = model.exhaustive([A], 3, alpha)
        assert decode(model, [[A]], 3, alpha=alpha) == [winners[alpha]], alpha
    assert winners == {0.0: [], 0.6: [A, B]}


def test_the_forced_eos_at_the_length_limit_costs_its_log_probability():
    # A A is likely, but EOS after A is nearly impossible: running to the limit (2 tokens) must pay for the
    # forced EOS, so stopping at once wins. With a free EOS at the limit, [A, A] would win.
    model = Scripted(table({(A, BOS): {EOS: 2.0, A: 2.7}, (A, A): {A: 6.0, EOS: -8.0}}, default=-4))
    assert model.exhaustive([A], 1, 0.6) == []
    assert decode(model, [[A]], 1) == [[]]


def test_a_model_that_never_emits_eos_stops_at_source_length_plus_50():
    model = Scripted(table({(s, prev): {A: 5.0, EOS: -10.0} for s in REAL for prev in range(V)}))
    srcs = [[A], [B, C, D], [C, A, A, A, A, A, A]]
    for beam in (1, 4):
        assert [len(y) for y in decode(model, srcs, 50, beam=beam)] == [len(x) + 50 for x in srcs]


def test_pad_bos_and_unk_are_never_generated():
    # The specials are the likeliest tokens everywhere; the real tokens still have an order among themselves.
    model = Scripted(table({(A, prev): {PAD: 9.0, BOS: 8.0, UNK: 9.5, C: 1.0, EOS: 0.5, B: 0.8} for prev in range(V)}))
    for beam in (1, 4):
        (out,) = decode(model, [[A, A]], 3, beam=beam)
        assert not set(out) & {PAD, BOS, UNK}, out
    assert decode(model, [[A, A]], 3) == [model.exhaustive([A, A], 3, 0.6)]


@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_decodes_alone_as_in_a_batch_of_other_lengths(beam):
    g = torch.Generator().manual_seed(0)
    model = Scripted(torch.randn(V, V, V, generator=g) * 2)
    srcs = [[A, B], [B, C, D, A, B, C], [C], [D, D, D]]
    together = decode(model, srcs, 3, beam=beam)
    alone = [decode(model, [x], 3, beam=beam)[0] for x in srcs]
    assert together == alone
    assert len({len(y) for y in together}) > 1  # the sentences end at different steps
    if beam == 4:  # exhaustive over 4^(|x| + 3) outputs: the short sentences only
        assert [y for x, y in zip(srcs, together) if len(x) <= 3] == [
            model.exhaustive(x, 3, 0.6) for x in srcs if len(x) <= 3
        ]
