"""Sweep, then report, then the exit status: written once, for every command that runs a sweep (`aiayn table3` with
any back end, `aiayn slurm table3|train`). The command line only parses, wires the report writer in (reports sit
beside sweeps, so it is handed over, not imported here) and calls `run_and_report`."""

from __future__ import annotations

from collections.abc import Callable

from aiayn.sweeps.backends import Backend, Sweep, SweepSummary


def check_launches(launches: list[tuple[Backend, Sweep]]) -> None:
    """Every (back end, sweep) checked before any runs: the sweep's budgets (`Sweep.check_budgets`), then what the
    back end cannot do (`Backend.check`)."""
    for backend, sweep in launches:
        sweep.check_budgets()
        backend.check(sweep)


def run_and_report(
    launches: list[tuple[Backend, Sweep]],
    *,
    write_report: Callable[[], list] | None = None,
    fail_on_diverged: bool = False,
    echo: Callable[[str], None] = print,
) -> int:
    """Check every (back end, sweep) before any runs, launch each (a preset's sweep, then its cells'), say what
    happened (the first back end's summary lines, counted over all), write the report (`write_report`, None: none
    asked for) where the runs have ended here (`Backend.report_now`), and return the exit status: 0 when every pair
    run completed, 1 when one failed (or diverged, with `fail_on_diverged`)."""
    check_launches(launches)
    summaries = [backend.launch(sweep, sweep.pairs) for backend, sweep in launches]
    total = SweepSummary.total(summaries)
    first, sweep = launches[0]
    for line in first.summary_lines(total, sweep):
        echo(line)
    if write_report is not None and any(b.report_now(s) for (b, _), s in zip(launches, summaries)):
        for path in write_report():
            echo(str(path))
    return total.exit_status(fail_on_diverged)
