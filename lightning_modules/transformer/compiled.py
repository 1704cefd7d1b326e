"""`--compile`: torch.compile for training only, with room for every shape a run's batches take.

Two defects of compiling the modules whole, both visible on a CPU with the eager backend:

- **The recompile limit.** Dynamo keeps `torch._dynamo.config.recompile_limit` graphs per function (8) and then runs
  that function eager for good, with one log line. With static shapes (`--static-shapes`: a fixed batch per length
  bucket) every bucket is a graph: Multi30k at `--pad-to 8` has 11 training shapes, WMT14 up to about 60, and each
  encoder and decoder layer shares one function. `compile_model` raises the limit to what the run's batches need
  (`shapes`, from the sampler) times the layers that share a function, so an epoch compiles each shape once and
  never falls back.
- **Evaluation and decoding.** Validation (under inference mode), the final evaluation and beam search (a KV cache
  that grows by one position per step: with `dynamic=False` a new graph per step) used to call the compiled
  functions too, each adding its own graphs and hitting the same limit. Compiled code now runs only where autograd
  records (`torch.is_grad_enabled()`: the training step); everything else runs the eager module, the same weights.

`--compile graphs` compiles the model whole in torch.compile's reduce-overhead mode, once for all the static shapes
(symbolic shapes: the first compile serves every shape; dynamo adds at most two, for a batch of one sentence, whose
size it specializes, and after a first batch whose sentence count equals its length), and records each static
training shape's forward and backward as CUDA graphs (cudagraph trees, a graph a shape), replayed at every step of
that shape: a small model's step costs a few graph launches instead of hundreds of kernel launches. It needs
--static-shapes (a bounded set of shapes) and a CUDA device; on any other device the run compiles as `model` does,
with the same symbolic shapes, and says why. Adam stays fused (one multi-tensor kernel a chunk of parameters: a few
launches a step), which skips a non-finite step's update on the device, so a graphed step needs no host-device sync
between log steps either.

No Lightning here: the transformer room's plain PyTorch.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

COMPILE_HOWS = ("auto", "none", "layers", "model", "graphs")
# `--compile auto` (the default): the model compiled whole where it pays, on a CUDA device (the first H200: the
# paper's base step 45.3 ms compiled as `model` against 74.2 eager, BENCHMARKS.md), eager on a CPU, where compiling
# costs more time than it saves at these sizes
AUTO = {True: "model", False: "none"}
GRAPHS_MODE = "reduce-overhead"  # torch.compile's mode of CUDA graphs (its docs: "reduces the overhead of python")
DEFAULT_RECOMPILE_LIMIT = 8  # dynamo's own default (torch.compile's docs, "recompile_limit")


def training_only(compiled, eager, fallback: bool = False):
    """A callable that runs `compiled` while autograd records (training) and `eager` otherwise (validation,
    evaluation, decoding): graphs are made for the training step's shapes only. `fallback` (`--compile auto`): a
    compile that fails (dynamo's or the backend's error, raised at the first call of a shape) is said in one line and
    the function runs eager from then on; a chosen `--compile` fails as it is."""
    failed: list[str] = []

    @functools.wraps(eager)
    def call(*args, **kwargs):
        if not torch.is_grad_enabled() or failed:
            return eager(*args, **kwargs)
        if not fallback:
            return compiled(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:
            failed.append(str(e).splitlines()[0] if str(e) else type(e).__name__)
            log.warning(
                "--compile auto: compiling %s failed (%s: %s); training eager from here (--compile none skips the "
                "attempt)",
                getattr(eager, "__name__", "the model"),
                type(e).__name__,
                failed[0][:200],
            )
            return eager(*args, **kwargs)

    call.aiayn_compiled = compiled
    return call


def resolve_compile(how: str, cuda: bool) -> str:
    """What `--compile HOW` compiles on this device: `auto` is AUTO's choice, any other HOW itself."""
    return AUTO[cuda] if how == "auto" else how


def _limit_names() -> list[str]:
    """The dynamo config names of the per-function graph limit in this torch (renamed from cache_size_limit in
    2.7; older releases keep the old name)."""
    config = torch._dynamo.config
    return [name for name in ("recompile_limit", "cache_size_limit") if hasattr(config, name)]


def raise_recompile_limit(graphs: int) -> int:
    """Let each compiled function keep at least `graphs` graphs (never lowers a larger limit); returns the limit."""
    config = torch._dynamo.config
    names = _limit_names()
    current = max((getattr(config, n) for n in names), default=DEFAULT_RECOMPILE_LIMIT)
    limit = max(current, graphs)
    for name in names:
        setattr(config, name, limit)
    if hasattr(config, "accumulated_recompile_limit"):  # the limit summed over all functions (torch >= 2.7)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * limit)
    return limit


def compile_model(
    model: nn.Module,
    how: str,
    dynamic: bool = True,
    shapes: int | None = None,
    backend: str | None = None,
    cuda: bool = False,
) -> int:
    """`--compile`: each encoder and decoder layer (`layers`: the layer's forward, as an instance attribute, so
    parameter names and checkpoints are unchanged), or the encoder and decoder whole (`model`); compiled code runs
    only in training (`training_only`). `dynamic`: shapes vary from batch to batch (without --static-shapes the
    sentence count does, even with --pad-to's length buckets), so compile for symbolic shapes instead of recompiling
    per shape; `shapes`: how many distinct training batch shapes an epoch has (static shapes), which sets the
    recompile limit now (or later, once the data is set up: `room_for`). `backend`: torch.compile's, default
    AIAYN_COMPILE_BACKEND or inductor (tests and the GPU check's CPU smoke count graphs with "eager": dynamo's tracing
    without code generation). `graphs` (static shapes only): the model whole, compiled once with symbolic shapes for
    every static shape (static where `shapes` is 1), as CUDA graphs where `cuda` (one recorded per shape), else
    without them, said once. Returns
    how many modules share each compiled function (0: nothing compiled)."""
    backend = backend or os.environ.get("AIAYN_COMPILE_BACKEND", "inductor")
    if how not in COMPILE_HOWS:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_HOWS)}, got {how!r}")
    fallback, how = how == "auto", resolve_compile(how, cuda)
    if how == "none":
        return 0
    if fallback:
        log.info("--compile auto: compiling the model whole on the GPU (--compile none trains eager)")
    mode = graphs_mode(how, dynamic, cuda)
    if how == "graphs" and shapes != 1:  # one compile for every static shape; a CUDA graph recorded per shape
        dynamic = True  # (one shape, as a bench's: static, whose symbolic tracing would cost more and buy nothing)
    compile_ = functools.partial(torch.compile, dynamic=dynamic, backend=backend, **({"mode": mode} if mode else {}))
    if how == "layers":
        layers = [*model.encoder, *model.decoder]
        for layer in layers:
            layer.forward = training_only(compile_(layer.forward), layer.forward, fallback)
        # layers of one kind share a function; each may specialize on its module and each shape: room for all
        share = max(len(model.encoder), len(model.decoder))
    else:
        # instance attributes: the state dict is unchanged
        model.encode = training_only(compile_(model.encode), model.encode, fallback)
        model.decode = training_only(compile_(model.decode), model.decode, fallback)
        share = 1
    if shapes:
        room_for(shapes, share)
    return share


def graphs_mode(how: str, dynamic: bool, cuda: bool) -> str | None:
    """torch.compile's mode for `--compile HOW`: reduce-overhead (CUDA graphs) for `graphs` on a CUDA device; None
    (its default) otherwise, and for `graphs` elsewhere the fallback said once. Graphs of dynamic shapes are refused:
    a caller's mistake (the run's checks refuse --compile graphs without --static-shapes first)."""
    if how != "graphs":
        return None
    if dynamic:
        raise ValueError("compile graphs needs static shapes: a CUDA graph is recorded per batch shape")
    if not cuda:
        log.warning(
            "--compile graphs: CUDA graphs need a CUDA device and this run has none; compiling the model "
            "whole without them, as --compile model"
        )
        return None
    return GRAPHS_MODE


def room_for(shapes: int, share: int) -> int:
    """Raise the recompile limit for `shapes` training batch shapes, each compiled function shared by `share`
    modules (compile_model's return), and two more (a last, shorter batch); returns the limit. The same room for
    `--compile graphs`' CUDA graphs: cudagraph trees record one a shape and warn past a count of their own."""
    limit = raise_recompile_limit(shapes * share + 2)
    import torch._inductor.config  # imported with torch.compile's backend; here before the first compile

    triton = torch._inductor.config.triton
    if getattr(triton, "cudagraph_dynamic_shape_warn_limit", None) is not None:
        triton.cudagraph_dynamic_shape_warn_limit = max(triton.cudagraph_dynamic_shape_warn_limit, shapes + 2)
    log.info("compiled training: %d batch shapes, recompile limit %d per function", shapes, limit)
    return limit
