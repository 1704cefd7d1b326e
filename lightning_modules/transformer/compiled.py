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

No Lightning here: the transformer room's plain PyTorch.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

COMPILE_HOWS = ("auto", "none", "layers", "model")
# `--compile auto` (the default): the model compiled whole where it pays, on a CUDA device (the first H200: the
# paper's base step 45.3 ms compiled as `model` against 74.2 eager, BENCHMARKS.md), eager on a CPU, where compiling
# costs more time than it saves at these sizes
AUTO = {True: "model", False: "none"}
DEFAULT_RECOMPILE_LIMIT = 8  # dynamo's own default (torch.compile's docs, "recompile_limit")


def _graphs_made() -> int:
    """How many graphs dynamo has compiled in this process (a new one: a first call, or a shape it recompiles for)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compile_backward(out, params) -> None:
    """Run the backward of `out` (a compiled function's output) once into nothing: AOTAutograd compiles a backward
    graph at its first backward call, which in training is `loss.backward()`, outside any guard. Zero gradients
    through `torch.autograd.grad` (returned, never accumulated into .grad), the graph kept for the step's own."""
    outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    wanted = [p for p in params() if p.requires_grad]
    if outs and wanted:
        zeros = [torch.zeros_like(t) for t in outs]
        torch.autograd.grad(outs, wanted, zeros, retain_graph=True, allow_unused=True)


def training_only(compiled, eager, fallback: bool = False, params=None, failed: list | None = None):
    """A callable that runs `compiled` while autograd records (training) and `eager` otherwise (validation,
    evaluation, decoding): graphs are made for the training step's shapes only. `fallback` (`--compile auto`): a
    compile that fails is said in one line and the function runs eager from then on, a chosen `--compile` failing as
    it is. A compile fails at the first call of a shape (dynamo's or the backend's error) or at its first backward
    (the backward graph's compiler): with `params` (a callable giving the parameters the function trains), a call
    that made a new graph runs that graph's backward at once, inside the guard. `failed`: a list the functions of one
    model share, so that one failure turns all of them eager, said once."""
    failed = [] if failed is None else failed

    @functools.wraps(eager)
    def call(*args, **kwargs):
        if not torch.is_grad_enabled() or failed:
            return eager(*args, **kwargs)
        if not fallback:
            return compiled(*args, **kwargs)
        before = _graphs_made()
        try:
            out = compiled(*args, **kwargs)
            if params is not None and _graphs_made() != before:
                _compile_backward(out, params)
            return out
        except Exception as e:  # dynamo's, the forward's backend or the backward's compiler (its own errors)
            if failed:  # another function of the model failed meanwhile: said already
                return eager(*args, **kwargs)
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
    without code generation). Returns how many modules share each compiled function (0: nothing compiled)."""
    backend = backend or os.environ.get("AIAYN_COMPILE_BACKEND", "inductor")
    if how not in COMPILE_HOWS:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_HOWS)}, got {how!r}")
    fallback, how = how == "auto", resolve_compile(how, cuda)
    if how == "none":
        return 0
    if fallback:
        log.info("--compile auto: compiling the model whole on the GPU (--compile none trains eager)")
    compile_ = functools.partial(torch.compile, dynamic=dynamic, backend=backend)
    failed: list[str] = []  # one failure under auto turns every compiled function of the model eager
    if how == "layers":
        layers = [*model.encoder, *model.decoder]
        for layer in layers:
            layer.forward = training_only(compile_(layer.forward), layer.forward, fallback, layer.parameters, failed)
        # layers of one kind share a function; each may specialize on its module and each shape: room for all
        share = max(len(model.encoder), len(model.decoder))
    else:
        # instance attributes: the state dict is unchanged
        model.encode = training_only(compile_(model.encode), model.encode, fallback, model.parameters, failed)
        model.decode = training_only(compile_(model.decode), model.decode, fallback, model.parameters, failed)
        share = 1
    if shapes:
        room_for(shapes, share)
    return share


def room_for(shapes: int, share: int) -> int:
    """Raise the recompile limit for `shapes` training batch shapes, each compiled function shared by `share`
    modules (compile_model's return), and two more (a last, shorter batch); returns the limit."""
    limit = raise_recompile_limit(shapes * share + 2)
    log.info("compiled training: %d batch shapes, recompile limit %d per function", shapes, limit)
    return limit
