"""The knobs of Table 3, each said once: its type, how a preset scales it, how `--set` explains it, how a report
prints it. The table's columns, the presets' rule, `--set`, the report and its TeX headers all derive from `KNOBS`.

Model knobs are `TransformerConfig`'s fields, named with the paper's symbols; `train_steps` is a table column
(the paper's steps for the row: `big` trains 3× as long); `warmup` and `lr_factor` are the preset's schedule,
which `--set` may change per run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

try:  # pandas' missing value (a report's Int64 column): printed as nothing. ablations/ imports no torch; pandas is
    from pandas import NA as _NA  # a dependency anyway
except ImportError:  # pragma: no cover
    _NA = object()

from aiayn.common.errors import UserError


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"expected true or false, got {text!r}")
    return value == "true"


@dataclass(frozen=True)
class Knob:
    name: str
    type: Callable[[str], object]  # parses a table cell or a --set value
    kind: str  # "model" (TransformerConfig), "steps" (a table column), "schedule" (the preset's, --set only)
    scale: str | None  # the preset factor it scales by: width, heads, depth, attention (h·d_k), steps; None: kept
    fmt: str  # how a report prints it: "d", "g", "s", "ln" (post/pre)
    tex: str  # its column header in a LaTeX table
    help: str
    label: str = ""  # its column header in a report's tables (default: its name)
    # the paper's value for base where the paper's table has no column for the knob (None: the table gives it); a
    # run whose value differs leaves the paper's recipe: a deviation (`deviation`'s text, or "NAME=VALUE (paper: …)")
    paper: object = None
    deviation: str = ""

    def header(self) -> str:
        return self.label or self.name

    def cell(self, value) -> str:
        """`value` as a report prints it ("" for none): by `fmt`."""
        if value is None or (isinstance(value, float) and value != value):  # None or NaN
            return ""
        try:
            if value is _NA:
                return ""
        except TypeError:
            pass
        if self.fmt == "ln":
            return "pre" if value else "post"
        if self.fmt == "d":
            return f"{int(value):d}"
        return f"{value:{self.fmt}}" if self.fmt != "s" else str(value)

    def deviates(self, value) -> str | None:
        """What a run with `value` says among its deviations, or None where it keeps the paper's recipe."""
        if self.paper is None or value == self.paper:
            return None
        return self.deviation or f"{self.name}={self.cell(value)} (paper: {self.cell(self.paper)})"

    @property
    def what(self) -> str:
        return {int: "an integer", float: "a number", parse_bool: "true or false"}.get(self.type, "a value")


KNOBS = {
    k.name: k
    for k in (
        Knob("N", int, "model", "depth", "d", "$N$", "layers in each of the encoder and decoder stacks"),
        Knob("d_model", int, "model", "width", "d", "$d_{model}$", "the model's width"),
        Knob("d_ff", int, "model", "width", "d", "$d_{ff}$", "the inner width of the position-wise FFN"),
        Knob("h", int, "model", "heads", "d", "$h$", "attention heads"),
        Knob("d_k", int, "model", "attention", "d", "$d_k$", "query/key width per head (default d_model/h)"),
        Knob("d_v", int, "model", "attention", "d", "$d_v$", "value width per head (default d_model/h)"),
        Knob("P_drop", float, "model", None, "g", "$P_{drop}$", "residual and embedding dropout"),
        Knob("eps_ls", float, "model", None, "g", r"$\epsilon_{ls}$", "label smoothing"),
        Knob("pe", str, "model", None, "s", "PE", "positional encoding: sinusoid, learned, none, rope", "PE"),
        Knob(
            "norm_first",
            parse_bool,
            "model",
            None,
            "ln",
            "LN",
            "pre-LN residuals (a deviation; paper: post-LN)",
            "LN",
            paper=False,
            deviation="pre-LN residuals (paper: post-LN)",
        ),
        Knob("train_steps", int, "steps", "steps", "d", "steps", "the row's training steps (paper's; big: 3x)"),
        Knob("warmup", int, "schedule", None, "d", "warmup", "warmup steps of the learning-rate schedule"),
        Knob("lr_factor", float, "schedule", None, "g", "lr", "factor on the paper's learning-rate schedule"),
    )
}
MODEL_KEYS = tuple(k for k, v in KNOBS.items() if v.kind == "model")  # TransformerConfig's knob fields
# the integer knobs that count something (layers, widths, heads, steps): a table cell or --set value below 1 is refused
POSITIVE_INTS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "train_steps")
TABLE_KNOBS = tuple(k for k, v in KNOBS.items() if v.kind in ("model", "steps"))  # a table file's knob columns
SCHEDULE_KEYS = tuple(k for k, v in KNOBS.items() if v.kind == "schedule")
OVERRIDABLE = (*MODEL_KEYS, *SCHEDULE_KEYS)  # what `--set KEY=VALUE` may change
PAPER_BASE = {k: v.paper for k, v in KNOBS.items() if v.paper is not None}  # base's knobs beyond the paper's table


def set_help() -> str:
    return "change a knob of the row (repeatable; listed among the run's deviations): " + "; ".join(
        f"{k} ({KNOBS[k].help})" for k in OVERRIDABLE
    )


def parse_value(key: str, text: str):
    """One `--set` value or table cell, typed as its knob; ValueError names what it must be."""
    try:
        value = KNOBS[key].type(text)
    except ValueError:
        raise ValueError(f"{key} must be {KNOBS[key].what}") from None
    if isinstance(value, float) and not math.isfinite(value):  # float() takes "nan" and "inf"
        raise ValueError(f"{key} must be a finite number")
    if KNOBS[key].type is int and key in POSITIVE_INTS and value < 1:  # a table's N=0 ran as N=1 (max(1, ...))
        raise ValueError(f"{key} must be a positive integer")
    return value


def parse_overrides(items: list[str] | tuple[str, ...] | None) -> dict:
    """`--set KEY=VALUE` (repeatable, or several pairs in one): each value typed as its knob."""
    out = {}
    for item in (pair for arg in items or () for pair in arg.split()):
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise UserError(f"--set {item}: expected KEY=VALUE; e.g. --set d_model=256")
        if key not in OVERRIDABLE:
            raise UserError(f"--set {key}: unknown key; use one of {', '.join(OVERRIDABLE)}")
        try:
            out[key] = parse_value(key, text)
        except ValueError as e:
            example = "true" if KNOBS[key].type is parse_bool else "1"
            raise UserError(f"--set {item}: {e}; e.g. --set {key}={example}") from None
    return out


def format_overrides(overrides: dict) -> list[str]:
    """The `--set` values that `parse_overrides` reads back as `overrides`."""
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]
