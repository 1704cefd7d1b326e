"""Submit and wait: sbatch, the jobs' outcomes, and `submit`, the whole of `aiayn slurm`."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.secrets import redact
from aiayn.sweeps.backends import Sweep, SweepSummary, write_resolved
from aiayn.sweeps.backends.slurm.checks import check, check_partition, first_missing
from aiayn.sweeps.backends.slurm.options import SlurmOptions
from aiayn.sweeps.backends.slurm.pairs import claims, classify, job_of, live_jobs
from aiayn.sweeps.backends.slurm.script import (
    disk_line,
    job_name,
    render,
    render_report,
    report_script_path,
    resolved_dir,
    script_path,
    write_script,
)
from aiayn.sweeps.books import report_dir

log = logging.getLogger(__name__)


def sbatch(script: Path, *options: str) -> str:
    """Submit (with sbatch `options` before the script); return the job id. sbatch's own complaint (a partition it
    does not know) is the user's."""
    proc = subprocess.run(["sbatch", "--parsable", *options, str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        problem = " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
        raise UserError(f"sbatch refused {script} ({problem}); fix the SLURM options (partition, account, time)")
    return proc.stdout.strip().split(";")[0]


def wait_for(jobs: set[str], poll_s: float) -> None:
    """Block until SLURM holds none of `jobs` (array tasks `123_4`); a requeued task stays held."""
    reported = None
    while True:
        left = jobs & live_jobs()
        if not left:
            return
        if len(left) != reported:
            log.info("waiting for %d SLURM task(s): %s", len(left), " ".join(sorted(left)))
            reported = len(left)
        time.sleep(poll_s)


def outcome(opts: SlurmOptions, sweep: Sweep, row: str, seed: int) -> str:
    """'completed', or what went wrong and the task's log."""
    status = sweep.run(row, seed).status()
    if status == "completed":
        return status
    log_file = sweep.out.backend("slurm") / "logs" / f"{job_name(opts)}-{job_of(sweep, row, seed)}.out"
    return f"{'no metrics.json' if status == 'missing' else status}; see {log_file}"


def submit(opts: SlurmOptions, sweep: Sweep, todo: list[tuple[str, int]] | None = None) -> SweepSummary:
    """Check, write the script, submit it (unless a dry run), optionally wait; return what happened, typed as every
    back end's launch returns it (its counts; `results`: each pair's outcome, after --wait; `details`: the job, the
    script, the pairs in SLURM and pending, the disk estimate, the report's job). `sweep`: the sweep as its driver
    resolved it, once (its out, preset, corpus and each row's spec: what the array's tasks train); `todo`: its pairs
    to run (default: all)."""
    per_node = check(opts)
    todo = sweep.pairs if todo is None else todo
    held = classify(sweep, todo, set() if opts.dry_run else live_jobs())
    summary = {"pairs": len(todo), **{k: len(v) for k, v in held.items()}, "job": None, "script": None}
    pending = held["pending"]
    if pending:
        if not opts.dry_run:
            check_partition(opts.resources.partition)
        text = render(opts, sweep, pending, per_node)
        summary["disk"] = disk_line(sweep, pending)
        new_dir, new_specs = first_missing(script_path(opts).parent / "logs"), first_missing(resolved_dir(opts))
        for row, spec in sweep.specs.items():  # what each task trains: the rows as the sweep resolved them, once
            write_resolved(resolved_dir(opts) / f"{row}.json", spec, f"aiayn slurm {opts.kind}")
        path = write_script(script_path(opts), text)
        (path.parent / "logs").mkdir(exist_ok=True)  # sbatch does not create --output's directory
        summary.update(script=str(path), text=redact(text))  # what a dry run prints: never a secret
        if not opts.dry_run:
            try:
                job = sbatch(path)
            except UserError:  # nothing submitted: leave nothing written either
                if new_specs is not None and new_specs.exists():
                    shutil.rmtree(new_specs)
                shutil.rmtree(new_dir) if new_dir and new_dir.exists() else path.unlink()
                raise
            summary["job"] = job
            for i, (row, seed) in enumerate(pending):
                claims(sweep).record(sweep.pair_key(row, seed), f"{job}_{i}", str(path))
            sweep.record("slurm")
        report = report_dir(opts.report, opts.train.out) if opts.kind == "table3" and not opts.wait else None
        if report is not None:  # the report after the array, as a job of its own (--wait writes it here instead)
            report_script = write_script(report_script_path(opts), render_report(opts, sweep, report))
            summary["report_script"] = str(report_script)
            if not opts.dry_run:
                try:
                    summary["report_job"] = sbatch(report_script, f"--dependency=afterany:{job}")
                except UserError as e:  # the array is submitted and recorded: say how to get the report instead
                    log.warning(
                        "the report job was not submitted (%s); when the array ends, run `aiayn report "
                        "--runs %s --out %s`",
                        e,
                        opts.train.out,
                        report,
                    )
    if opts.wait and not opts.dry_run:
        watched = {job_of(sweep, r, s) for r, s in pending + held["in_slurm"]} - {None}
        wait_for(watched, opts.poll_s)
        summary["results"] = {f"{r} seed {s}": outcome(opts, sweep, r, s) for r, s in todo}
    return SweepSummary.of(summary)
