"""`aiayn report`'s options and the command: light to import (the command line builds its parser from them), the
report itself (pandas, matplotlib) imported only when one is written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aiayn.common.files import check_writable_dir
from aiayn.common.options import option


@dataclass
class ReportOptions:
    """`aiayn report`: which runs, reported where, for which preset, and whether to W&B too."""

    runs: tuple[str, ...] = option(())
    """the --out of the runs to report (every metrics.json under it); repeat it to pool seed sets run into separate
    directories into one table (default: runs)"""
    out: str | None = option(None)
    """report directory (default: the first RUNS/reports)"""
    preset: str | None = option(None)
    """only this preset (default: every preset found)"""
    wandb: bool = option(False)
    """also log each report to W&B: the table as a wandb.Table, the files as an artifact"""
    against: str | None = option(None, metavar="DIR")
    """a report folder to compare with, verdict by verdict (e.g. reports/reference/evidence): writes
    table3-PRESET-against.md and .csv beside each report whose table3-PRESET.csv it holds"""


def report_command(opts: ReportOptions) -> list[Path]:
    """`aiayn report`: the reports of `opts.runs` (default: runs) written into `opts.out` (default: the first
    RUNS/reports), checked writable before anything is read. The files written."""
    from aiayn.reports.build import report

    runs = list(opts.runs) or ["runs"]
    out = opts.out or str(Path(runs[0]) / "reports")
    check_writable_dir(out, "--out")
    against = None
    if opts.against is not None:
        from aiayn.reports.against import reference_dir

        against = reference_dir(opts.against)
    return report(runs, out, opts.preset, wandb=opts.wandb, against=against)


def sweep_report_writer(train):
    """The report of a sweep's runs, handed by the command line to the sweep layer (which sits beside reports and
    cannot import it): `write(out, report_dir, preset)` writes reports/build.py's files, and a W&B report too where
    the sweep's runs (`train`, their TrainOptions) logged to W&B. The files written."""

    def write(out, report, preset) -> list:
        from aiayn.lightning_modules.run.loggers import of as loggers_of
        from aiayn.reports.build import report as write_report

        return write_report(out, report, preset, wandb="wandb" in loggers_of(train))

    return write
