"""`aiayn bench`: optimized paths equal the straightforward ones, the FLOP count, the peers' sizes, the CLI.

No timing is asserted here; BENCHMARKS.md has the measured numbers.
"""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from aiayn.bench import run as bench
from aiayn.cli import main
from aiayn.lightning_modules.transformer.decoding import beam_search
from aiayn.lightning_modules.transformer.loss import label_smoothed_loss, projected_label_smoothed_loss
from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig


@pytest.fixture(autouse=True)
def _through_both_paths(both_paths):
    """Every test here runs with the CPU fast paths and through the code a GPU takes (tests/conftest.py)."""


def small_cfg(**kw):
    return TransformerConfig(
        **{"N": 2, "d_model": 32, "d_ff": 64, "h": 4, "vocab_size": 50, "P_drop": 0.0, "max_len": 64, **kw}
    )


@pytest.mark.parametrize("chunk", [None, 1, 5, 7, 1000])
def test_projected_loss_equals_straightforward_loss_and_gradients(chunk):
    """Fused projection + label-smoothed loss, chunked over positions: loss, NLL and both gradients equal the
    straightforward F.linear + log_softmax path within 1e-5 (float32)."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 8, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    target = torch.randint(1, 50, (3, 8))
    target[0, 5:] = 0  # padding: excluded from loss, NLL and gradients
    ref_loss, ref_nll, ref_n = label_smoothed_loss(F.linear(hidden, weight), target, eps=0.1)
    ref_loss.backward()
    ref_gh, ref_gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    loss, nll, n = projected_label_smoothed_loss(hidden, weight, target, eps=0.1, chunk=chunk)
    (2.0 * loss).backward()  # an upstream gradient other than 1 scales the stored gradients
    assert int(n) == ref_n == 21
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nll, ref_nll, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden.grad, 2.0 * ref_gh, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weight.grad, 2.0 * ref_gw, atol=1e-5, rtol=1e-5)


def test_loss_chunks_are_sized_for_the_device(monkeypatch):
    """The fused loss's chunk: 128 MB of float32 logits on a CPU (906 positions at the paper's V 37000, as every CPU
    figure was measured), 512 MB on a GPU that can hold it (3627 on an 80 GB card: a quarter of the read-modify-writes
    of grad_w), a 64th of a smaller card's memory, never below a CPU's; the loss takes it where no chunk is given."""
    import types

    from aiayn.lightning_modules.transformer import loss

    assert loss.default_chunk(torch.device("cpu"), 37000) == 906
    for gb, positions in ((80, 3627), (16, 1689), (4, 906)):
        loss.chunk_bytes.cache_clear()
        props = types.SimpleNamespace(total_memory=gb * 10**9)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, p=props: p)
        assert loss.default_chunk(torch.device("cuda"), 37000) == positions, gb
    loss.chunk_bytes.cache_clear()
    seen = []
    monkeypatch.setattr(loss, "default_chunk", lambda device, vocab: seen.append((device.type, vocab)) or 3)
    hidden, weight = torch.randn(2, 5, 8), torch.randn(30, 8)
    projected_label_smoothed_loss(hidden, weight, torch.randint(1, 30, (2, 5)), eps=0.1)
    assert seen == [("cpu", 30)]


def test_training_step_loss_equals_module_loss_on_the_model():
    """The module's training path (fused loss on the decoder's hidden states, tied weight) equals the loss of
    the model's logits, and so gives the model's parameters the same gradients."""
    torch.manual_seed(0)
    model = Transformer(small_cfg())
    src, tgt_in, tgt_out = torch.randint(4, 50, (3, 6)), torch.randint(4, 50, (3, 5)), torch.randint(4, 50, (3, 5))
    tgt_out[1, 3:] = 0
    ref, _, _ = label_smoothed_loss(model(src, tgt_in), tgt_out, 0.1)
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    memory, mask = model.encode(src)
    loss, _, _ = projected_label_smoothed_loss(model.decode(tgt_in, memory, mask), model.embed.weight, tgt_out, 0.1)
    loss.backward()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    for p, g in zip(model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-5)


def test_flops_per_step_by_hand():
    # N=1, d_model=4, h=2, d_k=d_v=2, d_ff=8, V=10; one sentence, source 3 positions, target 2.
    cfg = TransformerConfig(N=1, d_model=4, d_ff=8, h=2, vocab_size=10, max_len=16)
    # per position, forward: Q and O projections 2·(4·4 + 4·4) = 64; K and V 64; FFN 2·(4·8 + 8·4) = 128;
    # attention QKᵀ + AV over k keys: 2·k·2·(2 + 2) = 16·k
    enc = 3 * (64 + 64 + 128 + 16 * 3)  # 912
    dec = 2 * (64 + 64 + 16 * 2 + 64 + 16 * 3 + 128) + 3 * 64  # self, cross (Q, O), FFN; cross K, V on source: 992
    out = 2 * 2 * 4 * 10  # output projection: 160
    assert bench.flops_per_step(cfg, 3, 2, 3, 2) == 3 * (enc + dec + out) == 6192


def test_flops_per_step_matches_torch_flop_counter():
    """The analytic count equals PyTorch's FlopCounterMode over aiayn's real training step (forward and
    backward, fused loss included; it counts matmuls, not embeddings or norms). Attention runs on SDPA's math
    backend here, whose matmuls the counter sees (it has no formula for the CPU flash-attention kernel)."""
    cfg = small_cfg(P_drop=0.0)
    model = Transformer(cfg)
    B, S, T = 2, 7, 5
    src, tgt_in, tgt_out = torch.randint(4, 50, (B, S)), torch.randint(4, 50, (B, T)), torch.randint(4, 50, (B, T))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        memory, mask = model.encode(src)
        loss, _, _ = projected_label_smoothed_loss(model.decode(tgt_in, memory, mask), model.embed.weight, tgt_out, 0.1)
        loss.backward()
    assert counter.get_total_flops() == bench.flops_per_step(cfg, B * S, B * T, S, T)


def test_peak_table():
    assert bench.peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert bench.peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert bench.peak_bf16_tflops("NVIDIA H200") == 989.0
    assert bench.peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert bench.peak_bf16_tflops("Tesla T4") is None


def _copy_into_torch_peer(ours: Transformer, peer: bench.TorchTransformerPeer) -> None:
    """aiayn's weights into the nn.Transformer wrapper (Q, K, V packed into in_proj)."""

    def attn(dst, src):
        dst.in_proj_weight.copy_(torch.cat([src.w_q.weight, src.w_k.weight, src.w_v.weight]))
        dst.in_proj_bias.copy_(torch.cat([src.w_q.bias, src.w_k.bias, src.w_v.bias]))
        dst.out_proj.weight.copy_(src.w_o.weight)
        dst.out_proj.bias.copy_(src.w_o.bias)

    def ffn_norms(dst, src, norms):
        dst.linear1.load_state_dict(src.ffn.w_1.state_dict())
        dst.linear2.load_state_dict(src.ffn.w_2.state_dict())
        for d, s in zip((dst.norm1, dst.norm2, getattr(dst, "norm3", None)), norms):
            d.load_state_dict(s.norm.state_dict())

    with torch.no_grad():
        peer.embed.weight.copy_(ours.embed.weight)
        for d, s in zip(peer.transformer.encoder.layers, ours.encoder):
            attn(d.self_attn, s.self_attn)
            ffn_norms(d, s, (s.res_attn, s.res_ffn))
        for d, s in zip(peer.transformer.decoder.layers, ours.decoder):
            attn(d.self_attn, s.self_attn)
            attn(d.multihead_attn, s.cross_attn)
            ffn_norms(d, s, (s.res_self, s.res_cross, s.res_ffn))


def test_torch_peer_is_the_same_function_with_the_same_parameter_count():
    """Same parameter count exactly; with aiayn's weights copied in, the same logits (eval) and the same beam
    search output: the cacheless prefix-recomputing decode_step equals aiayn's cached one."""
    torch.manual_seed(0)
    cfg = small_cfg()
    ours, peer = Transformer(cfg).eval(), bench.TorchTransformerPeer(cfg).eval()
    assert bench.trainable_params(peer) == bench.trainable_params(ours)
    _copy_into_torch_peer(ours, peer)
    src, tgt_in = torch.randint(4, 50, (3, 6)), torch.randint(4, 50, (3, 5))
    src[2, 4:] = 0
    with torch.no_grad():
        torch.testing.assert_close(peer(src, tgt_in), ours(src, tgt_in), atol=1e-4, rtol=1e-4)
    assert beam_search(peer, src, 2, 3, extra_len=5) == beam_search(ours, src, 2, 3, extra_len=5)


def test_marian_peer_sizes():
    """Marian from a matching config: the same trainable parameters; its only extra parameters are the two
    frozen sinusoid tables (encoder and decoder, max_len × d_model each); final_logits_bias is a buffer."""
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[test]')")
    cfg = small_cfg()
    marian, ours = bench.build("hf_marian", cfg), bench.build("aiayn", cfg)
    assert bench.trainable_params(marian) == bench.trainable_params(ours)
    all_params = sum(p.numel() for p in marian.parameters())
    assert all_params == bench.trainable_params(ours) + 2 * cfg.max_len * cfg.d_model
    assert marian.final_logits_bias.shape == (1, cfg.vocab_size)
    assert marian.get_input_embeddings().weight is marian.get_output_embeddings().weight  # tied


@pytest.mark.slow  # trains end to end (seconds): the slow tier
def test_bench_cli_writes_json(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[test]')")
    out = tmp_path / "bench.json"
    argv = [
        *"--size tiny --tokens 128 --steps 1 --warmup 1 --trials 1 --decode-sentences 2 --decode-src-len 4".split(),
        *"--decode-extra 2 --device cpu --peers --json".split(),
        str(out),
    ]
    assert main(["bench", *argv]) == 0
    results = json.loads(out.read_text())
    assert [r["impl"] for r in results] == ["aiayn", "torch_nn_transformer", "hf_marian"]
    for r in results:
        for key in ("train_tokens_per_s", "decode_sentences_per_s", "peak_mem_mb", "model", "device", "params"):
            assert key in r, key
        assert r["train_tokens_per_s"] > 0 and r["decode_sentences_per_s"] > 0
        assert r["model"]["d_model"] == 128 and r["model"]["vocab_size"] == 1000 and r["device"] == "cpu"


def test_the_bench_and_the_doctor_count_mfu_on_the_same_real_tokens(tmp_path, monkeypatch):
    """One MFU definition: the bench's achieved TFLOP/s (and so its MFU) are model FLOPs on the batch's real tokens,
    `model_flops`, the doctor's numerator; the FLOPs the padding costs are recorded beside them, larger."""
    out = tmp_path / "bench.json"
    argv = ["--size", "tiny", "--tokens", "128", "--steps", "1", "--warmup", "1", "--trials", "1"]
    argv += ["--decode-sentences", "2", "--decode-src-len", "4", "--decode-extra", "2", "--device", "cpu"]
    assert main(["bench", *argv, "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    bc = bench.bench_config("tiny", "cpu", None, 128)
    batch = bench.training_batch(bc.model, bc.tokens_per_side, bc.seq_len)
    assert r["model_flops_per_step"] == bench.model_flops(bc.model, batch) < r["padded_flops_per_step"]
    assert r["achieved_tflops"] == pytest.approx(r["model_flops_per_step"] / r["train_step_s"] / 1e12)


def test_bench_trainer_cli_times_the_real_trainer_beside_the_bare_step(tmp_path, capsys):
    """`aiayn bench --trainer`: per config one object with both sides' tokens/s and their ratio; the trainer side
    really ran Lightning's loop over TranslationModule (the module counts its own optimizer steps), the bare side
    as many steps, and the rounds were interleaved one trainer window per bare round."""
    out = tmp_path / "trainer.json"
    argv = [
        *"--trainer --trainer-size tiny --trainer-size laptop --tokens 64 --layers 1 --steps 1 --warmup 1".split(),
        *"--trials 2 --device cpu --json".split(),
        str(out),
    ]
    assert main(["bench", *argv]) == 0
    results = json.loads(out.read_text())
    assert [r["config"] for r in results] == ["tiny", "laptop"]
    assert [r["model"]["vocab_size"] for r in results] == [1000, 8000]  # laptop: the laptop preset's vocabulary
    for r in results:
        for key in (
            "trainer_tokens_per_s",
            "bare_tokens_per_s",
            "ratio",
            "trainer_step_s",
            "bare_step_s",
            "model",
            "device",
            "precision",
            "batch_tokens",
            "trainer_optimizer_steps",
        ):
            assert key in r, key
        assert r["trainer_tokens_per_s"] > 0 and r["bare_tokens_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["trainer_tokens_per_s"] / r["bare_tokens_per_s"])
        assert r["trainer_optimizer_steps"] == r["trainer_global_step"] == 1 + 2 * 1  # warm-up + trials × steps
        assert r["bare_optimizer_steps"] == 1 + 2 * 1
        assert len(r["trainer_step_s_trials"]) == len(r["bare_step_s_trials"]) == 2
    printed = capsys.readouterr().out
    assert "| config | trainer tokens/s | bare tokens/s | trainer / bare |" in printed
    assert "| tiny |" in printed and "| laptop |" in printed


def test_bench_trainer_config_is_checked():
    assert main(["bench", "--trainer", "--trainer-size", "huge", "--device", "cpu"]) == 2
    assert main(["bench", "--trainer-size", "tiny", "--device", "cpu"]) == 2  # without --trainer: a mistake


def test_bench_residual_dtype_keeps_aiayns_stream_in_bf16_and_says_so(monkeypatch):
    """`aiayn bench --residual-dtype bf16` (the bf16 stream's step on a GPU, the 31% MFU row of
    BENCHMARKS): aiayn's model gets `residual_stream(model, bf16)` before it is compiled or timed, and the result
    says which stream it timed. Called past the device check (a CPU bench has no autocast: refused below)."""
    from aiayn.bench import BenchOptions

    seen, real = [], bench.residual_stream

    def recorded(model, dtype):
        seen.append((model, dtype))
        real(model, dtype)

    monkeypatch.setattr(bench, "residual_stream", recorded)
    small = dict(size="tiny", tokens=64, layers=1, steps=1, warmup=1, trials=1, decode_sentences=2, decode_src_len=4)
    opts = BenchOptions(**small, decode_extra=2, device="cpu", residual_dtype="bf16")
    (result,) = bench.run(opts)
    assert len(seen) == 1 and seen[0][1] is torch.bfloat16 and seen[0][0].stream is torch.bfloat16
    assert result["residual_dtype"] == "bf16" and result["train_tokens_per_s"] > 0
    (plain,) = bench.run(dataclasses.replace(opts, residual_dtype="fp32"))
    assert len(seen) == 1 and plain["residual_dtype"] == "fp32"


@pytest.mark.parametrize(
    "argv,names",
    [([], "runs on cpu in fp32"), (["--trainer"], "the bare step's")],
    ids=["no CUDA", "--trainer"],
)
def test_bench_residual_dtype_where_it_changes_nothing_is_one_line_and_exit_2(argv, names, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--residual-dtype", "bf16", *argv, "--device", "cpu", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert names in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_the_fused_loss_casts_the_weight_once_per_call_under_autocast():
    """Under bf16 autocast (Lightning's bf16-mixed keeps autocast's cast cache off) the fp32 embedding was
    cast to bf16 for every chunk's logits and again for its gradient, 2 casts per chunk (56 a step at the paper's
    shapes); once per call now, counted as the ops that copy the weight's own storage to another dtype, 4 chunks here;
    and in fp32 (a CPU run) the weight is never cast."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss

    vocab, d = 300, 16

    class Casts(TorchDispatchMode):
        def __init__(self, storage: int):
            super().__init__()
            self.storage, self.weight = storage, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == "_to_copy" and args[0].data_ptr() == self.storage:
                self.weight += args[0].dtype != out.dtype
            return out

    def casts(autocast: bool) -> int:
        hidden = torch.randn(40, d, requires_grad=True)
        weight = torch.randn(vocab, d, requires_grad=True)
        target = torch.randint(4, vocab, (40,))
        with Casts(weight.data_ptr()) as counted, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            projected_label_smoothed_loss(hidden, weight, target, 0.1, chunk=10)[0].backward()
        return counted.weight

    assert casts(True) == 1 and casts(False) == 0


def test_decode_sources_land_on_the_models_device():
    """The bench decodes sources on the model's device (the old check accepted sources made on the CPU):
    on the meta device, which any device="cpu" left in the path would not give."""
    from aiayn.bench.run import decode_sources
    from aiayn.lightning_modules.transformer.model import TransformerConfig

    cfg = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=50, max_len=64)
    src = decode_sources(cfg, 4, 7, torch.device("meta"))
    assert src.device.type == "meta" and tuple(src.shape) == (4, 7)
    assert torch.equal(decode_sources(cfg, 4, 7, torch.device("cpu")), decode_sources(cfg, 4, 7, torch.device("cpu")))


def test_the_grad_w_path_is_found_once_logged_once_and_said(monkeypatch, caplog):
    """With bf16 chunks on a GPU, grad_w tries one GEMM that accumulates in float32 (addmm's out_dtype
    into a float32 accumulator); a torch that refuses it (before pytorch/pytorch#167931) used to fall back silently
    on every chunk. The path is found once per process, logged once, and said (`grad_w_path`, metrics.json's)."""
    import logging

    from aiayn.lightning_modules.transformer import loss as L

    monkeypatch.setattr(L, "_grad_w_paths", {})
    g, h = torch.randn(6, 5), torch.randn(6, 3)
    acc = torch.zeros(5, 3)
    L.accumulate_outer(acc, g, h)  # float32: the product, then the add
    assert L.grad_w_path("cpu") == L.FP32_PATH and torch.allclose(acc, g.t() @ h)

    monkeypatch.setattr(L, "_grad_w_paths", {})
    monkeypatch.setattr(L, "_one_gemm_device", lambda device: True)  # as on CUDA
    tried = []

    def refuses(*args, **kwargs):  # an older torch: no float32 out_dtype into a float32 accumulator
        tried.append(kwargs.get("out_dtype"))
        raise RuntimeError("out_dtype is only supported for ...")

    monkeypatch.setattr(L.torch, "addmm", refuses)
    acc = torch.zeros(5, 3)
    gb, hb = g.bfloat16(), h.bfloat16()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=L.__name__):
        for _ in range(4):  # four chunks
            L.accumulate_outer(acc, gb, hb)
    assert tried == [torch.float32]  # tried once per process, not per chunk
    assert L.grad_w_path("cpu") == L.THREE_PASS_PATH
    assert torch.allclose(acc, 4 * (gb.t() @ hb).float())
    said = [r.getMessage() for r in caplog.records if "grad_w on" in r.getMessage()]
    assert said == [f"grad_w on cpu: {L.THREE_PASS_PATH}"]

    monkeypatch.setattr(L, "_grad_w_paths", {})

    def one_gemm(acc, a, b, out_dtype=None, out=None):  # a torch that has it: one GEMM into the accumulator
        out += a.float() @ b.float()
        return out

    monkeypatch.setattr(L.torch, "addmm", one_gemm)
    L.accumulate_outer(acc, gb, hb)
    assert L.grad_w_path("cpu") == L.ONE_GEMM_PATH


# --- --profile: where a step's time goes ---------------------------------------------


def test_idle_fraction_is_the_share_of_the_span_no_kernel_covers():
    from aiayn.bench.profile import idle_fraction

    assert idle_fraction([(0, 1), (2, 3)]) == pytest.approx(1 / 3)
    assert idle_fraction([(2, 3), (0, 1), (5, 6)]) == pytest.approx(3 / 6)  # in any order
    assert idle_fraction([(0, 2), (1, 3)]) == 0.0  # overlapping kernels (two streams) leave no gap
    assert idle_fraction([(0, 10), (2, 3), (4, 5)]) == 0.0  # nested
    assert idle_fraction([]) == idle_fraction([(4, 4)]) == 0.0


def _profiled(layers: int, steps: int) -> dict:
    from aiayn.bench.profile import profile_steps

    bc = bench.bench_config("tiny", "cpu", layers=layers, tokens=128)
    device = torch.device("cpu")
    trainer = bench.Trainer(
        "aiayn",
        bench.build("aiayn", bc.model),
        bc.model,
        bench.training_batch(bc.model, bc.tokens_per_side, bc.seq_len),
        device,
    )
    trainer.step()  # warm: Adam's state exists, as in the bench's warm-up
    return profile_steps(trainer.step, device, steps)


def test_the_profile_counts_a_steps_launches_per_step_and_more_layers_launch_more():
    """A step launches the same operators every time: the count per step is the same over 1 and 3 steps; a layer
    more per stack launches more (a count of work, not of profiler events: nested operators count once)."""
    one, three, deeper = _profiled(1, 1), _profiled(1, 3), _profiled(2, 1)
    assert one["launches_per_step"] == three["launches_per_step"] > 100
    assert deeper["launches_per_step"] > one["launches_per_step"] + 50
    assert one["what"] == "leaf ATen operators" and "device_idle_fraction" not in one
    assert 0 < len(one["top"]) <= 8 and sum(t["share"] for t in one["top"]) <= 1.0 + 1e-9
    assert all(t["name"].startswith("aten::") for t in one["top"])
    assert "aten::linear" not in {t["name"] for t in one["top"]}  # the addmm under it did the work


def test_the_benchs_timed_figures_are_written_before_its_profile_runs(tmp_path, monkeypatch):
    """`aiayn bench --profile --json F`: F holds the timed figures before the profiler starts, so a limit that stops
    the call during the profile (the first H200's bench stages) loses only the profile."""
    from aiayn.bench import profile

    out, seen = tmp_path / "bench.json", []

    def stopped(step, device, steps):
        seen.append(json.loads(out.read_text()))
        raise KeyboardInterrupt  # the call's limit, mid-profile

    monkeypatch.setattr(profile, "profile_steps", stopped)
    argv = ["--size", "tiny", "--tokens", "128", "--steps", "1", "--warmup", "1", "--trials", "1"]
    argv += ["--decode-sentences", "1", "--decode-src-len", "4", "--decode-extra", "2", "--device", "cpu"]
    with pytest.raises(KeyboardInterrupt):
        main(["bench", *argv, "--profile", "--json", str(out)])
    ((written,),) = seen
    assert written["train_step_s"] > 0 and "profile" not in written


def test_bench_profile_prints_and_records_the_profile(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = [
        *"--size tiny --tokens 128 --steps 1 --warmup 1 --trials 1 --decode-sentences 1 --decode-src-len 4".split(),
        *"--decode-extra 2 --device cpu --profile --json".split(),
        str(out),
    ]
    assert main(["bench", *argv]) == 0
    printed = capsys.readouterr().out
    profile = json.loads(out.read_text())[0]["profile"]
    assert f"{profile['launches_per_step']:.0f} leaf ATen operators a step" in printed
