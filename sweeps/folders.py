"""The sweeps' own folders under --out, beside the run directories that lightning_modules/run/rundir.py lays out
(`OutDir`: OUT/PRESET/CORPUS/ROW/seedS, and nothing a sweep adds)::

    OUT/
        hpo/PRESET/ROW/trialNNNN/  an `aiayn hpo` trial: a run directory too (its metrics.json says kind "hpo")
        hpo/PRESET/ROW/best.json   the search's result
        .locks/                    one lock per claimed pair or trial, per queue pop, per driver setup
        optuna.db, hpo.db          the Optuna studies of `aiayn table3` and `aiayn hpo` (SQLite by default)
        slurm/, subprocess/        a back end's own folder (OUT/NAME): SLURM's sbatch scripts, logs/, pairs/;
                                   `aiayn hpo --backend subprocess`'s trial logs
        sweeps/PRESET-CORPUS.json  the pairs a sweep owes (every pair its commands asked for): `aiayn status` reads it
        reports/                   a sweep's reports, unless --report says otherwise
        PRESET/CORPUS/ROW/seedS.log        beside a run a sweep trains: its process's output (`sweep_log`)
        PRESET/CORPUS/ROW/seedS.spec.json  beside it too: the run as the sweep's driver resolved it

Their top-level names are `OutDir.RESERVED`: never a preset's.
"""

from __future__ import annotations

from pathlib import Path

from aiayn.common.names import under
from aiayn.lightning_modules.run.rundir import OutDir, RunDir


def resolved_file(run: RunDir) -> Path:
    """Beside a run a sweep trains: the run as the sweep's driver resolved it, for the run's own process."""
    return run.path.parent / f"{run.path.name}.spec.json"


def sweep_log(run: RunDir) -> Path:
    """Beside a run a sweep trains: its process's output, every attempt appended under a header line."""
    return run.path.parent / f"{run.path.name}.log"


class SweepOut(OutDir):
    """--out as the sweeps see it: the run directories (OutDir's) and the sweeps' own folders (the module docstring)."""

    def hpo_trial(self, preset: str, row: str, number: int) -> RunDir:
        return RunDir(under(self.root, "hpo", preset, row, f"trial{number:04d}", kinds=("", "preset", "row")))

    def hpo_best(self, preset: str, row: str) -> Path:
        return under(self.root, "hpo", preset, row, kinds=("", "preset", "row")) / "best.json"

    def lock(self, name: str) -> Path:
        return self.root / ".locks" / f"{name}.lock"

    def study_url(self, kind: str = "table3") -> str:
        """The default Optuna storage of `aiayn table3` (optuna.db) or `aiayn hpo` (hpo.db)."""
        return f"sqlite:///{(self.root / ('optuna.db' if kind == 'table3' else 'hpo.db')).resolve()}"

    def backend(self, name: str) -> Path:
        """A sweep back end's own folder under --out (its scripts, logs and books): OUT/NAME, e.g. OUT/slurm."""
        return self.root / name

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def sweep_record(self, key: str) -> Path:
        """OUT/sweeps/KEY.json (KEY: PRESET-CORPUS), the pairs a sweep owes."""
        return self.root / "sweeps" / f"{key}.json"

    def sweep_records(self) -> list[Path]:
        return sorted((self.root / "sweeps").glob("*.json"))
