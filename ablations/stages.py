"""A table's later stages, declared before any of their runs: `ablations/stages.csv`.

A stage re-tests some of its table's pre-registered tests (ablations/predictions.csv) on fresh seeds of its own,
every row of it base included, and is decided on those seeds alone: a stage's runs are the table's runs whose seed
is at least the stage's first seed (stage 1: the seeds below every later stage's). The tests and their predictions
are the registration's; a stage may only add, for a test predicted worse or better, an equivalence arm (`margin`:
the test is then decided either way, a difference by Welch's test or an equivalence within the margin by TOST; the
two nulls are disjoint, so they share the test's place in the Holm family). Every stage of a table is tested at
Šidák's level for the table's number of stages, 1 - (1 - α)^(1/k) (0.0253 for two at α 0.05), so that a test has
at most α overall of passing by chance at any stage, stage 1 included.

One line per (preset, stage, row): `first_seed`, the row's `seeds`, and for a test its `metric`, `predicted` (as
registered), `margin` (the equivalence arm, blank for none) and `reason` (why this stage, and its power).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from aiayn.ablations.predictions import METRICS, predictions
from aiayn.ablations.table import MAX_SEED
from aiayn.common.errors import UserError

STAGES_FILE = Path(__file__).resolve().parent / "stages.csv"
ALPHA = 0.05


@dataclass(frozen=True)
class StageTest:
    row: str
    metric: str
    predicted: str  # worse or better, as registered
    margin: float | None  # the equivalence arm, in the metric's units as predictions.csv gives margins
    reason: str


@dataclass(frozen=True)
class Stage:
    preset: str
    number: int
    first_seed: int
    seeds: dict = field(default_factory=dict)  # row -> seeds the stage trains (base among them)
    tests: dict = field(default_factory=dict)  # row -> StageTest

    def holds(self, seed: int) -> bool:
        """Whether a run of this seed is this stage's (its seeds, from its first)."""
        return self.first_seed <= seed < self.first_seed + max(self.seeds.values())


def _read(text: str, where: str, check: bool = True, only: str | None = None) -> dict[str, list[Stage]]:
    lines: dict[tuple[str, int], dict] = {}
    with io.StringIO(text, newline="") as f:
        for n, raw in enumerate(csv.DictReader(f), start=2):
            at = f"{where} line {n}"
            preset, row = (raw.get("preset") or "").strip(), (raw.get("row") or "").strip()
            if only is not None and preset != only:
                continue
            try:
                number, first, seeds = (int((raw.get(k) or "").strip()) for k in ("stage", "first_seed", "seeds"))
            except ValueError:
                raise UserError(f"{at}: stage, first_seed and seeds are whole numbers") from None
            if number < 2 or not 0 < first <= MAX_SEED or seeds < 1 or first + seeds - 1 > MAX_SEED:
                raise UserError(f"{at}: a later stage is 2 or more, its seeds within 1..{MAX_SEED}")
            stage = lines.setdefault((preset, number), {"first": first, "seeds": {}, "tests": {}})
            if stage["first"] != first:
                raise UserError(f"{at}: stage {number} of {preset} has one first_seed ({stage['first']})")
            if row in stage["seeds"]:
                raise UserError(f"{at}: row {row} of stage {number} of {preset} is listed twice")
            stage["seeds"][row] = seeds
            metric, predicted = (raw.get("metric") or "").strip(), (raw.get("predicted") or "").strip()
            if row == "base":
                continue
            margin_text = (raw.get("margin") or "").strip()
            try:
                margin = float(margin_text) if margin_text else None
            except ValueError:
                raise UserError(f"{at}: margin is a number (BLEU points, or a fraction of dev PPL)") from None
            reason = (raw.get("reason") or "").strip()
            stage["tests"][row] = StageTest(row, metric, predicted, margin, reason)
            stage.setdefault("lines", {})[row] = at
    out: dict[str, list[Stage]] = {}
    for (preset, number), s in sorted(lines.items()):
        if "base" not in s["seeds"]:
            raise UserError(f"{where}: stage {number} of {preset} trains no base of its own; add its base line")
        stage = Stage(preset, number, s["first"], s["seeds"], s["tests"])
        if check:
            _check(stage, s.get("lines", {}))
        out.setdefault(preset, []).append(stage)
    return out


def _check(stage: Stage, lines: dict[str, str]) -> None:
    """Each test of a stage is one its preset registered worse or better, on the same metric (a stage only adds an
    equivalence arm)."""
    registered = predictions(stage.preset)
    for row, t in stage.tests.items():
        mine = registered.get(row)
        if mine is None or mine.predicted not in ("worse", "better"):
            raise UserError(
                f"{lines[row]}: a stage re-tests a test {stage.preset} registered worse or better; {row} is not one"
            )
        if (t.metric, t.predicted) != (mine.metric, mine.predicted) or t.metric not in METRICS:
            raise UserError(f"{lines[row]}: {row} is registered {mine.predicted} on {mine.metric}; a stage keeps that")


@cache
def _all() -> dict[str, list[Stage]]:
    return _read(STAGES_FILE.read_text(encoding="utf-8"), str(STAGES_FILE), check=False)


def stages(preset: str) -> list[Stage]:
    """The preset's later stages, in order ([] for a table of one stage), each checked against the preset's
    registration."""
    mine = list(_all().get(preset, []))
    if mine:
        _read_again(preset)
    return mine


@cache
def _read_again(preset: str) -> None:
    """The preset's stages checked against its registration (ablations/predictions.csv), once."""
    _read(STAGES_FILE.read_text(encoding="utf-8"), str(STAGES_FILE), only=preset)


def stage(preset: str, number: int) -> Stage:
    for s in stages(preset):
        if s.number == number:
            return s
    known = ", ".join(str(s.number) for s in stages(preset)) or "none"
    raise UserError(f"preset {preset} registers no stage {number} (ablations/stages.csv: {known})")


def stage_of(preset: str, seed: int) -> int:
    """The stage a run of `seed` belongs to: the later stage whose seeds hold it, else 1."""
    return next((s.number for s in stages(preset) if s.holds(seed)), 1)


def level(preset: str) -> float:
    """The α every stage of the preset's table is tested at: Šidák's for its number of stages."""
    k = 1 + len(stages(preset))
    return ALPHA if k == 1 else 1 - (1 - ALPHA) ** (1 / k)
