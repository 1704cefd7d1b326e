"""Tables that grow: a row added to ablations/ or to a user's own table file (`--table`) joins an
existing study, whose rerun runs only the new pairs and whose report includes them; a study made
before rows became trial attributes keeps working. On SQLite and journal storage."""

import json
from pathlib import Path

import optuna
import pytest
from conftest import RunnerBackend

from aiayn.ablations.presets import PRESETS
from aiayn.ablations.selection import Selection
from aiayn.cli import main
from aiayn.lightning_modules.data.corpora import CorpusRef
from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.rundir import DataIdentity, OutDir, RunConfig, TrainPlan
from aiayn.lightning_modules.run.spec import resolve
from aiayn.reports.build import write_reports
from aiayn.sweeps.backends.queue import pair_of, study_name
from aiayn.sweeps.storage import open_storage
from aiayn.sweeps.table3 import SweepOptions, run_table3

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset


optuna.logging.set_verbosity(optuna.logging.WARNING)

MINE = (
    "row,group,N,d_model,d_ff,h,d_k,d_v,P_drop,eps_ls,pe,train_steps,note\nwide-ff,mine,,,4096,,,,,,,,twice the FFN\n"
)


def my_table(tmp_path: Path, text: str = MINE) -> str:
    path = tmp_path / "my.csv"
    path.write_text(text)
    return str(path)


class MetricsRunner:
    """Stands in for training: records each pair and writes the metrics.json a run would."""

    def __init__(self):
        self.calls = []

    def __call__(self, opts, corpus, row, seed):
        self.calls.append((row, seed))
        spec = resolve(row, "tiny", tables=opts.train.table)
        steps = spec.train_steps  # its whole budget: a run that stopped short would be run again (books' `short`)
        config = RunConfig(spec, DataIdentity(corpus), TrainPlan(seed, steps, 1, 1, 1024, "32-true"))
        run = OutDir(opts.train.out).run("tiny", corpus, row, seed)
        return run.write_metrics(
            config, "completed", dev_bleu=20.0 + len(row), dev_ppl=5.0, steps=steps, params=spec.model.params()
        ).to_dict()


def sweep(tmp_path, storage, rows, table=()):
    url = f"sqlite:///{tmp_path}/runs/optuna.db" if storage == "sqlite" else f"journal:///{tmp_path}/runs/j.log"
    (tmp_path / "runs").mkdir(exist_ok=True)
    return SweepOptions(
        select=Selection(rows=rows),
        storage=url,
        report="",
        train=TrainOptions(out=str(tmp_path / "runs"), table=tuple(table)),
    )


def trials_by_row(opts) -> dict:
    study = optuna.load_study(study_name=study_name("tiny", SYNTHETIC), storage=open_storage(opts.storage))
    out = {}
    for t in study.trials:
        if t.state == optuna.trial.TrialState.COMPLETE:
            out.setdefault(pair_of(t)[0], []).append(t.number)
    return out


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_row_of_a_users_table_joins_an_existing_study_and_the_report(tmp_path, storage):
    runner = MetricsRunner()
    assert run_table3(sweep(tmp_path, storage, "base,A1"), backend=RunnerBackend(runner)).completed == 2
    table = my_table(tmp_path)
    again = MetricsRunner()
    summary = run_table3(sweep(tmp_path, storage, "base,A1,wide-ff", [table]), backend=RunnerBackend(again))
    assert again.calls == [("wide-ff", 0)] and summary.counts() == {
        "pairs": 3,
        "ran": 1,
        "completed": 1,
        "failed": 0,
        "diverged": 0,
    }
    assert sorted(trials_by_row(sweep(tmp_path, storage, None))) == ["A1", "base", "wide-ff"]
    (md,) = [p for p in write_reports(tmp_path / "runs", tmp_path / "rep", "tiny") if p.suffix == ".md"]
    lines = {line.split("|")[2].strip(): line for line in md.read_text().splitlines() if line.startswith("| ")}
    assert {"base", "A1", "wide-ff"} <= set(lines) and "1024" in lines["wide-ff"]  # d_ff 4096 at width 1/4


def test_a_users_rows_inherit_from_base_and_are_selected_by_default(tmp_path, capsys):
    table = my_table(tmp_path)
    assert main(["rows", "--preset", "tiny", "--table", table, "--format", "json"]) == 0
    rows = {r["row"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows)[-1] == "wide-ff" and "base" in rows and "no-pe" not in rows  # paper rows + mine
    mine, base = rows["wide-ff"], rows["base"]
    assert mine["d_ff"] == 1024 == 2 * base["d_ff"] and mine["note"] == "twice the FFN" and mine["group"] == "mine"
    own = ("row", "group", "d_ff", "params", "note", "paper_ppl", "paper_bleu", "paper_params_m")
    assert {k: v for k, v in mine.items() if k not in own} == {k: v for k, v in base.items() if k not in own}
    assert mine["paper_bleu"] is None and mine["params"] > base["params"]
    assert Selection(rows="mine").pairs(PRESETS["tiny"], (table,)) == [("wide-ff", 0)]  # its group selects it too
