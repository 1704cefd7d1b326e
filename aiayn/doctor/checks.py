"""`aiayn doctor`'s checks: on a GPU node, in a few minutes, what this project could not check without a GPU.

Each check is a function of the run's `Context` that returns a `Result`: pass, fail or skip, a short value, a
one-line detail, and data for the JSON. `run_check` turns an exception into a fail with its one line, so one broken
check never ends the command. Checks that need CUDA (or two GPUs) are skipped, with the reason, where there is none.

What each check does on a GPU node (and on a machine without CUDA):

- cuda: every visible device runs a kernel; names, capabilities (skip; fail if an NVIDIA driver is there but torch
  sees no device);
- bf16: `torch.cuda.is_bf16_supported()` and a bf16 autocast matmul (bf16 autocast on the CPU);
- sdpa: which SDPA kernel serves each of the model's attention calls, training's in bf16 and decoding's (skip);
- bf16_loss: a bf16-mixed Trainer's losses over 2 steps equal 32-true's, same weights and batch (the same on CPU);
- syncs: host-device syncs per optimizer step of a real `aiayn train` loop, against the budget of 1 (skip);
- throughput: tokens/s and MFU of the paper's base step against the device's bf16 peak (the tiny step's tokens/s);
- ddp: `aiayn train --devices 2 --strategy ddp`, 3 steps of a tiny model, with 2 GPUs or more (skip);
- resume: that run resumed with one GPU visible (`CUDA_VISIBLE_DEVICES`) to 2 steps more (skip);
- translate: a 2-step run translates with `aiayn translate --device cuda` as with `--device cpu` (the CPU only).
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from aiayn import __version__
from aiayn.common.errors import UserError
from aiayn.common.files import atomic_write_json, check_writable_dir
from aiayn.common.secrets import redact, redact_obj
from aiayn.doctor import CHECKS, DoctorOptions

log = logging.getLogger(__name__)

STATUSES = ("pass", "fail", "skip")
NO_CUDA = "no CUDA device visible"
SYNC_BUDGET = 1.0  # host-device syncs per optimizer step the project allows itself
# bf16-mixed against 32-true, relative difference of the per-token training loss: at step 1 (same weights: only
# bf16 rounding) and at step 2 (after one Adam step at lr 1e-3 from each one's own gradients). Measured with CPU
# autocast (the tiny model, 256 positions per side): 2.3e-5 and 4.5e-5; the bounds are about 40x those, room for
# CUDA's kernels (an estimate: not measured on a GPU).
BF16_LOSS_RTOL = (1e-3, 2e-3)
BF16_LR = 1e-3
CPU_TOKENS = 256  # padded positions per side of the CPU's training batches (bf16_loss, throughput)
# SDPA outputs against float32 math on the same (upcast) inputs; |out| <= max |v| ~ 4 for N(0, 1) values
SDPA_ATOL = {torch.bfloat16: 5e-2, torch.float32: 2e-3}
SENTENCES = ("The dog sees the cat.", "Today the small boy sleeps in the garden.", "A woman reads a book.")
# `aiayn train` of a tiny model: seconds on a CPU, enough to exercise the whole recipe
TINY_RUN = (
    "--preset",
    "tiny",
    "--set",
    "N=1",
    "--set",
    "d_model=32",
    "--set",
    "d_ff=64",
    "--set",
    "h=2",
    "--eval-subset",
    "3",
    "--val-bleu-sentences",
    "0",
    "--no-progress",
)


# --- results --------------------------------------------------------------------------------------


@dataclass
class Result:
    status: str  # pass | fail | skip
    value: str = ""
    detail: str = ""
    data: dict = field(default_factory=dict)


def passed(value: str, detail: str, **data) -> Result:
    return Result("pass", value, detail, data)


def failed(value: str, detail: str, **data) -> Result:
    return Result("fail", value, detail, data)


def skipped(reason: str, **data) -> Result:
    return Result("skip", "", reason, data)


@dataclass
class Context:
    """What every check may use: the options, the devices, a scratch directory, and what earlier checks left for
    later ones (`shared`: the DDP run's directory for `resume`)."""

    opts: DoctorOptions
    scratch: Path
    gpus: int
    shared: dict = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.gpus > 0

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.cuda else "cpu")


@dataclass(frozen=True)
class Check:
    fn: Callable[[Context], Result]
    gpus: int = 0  # visible CUDA devices it needs


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def run_check(name: str, check: Check, ctx: Context) -> dict:
    """One check's record: {name, status, value, detail, seconds, data}; an exception is a fail with its line."""
    t0 = time.perf_counter()
    if check.gpus and ctx.gpus < check.gpus:
        result = skipped(NO_CUDA if not ctx.cuda else f"needs {check.gpus} GPUs, {ctx.gpus} visible")
    else:
        log.info("doctor: %s", name)
        try:
            result = check.fn(ctx)
        except (Exception, SystemExit) as e:  # a failed check, reported; the others still run
            log.debug("check %s raised", name, exc_info=True)
            result = failed(
                "error", f"{type(e).__name__}: {_first_line(e) or 'no message'}", traceback=traceback.format_exc()
            )
        if result.status not in STATUSES:
            result = failed("error", f"check returned status {result.status!r}")
    seconds = round(time.perf_counter() - t0, 2)
    return {"name": name, **asdict(result), "seconds": seconds}


# --- the environment -----------------------------------------------------------------------------


def _safe(fn, default=None):
    try:
        return fn()
    except Exception as e:  # the environment is reported as far as it can be read
        return default if default is not None else f"error: {type(e).__name__}: {_first_line(e)}"


def _cpu_name() -> str:
    from aiayn.bench.run import _cpu_name as name

    return name()


def _driver_version() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return _first_line(out.stdout) or None


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def device_records(gpus: int) -> list[dict]:
    out = []
    for i in range(gpus):
        p = torch.cuda.get_device_properties(i)
        memory = round(p.total_memory / 2**30, 1)
        out.append(
            {
                "index": i,
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gib": memory,
                "multiprocessors": p.multi_processor_count,
            }
        )
    return out


def environment(gpus: int) -> dict:
    """What a bug report needs to know about this machine (no environment variables beyond CUDA's)."""
    return {
        "aiayn": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": _safe(lambda: torch.backends.cudnn.version()) if gpus else None,
        "nccl": _safe(_nccl_version) if gpus else None,
        "lightning": pl.__version__,
        "driver": _safe(_driver_version),
        "cuda_available": torch.cuda.is_available(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": _safe(lambda: device_records(gpus), []),
        "cpu": _safe(_cpu_name),
        "threads": torch.get_num_threads(),
    }


# --- cuda, bf16 ------------------------------------------------------------------------------------


def _nvidia_present() -> str | None:
    """An NVIDIA driver on this machine (whether or not torch can use it): its device node or nvidia-smi."""
    if Path("/dev/nvidiactl").exists():
        return "/dev/nvidiactl"
    return shutil.which("nvidia-smi")


def check_cuda(ctx: Context) -> Result:
    """Every visible device runs a kernel; names and capabilities."""
    if not ctx.cuda:
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        driver = _nvidia_present()
        if driver:
            return failed(
                "0 devices",
                f"an NVIDIA driver is here ({driver}) but torch {torch.__version__} "
                f"({build}) sees no CUDA device; check CUDA_VISIBLE_DEVICES and the torch build",
            )
        return skipped(f"{NO_CUDA} (torch {torch.__version__}, {build})")
    devices = device_records(ctx.gpus)
    for i in range(ctx.gpus):
        x = torch.ones(4, device=f"cuda:{i}").add_(1)
        if float(x.sum()) != 8.0:
            return failed(f"cuda:{i}", f"a kernel on cuda:{i} computed {float(x.sum())} instead of 8.0")
    names = Counter(d["name"] for d in devices)
    caps = sorted({d["capability"] for d in devices})
    return passed(
        ", ".join(f"{n} × {name}" for name, n in names.items()),
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, compute capability {'/'.join(caps)}",
        devices=devices,
    )


def check_bf16(ctx: Context) -> Result:
    """CUDA: `torch.cuda.is_bf16_supported()` and a bf16 autocast matmul on the device. CPU: whether bf16 autocast
    works there (`torch.autocast("cpu", dtype=torch.bfloat16)`)."""
    if ctx.cuda and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name()
        return failed(
            "no",
            f"{name}: torch.cuda.is_bf16_supported() is False; train with --precision 32-true",
            is_bf16_supported=False,
        )
    x, w = torch.randn(64, 64, device=ctx.device), torch.randn(64, 64, device=ctx.device)
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
        y = F.linear(x, w)
    ref = F.linear(x, w)
    err = float((y.float() - ref).abs().max() / ref.abs().max())
    data = {"autocast_dtype": str(y.dtype).replace("torch.", ""), "max_rel_err": err}
    where = "CUDA" if ctx.cuda else "CPU"
    if y.dtype != torch.bfloat16 or not err < 2e-2:
        return failed("no", f"{where} bf16 autocast: F.linear gave {y.dtype}, {err:.2g} from float32", **data)
    if not ctx.cuda:
        return passed(
            "CPU autocast",
            f"{NO_CUDA}; bf16 autocast works on this CPU (torch {torch.__version__}): "
            f"F.linear in bfloat16, {err:.1g} from float32",
            **data,
        )
    data["is_bf16_supported"] = True
    return passed(
        "yes",
        f"{torch.cuda.get_device_name()}: torch.cuda.is_bf16_supported(), bf16 autocast matmul {err:.1g} from float32",
        **data,
    )


# --- sdpa ------------------------------------------------------------------------------------------


def _short(backend_name: str) -> str:
    return {
        "FLASH_ATTENTION": "flash",
        "EFFICIENT_ATTENTION": "efficient",
        "CUDNN_ATTENTION": "cudnn",
        "MATH": "math",
    }.get(backend_name, backend_name.lower())


def dispatch_choice(q, k, v, mask, causal: bool) -> str:
    """The SDPA backend `F.scaled_dot_product_attention` dispatches these inputs to under the current flags.

    `torch._fused_sdp_choice` is the op behind the choice: ATen's `scaled_dot_product_attention` calls
    `_fused_sdp_choice_stub` with exactly these arguments (query, key, value, the mask as given, dropout, is_causal)
    and switches on the result; on CUDA the stub is `_fused_sdp_choice_cuda`, i.e. `sdp::select_sdp_backend` over
    the enabled backends in `torch._C._get_sdp_priority_order()`. The backend's name comes from the same enum
    (`torch.nn.attention.SDPBackend`)."""
    from torch.nn.attention import SDPBackend

    return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal)).name


def dispatch_order() -> list[str]:
    """The order in which the dispatcher tries the SDPA backends (`torch._C._get_sdp_priority_order()`, what
    `select_sdp_backend` walks): on CUDA PyTorch puts cuDNN first on SM 9.0 and 10.x with a runtime cuDNN newer than
    9.15 (its `check_prefer_cudnn_attention`), where cuDNN serves the padding masks that rule out flash; the order is
    set at the first dispatch, so read it after one."""
    from torch.nn.attention import SDPBackend

    names = [SDPBackend(i).name for i in torch._C._get_sdp_priority_order()]
    return [_short(name) for name in names if name != "OVERRIDEABLE"]


# ATen's select_sdp_backend, when no enabled backend fits, warns "<backend> kernel not used because:" for each
# backend, each followed by its reasons, then raises "No available kernel"
_REASON_HEADERS = {"efficient": "memory efficient", "flash": "flash attention", "cudnn": "cudnn attention"}


def _reason(messages: list[str], backend: str, error: Exception) -> str:
    """Why `backend` alone could not run: its reasons among PyTorch's warnings, else the error's line."""
    current, reasons = None, []
    for text in messages:
        line = _first_line(text).split(" (Triggered internally")[0].strip()
        if "not used because" in line:
            current = next((b for b, h in _REASON_HEADERS.items() if line.lower().startswith(h)), None)
        elif current == backend:
            reasons.append(line)
    return "; ".join(reasons) or _first_line(error)


def sdpa_case(q, k, v, mask, causal: bool, backward: bool) -> dict:
    """One attention call of the model (`model.attention`, forward and, for training shapes, backward): the backend
    the dispatcher picks, which backends run it alone (`sdpa_kernel(backend)`, one at a time; for those that do not,
    PyTorch's first reason), and the largest difference of the default output from float32 math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from aiayn.lightning_modules.transformer.model import attention

    def call():
        qq, kk, vv = (t.detach().requires_grad_(backward) for t in (q, k, v))
        out = attention(qq, kk, vv, mask, causal)
        if backward:
            out.float().sum().backward()
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)  # an asynchronous kernel error surfaces here, inside the try
        return out.detach()

    alone = {}
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
            warnings.simplefilter("always")
            try:
                call()
                alone[_short(backend.name)] = "ok"
            except RuntimeError as e:
                alone[_short(backend.name)] = _reason([str(w.message) for w in caught], _short(backend.name), e)
    chosen = _short(dispatch_choice(q, k, v, mask, causal))
    out = call()
    with sdpa_kernel(SDPBackend.MATH):
        m = mask.float() if mask is not None and mask.dtype.is_floating_point else mask
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, is_causal=causal)
    return {
        "q": list(q.shape),
        "kv": list(k.shape),
        "dtype": str(q.dtype).replace("torch.", ""),
        "mask": None if mask is None else f"{str(mask.dtype).replace('torch.', '')} {list(mask.shape)}",
        "causal": causal,
        "backward": backward,
        "chosen": chosen,
        "alone": alone,
        "max_abs_err": float((out.float() - ref).abs().max()),
        "atol": SDPA_ATOL[q.dtype],
    }


# The presets whose tables a GPU trains or checks: the paper's, the wide table, and the CPU tables a GPU reruns
HEAD_SHAPE_PRESETS = ("paper", "wide", "real", "evidence")


def table_head_shapes() -> dict[tuple[int, int], list[str]]:
    """(d_k, d_v) -> the rows that train it ("PRESET ROW"), over every row of Table 3 and the extended rows at each
    of HEAD_SHAPE_PRESETS: the kernel a head gets depends on its widths (flash takes d_k up to 256, A1's is 512; B1
    and B2 have d_k != d_v), not on how many heads there are."""
    from aiayn.ablations.presets import get_preset, scale
    from aiayn.ablations.table import load_rows

    shapes: dict[tuple[int, int], list[str]] = {}
    for name in HEAD_SHAPE_PRESETS:
        preset = get_preset(name)
        for row in load_rows().values():
            k = scale(row, preset)
            shapes.setdefault((k["d_k"], k["d_v"]), []).append(f"{name} {row.row}")
    return dict(sorted(shapes.items()))


def head_shape_inputs(device: torch.device, seed: int = 0) -> dict:
    """Training's three attention calls (encoder self-attention with its padding mask, decoder self-attention,
    cross-attention) in bf16, for each head shape the tables train (`table_head_shapes`) but the paper base's, 64
    sentences of up to 40 tokens and 4 heads: each named by its widths and rows."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    h, B, L = 4, 64, 40
    lens = torch.randint(int(0.8 * L), L + 1, (B,), generator=g)
    pad = (torch.arange(L)[None, :] < lens[:, None])[:, None, None, :].to(device)
    cases = {}
    for (d_k, d_v), rows in table_head_shapes().items():
        if (d_k, d_v) == (64, 64):
            continue  # attention_inputs' own
        shown = ", ".join(rows[:3]) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")

        def t(d):
            return torch.randn(B, h, L, d, generator=g).to(device=device, dtype=torch.bfloat16)

        for call, mask, causal in (("enc self", pad, False), ("dec self", None, True), ("cross", pad, False)):
            cases[f"{call}, d_k {d_k} d_v {d_v} ({shown})"] = (t(d_k), t(d_k), t(d_v), mask, causal, True)
    return cases


def attention_inputs(device: torch.device, seed: int = 0) -> dict:
    """The model's attention calls at the paper's base sizes (h = 8, d_k = 64, the bench's paper batch: 625 sentences
    of up to 40 tokens), by name: training's encoder self-attention with its padding mask ("enc self"), decoder
    self-attention ("dec self", causal) and cross-attention with the source padding mask ("cross"), in bf16 as
    bf16-mixed training runs them; and a step of beam search (64 sentences × beam 4, 11 cached positions): decoder
    self-attention over the cache ("step self") and cross-attention grouped per sentence with the additive source mask
    of `Transformer.start_cache` ("step cross grouped"), in bf16 (validation under bf16-mixed) and in float32 (as
    `aiayn translate` runs them)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    h, d, B, L, K, sent, cached = 8, 64, 625, 40, 4, 64, 11

    def t(*shape, dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    lens = torch.randint(int(0.8 * L), L + 1, (B,), generator=g)
    pad = (torch.arange(L)[None, :] < lens[:, None])[:, None, None, :].to(device)  # (B, 1, 1, S) True = attend
    bf16 = torch.bfloat16

    def qkv(n, q_len, k_len, dtype=bf16):
        return t(n, h, q_len, d, dtype=dtype), t(n, h, k_len, d, dtype=dtype), t(n, h, k_len, d, dtype=dtype)

    cases = {  # sdpa_case's (q, k, v, mask, causal, backward)
        "enc self, pad mask": (*qkv(B, L, L), pad, False, True),
        "dec self, causal": (*qkv(B, L, L), None, True, True),
        "cross, pad mask": (*qkv(B, L, L), pad, False, True),
    }
    for dtype in (bf16, torch.float32):
        name = str(dtype).replace("torch.", "")
        bias = torch.zeros(sent, 1, 1, L, dtype=dtype).masked_fill_(~pad[:sent].cpu(), float("-inf")).to(device)
        cases[f"step self, {name}"] = (*qkv(sent * K, 1, cached, dtype), None, False, False)
        cases[f"step cross grouped, {name}"] = (*qkv(sent, K, L, dtype), bias, False, False)
    return cases


def check_sdpa(ctx: Context) -> Result:
    """Which SDPA kernel serves each attention call of training and decoding (see `attention_inputs`), and training's
    calls at every other head shape the tables train (`head_shape_inputs`: A1's d_k 512, B1/B2's d_k != d_v, A3/A4,
    the smaller tables' widths), and the dispatcher's order of backends; fail when one falls to the math backend (it
    materializes the T×S weights: slow and memory-hungry) or is inaccurate."""
    inputs = {**attention_inputs(ctx.device), **head_shape_inputs(ctx.device)}
    cases = {name: sdpa_case(*args) for name, args in inputs.items()}
    order = dispatch_order()
    problems = []
    for name, c in cases.items():
        if c["chosen"] == "math":
            problems.append(f"{name}: math backend")
        elif c["alone"].get(c["chosen"]) != "ok":
            problems.append(f"{name}: dispatcher picks {c['chosen']}, which fails alone")
        if c["max_abs_err"] > c["atol"]:
            problems.append(f"{name}: {c['max_abs_err']:.2g} from float32 math")
    picked = Counter(c["chosen"] for c in cases.values())
    value = ", ".join(f"{b} {n}" for b, n in picked.most_common())
    detail = "; ".join(f"{name}: {c['chosen']}" for name, c in cases.items())
    if problems:
        return failed(value, "; ".join(problems), cases=cases, order=order)
    detail = f"all fused, within tolerance of float32 math ({detail}; tried in the order {', '.join(order)})"
    return passed(value, detail, cases=cases, order=order)


# --- bf16 against fp32 ----------------------------------------------------------------------------


class LossRecorder(pl.Callback):
    """The training loss of each batch, per real target token (training_step returns the summed loss)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach().float()) / batch["n_tgt_tokens"])


def training_losses(device: torch.device, precision: str, cfg, batch: dict, steps: int, root: str) -> list[float]:
    """The module's per-token losses over `steps` Trainer steps on `batch` at `precision`, from seed 0's weights,
    at learning rate BF16_LR from the first step (warmup 1; the schedule's factor set for it)."""
    from aiayn.bench.trainer import batch_loader, lightning_trainer, on_device
    from aiayn.lightning_modules.run.module import TranslationModule

    torch.manual_seed(0)
    module = TranslationModule(cfg, warmup=1, lr_factor=BF16_LR * cfg.d_model**0.5)
    recorder = LossRecorder()
    trainer = lightning_trainer(device, steps, [recorder], root, precision=precision)
    trainer.fit(module, train_dataloaders=batch_loader(on_device(batch, device), steps))
    return recorder.losses


def check_bf16_loss(ctx: Context) -> Result:
    """A bf16-mixed training step's loss against 32-true's: the tiny preset's base row without dropout (so both see
    the same function), the same initial weights and batch, through Lightning's Trainer and the module's loss; the
    loss of step 1 (same weights) and of step 2 (after one Adam step from each one's own gradients)."""
    from aiayn.bench.run import training_batch
    from aiayn.lightning_modules.run.spec import resolve
    from aiayn.lightning_modules.transformer.config import TransformerConfig

    cfg = TransformerConfig.from_dict(resolve("base", "tiny").model.to_dict() | {"P_drop": 0.0})
    batch = training_batch(cfg, 1024 if ctx.cuda else CPU_TOKENS, 32)
    root = str(ctx.scratch / "bf16_loss")
    fp32 = training_losses(ctx.device, "32-true", cfg, batch, 2, root)
    bf16 = training_losses(ctx.device, "bf16-mixed", cfg, batch, 2, root)
    rel = [abs(b - a) / abs(a) for a, b in zip(fp32, bf16)]
    data = {"fp32": fp32, "bf16": bf16, "rel_diff": rel, "rtol": list(BF16_LOSS_RTOL), "device": ctx.device.type}
    value = f"{rel[0]:.1e} / {rel[1]:.1e}"
    where = "CUDA" if ctx.cuda else "CPU (autocast)"
    text = (
        f"{where}: per-token loss fp32 {fp32[0]:.4f}, {fp32[1]:.4f}; bf16-mixed {bf16[0]:.4f}, {bf16[1]:.4f} "
        f"(steps 1, 2); tolerance {BF16_LOSS_RTOL[0]:g}, {BF16_LOSS_RTOL[1]:g} relative"
    )
    if any(r > tol or r != r for r, tol in zip(rel, BF16_LOSS_RTOL)):
        return failed(value, text, **data)
    return passed(value, text, **data)


# --- host-device syncs -----------------------------------------------------------------------------

SYNC_WARNING = "called a synchronizing CUDA operation"  # c10::cuda::warn_or_error_on_sync's message
# CUDA runtime calls that block the host until the device is done (what the profiler window counts)
BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


class SyncCounter(pl.Callback):
    """Counts host-device syncs in two windows of `steps` optimizer steps, after `warmup` steps, from the end of one
    optimizer step to the end of the step `steps` later (each window holds `steps` whole iterations of the loop,
    logging and callbacks included).

    Window 1, `torch.cuda.set_sync_debug_mode("warn")`: c10's `stream_synchronize` and `memcpy_and_sync` (behind
    `.item()`, `.tolist()`, `bool(tensor)`, a blocking copy to or from the device, `nonzero`, ...) each emit the
    warning SYNC_WARNING, recorded here with the Python line that caused it. Window 2, `torch.profiler` with CUDA
    activity: the CUDA runtime calls that block the host (BLOCKING_CALLS), a second count that also sees syncs the
    debug mode does not cover. The second is information; the check judges by the first."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.marks, self.steps = (warmup, warmup + steps, warmup + 2 * steps), steps
        self.count: int | None = None
        self.sources: Counter = Counter()
        self.profiled: dict | None = None
        self.profiler_error: str | None = None
        self._last, self._catch, self._records, self._prof = -1, None, None, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last:  # inside an accumulation window
            return
        self._last = step
        if step == self.marks[0]:
            self._catch = warnings.catch_warnings(record=True)
            self._records = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        elif step == self.marks[1]:
            self.stop_debug()
            try:
                from torch.profiler import ProfilerActivity, profile

                self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self._prof.start()
            except Exception as e:  # the profiler's count is information only
                self._prof, self.profiler_error = None, f"{type(e).__name__}: {_first_line(e)}"
        elif step == self.marks[2]:
            self.stop_profiler()

    def stop_debug(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        if self._catch is None:
            return
        self._catch.__exit__(None, None, None)
        hits = [w for w in self._records if SYNC_WARNING in str(w.message)]
        self.count = len(hits)
        self.sources = Counter(f"{'/'.join(Path(w.filename).parts[-2:])}:{w.lineno}" for w in hits)  # dir/file:line
        self._catch = None

    def stop_profiler(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        try:
            prof.stop()
            names = Counter(e.name for e in prof.events())
            self.profiled = {name: names[name] for name in BLOCKING_CALLS}
        except Exception as e:
            self.profiler_error = f"{type(e).__name__}: {_first_line(e)}"


SYNC_WARMUP, SYNC_STEPS = 3, 10  # the window: the end of step 3 to the end of step 13, log step 10 inside it


def sync_options(ctx: Context):
    """The run the sync check counts: `aiayn train`'s defaults (the progress bar on, a log step every
    log_every_n_steps = 10, so step 10 of the window is one) on one GPU in bf16-mixed, tiny preset."""
    from aiayn.lightning_modules.run.options import TrainOptions

    return TrainOptions(
        preset="tiny",
        out=str(ctx.scratch / "syncs"),
        cache_dir=ctx.opts.cache_dir,
        accelerator="gpu",
        devices=1,
        precision="bf16-mixed",
        max_steps=SYNC_WARMUP + 2 * SYNC_STEPS + 1,
        eval_subset=3,
        val_bleu_sentences=0,
    )


def check_syncs(ctx: Context) -> Result:
    """Host-device syncs per optimizer step of the real training loop: `train()` (what `aiayn train` runs: the
    module, build_trainer's callbacks, CSV logger, checkpoints) with its defaults, the progress bar and a log step
    included (`sync_options`); counted over 10 steps after 3 (SyncCounter). Pass at SYNC_BUDGET per step or
    fewer."""
    from aiayn.lightning_modules.run.train import Hooks, train

    warmup, steps = SYNC_WARMUP, SYNC_STEPS
    counter = SyncCounter(warmup, steps)
    opts = sync_options(ctx)
    logged = [s for s in range(warmup + 1, warmup + steps + 1) if s % 10 == 0]  # log_every_n_steps (the default)
    try:
        train(opts, hooks=Hooks(callbacks=(counter,), run_dir=ctx.scratch / "syncs" / "run"))
    finally:
        counter.stop_debug()
        counter.stop_profiler()
    if counter.count is None:
        return failed("?", f"the count window (steps {warmup}..{warmup + steps}) never closed")
    per_step = counter.count / steps
    top = ", ".join(f"{src} ×{n}" for src, n in counter.sources.most_common(4))
    prof = (
        f"; profiler: {', '.join(f'{k} {v}' for k, v in counter.profiled.items() if v)} in {steps} steps"
        if counter.profiled
        else f"; profiler: {counter.profiler_error or 'no count'}"
    )
    data = {
        "syncs": counter.count,
        "steps": steps,
        "per_step": per_step,
        "budget": SYNC_BUDGET,
        "sources": dict(counter.sources.most_common()),
        "profiler": counter.profiled,
        "profiler_error": counter.profiler_error,
    }
    text = (
        f"{counter.count} syncs in {steps} optimizer steps (budget {SYNC_BUDGET:g} per step; progress bar on, log "
        f"step(s) {', '.join(map(str, logged))} in the window): {top or 'none'}{prof}"
    )
    if per_step > SYNC_BUDGET:
        return failed(f"{per_step:.1f} / step", text, **data)
    return passed(f"{per_step:.1f} / step", text, **data)


# --- throughput ------------------------------------------------------------------------------------


def check_throughput(ctx: Context) -> Result:
    """Training tokens/s of the bench's aiayn step (forward, fused loss, backward, fused Adam; bf16 autocast on
    CUDA): the paper's base row at 37000 vocabulary and 25k+25k padded positions on CUDA, with MFU against the
    device's bf16 dense peak (aiayn.bench.run's `model_flops` on the real tokens, the bench's MFU, and its peak
    table); on CPU the tiny preset's model on a batch of CPU_TOKENS padded positions per side (a quarter of its real
    batch: seconds, not minutes, on 2 busy cores).
    Median of 3 rounds of --steps steps after 2 warm-up steps. Information: passes when it runs."""
    from aiayn.bench import run as bench

    device = ctx.device
    bc = bench.bench_config("paper" if ctx.cuda else "tiny", device.type, tokens=None if ctx.cuda else CPU_TOKENS)
    batch = bench.training_batch(bc.model, bc.tokens_per_side, bc.seq_len)
    step = bench.Trainer("aiayn", bench.build("aiayn", bc.model).to(device), bc.model, batch, device)
    for _ in range(2):
        step.step()
    seconds = statistics.median(step.timed(ctx.opts.steps) for _ in range(3))
    tokens = batch["n_src_tokens"] + batch["n_tgt_tokens"]
    B, S = batch["src"].shape
    useful = bench.model_flops(bc.model, batch)
    tflops = useful / seconds / 1e12
    name = torch.cuda.get_device_name(device) if ctx.cuda else _cpu_name()
    stated = bench.peak_bf16_tflops(name) if ctx.cuda else None
    measured = measured_matmul_tflops(device) if ctx.cuda else None
    data = {
        "config": bc.name,
        "config_note": bc.note,
        "tokens_per_s": tokens / seconds,
        "step_s": seconds,
        "model_flops_per_step": useful,
        "achieved_tflops": tflops,
        "peak_bf16_tflops_stated": stated,
        "peak_bf16_tflops_measured": measured,
        "mfu": tflops / stated if stated else None,
        "mfu_of_measured": tflops / measured if measured else None,
        "device_name": name,
    }
    del step
    if ctx.cuda:
        torch.cuda.empty_cache()
    value = f"{tokens / seconds:,.0f} tokens/s" + (f", MFU {100 * tflops / stated:.1f}%" if stated else "")
    where = "bf16-mixed" if ctx.cuda else "fp32"
    if stated:
        peak_text = (
            f"{tflops:.1f} TFLOP/s of the real tokens' model FLOPs, {100 * tflops / stated:.1f}% of the "
            f"stated bf16 dense peak {stated:.0f} (datasheet)"
        )
        if measured:
            peak_text += f", {100 * tflops / measured:.1f}% of a measured bf16 matmul's {measured:.0f}"
    else:
        peak_text = f"{tflops * 1e3:.1f} GFLOP/s" + ("; no bf16 peak known for this device" if ctx.cuda else "")
    text = f"{name}, {bc.note}, batch {B}×{S}, {where}: {seconds * 1e3:.1f} ms/step, {peak_text}"
    return passed(value, text, **data)


def measured_matmul_tflops(device: torch.device, n: int = 8192, repeats: int = 20) -> float:
    """What this GPU delivers on the best case it has: an n×n by n×n bf16 matmul, timed with CUDA events after a
    warm-up (the measured peak MFU is also quoted against, beside the datasheet's)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize(device)
    seconds = start.elapsed_time(end) / 1e3 / repeats
    return 2 * n**3 / seconds / 1e12


# --- aiayn subprocesses: DDP, resume, translate -------------------------------------------------------


def aiayn(args: list[str], ctx: Context, log_name: str, env: dict | None = None) -> str:
    """Run `python -m aiayn ARGS` as a user would; its output is kept in the scratch directory. Returns the output;
    a non-zero exit raises with its last line. Inside a SLURM allocation the run is marked interactive
    (SLURM_JOB_NAME, Lightning's own convention), so that Lightning starts the DDP ranks itself instead of expecting
    `srun` to have started one task per GPU."""
    cmd = [sys.executable, "-m", "aiayn", *args]
    slurm = {"SLURM_JOB_NAME": "interactive"} if "SLURM_NTASKS" in os.environ else {}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=ctx.opts.timeout, env={**os.environ, **slurm, **(env or {})}
    )
    output = proc.stdout + proc.stderr
    log_file = ctx.scratch / f"{log_name}.log"
    log_file.write_text(f"$ {' '.join(cmd)}\n{output}")
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()]
        raise RuntimeError(
            f"aiayn {args[0]} exited {proc.returncode}: {last[-1] if last else 'no output'} (log: {log_file})"
        )
    return output


def _cache_args(ctx: Context) -> list[str]:
    return ["--cache-dir", ctx.opts.cache_dir] if ctx.opts.cache_dir else []


def _run_metrics(out: Path) -> dict:
    import json

    return json.loads((out / "tiny" / "synthetic" / "base" / "seed0" / "metrics.json").read_text())


def check_ddp(ctx: Context) -> Result:
    """`aiayn train --devices 2 --strategy ddp`, bf16-mixed, 3 steps of a tiny model: completes, 3 steps, world 2."""
    out = ctx.scratch / "ddp"
    aiayn(
        [
            "train",
            *TINY_RUN,
            "--out",
            str(out),
            *"--max-steps 3 --accelerator gpu --devices 2 --strategy ddp --precision bf16-mixed".split(),
            *_cache_args(ctx),
        ],
        ctx,
        "ddp",
    )
    m = _run_metrics(out)
    ctx.shared["ddp_out"] = out
    if m.get("status") != "completed" or m.get("steps") != 3:
        return failed(m.get("status", "?"), f"metrics.json says status {m.get('status')}, {m.get('steps')} steps")
    return passed(
        "3 steps",
        f"2 ranks (DDP, NCCL), bf16-mixed: completed, dev PPL {m['dev_ppl']:.1f}",
        metrics={k: m.get(k) for k in ("steps", "dev_ppl", "tokens_per_s", "train_time_s")},
    )


def check_resume(ctx: Context) -> Result:
    """The DDP run's checkpoint resumed as it ran (2 GPUs, DDP) to 5 steps: Lightning restores it and the run completes
    at step 5; before that, resuming it on one GPU (CUDA_VISIBLE_DEVICES narrowed to the first, `--devices 1`) is
    refused in one line, since its data position is counted in the 2-rank split (RunDir.check_resume_plan)."""
    out = ctx.shared.get("ddp_out")
    if out is None:
        return skipped("needs the ddp check's run, which did not complete")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    first = visible.split(",")[0].strip() or "0"
    common = [
        "train",
        *TINY_RUN,
        "--out",
        str(out),
        *"--max-steps 5 --accelerator gpu --precision bf16-mixed".split(),
        *_cache_args(ctx),
    ]
    try:
        aiayn([*common, "--devices", "1"], ctx, "resume-one-gpu", env={"CUDA_VISIBLE_DEVICES": first})
        refused = False
    except RuntimeError as e:
        refused = "exited 2" in str(e) and "would misplace its position in the data" in str(e)
    output = aiayn([*common, "--devices", "2", "--strategy", "ddp"], ctx, "resume")
    m = _run_metrics(out)
    restored = "Restored all states from the checkpoint" in output  # Lightning's own line when it resumes
    text = (
        f"on 1 GPU: refused {refused}; on 2 (as it ran): restored {restored}, status {m.get('status')}, "
        f"{m.get('steps')} steps"
    )
    if not refused or not restored or m.get("status") != "completed" or m.get("steps") != 5:
        return failed("no", text)
    return passed("yes", text)


def check_translate(ctx: Context) -> Result:
    """A 2-step run of a tiny model (`aiayn train`), then `aiayn translate` of SENTENCES on the CPU and, with CUDA,
    on the GPU: every sentence translated, and the GPU's translations in float32 equal the CPU's (beam 4); the
    GPU's bf16 translations (its default) are counted against them as information."""
    out = ctx.scratch / "translate"
    accelerator = "gpu" if ctx.cuda else "cpu"
    aiayn(
        ["train", *TINY_RUN, "--out", str(out), "--max-steps", "2", "--accelerator", accelerator, *_cache_args(ctx)],
        ctx,
        "translate-train",
    )
    run = out / "tiny" / "synthetic" / "base" / "seed0"
    src = ctx.scratch / "sentences.en"
    src.write_text("".join(s + "\n" for s in SENTENCES))
    outputs = {}
    for key, device, precision in TRANSLATE_RUNS if ctx.cuda else TRANSLATE_RUNS[:1]:
        hyp = ctx.scratch / f"translate-{key}.de"
        aiayn(
            [
                "translate",
                "--run",
                str(run),
                "--device",
                device,
                "--precision",
                precision,
                "--input",
                str(src),
                "--output",
                str(hyp),
            ],
            ctx,
            f"translate-{key}",
        )
        outputs[key] = hyp.read_text().splitlines()
        if len(outputs[key]) != len(SENTENCES):
            return failed(
                f"{len(outputs[key])} lines",
                f"--device {device} --precision {precision}: {len(outputs[key])} lines for {len(SENTENCES)} sentences",
                outputs=outputs,
            )
    if not ctx.cuda:
        return passed(
            f"{len(SENTENCES)} sentences",
            f"{NO_CUDA}: a 2-step run translates on the CPU; the GPU's output is compared with it on a GPU node",
            outputs=outputs,
        )
    # like with like: float32 on both devices (`--device cuda` alone would decode in bf16, `--precision auto`)
    differ = [i for i, (a, b) in enumerate(zip(outputs["cpu"], outputs["cuda"])) if a != b]
    same_bf16 = sum(a == b for a, b in zip(outputs["cpu"], outputs["cuda-bf16"]))
    info = f"; in bf16 (the GPU's default) {same_bf16} of {len(SENTENCES)} equal the float32 ones (information)"
    if differ:
        i = differ[0]
        return failed(
            f"{len(differ)} differ",
            f"float32 on both, sentence {i + 1}: cpu {outputs['cpu'][i]!r}, cuda {outputs['cuda'][i]!r}{info}",
            outputs=outputs,
        )
    return passed(
        f"{len(SENTENCES)} equal",
        f"a 2-step run translates on cuda as on cpu (beam 4, float32 on both){info}",
        outputs=outputs,
    )


# (key, --device, --precision): the CPU's float32, the GPU's float32 (compared with it), the GPU's default bf16
TRANSLATE_RUNS = (("cpu", "cpu", "32-true"), ("cuda", "cuda", "32-true"), ("cuda-bf16", "cuda", "bf16-mixed"))


REGISTRY: dict[str, Check] = {
    "cuda": Check(check_cuda),
    "bf16": Check(check_bf16),
    "sdpa": Check(check_sdpa, gpus=1),
    "bf16_loss": Check(check_bf16_loss),
    "syncs": Check(check_syncs, gpus=1),
    "throughput": Check(check_throughput),
    "ddp": Check(check_ddp, gpus=2),
    "resume": Check(check_resume, gpus=2),
    "translate": Check(check_translate),
}
assert tuple(REGISTRY) == CHECKS, "aiayn/doctor/__init__.py's CHECKS names these, in this order"


# --- the command -------------------------------------------------------------------------------------


def run_doctor(opts: DoctorOptions) -> dict:
    """Every selected check, in order, and the environment: the JSON document."""
    unknown = [name for name in opts.checks if name not in REGISTRY]
    if unknown:
        raise UserError(f"--check {unknown[0]}: unknown check; choose from {', '.join(CHECKS)}")
    names = [name for name in CHECKS if not opts.checks or name in opts.checks]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    keep = opts.out is not None
    if keep:
        check_writable_dir(opts.out, "--out")
    scratch = Path(opts.out) if keep else Path(tempfile.mkdtemp(prefix="aiayn-doctor-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        ctx = Context(opts, scratch, gpus)
        records = [run_check(name, REGISTRY[name], ctx) for name in names]
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = {status: sum(r["status"] == status for r in records) for status in STATUSES}
    return {
        "schema": 1,
        "command": "aiayn doctor",
        "environment": environment(gpus),
        "checks": records,
        "summary": summary,
    }


def table(report: dict) -> str:
    env = report["environment"]
    devices = ", ".join(f"{d['name']} (sm {d['capability']})" for d in env["devices"]) or f"CPU: {env['cpu']}"
    lines = [
        f"aiayn {env['aiayn']}, torch {env['torch']} (CUDA {env['torch_cuda'] or 'none'}), lightning "
        f"{env['lightning']}, python {env['python']}; {devices}",
        "",
        "| check | result | value | detail |",
        "| --- | --- | --- | --- |",
    ]
    for r in report["checks"]:
        detail = r["detail"].replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r['name']} | {r['status'].upper() if r['status'] == 'fail' else r['status']} "
            f"| {r['value']} | {detail} |"
        )
    s = report["summary"]
    lines.append(f"\n{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped")
    return redact("\n".join(lines))


def main(opts: DoctorOptions) -> int:
    """Print the table, write the JSON; 1 when a check failed, else 0 (skips are fine)."""
    report = run_doctor(opts)
    print(table(report))
    if opts.json:
        atomic_write_json(opts.json, redact_obj(report))
        print(f"wrote {opts.json}: attach it to a bug report")
    return 1 if report["summary"]["fail"] else 0
