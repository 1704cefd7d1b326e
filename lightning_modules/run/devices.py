"""What a run's hardware decides: its precision (`--precision auto`), the matmul precision of fp32 on a GPU, the data
loader's workers and pinned memory, and the autocast that evaluation and decoding run under.

The paper trained in fp32 on P100s; on a GPU of today a run without bf16 is 5-10x slower than it needs to be, so
`auto` is bf16-mixed wherever the GPU supports it, and fp32 with TF32 matmuls (torch.set_float32_matmul_precision
"high") where not. On a CPU it is fp32, as it always was: a CPU run's numbers do not move.
"""

from __future__ import annotations

import contextlib
import os

import torch

from aiayn.common.errors import UserError

# Precisions the fused loss cannot train under: it computes the projection's gradients inside the forward pass,
# where fp16's GradScaler cannot scale them (ε/V underflows, and an overflow would skip every step silently).
REFUSED_PRECISIONS = ("16-mixed", "16", "16-true", "fp16", "half", "transformer-engine-float16")
CUDA_ACCELERATORS = ("auto", "gpu", "cuda")
MAX_WORKERS = 4


def uses_cuda(accelerator: str) -> bool:
    """Whether Lightning's `accelerator` will train on a CUDA device here."""
    return accelerator in CUDA_ACCELERATORS and torch.cuda.is_available()


def resolve_precision(precision: str, accelerator: str) -> str:
    """`auto`: bf16-mixed on a GPU that supports bf16, else 32-true; a precision the loss cannot train under is a
    UserError."""
    if precision in REFUSED_PRECISIONS:
        raise UserError(f"--precision {precision}: the fused loss computes its gradients in the forward pass, where "
                        f"fp16's gradient scaler cannot scale them; use bf16-mixed or 32-true (or auto)")  # fmt: skip
    if precision != "auto":
        return precision
    if uses_cuda(accelerator) and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def prepare_matmuls(accelerator: str) -> None:
    """fp32 matmuls on TF32 tensor cores on a GPU (Lightning warns when this is left at "highest"); CPUs unchanged."""
    if uses_cuda(accelerator):
        torch.set_float32_matmul_precision("high")


def data_workers(requested: int | None, accelerator: str) -> int:
    """Loader worker processes: `--num-workers`, or on a GPU a few (collating a 25k-token batch takes ~15 ms the GPU
    would wait for), on a CPU none (its cores are training)."""
    if requested is not None:
        return requested
    return min(MAX_WORKERS, os.cpu_count() or 1) if uses_cuda(accelerator) else 0


def autocast(device: torch.device, precision: str):
    """The autocast evaluation and decoding run under: the training's bf16 on a GPU, nothing elsewhere."""
    if device.type == "cuda" and precision.startswith("bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def pad_multiple(requested: int | None, accelerator: str) -> int:
    """`--pad-to`, else 1 everywhere: length buckets cost padding (Multi30k: 9% of positions unbucketed, 25% at
    multiples of 8; BENCHMARKS.md), which only pays with --static-shapes and --compile model on a GPU, so they are
    asked for, not a default."""
    return requested if requested is not None else 1
