"""`aiayn doctor` on a machine without CUDA: the checks that apply pass, the GPU ones are skipped with their reason,
a check that raises is a fail (exit 1) without ending the others; and the pieces the GPU checks are made of, where
they can run without a GPU: the SDPA backend detection on CPU tensors, the sync counter's windows."""

import json
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.cli import main
from aiayn.doctor import CHECKS
from aiayn.doctor import checks as doctor

GPU_CHECKS = ("cuda", "sdpa", "syncs", "ddp", "resume")
CPU_CHECKS = ("bf16", "bf16_loss", "throughput", "translate")

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without CUDA reports")


def test_every_check_has_its_function():
    assert tuple(doctor.REGISTRY) == CHECKS
    assert set(GPU_CHECKS) | set(CPU_CHECKS) == set(CHECKS)


@no_cuda
@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_doctor_on_cpu_passes_what_applies_and_skips_the_gpu_checks(cache, tmp_path, capsys):
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--json", str(out), "--out", str(tmp_path / "scratch")]) == 0
    printed = capsys.readouterr().out
    assert "| check | result | value | detail |" in printed
    for name in CHECKS:
        assert f"| {name} |" in printed, name
    report = json.loads(out.read_text())
    records = {r["name"]: r for r in report["checks"]}
    assert list(records) == list(CHECKS)
    assert all(r["status"] in ("pass", "fail", "skip") for r in records.values())
    for name in GPU_CHECKS:
        assert records[name]["status"] == "skip", records[name]
        assert records[name]["detail"].startswith("no CUDA device visible"), records[name]
    for name in CPU_CHECKS:
        assert records[name]["status"] == "pass", records[name]
    assert report["summary"] == {"pass": len(CPU_CHECKS), "fail": 0, "skip": len(GPU_CHECKS)}
    env = report["environment"]
    for key in ("torch", "torch_cuda", "lightning", "python", "devices", "cpu", "cuda_available"):
        assert key in env, key
    assert env["torch"] == torch.__version__ and env["cuda_available"] is False
    # what the passes rest on
    loss = records["bf16_loss"]["data"]
    assert len(loss["fp32"]) == len(loss["bf16"]) == 2 and loss["fp32"] != loss["bf16"]  # bf16 really ran
    assert all(r <= tol for r, tol in zip(loss["rel_diff"], loss["rtol"]))
    assert records["throughput"]["data"]["tokens_per_s"] > 0
    translations = records["translate"]["data"]["outputs"]["cpu"]
    assert len(translations) == len(doctor.SENTENCES) and all(translations)


def _boom(ctx):
    raise RuntimeError("boom\nsecond line")


def test_a_check_that_raises_is_a_fail_and_the_exit_status_is_1(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(doctor.REGISTRY, "bf16", doctor.Check(_boom))
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--check", "bf16", "--check", "cuda", "--json", str(out)]) == 1
    records = {r["name"]: r for r in json.loads(out.read_text())["checks"]}
    assert list(records) == ["cuda", "bf16"]  # in the doctor's order; the one after the failure still ran
    assert records["bf16"]["status"] == "fail"
    assert records["bf16"]["detail"] == "RuntimeError: boom"  # one line
    assert "| bf16 | FAIL |" in capsys.readouterr().out


def test_an_unknown_check_is_a_user_error():
    assert main(["doctor", "--check", "nope"]) == 2


def test_sdpa_case_names_the_dispatchers_backend_and_which_run_alone():
    """On CPU tensors long enough that the model's `attention` calls SDPA (keys > 64, queries > 16): the backend the
    dispatcher picks runs alone, math runs alone, CUDA-only backends do not and carry PyTorch's reason, and the
    default output equals float32 math."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for n in (20, 80, 80))
    mask = torch.ones(2, 1, 1, 80, dtype=torch.bool)
    mask[1, ..., 70:] = False
    case = doctor.sdpa_case(q, k, v, mask, causal=False, backward=True)
    assert case["alone"][case["chosen"]] == "ok"
    assert case["alone"]["math"] == "ok"
    assert case["alone"]["efficient"] != "ok" and case["alone"]["efficient"]  # a reason, not empty
    assert case["max_abs_err"] < case["atol"]
    assert case["q"] == [2, 2, 20, 8] and case["mask"] == "bool [2, 1, 1, 80]"


def test_the_sdpa_check_dispatches_every_head_shape_the_tables_train():
    """A1's d_k 512 (beyond flash's 256), B1/B2's d_k != d_v, A3/A4 and the smaller tables' widths: each shape's three
    training calls are a case of the check, named by its widths and rows (the base's are attention_inputs' own)."""
    shapes = doctor.table_head_shapes()
    assert {(512, 512), (16, 64), (32, 64), (32, 32), (16, 16), (8, 8), (64, 64)} <= set(shapes)
    assert "paper A1" in shapes[(512, 512)] and "paper B1" in shapes[(16, 64)] and "paper A3" in shapes[(32, 32)]
    cases = doctor.head_shape_inputs(torch.device("cpu"))
    assert len(cases) == 3 * (len(shapes) - 1)
    (a1,) = [name for name in cases if name.startswith("enc self, d_k 512 d_v 512 (paper A1")]
    q, k, v, mask, causal, backward = cases[a1]
    assert q.shape[-1] == k.shape[-1] == v.shape[-1] == 512 and mask is not None and backward
    (b1,) = [args for name, args in cases.items() if name.startswith("cross, d_k 16 d_v 64")]
    assert b1[0].shape[-1] == 16 and b1[2].shape[-1] == 64


def test_dispatch_choice_follows_the_enabled_backends():
    q = k = v = torch.randn(1, 2, 80, 8)
    with sdpa_kernel(SDPBackend.MATH):
        assert doctor.dispatch_choice(q, k, v, None, False) == "MATH"
    assert doctor.dispatch_choice(q, k, v, None, False) != "MATH"  # torch 2.13 CPU: its flash kernel


def test_dispatch_order_is_the_order_the_dispatcher_tries_the_backends():
    """The sdpa check reports the dispatcher's order (on an H100 with a recent cuDNN, PyTorch puts cuDNN first,
    which serves the padding masks flash cannot); a priority set by the caller is the one reported."""
    assert doctor.dispatch_order()[:3] == ["flash", "efficient", "math"]  # torch's default order on a CPU build
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH], set_priority=True):
        assert doctor.dispatch_order()[:2] == ["cudnn", "math"]
    assert "overrideable" not in doctor.dispatch_order()


def test_reason_picks_the_backends_own_lines_from_atens_warnings():
    """select_sdp_backend's warnings when nothing fits: a header per backend, then that backend's reasons."""
    messages = [
        "Memory efficient kernel not used because: (Triggered internally at sdp_utils.cpp:1)",
        "Memory Efficient attention has been runtime disabled. (Triggered internally at sdp_utils.cpp:2)",
        "Flash attention kernel not used because:",
        "Flash Attention does not support non-null attn_mask. (Triggered internally at sdp_utils.cpp:3)",
        "CuDNN attention kernel not used because:",
        "cuDNN attention has been runtime disabled.",
    ]
    error = RuntimeError("No available kernel. Aborting execution.")
    assert doctor._reason(messages, "flash", error) == "Flash Attention does not support non-null attn_mask."
    assert doctor._reason(messages, "cudnn", error) == "cuDNN attention has been runtime disabled."
    assert doctor._reason([], "flash", error) == "No available kernel. Aborting execution."


class _Trainer:
    global_step = 0


def test_sync_counter_counts_the_syncs_of_exactly_its_window(monkeypatch):
    """Step s of a fake loop raises s sync warnings; the counter's window is steps warmup+1 .. warmup+steps (the end
    of step 2 to the end of step 5: 3 + 4 + 5 warnings), with the sync debug mode on for that window only."""
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    counter, trainer = doctor.SyncCounter(warmup=2, steps=3), _Trainer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # outside the window: not recorded
        for step in range(1, 9):
            for _ in range(step):
                warnings.warn(doctor.SYNC_WARNING, UserWarning, stacklevel=1)
            warnings.warn("another warning", UserWarning, stacklevel=1)
            trainer.global_step = step
            counter.on_train_batch_end(trainer, None, None, None, step - 1)
    counter.stop_profiler()
    assert counter.count == 3 + 4 + 5
    assert modes[:2] == ["warn", "default"]
    assert list(counter.sources) == [f"tests/test_doctor.py:{_line_of('warnings.warn(doctor.SYNC_WARNING')}"]


def _line_of(text: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


def _ctx(tmp_path, gpus=0):
    from aiayn.doctor import DoctorOptions

    return doctor.Context(DoctorOptions(), tmp_path, gpus)


def test_the_sync_check_counts_the_defaults_with_a_log_step_in_its_window(tmp_path, monkeypatch):
    """The window (after step 3, 10 steps) holds log step 10, and the run has `aiayn train`'s defaults (the
    progress bar on, log_every_n_steps not overridden), so a healthy node is judged on what users run."""
    from aiayn.lightning_modules.run import train as T

    seen = {}
    monkeypatch.setattr(T, "train", lambda opts, hooks: seen.update(opts=opts, hooks=hooks))
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    result = doctor.check_syncs(_ctx(tmp_path, gpus=1))
    opts, (counter,) = seen["opts"], seen["hooks"].callbacks
    assert opts.progress is True and opts.trainer == {} and T.TRAINER_DEFAULTS["log_every_n_steps"] == 10
    assert counter.marks[0] < 10 <= counter.marks[1] and opts.max_steps > counter.marks[2]
    assert result.status == "fail" and "never closed" in result.detail  # the fake loop ran nothing


def test_the_translate_check_compares_float32_on_both_devices(tmp_path, monkeypatch):
    """`--device cuda` alone decodes in bf16 (`--precision auto`): the compared GPU run asks for float32, as the CPU
    one does; the bf16 run is counted as information. Seen with bf16 translations that differ from float32."""
    calls = []

    def fake_aiayn(args, ctx, log_name, env=None):
        calls.append(args)
        if args[0] == "translate":
            precision = args[args.index("--precision") + 1]
            out = [f"Satz {i}" + (" bf16" if precision.startswith("bf16") and i == 0 else "") for i in range(8)]
            (tmp_path / args[args.index("--output") + 1].split("/")[-1]).write_text("\n".join(out) + "\n")
        return ""

    monkeypatch.setattr(doctor, "aiayn", fake_aiayn)
    monkeypatch.setattr(doctor, "SENTENCES", [f"sentence {i}" for i in range(8)])
    result = doctor.check_translate(_ctx(tmp_path, gpus=1))
    runs = [(a[a.index("--device") + 1], a[a.index("--precision") + 1]) for a in calls if a[0] == "translate"]
    assert runs == [("cpu", "32-true"), ("cuda", "32-true"), ("cuda", "bf16-mixed")]
    assert result.status == "pass" and "float32 on both" in result.detail and "7 of 8 equal" in result.detail


def test_mfu_counts_the_real_tokens_not_the_padding():
    from aiayn.bench import run as bench
    from aiayn.lightning_modules.transformer.model import TransformerConfig

    cfg = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=50, max_len=64)
    batch = bench.training_batch(cfg, 64, 8)  # 8 sentences padded to 8 tokens: about 10% padding
    B, S = batch["src"].shape
    real = bench.model_flops(cfg, batch)
    padded = bench.flops_per_step(cfg, B * S, B * batch["tgt_in"].shape[1], S, batch["tgt_in"].shape[1])
    n_src, n_tgt = batch["n_src_tokens"], batch["n_tgt_tokens"]
    assert n_src < B * S and real < padded
    assert real == bench.flops_per_step(cfg, n_src, n_tgt, n_src / B, n_tgt / B)
