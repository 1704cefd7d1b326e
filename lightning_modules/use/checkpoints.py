"""Checkpoints: load with a clear error, average the last k (paper §6.1), and the run files they carry.

A checkpoint written by `aiayn train` holds, beside Lightning's state, the run's resolved config
and its tokenizer (`checkpoint["aiayn"]`, see callbacks.RunFilesInCheckpoint); an averaged one keeps
those of the checkpoints it averages, which must agree. That config is the checkpoint's only one (no Lightning
hyper-parameters), read back typed by `RunConfig.from_checkpoint` (as litgpt's `Config.from_checkpoint`; the readers
live in run/rundir.py, beside the type).
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.files import atomic_torch_save
from aiayn.lightning_modules.run.rundir import (  # the readers live with the run config they read (RunConfig)
    RunDir,
    embedded_tokenizer,
    load_raw,
    run_config,
    run_files,
)

log = logging.getLogger(__name__)

__all__ = [
    "average",
    "averaged",
    "embedded_tokenizer",
    "last_checkpoints",
    "load_raw",
    "periodic_checkpoints",
    "run_config",
    "run_files",
]

# What a checkpoint for translation keeps; the rest (optimizer, loops, RNG states) is for resuming training.
TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks")


def periodic_checkpoints(run_or_dir: str | Path) -> list[Path]:
    """The kept periodic checkpoints of a run (or a checkpoints/ directory), oldest first."""
    d = Path(run_or_dir)
    run = RunDir(d.parent) if d.name == "checkpoints" and not (d / "checkpoints").is_dir() else RunDir(d)
    found = run.periodic_checkpoints()
    if not found:
        where = run.checkpoints if run.checkpoints.is_dir() else d
        raise UserError(f"no periodic checkpoints (stepNNNNNNN.ckpt) in {where}; pass a run directory that has trained")
    return found


# The paper averaged its last 5 checkpoints, written 10 minutes apart, of a 12-hour run: the last 7% of training.
# Averaging checkpoints from further back mixes in a model that was still learning (the tiny preset keeps 5, 250 steps
# apart: averaging them spans steps 250-1200 and cost 6 BLEU), so a wider span is said.
AVERAGE_SPAN = 0.1


def _step(path: Path) -> int | None:
    digits = path.stem.removeprefix("step")
    return int(digits) if digits.isdigit() else None


def span_warning(paths: list[Path], flag: str = "--average") -> str | None:
    """A line when checkpoints to average span more than AVERAGE_SPAN of the run they end (by their steps); None
    when they lie near its end, as the paper's did."""
    steps = [_step(p) for p in paths]
    if len(paths) < 2 or None in steps or not steps[-1]:
        return None
    span = (steps[-1] - steps[0]) / steps[-1]
    if span <= AVERAGE_SPAN:
        return None
    return (
        f"{flag} {len(paths)} averages the checkpoints of steps {steps[0]}-{steps[-1]}, {span:.0%} of the run "
        f"(the paper's last 5 lay in its last 7%): the older ones are a model still learning; average fewer, or "
        f"train with a smaller --ckpt-every so that the last {len(paths)} lie near the end"
    )


def last_checkpoints(run_or_dir: str | Path, k: int, flag: str = "--last") -> list[Path]:
    """The newest `k` periodic checkpoints of a run, oldest first."""
    paths = periodic_checkpoints(run_or_dir)
    if k > len(paths):
        raise UserError(
            f"{flag} {k} asks for more checkpoints than the {len(paths)} kept in {run_or_dir}; "
            f"pass {flag} {len(paths)} or less"
        )
    return paths[-k:]


def averaged(paths: list[Path], flag: str = "--average") -> dict:
    """The checkpoint whose parameters are the mean of those of `paths` (the paper averages the last 5
    or 20 checkpoints, §6.1); it keeps the last one's config and run files, without training state.
    Floating-point tensors are the float64 mean cast back to their dtype; other tensors (counters) are the
    last checkpoint's.
    The checkpoints must share the model config and the tokenizer; once they are found to, a warning where they
    span more than AVERAGE_SPAN of the run (`span_warning`, naming `flag`), so that a refusal is the only line."""
    ckpts = [load_raw(p) for p in paths]
    first, last = ckpts[0], ckpts[-1]
    configs = [run_config(c, p) for p, c in zip(paths, ckpts)]
    for p, c, config in zip(paths[1:], ckpts[1:], configs[1:]):
        for name, mine, theirs in (
            ("model", config.spec.model, configs[0].spec.model),
            ("data", config.data, configs[0].data),
        ):
            if mine != theirs:
                raise UserError(
                    f"checkpoint {p} has another {name} config than {paths[0]}; average checkpoints of one run"
                )
        if run_files(c).get("tokenizer_sha256") != run_files(first).get("tokenizer_sha256"):
            raise UserError(f"checkpoint {p} has another tokenizer than {paths[0]}; average checkpoints of one run")
    warning = span_warning(paths, flag)
    if warning:
        log.warning(warning)
    avg = {}
    for key, value in last["state_dict"].items():
        if value.is_floating_point():
            avg[key] = sum(c["state_dict"][key].double() for c in ckpts).div(len(ckpts)).to(value.dtype)
        else:
            avg[key] = value
    result = {k: v for k, v in ckpts[-1].items() if k not in TRAINING_STATE}
    result["state_dict"] = avg
    result["averaged_from"] = [str(p) for p in paths]
    return result


def average(paths: list[Path], out: str | Path, flag: str = "--last") -> Path:
    """Average the parameters of `paths` into a new checkpoint (written atomically)."""
    return atomic_torch_save(averaged(paths, flag), out)
