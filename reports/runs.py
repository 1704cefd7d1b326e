"""Reading finished (and failed) runs: every metrics.json under a runs directory, and their curves."""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd

from aiayn.common.errors import UserError
from aiayn.common.files import read_json, read_record
from aiayn.lightning_modules.run.rundir import RECORD_MAX_BYTES, OutDir, RunConfig, RunDir, RunMetrics

log = logging.getLogger(__name__)
CURVE_MAX_BYTES = 1 << 26  # a paper-scale run's curve (100,000 steps, a line each 10) or dev.hyp: a few MB


@dataclass(frozen=True)
class Run:
    dir: Path
    metrics: RunMetrics

    @property
    def files(self) -> RunDir:
        return RunDir(self.dir)

    @cached_property
    def config(self) -> RunConfig | None:
        """config.json (the resolved config), or None when it is missing or unreadable."""
        try:
            return self.files.read_config()
        except UserError:
            return None

    @property
    def row(self) -> str:
        return self.metrics.row

    @property
    def seed(self) -> int:
        return self.metrics.seed

    @property
    def preset(self) -> str:
        return self.metrics.preset

    @property
    def data(self) -> str:
        return self.metrics.data

    @property
    def completed(self) -> bool:
        return self.metrics.completed

    @property
    def budget(self) -> int | None:
        """Its row's budget at its preset: metrics.json's budget_steps, else (an older aiayn's run) config.json's."""
        if self.metrics.budget_steps is not None:
            return self.metrics.budget_steps
        return self.config.spec.train_steps if self.config is not None else None

    @property
    def capped(self) -> bool:
        """Completed short of its budget (`--max-steps`): a look, not the preset's table."""
        return self.completed and None not in (self.metrics.steps, self.budget) and self.metrics.steps < self.budget


@dataclass
class Scan:
    runs: list[Run] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (path relative to runs_dir, reason)


def _load(path: Path) -> RunMetrics:
    """One metrics.json; ValueError (with a short reason) when it cannot be used."""
    data = read_json(path, RECORD_MAX_BYTES)
    try:
        return RunMetrics.from_dict(data)
    except TypeError as e:
        raise ValueError(f"not a metrics.json of aiayn ({e})") from e


def scan(runs_dir: str | Path) -> Scan:
    """The metrics.json of every Table 3 run under `runs_dir` (an output directory: OUT/PRESET/CORPUS/ROW/seedS;
    `aiayn hpo`'s trials are not Table 3 runs and are left out); corrupt ones are skipped, named and logged."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise UserError(
            f"runs directory {str(runs_dir)!r} does not exist; train some rows first (`aiayn train`) or pass --runs DIR"
        )
    paths = sorted(p for p in runs_dir.glob("*/*/*/seed*/metrics.json") if p.parent.is_dir())
    paths = [p for p in paths if p.relative_to(runs_dir).parts[0] not in OutDir.RESERVED]
    failures = _failed_before_training(runs_dir)
    if not paths and not failures:
        raise UserError(
            f"no metrics.json under {str(runs_dir)!r}; train some rows first (`aiayn train`) or pass --runs DIR"
        )
    out = Scan()
    for path in paths:
        try:
            metrics = _load(path)
        except ValueError as e:
            rel = path.relative_to(runs_dir)
            log.warning("skipping %s: %s", path, e)
            out.skipped.append((rel, str(e)))
            continue
        if metrics.kind == "table3":
            out.runs.append(Run(path.parent, metrics))
    corpus_of = {(r.dir.parent.parent.parent.name, r.dir.parent.parent.name): r.data for r in out.runs}
    for run_dir, failure in failures:
        preset, corpus, row = run_dir.parts[-4:-1]
        seed = int(run_dir.name.removeprefix("seed"))
        out.runs.append(
            Run(
                run_dir,
                RunMetrics(
                    row,
                    seed,
                    preset,
                    failure["status"],
                    error=failure["error"],
                    data=corpus_of.get((preset, corpus), corpus),
                ),
            )
        )
    return out


def _failed_before_training(runs_dir: Path) -> list[tuple[Path, dict]]:
    """(run directory, its failure record) of every pair whose last attempt failed before it had a metrics.json
    (`RunDir.failure_file`): the sweep's books list it as failed, and so does the report."""
    out = []
    for path in sorted(runs_dir.glob("*/*/*/seed*.failed.json")):
        run = RunDir(path.parent / path.name.removesuffix(".failed.json"))
        seed = run.path.name.removeprefix("seed")
        if path.relative_to(runs_dir).parts[0] in OutDir.RESERVED or not seed.isdigit() or run.metrics_file.exists():
            continue
        failure = run.read_failure()
        if failure is not None:
            out.append((run.path, failure))
    return out


def read_text_lines(path: Path) -> list[str] | None:
    """Lines of a dev.hyp / dev.ref (without the final newline), or None when missing or unreadable."""
    try:
        text = read_record(path, CURVE_MAX_BYTES)
    except ValueError:
        return None
    # only the one final newline goes: an empty last hypothesis is still a line
    return (text[:-1] if text.endswith("\n") else text).split("\n") if text else []


def _version(p: Path) -> int:
    m = re.fullmatch(r"version_(\d+)", p.parent.name)
    return int(m.group(1)) if m else -1


def read_curve(run_dir: Path, metric: str = "val/bleu") -> pd.DataFrame:
    """`step` and `metric` over all attempts (logs/version_N, by N); a step logged twice keeps the later attempt. Only
    whole lines: a run that is training may be writing its last one."""
    frames = []
    for i, path in enumerate(sorted(RunDir(run_dir).logs.glob("version_*/metrics.csv"), key=_version)):
        try:
            text = read_record(path, CURVE_MAX_BYTES)
            df = pd.read_csv(io.StringIO(text[: text.rfind("\n") + 1]))
        except (OSError, ValueError, pd.errors.ParserError) as e:
            log.warning("skipping curve %s: %s", path, e)
            continue
        if "step" not in df.columns or metric not in df.columns:
            continue
        df = df[["step", metric]].dropna()
        frames.append(df.assign(_attempt=i))
    if not frames:
        return pd.DataFrame({"step": pd.Series(dtype="int64"), metric: pd.Series(dtype="float64")})
    df = pd.concat(frames, ignore_index=True)
    df = df.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
    return df[["step", metric]].astype({"step": "int64"}).reset_index(drop=True)
