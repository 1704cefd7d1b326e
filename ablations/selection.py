"""Which (row, seed) pairs a sweep owes: the rows chosen by `--rows` (or the preset's default: every paper row,
or its pre-registered scored rows and base), each with its seeds; base may have more seeds than the rows."""

from __future__ import annotations

import logging
import typing
from dataclasses import dataclass

from aiayn.ablations.predictions import predictions, scored_rows
from aiayn.ablations.presets import Preset
from aiayn.ablations.stages import stage
from aiayn.ablations.table import MAX_SEED, select_rows
from aiayn.common.errors import UserError
from aiayn.common.options import LIMITS, option

log = logging.getLogger(__name__)


@dataclass
class Selection:
    """The rows × seeds of a sweep (`aiayn table3`, `aiayn slurm`): each row `seeds`, base `base_seeds`, and so does
    a row the preset predicts equivalent to base; a row it reports as a check, one; a row whose registration names
    its seeds (ablations/predictions.csv), that many (unless --seeds is given)."""

    OPTION_GROUPS: typing.ClassVar = (
        ("the sweep", ("rows", "seeds", "base_seeds", "first_seed", "extended", "stage")),
    )

    rows: str | None = option(None)
    """row ids and/or groups, comma-separated; 'all': every paper row (and those of --table); 'scored': the preset's
    pre-registered rows (ablations/predictions.csv) and base (default: the preset's choice)"""
    extended: bool = option(False)
    """include the extended rows beyond the paper (ablations/extended.csv)"""
    seeds: int | None = option(None, positive=True, at_most=LIMITS["seed"])
    """seeds per row (default: the preset's; tiny: 1)"""
    base_seeds: int | None = option(None, positive=True, at_most=LIMITS["seed"])
    """seeds for base, when more than --seeds (default: the preset's)"""
    first_seed: int = option(0, at_least=0, at_most=LIMITS["seed"])
    """seeds are FIRST, FIRST+1, ...: a second sweep with --first-seed 1 repeats the first one on other seeds"""
    stage: int | None = option(None, positive=True)
    """a later stage of the preset's table, as registered (ablations/stages.csv): its rows and their seeds, from its
    first seed (default: the table itself)"""

    def row_names(self, preset: Preset, tables: tuple[str, ...] = ()) -> list[str]:
        """The rows to train, in table order; a row the preset's rule maps onto another (`Preset.aliases`) is
        trained once, under that row's name."""
        spec = self.rows if self.rows is not None else preset.rows
        if spec == "scored":  # the pre-registered tests, base, their controls and the checks (label smoothing's)
            beside = [r for r, p in predictions(preset.name).items() if p.check or p.control]
            rows = ["base", *scored_rows(preset.name), *beside]
        else:
            rows = select_rows(spec, self.extended, tables)
        same = dict(preset.aliases)
        for alias in [r for r in rows if r in same]:
            log.info(
                "%s is %s at preset %s (same config): trained once, as %s", alias, same[alias], preset.name, same[alias]
            )
        wanted = {same.get(r, r) for r in rows}
        return [r for r in select_rows("all", True, tables) if r in wanted]

    def pairs(self, preset: Preset, tables: tuple[str, ...] = ()) -> list[tuple[str, int]]:
        if self.stage is not None:
            return self._stage_pairs(preset)
        seeds = self.seeds or preset.seeds
        base_seeds = max(self.base_seeds or preset.base_seeds or seeds, seeds)
        # an equivalence claim needs the power of base's seeds on its side too; a check (a row compared with its own
        # floor, not with base over seeds) one seed; a row whose registration names its seeds, those
        # (ablations/predictions.csv)
        registered = predictions(preset.name) if self.seeds is None else {}
        equivalent = {r for r, p in registered.items() if p.equivalence}
        checks = {r for r, p in registered.items() if p.check}
        registered_seeds = {r: p.seeds for r, p in registered.items() if p.seeds is not None}
        most = max([base_seeds, *registered_seeds.values()])
        if self.first_seed < 0 or self.first_seed + most - 1 > MAX_SEED:
            raise UserError(
                f"seeds {self.first_seed}..{self.first_seed + most - 1} are outside 0..{MAX_SEED}; "
                f"pass a smaller --first-seed or fewer seeds"
            )
        out = []
        for row in self.row_names(preset, tables):
            n = base_seeds if row == "base" or row in equivalent else 1 if row in checks else seeds
            n = registered_seeds.get(row, n)
            out += [(row, seed) for seed in range(self.first_seed, self.first_seed + n)]
        return out

    def _stage_pairs(self, preset: Preset) -> list[tuple[str, int]]:
        """A registered stage's (row, seed) pairs: each row its seeds from the stage's first, seed by seed."""
        given = [
            flag
            for flag, value in (
                ("--rows", self.rows),
                ("--seeds", self.seeds),
                ("--base-seeds", self.base_seeds),
                ("--extended", self.extended or None),
            )
            if value is not None
        ]
        if self.first_seed:
            given.append("--first-seed")
        if given:
            raise UserError(
                f"--stage {self.stage} names its rows and seeds (ablations/stages.csv); drop {', '.join(given)}"
            )
        registered = stage(preset.name, self.stage)
        rows = [row for row in select_rows("all", True) if row in registered.seeds]
        # seed by seed, each seed's rows together: a stage that runs on more than one machine (a session ends, the
        # next resumes it elsewhere) gives every machine the rows in the same proportion, so that no machine's
        # kernels stand in for a row's effect
        return [
            (row, seed)
            for seed in range(registered.first_seed, registered.first_seed + max(registered.seeds.values()))
            for row in rows
            if seed < registered.first_seed + registered.seeds[row]
        ]
