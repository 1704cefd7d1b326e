"""Checkpoints: load with a clear error, average the last k (paper §6.1), rebuild their data module."""

from __future__ import annotations

from pathlib import Path

import torch

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_torch_save
from aiayn.lightning_modules.module import TranslationModule
from aiayn.lightning_modules.rundir import RunDir


def load_raw(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; pass the path of a .ckpt file (see RUN/checkpoints/)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or not a checkpoint at all
        raise UserError(
            f"checkpoint {path} is unreadable ({type(e).__name__}); it is truncated or not an aiayn checkpoint"
        ) from e
    if "model_cfg" not in ckpt.get("hyper_parameters", {}):
        raise UserError(f"checkpoint {path} was not written by aiayn (no model_cfg in its hyper-parameters)")
    return ckpt


def load_module(path: str | Path) -> TranslationModule:
    ckpt = load_raw(path)
    module = TranslationModule(**ckpt["hyper_parameters"])
    try:
        module.load_state_dict(ckpt["state_dict"])
    except RuntimeError as e:
        raise UserError(f"checkpoint {path} does not match its own config ({str(e).splitlines()[0]})") from e
    return module.eval()


def periodic_checkpoints(run_or_dir: str | Path) -> list[Path]:
    """The kept periodic checkpoints of a run (or a checkpoints/ directory), oldest first."""
    d = Path(run_or_dir)
    run = RunDir(d.parent) if d.name == "checkpoints" and not (d / "checkpoints").is_dir() else RunDir(d)
    found = run.periodic_checkpoints()
    if not found:
        where = run.checkpoints if run.checkpoints.is_dir() else d
        raise UserError(f"no periodic checkpoints (stepNNNNNNN.ckpt) in {where}; pass a run directory that has trained")
    return found


def average(paths: list[Path], out: str | Path) -> Path:
    """Average the parameters of `paths` into a new checkpoint (written atomically): floating-point tensors
    are the float64 mean cast back to their dtype; other tensors (counters) and everything else are the last
    checkpoint's."""
    ckpts = [load_raw(p) for p in paths]
    first, last = ckpts[0], ckpts[-1]
    for p, c in zip(paths[1:], ckpts[1:]):
        for what in ("model_cfg", "data"):
            if c["hyper_parameters"].get(what) != first["hyper_parameters"].get(what):
                raise UserError(
                    f"checkpoint {p} has another {'model config' if what == 'model_cfg' else 'data config'} than "
                    f"{paths[0]}; average checkpoints of one run"
                )
    avg = {}
    for key, value in last["state_dict"].items():
        if value.is_floating_point():
            avg[key] = sum(c["state_dict"][key].double() for c in ckpts).div(len(ckpts)).to(value.dtype)
        else:
            avg[key] = value
    result = {
        k: v for k, v in ckpts[-1].items() if k not in ("optimizer_states", "lr_schedulers", "loops", "callbacks")
    }
    result["state_dict"] = avg
    result["averaged_from"] = [str(p) for p in paths]
    return atomic_torch_save(result, out)
