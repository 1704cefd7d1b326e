"""What a run's hardware decides: its precision (`--precision auto`), the matmul precision of fp32 on a GPU, the data
loader's workers and pinned memory, and the autocast that evaluation and decoding run under.

The paper trained in fp32 on P100s; on a GPU of today a run without bf16 is 5-10x slower than it needs to be, so
`auto` is bf16-mixed wherever the GPU supports it, and fp32 with TF32 matmuls (torch.set_float32_matmul_precision
"high") where not. On a CPU it is fp32, as it always was: a CPU run's numbers do not move.

A GPU rerun of a table registered and run on CPUs (the evidence preset, the main job) is the same experiment only
in fp32 with exact fp32 matmuls: `--precision 32-true --matmul-precision highest`. Each run records what it trained
under (metrics.json's `precision`), and a report whose runs differ in it says so.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from aiayn.common.errors import UserError

if TYPE_CHECKING:
    import torch

# Precisions the fused loss cannot train under: it computes the projection's gradients inside the forward pass,
# where fp16's GradScaler cannot scale them (ε/V underflows, and an overflow would skip every step silently).
REFUSED_PRECISIONS = ("16-mixed", "16", "16-true", "fp16", "half", "transformer-engine-float16")
CUDA_ACCELERATORS = ("auto", "gpu", "cuda")
MAX_WORKERS = 4


def uses_cuda(accelerator: str) -> bool:
    """Whether Lightning's `accelerator` will train on a CUDA device here."""
    import torch

    return accelerator in CUDA_ACCELERATORS and torch.cuda.is_available()


def lightning_precisions() -> tuple[str, ...]:
    """The precision strings this Lightning accepts (its connector's Literal types; empty where a release moved
    them, and then Lightning's own check stands)."""
    from typing import get_args

    try:
        from lightning.fabric import connector
    except ImportError:
        return ()
    names = ("_PRECISION_INPUT_STR", "_PRECISION_INPUT_STR_ALIAS")
    return tuple(p for n in names for p in get_args(getattr(connector, n, None)) if isinstance(p, str))


def check_strategy(strategy: str) -> None:
    """--strategy names one of Lightning's registered strategies (or auto): one line now, not Lightning's ValueError
    after the run directory was made."""
    from lightning.pytorch.strategies import StrategyRegistry

    known = ("auto", *StrategyRegistry.available_strategies())
    if strategy not in known:
        common = [s for s in known if s in ("auto", "ddp", "ddp_spawn", "fsdp", "deepspeed", "single_device")]
        raise UserError(
            f"--strategy {strategy}: not a strategy Lightning knows; use one of {', '.join(common)} "
            f"(or another of Lightning's StrategyRegistry)"
        )


def resolve_precision(precision: str, accelerator: str) -> str:
    """`auto`: bf16-mixed on a GPU that supports bf16, else 32-true; a precision the loss cannot train under is a
    UserError."""
    import torch

    if precision in REFUSED_PRECISIONS:
        raise UserError(
            f"--precision {precision}: the fused loss computes its gradients in the forward pass, where "
            f"fp16's gradient scaler cannot scale them; use bf16-mixed or 32-true (or auto)"
        )
    known = lightning_precisions() if precision != "auto" else ()
    if known and precision not in known:  # Lightning's ValueError came after the run dir
        raise UserError(
            f"--precision {precision}: not a precision Lightning knows; use auto, 32-true, bf16-mixed, "
            "bf16-true or 64-true"
        )
    if precision != "auto":
        return precision
    if uses_cuda(accelerator) and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def residual_stream_dtype(residual_dtype: str, precision: str):
    """The residual stream's dtype for `--residual-dtype` in a run that trains in `precision` (resolved): bf16 for
    bf16, and for auto under bf16-mixed (where BENCHMARKS' numerics check passed); None (fp32, as autocast leaves
    it) otherwise."""
    import torch

    if residual_dtype == "bf16" or (residual_dtype == "auto" and precision == "bf16-mixed"):
        return torch.bfloat16
    return None


def prepare_matmuls(accelerator: str, matmul_precision: str | None = None) -> None:
    """fp32 matmuls on a GPU: `matmul_precision` where given (`highest`: exact fp32, as a CPU computes), else on TF32
    tensor cores (`high`; Lightning warns when it is left at "highest"); CPUs unchanged."""
    import torch

    if uses_cuda(accelerator):
        torch.set_float32_matmul_precision(matmul_precision or "high")


def trained_precision(precision: str) -> str:
    """What a run trained under, for metrics.json: Lightning's precision, and where fp32 matmuls run on a GPU, at
    which precision ("32-true, fp32 matmuls highest")."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"{precision}, fp32 matmuls {torch.get_float32_matmul_precision()}"
    return precision


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (what SLURM's --cpus-per-task, a cgroup or taskset gave it),
    where the platform says, else every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def data_workers(requested: int | None, accelerator: str) -> int:
    """Loader worker processes: `--num-workers`, or on a GPU a few (collating a 25k-token batch takes ~15 ms the GPU
    would wait for), at most one fewer than the CPUs this process may use (`usable_cpus`: a SLURM task given 4 CPUs
    on a 64-core node gets 3, not 4 on top of its own), on a CPU none (its cores are training)."""
    if requested is not None:
        return requested
    return min(MAX_WORKERS, max(usable_cpus() - 1, 0)) if uses_cuda(accelerator) else 0


def autocast(device: torch.device, precision: str):
    """The autocast evaluation and decoding run under: the training's bf16 on a GPU, nothing elsewhere."""
    import torch

    if device.type == "cuda" and precision.startswith("bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def pad_multiple(requested: int | None, accelerator: str) -> int:
    """`--pad-to`, else 1 everywhere: length buckets cost padding (Multi30k: 9% of positions unbucketed, 25% at
    multiples of 8; BENCHMARKS.md), which only pays with --static-shapes and --compile model on a GPU, so they are
    asked for, not a default."""
    return requested if requested is not None else 1
