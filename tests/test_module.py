"""The training system: the paper's schedule, label smoothing, and a golden loss curve."""

import pytest
import torch
import torch.nn.functional as F

from aiayn.lightning_modules.run.module import TranslationModule, noam_lr
from aiayn.lightning_modules.transformer.loss import label_smoothed_loss
from aiayn.lightning_modules.transformer.model import TransformerConfig


def test_lr_at_step_1_warmup_and_twice_warmup():
    assert noam_lr(1, 512, 4000) == pytest.approx(1.746928107e-07, rel=1e-9)
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.987712430e-04, rel=1e-9)  # the peak
    assert noam_lr(8000, 512, 4000) == pytest.approx(4.941058844e-04, rel=1e-9)
    assert noam_lr(4000, 512, 4000, factor=2.0) == pytest.approx(2 * 6.987712430e-04, rel=1e-9)


def tiny_module(**kw):
    cfg = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=20, P_drop=0.0, max_len=32)
    return TranslationModule(cfg, **kw)


def test_schedule_is_stepped_per_optimizer_step():
    module = tiny_module(warmup=4)
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([noam_lr(s, 16, 4) for s in range(1, 9)])
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9


def test_label_smoothed_loss_by_hand():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]])
    target = torch.tensor([[1, 0]])  # the second position is padding (id 0) and must not count
    loss, nll, n = label_smoothed_loss(logits, target, eps=0.1)
    # log Z = ln(e^2 + e + 1 + e^-1) = 2.4401896; -log p = [0.44019, 1.44019, 2.44019, 3.44019]
    # loss = 0.9 * 1.44019 + 0.1 * mean(-log p) = 0.9 * 1.4401896 + 0.1 * 1.9401896 = 1.4901896
    assert n == 1
    assert nll.item() == pytest.approx(1.4401896, abs=1e-6)
    assert loss.item() == pytest.approx(1.4901896, abs=1e-6)
    ref = F.cross_entropy(logits[0], target[0], label_smoothing=0.1, ignore_index=0)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)


def test_golden_loss_for_the_first_steps():
    """Fixed seed, fixed batch, five optimizer steps on CPU: the losses are pinned."""
    torch.manual_seed(1234)
    module = tiny_module(warmup=10)
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, 20, (4, 6), generator=g), torch.randint(4, 20, (4, 7), generator=g)
    tgt_in, tgt_out = torch.cat([torch.full((4, 1), 2), tgt[:, :-1]], 1), tgt
    losses = []
    for _ in range(5):
        loss, _, _ = label_smoothed_loss(module.model(src, tgt_in), tgt_out, module.cfg.eps_ls)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(round(loss.item(), 4))
    assert losses == pytest.approx(GOLDEN, abs=2e-4)


GOLDEN = [3.3202, 2.8294, 2.4586, 2.2648, 2.0751]  # measured on CPU, torch 2.13; pinned


def test_validation_nll_through_the_chunked_path_equals_cross_entropy_on_full_logits():
    """Evaluation's NLL comes from the fused, chunked projection (no (B, T, V) logits), equal to the straightforward
    cross-entropy within float32 rounding."""
    from aiayn.lightning_modules.run.evaluate import nll_sum
    from aiayn.lightning_modules.transformer.model import PAD, Transformer, TransformerConfig

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=50, max_len=64)).eval()
    src = torch.randint(4, 50, (3, 7))
    tgt_out = torch.randint(4, 50, (3, 6))
    tgt_out[1, 4:] = PAD
    batch = {"src": src, "tgt_in": torch.randint(4, 50, (3, 6)), "tgt_out": tgt_out}
    with torch.no_grad():
        nll, n = nll_sum(model, batch)
        logits = model(batch["src"], batch["tgt_in"])
        expected = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum")
    assert n == 16 and torch.allclose(nll, expected, rtol=1e-6)


@pytest.mark.slow
def test_the_compiled_chunk_body_equals_the_eager_one():
    """On a GPU the chunk body of the fused loss is torch.compile'd; compiled on this CPU, it gives the eager body's
    loss, NLL and gradient (slow: compiling takes tens of seconds)."""
    from aiayn.lightning_modules.transformer.loss import _compiled, chunk_loss

    torch.manual_seed(0)
    logits, t = torch.randn(37, 211), torch.randint(0, 211, (37,))
    m, inv_n = (t != 0).float(), torch.tensor(1 / 30)
    eager = chunk_loss(logits.clone(), t, m, inv_n, 0.1, True)
    compiled = _compiled()(logits.clone(), t, m, inv_n, 0.1, True)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
