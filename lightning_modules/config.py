"""From a resolved row (ablations/) to the model's config: `--set` overrides checked, then
`TransformerConfig`, whose impossible values become one-line user errors. No Lightning here, so
the sweep driver can size runs (`aiayn table3` orders its queue by cost) without importing it."""

from __future__ import annotations

from aiayn.ablations.presets import Preset
from aiayn.ablations.table import MODEL_KEYS, SCHEDULE_KNOBS, format_overrides
from aiayn.common.errors import UserError
from aiayn.lightning_modules.model import TransformerConfig, count_params


def model_config(resolved: dict, vocab_size: int, max_len: int = 1024) -> TransformerConfig:
    """The model config of a resolved row; impossible values name the field, the row and the fix."""
    try:
        return TransformerConfig(**{k: resolved[k] for k in MODEL_KEYS}, vocab_size=vocab_size, max_len=max_len)
    except ValueError as e:
        raise UserError(
            f"{e} (row {resolved['row']} at preset {resolved['preset']}); fix the row's line in ablations/"
        ) from e


def params_of(resolved: dict, vocab_size: int | None = None) -> int:
    """Exact parameter count of a resolved row (at the preset's vocabulary unless given)."""
    return count_params(model_config(resolved, vocab_size or resolved["vocab_size"]))


def apply_overrides(resolved: dict, preset: Preset, overrides: dict | None) -> tuple[dict, dict]:
    """The row's knobs and the schedule with `--set` values applied and checked (a UserError naming
    the value); each override is listed among the run's deviations. Setting d_model or h without
    d_k/d_v makes those d_model/h again, as in the paper."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(MODEL_KEYS) - set(SCHEDULE_KNOBS))
    if unknown:
        raise UserError(f"--set {unknown[0]}: unknown key; use one of {', '.join((*MODEL_KEYS, *SCHEDULE_KNOBS))}")
    resolved = dict(resolved)
    if {"d_model", "h"} & set(overrides):
        for name in ("d_k", "d_v"):
            resolved[name] = overrides.get(name)
    resolved.update({k: v for k, v in overrides.items() if k in MODEL_KEYS})
    schedule = {"warmup": preset.warmup, "lr_factor": preset.lr_factor}
    schedule.update({k: v for k, v in overrides.items() if k in SCHEDULE_KNOBS})
    for key in SCHEDULE_KNOBS:
        if schedule[key] <= 0:
            raise UserError(f"--set {key}={schedule[key]}: {key} must be positive; change the --set value")
    if overrides:
        given = " ".join(format_overrides(overrides))
        try:  # the checks of TransformerConfig, before any data is prepared or anything written
            cfg = model_config(resolved, preset.vocab_size)
            resolved["d_k"], resolved["d_v"] = cfg.d_k, cfg.d_v
        except UserError as e:
            raise UserError(f"{str(e.__cause__ or e)} (--set {given}); change the --set value") from e
        resolved["deviations"] = [*resolved["deviations"], f"overridden: {given}"]
    return resolved, schedule
