"""Budgets are part of a result: a run records the budget its row has at its preset and the steps it
trained; a look capped by `--max-steps` is marked capped in status, reports and trackers; a later sweep at the full
budget extends it (and an extended run is the uninterrupted one, bit for bit), a shorter one is refused; a report of
capped runs gives no verdict, and a row trained to another share of its budget than base's is not compared with it;
`aiayn table3 --dry-run` lists what a command would do.

The sweep-level tests use a stand-in runner that writes the metrics.json a run of that many steps would; the real
training is in the slow tier."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import RunnerBackend, StepsRunner

from aiayn.ablations.selection import Selection
from aiayn.cli import main
from aiayn.common.errors import UserError
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.rundir import OutDir, RunMetrics
from aiayn.reports.build import write_reports
from aiayn.sweeps.status import sweep_status
from aiayn.sweeps.table3 import SweepOptions, table3

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset


FIXTURES = Path(__file__).parent / "fixtures" / "report"


def sweep_opts(tmp_path, max_steps=None, dry_run=False) -> SweepOptions:
    return SweepOptions(
        select=Selection(rows="base,C1", seeds=1),
        report="",
        dry_run=dry_run,
        train=TrainOptions(preset="tiny", out=str(tmp_path / "runs"), progress=False, max_steps=max_steps),
    )


def test_a_capped_look_then_the_full_command_extends_every_run_and_never_reports_the_look(tmp_path, capsys):
    runner = StepsRunner()
    backend = RunnerBackend(runner)
    assert table3(sweep_opts(tmp_path, max_steps=20), backend=backend) == 0
    assert sorted(runner.calls) == [("C1", 0, 20), ("base", 0, 20)]
    status = {(p["row"], p["seed"]): p for p in sweep_status(tmp_path / "runs")[0]["pairs"]}
    assert status[("base", 0)]["capped"] and status[("base", 0)]["budget"] == 1200
    # the full command: not "0 to run" -- both capped runs are extended to the budget
    assert table3(sweep_opts(tmp_path), backend=backend) == 0
    assert sorted(runner.calls[2:]) == [("C1", 0, 1200), ("base", 0, 1200)]
    status = {(p["row"], p["seed"]): p for p in sweep_status(tmp_path / "runs")[0]["pairs"]}
    assert not status[("base", 0)]["capped"] and status[("base", 0)]["state"] == "completed"
    # and again: nothing left to do
    assert table3(sweep_opts(tmp_path), backend=backend) == 0
    assert len(runner.calls) == 4
    # a shorter look into the same --out cannot shorten the runs: one line naming the flag, nothing run
    with pytest.raises(
        UserError,
        match=r"already trained 1200 steps .* --max-steps 30 asks for 30, and a run cannot "
        r"be shortened .* pass another --out",
    ):
        table3(sweep_opts(tmp_path, max_steps=30), backend=backend)
    assert len(runner.calls) == 4


def test_status_says_which_runs_are_capped(tmp_path):
    table3(sweep_opts(tmp_path, max_steps=20), backend=RunnerBackend(StepsRunner()))
    assert main(["status", str(tmp_path / "runs")]) == 0


def test_the_dry_run_lists_what_would_run_and_what_stands_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "runs"
    table3(sweep_opts(tmp_path, dry_run=True), backend=RunnerBackend(StepsRunner()))
    said = capsys.readouterr().out
    assert "table3 tiny on synthetic" in said and "2 pairs: 2 run" in said
    assert not out.exists(), "a dry run wrote something"
    runner = StepsRunner()
    table3(sweep_opts(tmp_path, max_steps=20), backend=RunnerBackend(runner))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    table3(sweep_opts(tmp_path, dry_run=True), backend=RunnerBackend(runner))
    said = capsys.readouterr().out
    assert "2 pairs: 2 extend" in said and "trained 20 of 1200 steps" in said
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before and len(runner.calls) == 2


def test_the_command_line_dry_run(tmp_path, capsys):
    argv = ["table3", "--preset", "tiny", "--rows", "base", "--out", str(tmp_path / "o"), "--dry-run"]
    assert main(argv) == 0
    assert "base  seed 0   run" in capsys.readouterr().out and not (tmp_path / "o").exists()


def _report_of(tmp_path, edit) -> str:
    """The report fixture's runs, each metrics.json edited by `edit(row, metrics)`, reported; the Markdown."""
    runs = tmp_path / "runs"
    shutil.copytree(FIXTURES / "runs", runs)
    for path in runs.rglob("metrics.json"):
        try:
            m = json.loads(path.read_text())
        except ValueError:
            continue
        edit(m["row"], m)
        path.write_text(json.dumps(m))
    write_reports(runs, tmp_path / "out")
    return (tmp_path / "out" / "table3-tiny.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--preset", "paper", "--jobs", "8", "--gpus-per-job", "1"], "hands out GPUs but none is visible"),
        (["--storage", "sqlite:////no/such/dir/x.db"], "directory /no/such/dir does not exist"),
        (["--storage", "sqlite://"], "an in-memory database keeps no books"),
        (["--storage", "postgresql://u:pw@db.invalid/x"], "needs its database driver, which is not installed"),
        (["--storage", "postgresql://u:$AIAYN_UNSET_PW@db.invalid/x"], "names $AIAYN_UNSET_PW, which is not set"),
    ],
    ids=[
        "GPUs where none is visible",
        "storage in a missing folder",
        "storage in memory",
        "a server without its driver",
        "a password variable not set",
    ],
)
def test_a_dry_run_refuses_what_the_real_run_refuses_in_the_same_line(tmp_path, capsys, monkeypatch, flags, says):
    """`--dry-run` says "run" only where the real command would run: it makes the real run's checks first."""
    monkeypatch.setattr("aiayn.sweeps.backends.processes.visible_gpus", lambda: [])
    lines = []
    for dry in (["--dry-run"], []):
        assert main(["table3", *flags, "--out", str(tmp_path / "o"), *dry]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
        lines.append(err[0])
    assert lines[0] == lines[1] and not (tmp_path / "o").exists()


def test_a_report_of_capped_runs_says_so_first_and_gives_no_verdict(tmp_path):
    def capped(row, m):  # every run trained 800 of a 1200-step budget
        m["budget_steps"] = 1200

    md = _report_of(tmp_path, capped)
    first = md.splitlines()[4]
    assert first.startswith(
        "**A look, not the table: 12 of 12 completed run(s) stopped short of their budget "
        "(`--max-steps`: 800 of 1200 steps, evaluated on 12 dev sentences).**"
    )
    assert "No pre-registered verdicts: runs stopped short of their budget (`--max-steps`)" in md
    table = (tmp_path / "out" / "table3-tiny.csv").read_text().splitlines()
    verdict = table[0].split(",").index("verdict")
    assert all(line.split(",")[verdict] == "" for line in table[1:])  # no row judged


@pytest.mark.parametrize("capped", [False, True], ids=["the table", "a look"])
def test_every_plot_of_a_look_says_so_in_its_title(tmp_path, monkeypatch, capped):
    """A plot pasted alone must not read as a result: forest, delta_vs_paper and bleu_vs_params name the look as
    curves.png does."""
    from aiayn.reports import plots

    titles = {}
    for name in ("bleu_vs_params", "delta_vs_paper", "forest", "curves"):
        draw = getattr(plots, name)
        monkeypatch.setattr(
            plots,
            name,
            lambda *a, _n=name, _d=draw, **k: titles.setdefault(_n, (a[2], k.get("capped"))) and _d(*a, **k),
        )

    def edit(row, m):
        if capped:
            m["budget_steps"] = 1200

    _report_of(tmp_path, edit)
    assert set(titles) == {"bleu_vs_params", "delta_vs_paper", "forest", "curves"}
    for name, (title, curve_capped) in titles.items():
        says = "capped by --max-steps" in title or bool(curve_capped)
        assert says == capped, f"{name}: {title!r}"


def test_a_row_trained_to_another_share_of_its_budget_is_not_compared_with_base(tmp_path):
    def mixed(row, m):  # C1 looked at 400 steps, every other run at 800, of an 800-step budget
        m["budget_steps"] = 800
        if row == "C1":
            m["steps"] = m["planned_steps"] = 400

    md = _report_of(tmp_path, mixed)
    assert "Not comparable with base" in md and "C1: 400 of 800 steps against base's 800 of 800 steps" in md
    line = next(x for x in md.splitlines() if x.startswith("| C ") or "| C1 " in x)
    assert "+29.41" not in line  # its Δ is left blank (the fixture's C1 is +29.41% at equal budgets)
    slopes = (tmp_path / "out" / "table3-tiny-slopes.csv").read_text()
    assert "C1" not in slopes  # nor does it join the depth series' slope


def test_trackers_get_the_budget_beside_the_final_numbers():
    from aiayn.lightning_modules.run.loggers import budget_values

    m = RunMetrics("base", 0, "quick", "completed", steps=60, planned_steps=60, budget_steps=3000)
    assert m.capped and budget_values(m) == {"budget/steps": 60.0, "budget/budget_steps": 3000.0, "budget/capped": 1.0}
    full = RunMetrics("base", 0, "quick", "completed", steps=3000, planned_steps=3000, budget_steps=3000)
    assert not full.capped and budget_values(full)["budget/capped"] == 0.0
    assert (
        "capped: 60 of its 3000"
        in RunMetrics(
            "base",
            0,
            "quick",
            "completed",
            steps=60,
            budget_steps=3000,
            dev_bleu=1.0,
            dev_ppl=2.0,
            params=10,
            train_time_s=1.0,
            tokens_per_s=1.0,
        ).summary_line()
    )


SMALL = [
    "--set",
    "N=1 d_model=32 d_ff=64 h=2",
    *"--val-every 4 --ckpt-every 100 --eval-subset 20 --no-progress --accelerator cpu".split(),
]


@pytest.mark.slow
def test_a_capped_run_extended_to_more_steps_is_the_uninterrupted_run_bit_for_bit(cache, tmp_path, capsys):
    """6 steps, then the same command with 12: the final step is no checkpoint step, and the run ends as the run of 12
    steps trained at once (weights and dev perplexity), its config.json saying 12. Rerun once more, it trains nothing
    and leaves metrics.json as it was."""

    def run(out, steps):
        assert (
            main(["train", "--row", "base", "--preset", "tiny", "--out", str(out), "--max-steps", str(steps), *SMALL])
            == 0
        )
        return OutDir(out).run("tiny", SYNTHETIC, "base", 0)

    whole = run(tmp_path / "whole", 12)
    run(tmp_path / "looked", 6)
    extended = run(tmp_path / "looked", 12)
    a, b = (torch.load(r.last_checkpoint, weights_only=True)["state_dict"] for r in (whole, extended))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert extended.read_metrics().dev_ppl == whole.read_metrics().dev_ppl
    assert extended.read_config().train.steps == 12
    before = extended.metrics_file.read_bytes()
    capsys.readouterr()
    run(tmp_path / "looked", 12)  # completed: nothing trained, metrics.json untouched
    assert extended.metrics_file.read_bytes() == before
    capsys.readouterr()
    assert (
        main([*"train --row base --preset tiny --out".split(), str(tmp_path / "looked"), "--max-steps", "6", *SMALL])
        == 2
    )
    assert "already trained 12 steps, and this command asks for 6" in capsys.readouterr().err
    assert extended.metrics_file.read_bytes() == before
