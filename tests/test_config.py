"""Config files: `aiayn train --config FILE` (a run's config.json, or YAML) trains that run again,
exactly; `--print-config` prints the resolved config and writes nothing."""

import json

import pytest
import torch

from aiayn.cli import main
from aiayn.common.files import sha256_file

FAST = "--max-steps 2 --ckpt-every 1 --val-bleu-sentences 4 --eval-subset 4 --no-progress --accelerator cpu".split()
MINE = "row,group,d_ff\nwide-ff,mine,4096\n"


@pytest.fixture(scope="module")
def trained(cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    assert main(["train", "--row", "C1", "--preset", "tiny", "--out", str(out), "--set", "h=4", *FAST]) == 0
    return out / "tiny" / "synthetic" / "C1" / "seed0"


def printed(capsys, *argv) -> dict:
    assert main(["train", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def tree(root):
    return sorted(p.relative_to(root) for p in root.rglob("*"))


@pytest.mark.slow  # trains end to end (seconds): the slow tier
def test_a_runs_config_json_trains_that_run_again_exactly(trained, tmp_path):
    other = tmp_path / "again"
    assert main(["train", "--config", str(trained / "config.json"), "--out", str(other)]) == 0
    again = other / "tiny" / "synthetic" / "C1" / "seed0"
    first, second = (json.loads((d / "config.json").read_text()) for d in (trained, again))
    assert second["options"].pop("out") == str(other) and first["options"].pop("out") == str(trained.parents[3])
    assert second["options"].pop("tokenizer") == str(trained / "tokenizer.model")  # the run's own, not the cache's
    assert first["options"].pop("tokenizer") is None and first == second  # h=4 and every other option kept
    assert first["spec"]["model"]["h"] == 4 and first["options"]["overrides"] == {"h": 4}
    a, b = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for d in (trained, again))
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit (CPU, deterministic)
    m1, m2 = (json.loads((d / "metrics.json").read_text()) for d in (trained, again))
    assert {k: m1[k] for k in ("steps", "dev_bleu", "dev_ppl", "params")} == {
        k: m2[k] for k in ("steps", "dev_bleu", "dev_ppl", "params")
    }


def test_print_config_is_the_runs_config_and_writes_nothing(trained, tmp_path, capsys):
    config = trained / "config.json"
    before = tree(trained.parents[3])
    assert printed(capsys, "--config", str(config)) == json.loads(config.read_text())
    changed = printed(capsys, "--config", str(config), "--set", "d_ff=64", "--seed", "3")
    assert changed["spec"]["model"]["d_ff"] == 64 and changed["spec"]["model"]["h"] == 4  # --set adds to the file's
    assert changed["train"]["seed"] == 3 and changed["options"]["overrides"] == {"h": 4, "d_ff": 64}
    # seed3 is another run directory: it takes the tokenizer.model beside the config file
    assert changed["tokenizer"]["sha256"] == sha256_file(trained / "tokenizer.model")
    assert tree(trained.parents[3]) == before


def test_a_yaml_file_of_options(tmp_path, capsys):
    (tmp_path / "c1.yaml").write_text("# my run\nrow: C1\npreset: tiny\nmax-steps: 3\nset:\n  h: 2\n")
    config = printed(capsys, "--config", str(tmp_path / "c1.yaml"), "--out", str(tmp_path / "runs"))
    assert (config["spec"]["row"], config["train"]["steps"], config["spec"]["model"]["h"]) == ("C1", 3, 2)
    assert config["spec"]["deviations"] == [{"kind": "override", "text": "overridden: h=2"}]
    assert config["spec"]["overrides"] == {"h": 2} and not (tmp_path / "runs").exists()


def test_the_config_files_row_is_trained_even_when_its_table_changed(tmp_path, capsys):
    table = tmp_path / "my.csv"
    table.write_text(MINE)
    (tmp_path / "config.json").write_text(json.dumps(printed(capsys, "--table", str(table), "--row", "wide-ff")))
    table.write_text(MINE.replace("4096", "8192"))
    assert main(["train", "--config", str(tmp_path / "config.json"), "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["spec"]["model"]["d_ff"] == 1024  # 4096 at width 1/4, as the config file says
    assert "WARNING aiayn.lightning_modules.run.spec: row wide-ff of the config file differs from its table now" in err
    assert "'d_ff': (1024, 2048)" in err
    table.unlink()  # the table is gone: the config file's row is all there is
    assert printed(capsys, "--config", str(tmp_path / "config.json"))["spec"]["model"]["d_ff"] == 1024


def test_a_row_is_looked_up_and_resolved_once_from_the_sweep_to_the_model_config(tmp_path, monkeypatch):
    """`aiayn table3 --rows B1` down to the model's config: the sweep's driver resolves B1 once (a RunSpec) and hands
    it to the run, which builds no second spec, looks the row up in no table and builds no other model config (the
    parameter count comes from the shapes: no throw-away model either)."""
    from aiayn.ablations.selection import Selection
    from aiayn.lightning_modules.run import spec, train
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.transformer import config
    from aiayn.sweeps.table3 import SweepOptions, build_sweep

    counts = _count_lookups(monkeypatch)  # the same dict, counting two more
    counts.update(TransformerConfig=0, Transformer=0)
    monkeypatch.setattr("aiayn.sweeps.backends.resolve", spec.resolve)
    real_init = config.TransformerConfig.__post_init__
    monkeypatch.setattr(
        config.TransformerConfig,
        "__post_init__",
        lambda self: counts.__setitem__("TransformerConfig", counts["TransformerConfig"] + 1) or real_init(self),
    )
    from aiayn.lightning_modules.transformer import model

    monkeypatch.setattr(model.Transformer, "__init__", lambda *a, **k: pytest.fail("a model built to size the run"))
    opts = SweepOptions(select=Selection(rows="B1"), train=TrainOptions(out=str(tmp_path), max_steps=2))
    sweep = build_sweep(opts)
    resolved = sweep.specs["B1"]
    sweep.specs["B1"].cost()  # the sweep orders its queue by it
    p = train.plan(sweep.run_options("B1", 0), resolved)
    assert counts == {"get_row": 1, "resolve": 1, "TransformerConfig": 1, "Transformer": 0}
    assert p.spec is resolved and p.config.spec.model.d_k == 8


def _count_lookups(monkeypatch) -> dict:
    """How often a row is looked up in a table (get_row) or resolved (resolve), wherever it is called from."""
    from aiayn.ablations import table
    from aiayn.lightning_modules.run import spec

    counts = {"get_row": 0, "resolve": 0}

    def counting(module, name, key):
        real = getattr(module, name)

        def wrapped(*a, **k):
            counts[key] += 1
            return real(*a, **k)

        monkeypatch.setattr(module, name, wrapped)

    counting(table, "get_row", "get_row")
    counting(spec, "get_row", "get_row")
    counting(spec, "resolve", "resolve")
    return counts


def _child_spec(argv: list[str]):
    """The spec a run's own process trains for `aiayn ARGV` (its `aiayn train` command line), in this process."""
    from aiayn.cli import parse
    from aiayn.common.options import from_args
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.spec import spec_for

    args = parse(argv)
    return spec_for(from_args(TrainOptions, args), args.recorded)


def test_every_back_end_hands_its_runs_the_row_it_resolved_once(tmp_path, monkeypatch):
    """The subprocess back end, a SLURM array task and an HPO trial train the spec their driver resolved: the
    child looks no row up, and a table edited after the driver resolved it changes nothing already handed out."""
    import shlex

    from conftest import fake_popen

    from aiayn.ablations.selection import Selection
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.sweeps.backends import make_sweep, slurm
    from aiayn.sweeps.backends import processes as backends
    from aiayn.sweeps.hpo import HpoOptions, run_hpo
    from aiayn.sweeps.table3 import SweepOptions, build_sweep

    table = tmp_path / "mine.csv"
    table.write_text(MINE)
    counts = _count_lookups(monkeypatch)

    # subprocess: the driver resolves, writes the row beside the run, and the fresh `aiayn train` reads it back
    opts = SweepOptions(
        select=Selection(rows="wide-ff"),
        backend="subprocess",
        train=TrainOptions(out=str(tmp_path / "sub"), max_steps=2, table=(str(table),)),
    )
    sweep = build_sweep(opts)
    started = []
    with monkeypatch.context() as m:  # subprocess.Popen itself: only for this call
        m.setattr(backends.subprocess, "Popen", fake_popen(started, returncode=0))
        backends.SubprocessBackend().run_one(sweep, "wide-ff", 0, None)
    table.write_text(MINE.replace("4096", "1024"))  # edited after the driver resolved the row
    before = dict(counts)
    child = _child_spec(started[0][0][3:])  # [python, -m, aiayn, train, ...]
    assert counts == before and child == sweep.specs["wide-ff"] and child.model.d_ff == 1024  # 4096 x 1/4, not 1024
    table.write_text(MINE)

    # SLURM: the array's tasks train the rows as `aiayn slurm` resolved them at submission
    res = slurm.SlurmResources(partition="debug", time="00:30:00", tasks_per_node=1)
    so = slurm.SlurmOptions(
        select=Selection(rows="wide-ff"),
        dry_run=True,
        resources=res,
        train=TrainOptions(
            accelerator="cpu",
            devices=None,
            num_nodes=None,
            strategy=None,
            progress=False,
            out=str(tmp_path / "sl"),
            table=(str(table),),
        ),
    )
    slurm.submit(so, make_sweep(slurm.pairs(so), so.train))
    script = slurm.script_path(so).read_text()
    line = " ".join(script.split("srun ", 1)[1].replace("\\\n", " ").split())
    words = shlex.split(line.replace("$ROW", "wide-ff").replace("$SEED", "0"))
    table.write_text(MINE.replace("4096", "1024"))
    before = dict(counts)
    task = _child_spec(words[words.index("train") :])
    assert counts == before and task.model.d_ff == 1024  # the table as it was at submission (4096 x 1/4)
    table.write_text(MINE)

    # HPO: the search resolves the row once; each trial trains it with the trial's values on top
    from aiayn.lightning_modules.run import train as train_mod
    from aiayn.lightning_modules.run.rundir import RunMetrics

    trained = []

    def fake(o, spec, hooks):
        trained.append(spec)
        return RunMetrics(o.row, o.seed, o.preset, "completed", dev_ppl=5.0, dev_bleu=1.0)

    monkeypatch.setattr(train_mod, "train", fake)
    before = dict(counts)
    run_hpo(HpoOptions(trials=2, train=TrainOptions(row="C1", out=str(tmp_path / "hpo"), progress=False)))
    assert counts["resolve"] - before["resolve"] == 1 and len(trained) == 2
    assert all(set(s.overrides) == {"lr_factor", "warmup", "P_drop"} for s in trained)  # eps_ls: not by default


def test_a_trainer_argument_reaches_lightnings_trainer_and_is_recorded(cache, tmp_path):
    """--trainer log_every_n_steps=1: the training curve gets a row per step (the default, 10, gives none in 2)."""
    import csv

    def trained_rows(out, *extra):
        assert main(["train", "--out", str(out), *FAST, "--logger", "csv", *extra]) == 0
        run = out / "tiny" / "synthetic" / "base" / "seed0"
        with open(next(run.glob("logs/version_*/metrics.csv"))) as f:
            rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
        return rows, json.loads((run / "config.json").read_text())["options"]["trainer"]

    rows, recorded = trained_rows(tmp_path / "every", "--trainer", "log_every_n_steps=1")
    assert len(rows) == 2 and recorded == {"log_every_n_steps": 1}
    rows, recorded = trained_rows(tmp_path / "default")
    assert rows == [] and recorded == {}
