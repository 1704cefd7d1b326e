"""Packed runs: K seeds in one computation are K seeds, each as it would train alone, in the launches
of one."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn.lightning_modules.transformer.config import BOS, PAD, TransformerConfig
from aiayn.lightning_modules.transformer.dropout_stream import DropoutStream, counter_dropout
from aiayn.lightning_modules.transformer.loss import label_smoothed_loss, projected_label_smoothed_loss
from aiayn.lightning_modules.transformer.model import Transformer
from aiayn.lightning_modules.transformer.packed import pack, packed_loss, stack_batches, unpack

CFG = TransformerConfig(N=2, d_model=16, d_ff=32, h=4, vocab_size=40, max_len=64)


def batches_of(seed: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A seed's own sentences: its own batch sizes and lengths, right-padded as collate pads them."""
    g = torch.Generator().manual_seed(1000 + seed)
    out = []
    for _ in range(steps):
        B, S, T = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((2, 6), (3, 12), (3, 12)))
        src = torch.randint(4, CFG.vocab_size, (B, S), generator=g)
        tgt = torch.randint(4, CFG.vocab_size, (B, T), generator=g)
        tgt[:, 0] = BOS
        for row in range(B):  # ragged sentences: right padding, at least two target tokens
            src[row, int(torch.randint(1, S + 1, (1,), generator=g)) :] = PAD
            tgt[row, int(torch.randint(2, T + 1, (1,), generator=g)) :] = PAD
        out.append((src, tgt))
    return out


def noam(opt: torch.optim.Optimizer, d_model: int, warmup: int = 4):
    rate = lambda s: d_model**-0.5 * min((s + 1) ** -0.5, (s + 1) * warmup**-1.5)  # noqa: E731 - §5.3's lrate
    return torch.optim.lr_scheduler.LambdaLR(opt, rate)


def adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1.0, betas=(0.9, 0.98), eps=1e-9)  # the paper's (§5.3), as the trainer's


def model_of(seed: int, cfg: TransformerConfig = CFG) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg)


def train_alone(seed: int, data, cfg: TransformerConfig = CFG):
    model = model_of(seed, cfg).train()
    stream = DropoutStream([seed])
    counter_dropout(model, stream)
    opt = adam(model.parameters())
    sched = noam(opt, cfg.d_model)
    losses = []
    for step, (src, tgt) in enumerate(data):
        stream.step = step
        loss, _, _ = label_smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:], cfg.eps_ls)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, model.state_dict()


def packed_step(packed, opt, src, tgt, eps):
    loss, _, n = packed_loss(packed, src, tgt[:, :-1], tgt[:, 1:], eps)
    opt.zero_grad()
    (loss / n).sum().backward()  # each block's loss over its own tokens: seeds' parameters are apart
    opt.step()
    return loss / n


def train_packed(seeds: list[int], datas, cfg: TransformerConfig = CFG):
    packed = pack([model_of(seed, cfg) for seed in seeds]).train()
    stream = DropoutStream(seeds)
    counter_dropout(packed, stream)
    opt = adam(packed.parameters())
    sched = noam(opt, cfg.d_model)
    losses = []
    for step, batches in enumerate(zip(*datas)):
        stream.step = step
        losses.append(packed_step(packed, opt, *stack_batches(list(batches)), cfg.eps_ls).tolist())
        sched.step()
    return [list(x) for x in zip(*losses)], unpack(packed)


@pytest.mark.parametrize(
    "cfg",
    [
        CFG,
        TransformerConfig(
            N=1, d_model=16, d_ff=24, h=2, d_k=5, d_v=7, pe="learned", norm_first=True, vocab_size=40, max_len=64
        ),
    ],
    ids=["paper", "learned-pre-LN-free-dk"],
)
def test_each_seed_of_a_pack_trains_as_it_would_alone(cfg):
    """Losses at every step and the final weights of each of K seeds, packed, equal that seed trained alone (fp32,
    to float tolerance over 20 steps): own initialization, sentences (ragged, other lengths than the others'),
    dropout masks (the counter stream) and Adam state."""
    seeds, steps = [0, 1, 7], 20
    datas = [batches_of(seed, steps) for seed in seeds]
    packed_losses, packed_states = train_packed(seeds, datas, cfg)
    for k, seed in enumerate(seeds):
        losses, state = train_alone(seed, datas[k], cfg)
        assert packed_losses[k] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        assert state.keys() == packed_states[k].keys()
        for name, value in state.items():
            if name.endswith("w_k.bias"):  # its gradient is 0 in exact arithmetic (q·b_k is the same for every key,
                continue  # and softmax ignores it): rounding noise both ways, which Adam scales to whole steps
            torch.testing.assert_close(packed_states[k][name], value, rtol=1e-4, atol=2e-4, msg=name)
    assert len({tuple(x) for x in packed_losses}) == len(seeds)  # not one seed's numbers three times


def test_a_packs_bf16_residual_stream_is_each_seeds_own():
    """Under bf16 autocast with a bf16 residual stream (`--residual-dtype`, a GPU's default under bf16-mixed), a
    pack's every residual block hands on bf16 and each seed's loss is the loss of that seed alone with the same
    stream."""
    from aiayn.lightning_modules.transformer.model import Residual, residual_stream

    seeds = [0, 1]
    datas = [batches_of(seed, 1)[0] for seed in seeds]
    alone, packed = [model_of(s).eval() for s in seeds], pack([model_of(s) for s in seeds]).eval()
    for model in (*alone, packed):
        residual_stream(model, torch.bfloat16)
    dtypes = set()
    for module in packed.modules():
        if isinstance(module, Residual):
            module.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        src, tgt = stack_batches(datas)
        loss, _, n = packed_loss(packed, src, tgt[:, :-1], tgt[:, 1:], CFG.eps_ls)
        own = [label_smoothed_loss(m(s, t[:, :-1]), t[:, 1:], CFG.eps_ls)[0] for m, (s, t) in zip(alone, datas)]
    assert dtypes == {torch.bfloat16}
    assert (loss / n).tolist() == pytest.approx([float(x) for x in own], rel=1e-3)


def test_a_seed_gone_non_finite_leaves_the_others_numbers_alone():
    """A seed that diverges is that seed's: NaN weights in seed 1 change nothing of seeds 0 and 2 (no operation
    mixes blocks of rows), so the pack can report it alone and go on."""
    seeds = [0, 1, 2]
    src, tgt = stack_batches([batches_of(seed, 1)[0] for seed in seeds])
    grads = []
    for poison in (False, True):
        packed = pack([model_of(seed) for seed in seeds]).train()
        counter_dropout(packed, DropoutStream(seeds))
        if poison:
            with torch.no_grad():
                packed.encoder[0].ffn.w_1.weight[1, 0, 0] = float("nan")
        loss, _, n = packed_loss(packed, src, tgt[:, :-1], tgt[:, 1:], CFG.eps_ls)
        (loss / n).sum().backward()
        grads.append((loss.detach(), {name: p.grad.clone() for name, p in packed.named_parameters()}))
    (clean, clean_grads), (poisoned, poisoned_grads) = grads
    assert torch.isnan(poisoned[1]) and torch.equal(poisoned[[0, 2]], clean[[0, 2]])
    for name, g in clean_grads.items():
        assert torch.equal(poisoned_grads[name][[0, 2]], g[[0, 2]]), name


@pytest.mark.parametrize("chunk", [None, 7])  # one chunk; several, the last one short
def test_a_packs_fused_loss_is_each_models_own(chunk):
    """The pack's loss fuses the projection as a model alone does (no logits): each block's loss, NLL, tokens and
    gradients (of its hidden states and its embedding) equal that model's own fused loss on its block alone, over
    one chunk or several; a block whose loss is multiplied by 0 (a seed gone) gets exactly no gradient."""
    K, B, T, V, d = 3, 4, 5, CFG.vocab_size, CFG.d_model
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(K * B, T, d, generator=g)
    weight = torch.randn(K, V, d, generator=g)
    target = torch.randint(4, V, (K * B, T), generator=g)
    target[torch.rand(K * B, T, generator=g) < 0.3] = PAD
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, nll, n = projected_label_smoothed_loss(h, w, target, 0.1, chunk=chunk, reduction="sum")
    assert loss.shape == nll.shape == n.shape == (K,)
    (loss * torch.tensor([1.0, 0.0, 2.0])).sum().backward()
    for k in range(K):
        rows = slice(k * B, (k + 1) * B)
        h_k, w_k = hidden[rows].clone().requires_grad_(), weight[k].clone().requires_grad_()
        loss_k, nll_k, n_k = projected_label_smoothed_loss(h_k, w_k, target[rows], 0.1, chunk=chunk, reduction="sum")
        (loss_k * [1.0, 0.0, 2.0][k]).backward()
        torch.testing.assert_close((loss[k], nll[k]), (loss_k, nll_k), rtol=1e-6, atol=1e-5)
        assert int(n[k]) == int(n_k) == int((target[rows] != PAD).sum())
        torch.testing.assert_close(h.grad[rows], h_k.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w.grad[k], w_k.grad, rtol=1e-5, atol=1e-6)
    assert not h.grad[B : 2 * B].any() and not w.grad[1].any()


def launches_of_a_step(K: int) -> float:
    """A CPU's kernel launches (its leaf ATen operators, as `aiayn bench --profile` counts them) of one packed
    training step: forward, backward, Adam."""
    from aiayn.bench.profile import profile_steps

    seeds = list(range(K))
    packed = pack([model_of(seed) for seed in seeds]).train()
    counter_dropout(packed, DropoutStream(seeds))
    opt = torch.optim.Adam(packed.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    src, tgt = stack_batches([batches_of(0, 1)[0]] * K)
    packed_step(packed, opt, src, tgt, CFG.eps_ls)  # Adam's state made: the step after is every step's
    return profile_steps(lambda: packed_step(packed, opt, src, tgt, CFG.eps_ls), torch.device("cpu"), 1)[
        "launches_per_step"
    ]


def test_a_packed_steps_launches_do_not_grow_with_its_seeds():
    """The same launches for a pack of 2, 8 and 16 seeds: one step's, whatever K (3,171 at this size). A pack
    of one launches 12 fewer (copies): with a leading dimension of size 1 autograd keeps the weight gradients'
    layout; from K = 2 on AccumulateGrad copies the transposed bmm's gradient into the parameter's layout."""
    two = launches_of_a_step(2)
    assert two > 500  # a whole step was counted
    assert launches_of_a_step(8) == two and launches_of_a_step(16) == two
    assert two - 20 < launches_of_a_step(1) <= two


def test_counter_dropout_masks_are_a_function_of_seed_step_and_site():
    """The counter stream's masks: the same for the same (seed, step, site) in any pack, different across each,
    and keeping 1 - P_drop of the elements."""
    x = torch.ones(4, 9, 16)

    def mask(seeds, step, site, rows=x):
        return DropoutStream(seeds, step).keep(rows, site, 0.1)

    a = mask([3], 5, 2)
    assert torch.equal(mask([8, 3], 5, 2, torch.ones(8, 9, 16))[4:], a)  # seed 3's block of a pack of two
    for other in (mask([4], 5, 2), mask([3], 6, 2), mask([3], 5, 1)):
        assert not torch.equal(other, a)
    kept = (mask(list(range(50)), 0, 0, torch.ones(200, 9, 16)) > 0).float().mean().item()
    assert kept == pytest.approx(0.9, abs=0.005)
    assert a.unique().tolist() == [0.0, pytest.approx(1 / 0.9)]


def test_a_seed_trained_by_aiayn_train_is_that_seed_of_a_pack(cache, tmp_path, monkeypatch):
    """The trainer and the pack agree: `aiayn train --dropout-rng counter` (Lightning, the data module's batches,
    the fused loss, fused Adam, the paper's schedule, the per-step normalization) trains seed 3 to the losses and
    weights that seed 3 reaches in a pack beside another seed on other sentences, given the same batches."""
    from aiayn.cli import main
    from aiayn.lightning_modules.run.module import TranslationModule, noam_lr

    batches, losses, step = [], [], TranslationModule.training_step

    def recording(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        batches.append((batch["src"].clone(), torch.cat([batch["tgt_in"][:, :1], batch["tgt_out"]], 1)))
        losses.append(loss.item() / batch["n_tgt_tokens"])
        return loss

    monkeypatch.setattr(TranslationModule, "training_step", recording)
    argv = [
        "train",
        "--row",
        "base",
        "--preset",
        "tiny",
        "--seed",
        "3",
        "--out",
        str(tmp_path),
        "--set",
        "N=1 d_model=32 d_ff=64 h=2",
        "--max-steps",
        "8",
        "--val-every",
        "100",
        "--no-stability-validations",
        "--eval-subset",
        "2",
        "--accelerator",
        "cpu",
        "--no-progress",
        "--dropout-rng",
        "counter",
    ]
    assert main(argv) == 0
    run = tmp_path / "tiny/synthetic/base/seed3"
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["accumulate"] == 1 and len(batches) == 8
    cfg = TransformerConfig.from_dict(config["spec"]["model"])
    d, warmup, factor = cfg.d_model, config["spec"]["schedule"]["warmup"], config["spec"]["schedule"]["lr_factor"]

    seeds = [3, 9]
    packed = pack([model_of(seed, cfg) for seed in seeds]).train()
    stream = DropoutStream(seeds)
    counter_dropout(packed, stream)
    opt = torch.optim.Adam(packed.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: noam_lr(s + 1, d, warmup, factor))
    packed_losses = []
    for place, (mine, other) in enumerate(zip(batches, reversed(batches))):
        stream.step = place
        packed_losses.append(packed_step(packed, opt, *stack_batches([mine, other]), cfg.eps_ls)[0].item())
        sched.step()
    assert packed_losses == pytest.approx(losses, rel=1e-5)
    trained = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for name, value in unpack(packed)[0].items():
        if not name.endswith("w_k.bias"):  # the key biases' exact gradient is 0 (see above)
            torch.testing.assert_close(value, trained[f"model.{name}"], rtol=1e-4, atol=2e-4, msg=name)


@pytest.fixture
def dynamo():
    """Dynamo's counters from zero, its caches and limits restored afterwards."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    config = torch._dynamo.config
    limits = {n: getattr(config, n) for n in ("recompile_limit", "cache_size_limit") if hasattr(config, n)}
    yield counters
    for name, value in limits.items():
        setattr(config, name, value)
    torch._dynamo.reset()


def test_a_compiled_pack_draws_the_counter_streams_masks_in_one_graph_for_every_step(dynamo):
    """The counter stream's keys are a tensor filled each step: a pack compiled whole (dynamo's
    tracing, the eager backend) makes its graphs at the first step and none at the next five, whose masks change,
    and its losses are the eager pack's step by step (the same masks)."""
    from aiayn.lightning_modules.transformer.compiled import compile_model

    seeds, datas = [3, 5], [batches_of(s, 1) for s in (3, 5)]
    src, tgt = stack_batches([d[0] for d in datas])

    def losses(how: str) -> list[float]:
        packed = pack([model_of(s) for s in seeds]).train()
        stream = DropoutStream(seeds)
        counter_dropout(packed, stream)
        compile_model(packed, how, dynamic=False, backend="eager")
        out = []
        for step in range(6):
            stream.step = step
            loss, _, _ = packed_loss(packed, src, tgt[:, :-1], tgt[:, 1:], CFG.eps_ls)
            loss.sum().backward()  # the training step's autograd: the compiled functions run
            out += loss.tolist()
            if step == 0:
                graphs = dynamo["stats"]["unique_graphs"]
        if how != "none":
            assert graphs > 0 and dynamo["stats"]["unique_graphs"] == graphs, "a new graph for a later step"
        return out

    eager = losses("none")
    assert eager[:2] != eager[2:4]  # the masks change with the step
    assert losses("model") == pytest.approx(eager, rel=1e-6)


def test_a_packs_loaders_share_its_workers(monkeypatch):
    """Each seed of a pack had a loader with the run's --num-workers (a GPU's default 4): a pack of 8 ran 32 loader
    processes. The pack's workers are shared among its seeds' loaders, at least one each where any are asked for."""
    from aiayn.lightning_modules.run import pack as P
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.spec import spec_of

    assert [P.pack_workers(4, k) for k in (1, 2, 3, 8, 16)] == [4, 2, 2, 1, 1]
    assert P.pack_workers(0, 8) == 0
    seen = []

    class Planned(Exception):
        pass

    def plan(opts, spec):
        seen.append(opts.num_workers)
        raise Planned

    monkeypatch.setattr(P, "plan", plan)
    opts = TrainOptions(pack_seeds="0,1,2,3,4,5,6,7", num_workers=4, accelerator="cpu", progress=False)
    with pytest.raises(Planned):
        P.train_pack(opts, spec_of(opts))
    assert seen == [1]  # the first seed's plan: 8 loaders of one worker each, not of 4
