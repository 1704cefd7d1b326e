"""The committed reference reports (reports/reference/) agree with the code and the pre-registered predictions.

Each reference table ships its per-run CSV (`table3-PRESET-runs.csv`: every seed's final dev numbers, its numbers at
the stability rule's earlier points, its last-quarter fall) and every run's validation curve
(`table3-PRESET-curves.csv`). The falls and the points are recomputed from the curves, and the verdicts from the
per-run numbers with today's `ablations/predictions.csv` and `reports.verdicts`: they must give the committed
columns, verdicts and Holm-adjusted p-values, so a scored set edited after the results, a change to the statistics,
or a curve that does not say what the table says shows here rather than passing unnoticed.
"""

import math
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from aiayn.ablations.presets import PRESETS
from aiayn.ablations.stages import level
from aiayn.lightning_modules.run.spec import resolve
from aiayn.reports.runs import read_curve
from aiayn.reports.table import EARLY, read_points
from aiayn.reports.verdicts import Cell, convergence_drop, judge_cells, point_value, smoothing_floor

REFERENCE = Path(__file__).resolve().parents[1] / "reports" / "reference"
# every table3-PRESET.csv outside history/ (earlier attempts' reports, kept as they were: its README says why), and
# the main job's other seed sets (main-job-seed-sets/first-seed-S.csv: preset quick)
TABLES = sorted(
    p
    for p in REFERENCE.rglob("*.csv")
    if (p.name.startswith("table3-") or p.name.startswith("first-seed-"))
    and not p.name.endswith(("-runs.csv", "-slopes.csv", "-curves.csv"))
    and not {"history", "pilots", "ct2"} & set(p.relative_to(REFERENCE).parts)
)


# Labels a committed report was written before: (table, row) -> {column: (committed label, today's)}. Evidence v6's
# A3 was reported `inconclusive` before an equivalence whose 90% interval lies wholly outside its margin was called
# `not equivalent`; its numbers, and so its miss, are unchanged (docs/tables.md).
RELABELLED = {
    ("table3-evidence.csv", "A3"): {
        "verdict": ("inconclusive", "not equivalent"),
        "verdict_75": ("inconclusive", "not equivalent"),
    },
}


def _label(table: Path, row: str, column: str, committed: str) -> str:
    """The committed label as today's rules name it (RELABELLED), else as committed."""
    before, now = RELABELLED.get((table.name, row), {}).get(column, (None, None))
    return now if committed == before else committed


def _preset(table: Path) -> str:
    return "quick" if table.name.startswith("first-seed-") else table.stem.removeprefix("table3-")


def _suffix(fraction: float) -> str:
    return f"{100 * fraction:g}"


def _cell(runs: pd.DataFrame, preset: str) -> Cell:
    """The preset's Cell from its per-run CSV (stage 1's runs: a later stage is judged apart): the final numbers, and
    each point its stability reading takes from the curves (ppl_75, ppl_87.5; ppl_100 too where it reads a window at
    the end), at the level of its table's stages."""
    done = runs[(runs["status"] == "completed") & (runs["stage"] == 1 if "stage" in runs else True)]
    values = {row: {"ppl": list(g["dev_ppl"]), "bleu": list(g["dev_bleu"])} for row, g in done.groupby("row")}
    points = {
        f: {
            row: {m: list(g[f"{m}_{_suffix(f)}"].dropna()) if f"{m}_{_suffix(f)}" in g else [] for m in ("ppl", "bleu")}
            for row, g in done.groupby("row")
        }
        for f in read_points(PRESETS[preset].stability)
    }
    floors = {}
    for row in values:
        model = resolve(row, preset).model
        floors[row] = smoothing_floor(model.eps_ls, model.vocab_size)
    return Cell(preset, values, points, floors, alpha=level(preset))


def _judge_again(runs: pd.DataFrame, preset: str, table: Path | None = None) -> dict:
    """The verdicts again from the per-run CSVs: the preset's, with its cells' beside it (table3-CELL-runs.csv in the
    same directory) in one Holm family, as the report judged them."""
    cells = [_cell(runs, preset)]
    for name in PRESETS[preset].cells if table is not None and table.name.startswith("table3-") else ():
        cells.append(_cell(pd.read_csv(table.with_name(f"table3-{name}-runs.csv")), name))
    return {row: v for (cell, row), v in judge_cells(cells).items() if cell == preset}


def test_every_reference_table_has_its_runs_and_their_curves():
    assert TABLES, f"no reference tables under {REFERENCE}"
    for table in TABLES:
        assert table.with_name(f"{table.stem}-runs.csv").exists(), f"{table} has no per-run CSV beside it"
        assert table.with_name(f"{table.stem}-curves.csv").exists(), f"{table} has no curves beside it"
    # a run folder holds every attempt's logs/version_N: its curve runs to its last step (not version_0's) unbroken
    folders = sorted(m.parent for m in REFERENCE.rglob("metrics.json"))
    assert len(folders) >= 42, folders  # the real table's runs
    for folder in folders:
        curve, steps = read_curve(folder, "train/loss"), pd.read_json(folder / "metrics.json", typ="series")["steps"]
        assert curve["step"].max() == steps - 1 and curve["step"].diff().max() <= 10, folder


@pytest.mark.parametrize("table", TABLES, ids=[str(t.relative_to(REFERENCE)) for t in TABLES])
def test_the_falls_and_the_stability_points_recompute_from_the_committed_curves(table):
    """A reader re-derives every run's last-quarter fall (by the preset's rule) and its dev PPL at each
    point of the stability rule, by the preset's reading (the validation nearest 75% and 87.5% of its budget, or the
    median of the three nearest, at 100% too), from the committed curves alone, and gets the per-run CSV."""
    runs = pd.read_csv(table.with_name(f"{table.stem}-runs.csv"))
    curves = pd.read_csv(table.with_name(f"{table.stem}-curves.csv"))
    rule, reading = PRESETS[_preset(table)].convergence, PRESETS[_preset(table)].stability
    done = runs[runs["status"] == "completed"]
    assert len(done), f"{table.name}: no completed run"
    for _, run in done.iterrows():
        curve = curves[(curves["row"] == run["row"]) & (curves["seed"] == run["seed"])]
        curve = curve.rename(columns={"val_ppl": "val/ppl"}).reset_index(drop=True)
        where = f"{table.name}: {run['row']} seed {run['seed']}"
        assert len(curve), f"{where} has no curve"
        assert convergence_drop(curve, rule) == pytest.approx(run["last_drop"], abs=1.5e-4), where
        values = dict(zip(curve["step"], curve["val/ppl"]))
        for fraction in read_points(reading):
            at = point_value(values, int(run["steps"]), fraction, reading)
            assert at == pytest.approx(run[f"ppl_{_suffix(fraction)}"], abs=1.5e-4), f"{where} at {fraction:.1%}"


@pytest.mark.parametrize("table", TABLES, ids=[str(t.relative_to(REFERENCE)) for t in TABLES])
def test_reference_verdicts_reproduce(table):
    committed = pd.read_csv(table).set_index("row")
    runs = pd.read_csv(table.with_name(f"{table.stem}-runs.csv"))
    again = _judge_again(runs, _preset(table), table)
    scored = committed[committed["verdict"].notna()]
    assert scored.index.tolist(), f"{table.name} has no verdicts"
    for row, line in scored.iterrows():
        if line["verdict"] == "not run":  # a table cut at a slice: scored by the registration, no run of it here
            assert not ((runs["row"] == row) & (runs["status"] == "completed")).any(), f"{table.name} {row}: it ran"
            continue
        v = again[row]
        committed_verdict = _label(table, row, "verdict", line["verdict"])
        assert v.verdict == committed_verdict, f"{table.name} {row}: committed {line['verdict']!r}, now {v.verdict!r}"
        if v.points:  # the stability rule's earlier points, as committed
            early = [_label(table, row, f"verdict_{s}", line[f"verdict_{s}"]) for s in EARLY.values()]
            assert [p.verdict for p in v.points[:-1]] == early, row
        assert (v.metric, v.predicted) == (line["metric"], line["predicted"]), (
            f"{table.name} {row}: predicted differently"
        )
        if math.isnan(line["p_holm"]):
            assert math.isnan(v.p_holm), f"{table.name} {row}: no test was committed, one is made now"
        else:
            # the runs CSV rounds dev PPL to 4 decimals: p moves a little, never across a verdict
            assert v.p_holm == pytest.approx(line["p_holm"], rel=0.1, abs=1e-4), f"{table.name} {row}"
    # every row the predictions score for this preset is in the committed table: none was dropped after the fact
    predicted = {row for row, v in again.items() if v.predicted in ("worse", "better", "equivalent")}
    assert predicted <= set(scored.index), (
        f"{table.name}: scored now but not in the committed table: {sorted(predicted - set(scored.index))}"
    )


@pytest.mark.parametrize("table", TABLES, ids=[str(t.relative_to(REFERENCE)) for t in TABLES])
def test_reference_runs_were_trained_at_the_presets_budget(table):
    """A preset whose step budget changed has its reference reports run again: a table of the old budget fails."""
    preset = PRESETS[_preset(table)]
    runs = pd.read_csv(table.with_name(f"{table.stem}-runs.csv"))
    done = runs[(runs["status"] == "completed") & (runs["row"] != "big")]  # big trains 3x, as in the paper
    assert set(done["steps"]) == {preset.train_steps}, f"{table.name}: {sorted(set(done['steps']))} steps"


def _main_job_verdicts(reference: Path) -> dict[str, pd.Series]:
    sets = {"{0}": reference / "table3-quick.csv"}
    sets |= {f"{{{p.stem[-1]}}}": p for p in sorted((reference / "main-job-seed-sets").glob("first-seed-?.csv"))}
    return {name: pd.read_csv(path).set_index("row")["verdict"].dropna() for name, path in sets.items()}


def test_the_main_job_gives_the_same_verdict_on_each_seed_set_run_apart(reference=REFERENCE):
    """Seed sets {0}, {1} and {2} of the main job (`quick`), each a separate `aiayn table3
    --first-seed S`, give every scored row the same verdict."""
    verdicts = _main_job_verdicts(reference)
    assert sorted(verdicts) == ["{0}", "{1}", "{2}"]
    first = verdicts["{0}"]
    for name, other in verdicts.items():
        differ = {
            row: (first.get(row), other.get(row))
            for row in set(first.index) | set(other.index)
            if first.get(row) != other.get(row)
        }
        assert not differ, f"seed set {name} against {{0}}: {differ}"


def _git(*args: str) -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(REFERENCE.parents[1]), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout


def _provenance_tables() -> list[Path]:
    """The reference tables whose runs recorded their commit: every one outside docs/history/reports/."""
    return TABLES


def test_reference_reports_outside_history_recorded_their_provenance():
    """Reports made before runs recorded their commit live in docs/history/reports/ (its README says so); every
    other reference report's runs name the commit they ran from."""
    for table in _provenance_tables():
        runs = pd.read_csv(table.with_name(f"{table.stem}-runs.csv"))
        assert {"commit", "dirty", "predictions_sha256"} <= set(runs.columns), f"{table.name}: no provenance columns"
        assert runs["commit"].notna().all(), f"{table.name}: a run without its commit"


@pytest.mark.parametrize(
    "table", _provenance_tables(), ids=[str(t.relative_to(REFERENCE)) for t in _provenance_tables()]
)
def test_a_reference_reports_predictions_were_committed_before_its_results(table):
    """Every run of a reference report ran from a commit of this repository, with a clean tree, whose
    ablations/predictions.csv already held the preset's pre-registration the run recorded; and that pre-registration
    is today's, the one the report's verdicts were judged by. A scored set written or changed after the runs fails
    here."""
    from aiayn.ablations.predictions import registration_sha256

    runs = pd.read_csv(table.with_name(f"{table.stem}-runs.csv"))
    preset = _preset(table)
    if _git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.fail("a shallow clone: the test needs the history (git fetch --unshallow)")
    for commit in sorted(set(runs["commit"])):
        assert _git("merge-base", "--is-ancestor", commit, "HEAD") == "", f"{table.name}: {commit} not in history"
        then = _git("show", f"{commit}:ablations/predictions.csv")
        recorded = set(runs.loc[runs["commit"] == commit, "predictions_sha256"].dropna())
        assert recorded == {registration_sha256(preset, then)}, (
            f"{table.name}: runs of {commit[:12]} recorded a pre-registration that commit did not hold"
        )
    assert not runs["dirty"].astype(bool).any(), f"{table.name}: a run from a tree with uncommitted changes"
    assert set(runs["predictions_sha256"].dropna()) == {registration_sha256(preset)}, (
        f"{table.name}: the pre-registration changed after its runs"
    )


# The command each reference table's runs were trained by, as BENCHMARKS.md quotes it (reports/reference/commands.csv),
# with every flag whose default changed since it ran (evidence v6: `--source-eos no`)
COMMANDS = pd.read_csv(REFERENCE / "commands.csv")


def test_every_reference_table_has_its_command_quoted_in_benchmarks():
    runs = {str(t.relative_to(REFERENCE)).removesuffix(".csv") + "-runs.csv" for t in TABLES}
    assert set(COMMANDS["runs"]) == runs
    quoted = (REFERENCE.parents[1] / "BENCHMARKS.md").read_text(encoding="utf-8")
    for command in COMMANDS["command"]:
        # the main job's seed sets are quoted once, `aiayn table3 --first-seed S`, S = 0, 1, 2
        spelled = (command, re.sub(r"--first-seed \d+", "--first-seed S", command))
        assert any(c in quoted for c in spelled), f"{command!r} is not quoted in BENCHMARKS.md"


def resolved_runs(command: str, out: Path) -> dict:
    """(row, seed) -> (steps, parameters, experiment fingerprint) of every run `command` (`aiayn table3 ...`) trains
    today, each resolved as the sweep resolves it (its RunConfig, before any data is prepared), nothing trained."""
    from aiayn.cli import parse
    from aiayn.common.options import from_args
    from aiayn.lightning_modules.run.train import plan
    from aiayn.sweeps.table3 import launches

    argv = shlex.split(command)
    assert argv[:2] == ["aiayn", "table3"], command
    args = parse([*argv[1:], "--out", str(out)])
    opts = from_args(args.command_of.options, args, **dict(args.command_of.fixed))
    out = {}
    for _, sweep in launches(opts):
        for row, seed in sweep.pairs:
            config = plan(sweep.run_options(row, seed), sweep.specs[row]).config
            out[(row, seed)] = (config.train.steps, sweep.specs[row].model.params(), config.experiment_sha256())
    return out


@pytest.mark.parametrize("runs_csv, commands", COMMANDS.groupby("runs")["command"].apply(list).items())
def test_a_quoted_command_resolves_today_to_the_runs_its_report_recorded(runs_csv, commands, tmp_path, monkeypatch):
    """The commands quoted beside a reference table (one per stage of it) train, today, the runs its report recorded:
    the same (row, seed) pairs, each at the steps and parameter count recorded, and, where the report recorded each
    run's experiment fingerprint (its model, data, schedule, budget, tokens a step, precision), the same experiment.
    A default changed since (sources ending in `</s>`) changes the fingerprint, so the quote must name the flag that
    keeps the old."""
    monkeypatch.chdir(REFERENCE.parents[1])  # a quoted --data-dir is relative to the checkout
    runs = pd.read_csv(REFERENCE / runs_csv)
    recorded = {(r.row, int(r.seed)): r for r in runs.itertuples(index=False)}
    resolved = {k: v for i, c in enumerate(commands) for k, v in resolved_runs(c, tmp_path / f"out{i}").items()}
    command = " and ".join(commands)
    assert sorted(resolved) == sorted(recorded)
    for key, (steps, params, experiment) in resolved.items():
        run = recorded[key]
        assert (int(run.steps), int(run.params)) == (steps, params), key
        if "experiment_sha256" in runs.columns:
            assert run.experiment_sha256 == experiment, f"{key}: {command!r} resolves to another experiment"


def test_the_experiment_fingerprint_sees_a_changed_default_and_not_the_machine(tmp_path, monkeypatch):
    """Evidence v6's runs predate sources ending in `</s>`: its command without `--source-eos no` is another
    experiment for every run, and the fingerprint says so; where the runs are written is not the experiment."""
    monkeypatch.chdir(REFERENCE.parents[1])
    command = "aiayn table3 --preset evidence --rows base,A3 --seeds 1 --base-seeds 1 --first-seed 120"
    today = resolved_runs(command, tmp_path / "a")
    then = resolved_runs(command + " --source-eos no", tmp_path / "b")
    assert sorted(today) == sorted(then) == [("A3", 120), ("base", 120)]
    assert all(today[k][2] != then[k][2] and today[k][:2] == then[k][:2] for k in today)
    elsewhere = resolved_runs(command + " --source-eos no", tmp_path / "c")
    assert elsewhere == then
