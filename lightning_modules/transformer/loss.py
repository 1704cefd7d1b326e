"""The paper's loss (§5.4: label smoothing ε_ls) with the pre-softmax projection (§3.4) fused into it, computed a
chunk of target positions at a time, so that no (B, T, V) logits ever exist; the same path gives validation's NLL.

The chunk's body (`chunk_loss`) is one function of the chunk's logits: on a GPU it is compiled (`torch.compile`,
once per process: its ~10 elementwise passes over the (chunk, V) logits become one or two kernels, and the
gradient is written once, in the compute dtype); on a CPU it runs as written, so a CPU run's numbers are the ones
they always were (`AIAYN_COMPILE_LOSS=0` keeps it eager on a GPU too). No Lightning here.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.lightning_modules.transformer.config import PAD

log = logging.getLogger(__name__)


def label_smoothed_loss(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor, int]:
    """Mean label-smoothed cross-entropy and mean NLL over non-pad target tokens.

    The smoothed target puts 1 - ε on the reference and spreads ε uniformly over all V classes,
    as `F.cross_entropy(label_smoothing=ε)` does (tensor2tensor spreads it over the V - 1 others;
    the difference is ε/V on the reference). One log-softmax serves both numbers.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    mask = target != PAD
    n = int(mask.sum())
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    loss = ((1.0 - eps) * nll + eps * smooth)[mask].sum() / max(n, 1)
    return loss, nll[mask].sum() / max(n, 1), n


def projected_label_smoothed_loss(
    hidden: Tensor, weight: Tensor, target: Tensor, eps: float, chunk: int | None = None, reduction: str = "mean"
) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_loss(F.linear(hidden, weight), target, eps)` without the (B, T, V) logits.

    The pre-softmax projection (§3.4) and the loss, fused and computed `chunk` target positions at a
    time, so only (chunk, V) logits ever exist (at the paper's 25k tokens × 37k vocabulary the
    straightforward path holds 3.7 GB of float32 log-probabilities, and as much again for their
    gradient). The loss is a scalar, so its gradients are computed in the same pass
    (d loss / d logits = softmax - (1 - ε)·onehot - ε/V per non-pad position, / n) and backward only
    scales them: no logits are recomputed. Equal to the straightforward loss within 1e-5 (float32),
    tested in tests/test_bench.py. Returns (loss, nll, n) like `label_smoothed_loss`, n a tensor:
    nothing here waits for the device. `reduction="sum"`: loss and NLL summed over the n tokens, not
    averaged (the training step's; the optimizer step divides by the update's tokens).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    hidden, target = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    chunk = chunk or default_chunk(hidden.device, weight.shape[0])
    return _ProjectedLabelSmoothedLoss.apply(hidden, weight, target, eps, chunk, reduction == "mean")


CPU_CHUNK_BYTES = 2**27  # float32 logits a chunk on a CPU: 128 MB (every CPU figure so far was measured with it)
GPU_CHUNK_BYTES = 2**29  # on a GPU: 512 MB, a quarter of the chunks (each chunk re-reads and re-writes grad_w)


@functools.cache
def chunk_bytes(device: torch.device) -> int:
    """The float32 logits a chunk holds on `device`, in bytes: CPU_CHUNK_BYTES on a CPU; GPU_CHUNK_BYTES on a GPU,
    or a 64th of its memory where that is less (a 16 GB card: 256 MB), never below a CPU's."""
    if device.type != "cuda":
        return CPU_CHUNK_BYTES
    total = torch.cuda.get_device_properties(device).total_memory
    return max(CPU_CHUNK_BYTES, min(GPU_CHUNK_BYTES, total // 64))


def default_chunk(device: torch.device, vocab_size: int) -> int:
    """Target positions a chunk on `device` at vocabulary `vocab_size` (the paper's 37000: 906 on a CPU, 3627 on an
    80 GB GPU)."""
    return max(1, chunk_bytes(device) // (4 * vocab_size))


def compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the chunk's matmuls run in: autocast's where it is on for the device (bf16-mixed), else the hidden
    states' own."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return hidden.dtype


# How grad_w (the projection's gradient, V × d_model) is accumulated, per device type, as this process found it:
# logged once and recorded in metrics.json (`grad_w_path`), so that a GPU run says which path ran.
FP32_PATH = "float32: the product, then the add"
ONE_GEMM_PATH = "one GEMM: the compute dtype's product accumulated in float32 (addmm out_dtype)"
THREE_PASS_PATH = "three passes: the product in the compute dtype, cast to float32, then the add"
_grad_w_paths: dict[str, str] = {}


def grad_w_path(device_type: str) -> str | None:
    """The grad_w path this process took on `device_type` (None: no gradient of the projection computed there)."""
    return _grad_w_paths.get(device_type)


def _took(device_type: str, path: str) -> None:
    if _grad_w_paths.get(device_type) != path:
        _grad_w_paths[device_type] = path
        log.info("grad_w on %s: %s", device_type, path)


def _one_gemm_device(device: torch.device) -> bool:
    """Where the one-GEMM overload is tried: CUDA (a CPU's bf16 chunks keep the product, then the add)."""
    return device.type == "cuda"


def accumulate_outer(acc: Tensor, g: Tensor, h: Tensor) -> None:
    """acc (float32) += gᵀ h. With bf16 chunks on a GPU, one GEMM: cuBLAS's bf16 GEMM accumulating in float32
    straight into `acc` (addmm's out_dtype, with a float32 `acc`: torch refuses that combination before
    pytorch/pytorch#167931), where it used to write a bf16 product, cast it to a float32 copy and add that (three
    passes over a V × d_model matrix per chunk); elsewhere (float32, or bf16 on a CPU, or a torch that refuses the
    overload: tried once per process) the product, then the add. Which path ran is `grad_w_path`."""
    kind = acc.device.type
    if g.dtype == acc.dtype:  # float32: the product, then the add, as it always was (a CPU run's bits unchanged)
        acc += g.mT @ h
        _took(kind, FP32_PATH)
        return
    if _one_gemm_device(acc.device) and _grad_w_paths.get(kind) != THREE_PASS_PATH:
        try:
            torch.addmm(acc, g.t(), h, out_dtype=acc.dtype, out=acc)
        except (RuntimeError, TypeError, NotImplementedError) as e:
            log.info(
                "torch %s refuses addmm(out_dtype=float32) into a float32 accumulator (%s: %s)",
                torch.__version__,
                type(e).__name__,
                str(e).splitlines()[0] if str(e) else "",
            )
        else:
            _took(kind, ONE_GEMM_PATH)
            return
    acc += (g.mT @ h).to(acc.dtype)
    _took(kind, THREE_PASS_PATH)


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """hidden (N, d), weight (V, d), target (N,): the scalar sums of one model's loss."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, eps: float, chunk: int, mean: bool):
        mask = target != PAD
        n = mask.sum(-1)
        inv_n = 1.0 / n.clamp(min=1).float() if mean else torch.ones_like(n, dtype=torch.float32)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # the weight in the compute dtype once per call, not once per chunk and matmul (under Lightning's autocast,
        # whose cast cache is off, F.linear re-cast the fp32 embedding for every chunk, and the gradient again)
        dtype, hidden_dtype = compute_dtype(hidden), hidden.dtype
        w, hidden = weight.to(dtype), hidden.to(dtype)
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_w else None
        loss = torch.zeros_like(inv_n)
        nll = torch.zeros_like(inv_n)
        body = chunk_body(hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):  # the operands are in `dtype` already
            for s in range(0, hidden.shape[0], chunk):
                h, t, m = hidden[s : s + chunk], target[s : s + chunk], mask[s : s + chunk].float()
                loss_c, nll_c, g = body(F.linear(h, w), t, m, inv_n, eps, want_h or want_w)
                loss, nll = loss + loss_c, nll + nll_c
                if g is not None:
                    if want_h:
                        grad_h[s : s + chunk] = g @ w
                    if want_w:
                        accumulate_outer(grad_w, g, h)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype, ctx.hidden_dtype = weight.dtype, hidden_dtype
        nll = nll * inv_n
        ctx.mark_non_differentiable(nll, n)
        return loss * inv_n, nll, n

    @staticmethod
    def backward(ctx, g_loss: Tensor, g_nll, g_n):
        grad_h, grad_w = ctx.saved_tensors
        gh = (grad_h * g_loss).to(ctx.hidden_dtype) if grad_h is not None else None
        gw = (grad_w * g_loss).to(ctx.weight_dtype) if grad_w is not None else None
        return gh, gw, None, None, None, None


def chunk_loss(logits: Tensor, t: Tensor, m: Tensor, inv_n: Tensor, eps: float, want_grad: bool):
    """One chunk: (summed smoothed loss, summed NLL, d loss / d logits or None) of logits (c, V) against targets t
    (c,), m the non-pad mask (c,) as floats, inv_n the loss's normalizer. The gradient, softmax - (1 - ε)·onehot - ε/V
    per non-pad position, times inv_n, in the logits' own dtype (the compute dtype), is built in place of them."""
    V = logits.shape[-1]
    dtype = logits.dtype
    logits = logits.float()  # (c, V)
    lse = logits.logsumexp(-1)  # log Z per position
    nll_c = lse - logits.gather(-1, t[..., None]).squeeze(-1)  # -log p(reference)
    smooth_c = lse - logits.mean(-1)  # mean over all V classes of -log p
    loss = ((1.0 - eps) * nll_c + eps * smooth_c).mul(m).sum(-1)
    nll = nll_c.mul(m).sum(-1)
    if not want_grad:
        return loss, nll, None
    g = logits.sub_(lse[..., None]).exp_().sub_(eps / V)  # softmax - ε/V, in place of the logits
    g.scatter_add_(-1, t[..., None], g.new_full((*g.shape[:-1], 1), eps - 1.0))  # - (1 - ε) on the reference
    return loss, nll, g.mul_((m * inv_n)[..., None]).to(dtype)  # padding contributes nothing


@functools.cache
def _compiled():
    return torch.compile(chunk_loss, dynamic=True)


def chunk_body(device: torch.device):
    """The chunk body for `device`: compiled on CUDA, as written elsewhere."""
    if device.type == "cuda" and os.environ.get("AIAYN_COMPILE_LOSS", "1") != "0":
        return _compiled()
    return chunk_loss


def nll_sum_of_hidden(hidden: Tensor, weight: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Summed unsmoothed NLL of the target tokens and their count (padding excluded), through the chunked path: at
    evaluation too no (B, T, V) logits exist."""
    _, nll, n = projected_label_smoothed_loss(hidden, weight, target, 0.0, reduction="sum")
    return nll, n
