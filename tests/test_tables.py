"""Tables that grow: a row added to ablations/ or to a user's own table file (`--table`) joins an
existing study, whose rerun runs only the new pairs and whose report includes them; a study made
before rows became trial attributes keeps working. On SQLite and journal storage."""

import json
from pathlib import Path

import optuna
import pytest

from aiayn.ablations.presets import PRESETS, resolve
from aiayn.ablations.selection import Selection
from aiayn.ablations.table import MAX_SEED, load_rows
from aiayn.cli import main
from aiayn.lightning_modules.config import params_of
from aiayn.lightning_modules.options import TrainOptions
from aiayn.lightning_modules.rundir import RunDir
from aiayn.reports.build import write_reports
from aiayn.sweeps.storage import open_storage
from aiayn.sweeps.table3 import SweepOptions, pair_of, run_table3, study_name

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
        resolved = resolve(row, "tiny", opts.train.table)
        config = {"row": resolved, "data": {"corpus": corpus},
                  "train": {"seed": seed, "steps": 10, "effective_tokens_per_step": 1024}}  # fmt: skip
        run = RunDir.of(opts.train.out, "tiny", corpus, row, seed)
        return run.write_metrics(config, "completed", dev_bleu=20.0 + len(row), dev_ppl=5.0, steps=10,
                                 params=params_of(resolved))  # fmt: skip


def sweep(tmp_path, storage, rows, table=()):
    url = f"sqlite:///{tmp_path}/runs/optuna.db" if storage == "sqlite" else f"journal:///{tmp_path}/runs/j.log"
    (tmp_path / "runs").mkdir(exist_ok=True)
    return SweepOptions(select=Selection(rows=rows), storage=url, report="",
                        train=TrainOptions(out=str(tmp_path / "runs"), table=tuple(table)))  # fmt: skip


def trials_by_row(opts) -> dict:
    study = optuna.load_study(study_name=study_name("tiny", "synthetic"), storage=open_storage(opts.storage))
    out = {}
    for t in study.trials:
        if t.state == optuna.trial.TrialState.COMPLETE:
            out.setdefault(pair_of(t)[0], []).append(t.number)
    return out


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_row_of_a_users_table_joins_an_existing_study_and_the_report(tmp_path, storage):
    runner = MetricsRunner()
    assert run_table3(sweep(tmp_path, storage, "base,A1"), runner=runner)["completed"] == 2
    table = my_table(tmp_path)
    again = MetricsRunner()
    summary = run_table3(sweep(tmp_path, storage, "base,A1,wide-ff", [table]), runner=again)
    assert again.calls == [("wide-ff", 0)] and summary == {"pairs": 3, "ran": 1, "completed": 1, "failed": 0}
    assert sorted(trials_by_row(sweep(tmp_path, storage, None))) == ["A1", "base", "wide-ff"]
    (md,) = [p for p in write_reports(tmp_path / "runs", tmp_path / "rep", "tiny") if p.suffix == ".md"]
    lines = {line.split("|")[2].strip(): line for line in md.read_text().splitlines() if line.startswith("| ")}
    assert {"base", "A1", "wide-ff"} <= set(lines) and "1024" in lines["wide-ff"]  # d_ff 4096 at width 1/4


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_study_made_before_rows_were_trial_attributes_keeps_its_pairs_and_takes_new_rows(tmp_path, storage):
    """The format of aiayn 0.1 (commit 30b8e88): the pair enqueued as fixed parameters, the row a
    categorical over the rows of that day. Its completed pairs stay done, its queued pair runs, and a
    row added since runs once."""
    opts = sweep(tmp_path, storage, "base,A1,A2,wide-ff", [my_table(tmp_path)])
    study = optuna.create_study(study_name=study_name("tiny", "synthetic"), storage=open_storage(opts.storage),
                                direction="maximize")  # fmt: skip
    old_rows = list(load_rows())  # the rows of that day: no wide-ff among them
    for row in ("base", "A1", "A2"):
        study.enqueue_trial({"row": row, "seed": 0})
    for _ in range(2):  # base and A1 done; A2 still queued
        trial = study.ask()
        trial.suggest_categorical("row", old_rows)
        trial.suggest_int("seed", 0, MAX_SEED)
        study.tell(trial, 30.0)
    # and what aiayn 0.1 left when it met a row added to its table: the pair popped, then the crash on
    # the row's categorical, the trial RUNNING and unclaimed
    study.enqueue_trial({"row": "wide-ff", "seed": 0})
    crashed = study.ask()
    with pytest.raises(ValueError, match="CategoricalDistribution does not support dynamic value space"):
        crashed.suggest_categorical("row", [*old_rows, "wide-ff"])
    runner = MetricsRunner()
    assert run_table3(opts, runner=runner)["completed"] == 2
    assert sorted(runner.calls) == [("A2", 0), ("wide-ff", 0)]
    assert {row: len(n) for row, n in trials_by_row(opts).items()} == {"base": 1, "A1": 1, "A2": 1, "wide-ff": 1}
    assert study.get_trials()[crashed.number].state == optuna.trial.TrialState.FAIL
    again = MetricsRunner()
    assert run_table3(opts, runner=again)["ran"] == 0 and again.calls == []


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
