"""Bad input, tabled: every mistake a user can make on the command line, in a config, a corpus, a
checkpoint or a storage URL gives one exact line `aiayn: error: <problem>; <fix>` on stderr, exit
status 2, and writes nothing (no run directory, report, database or lock); stderr holds nothing else
but INFO log lines of the work done before the mistake was found (e.g. tokenizer training).

(SLURM options have their own table in tests/test_slurm.py.) An unwritable output directory is a
path under a regular file: CI runs as root, where permission bits do not stop a write.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import checkpoint_of

from aiayn.ablations.knobs import MODEL_KEYS, SCHEDULE_KEYS
from aiayn.ablations.presets import PRESETS
from aiayn.ablations.table import COLUMNS, TABLE_FILES, load_rows
from aiayn.cli import main
from aiayn.lightning_modules.data.corpora import CORPORA, CorpusRef
from aiayn.lightning_modules.run.rundir import DataIdentity, RunConfig, TrainPlan
from aiayn.lightning_modules.run.spec import resolve
from aiayn.lightning_modules.transformer.config import PE_KINDS

SYNTHETIC = CorpusRef.parse("synthetic")  # the corpus of the tiny preset
ROOT = Path(__file__).resolve().parents[1]


ROWS = ", ".join(load_rows())
GROUPS = ", ".join(sorted({r.group for r in load_rows().values()}))


pytestmark = pytest.mark.usefixtures("cache")  # tests/conftest.py: a fresh AIAYN_CACHE for the module


def corpus(tmp: Path, break_it=None) -> None:
    lines = [f"sentence number {i} ." for i in range(50)]
    d = tmp / "corpus"
    d.mkdir()
    for split in ("train", "dev", "test"):
        for lang in ("en", "de"):
            (d / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    if break_it == "empty":
        (d / "test.en").write_text("")
    elif break_it == "mismatch":
        (d / "train.de").write_text("\n".join(lines[:40]) + "\n")
    elif break_it == "missing":
        (d / "dev.de").unlink()
    elif break_it == "utf8":
        (d / "train.en").write_bytes(b"ok\n\xff\xfe broken\n" + b"x\n" * 48)
    elif break_it == "blank dev":
        for lang in ("en", "de"):
            (d / f"dev.{lang}").write_text("\n" * 50)


def checkpoint(tmp: Path, kind: str) -> None:
    ckpt = checkpoint_of()
    path = tmp / "model.ckpt"
    if kind == "foreign":
        torch.save({"state_dict": {}}, path)
        return
    if kind == "smuggled":  # a callable by __reduce__: torch 2.13 words this refusal apart from a class's
        ckpt["planted"] = Smuggled()
    if kind == "format 99":  # written by a later aiayn whose checkpoint layout this one does not know
        ckpt["aiayn"]["format"] = 99
    if kind == "random tokenizer":  # bytes that match the sha256 recorded with them, but no SentencePiece model
        junk = bytes(range(256)) * 8
        ckpt["aiayn"].update(tokenizer_model=junk, tokenizer_sha256=hashlib.sha256(junk).hexdigest())
    if kind == "other-config":  # weights of d_ff=32 under a config that says d_ff=64
        other = resolve("base", "tiny", overrides={"N": 1, "d_model": 16, "d_ff": 64, "h": 2}, vocab_size=50)
        ckpt["aiayn"] = checkpoint_of(other, state_dict={})["aiayn"]
    torch.save(ckpt, path)
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:1000])


class Smuggled:
    def __reduce__(self):
        import os

        return (os.system, ("echo this ran",))


def table(text: str):
    """A user's table file {tmp}/t.csv holding `text`."""
    return lambda tmp: (tmp / "t.csv").write_text(text)


def base_d_model() -> int:
    return resolve("base", "tiny").model.d_model


def other_run(tmp: Path) -> None:
    """The run directory of base/seed0 holding a run whose d_model is two more than base's (and the same data)."""
    spec = resolve("base", "tiny", corpus=CorpusRef.parse("files"), vocab_size=60)
    data = DataIdentity(CorpusRef.parse("files"), str(tmp / "corpus"), 60)
    config = RunConfig(spec, data, TrainPlan(0, 2, 1, 1, 1024, "32-true")).to_dict()
    config["spec"]["knobs"]["d_model"] += 2  # the knob the model is built from, and the model derived from it
    config["spec"]["model"]["d_model"] += 2
    d = tmp / "runs" / "tiny" / "files" / "base" / "seed0"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))


HELD = []  # locks held by a "running" process during one test


@pytest.fixture(autouse=True)
def release_locks():
    yield
    while HELD:
        HELD.pop().close()


def busy_run(tmp: Path) -> None:
    """Another process trains base/seed0: it holds RUN/.lock (flock)."""
    import fcntl

    corpus(tmp)
    d = tmp / "runs" / "tiny" / "files" / "base" / "seed0"
    d.mkdir(parents=True)
    f = open(d / ".lock", "a+")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    HELD.append(f)


def regular_file(tmp: Path) -> None:
    (tmp / "afile").write_text("not a directory\n")


def garbled(name: str, data: bytes):
    """A storage file {tmp}/NAME holding `data` (not what Optuna wrote)."""
    return lambda tmp: (tmp / name).write_bytes(data)


def foreign_sqlite(tmp: Path) -> None:
    """{tmp}/o.db: another program's SQLite database (Optuna would add its tables to it)."""
    import sqlite3

    with sqlite3.connect(tmp / "o.db") as db:
        db.execute("create table users (id integer)")


def run_config_of_schema(schema: int):
    """{tmp}/c.json: a run's config.json, as a newer aiayn would write it."""

    def write(tmp: Path) -> None:
        config = RunConfig(
            resolve("base", "tiny"),
            DataIdentity(SYNTHETIC, None, 1000),
            TrainPlan(0, 2, 1, 1, 1024, "32-true"),
            options={"row": "base"},
        ).to_dict()
        (tmp / "c.json").write_text(json.dumps({**config, "schema": schema}))

    return write


TRAIN = ["train", "--out", "{tmp}/runs", "--max-steps", "2", "--no-progress", "--accelerator", "cpu"]
FILES = ["--data", "files", "--data-dir", "{tmp}/corpus", "--vocab-size", "60"]
T3 = ["table3", "--out", "{tmp}/runs", "--report", "{tmp}/reports"]


CASES = {
    # --- the command line
    "unknown row": (TRAIN + ["--row", "Z1"], None, f"unknown row 'Z1'; choose one of: {ROWS} (see `aiayn rows`)"),
    "unknown preset": (
        TRAIN + ["--preset", "huge"],
        None,
        f"unknown preset 'huge'; choose one of: {', '.join(PRESETS)}",
    ),
    "unknown corpus": (
        TRAIN + ["--data", "europarl"],
        None,
        f"unknown corpus 'europarl'; use --data with one of {', '.join(CORPORA)}, or hf:NAME[:CONFIG] "
        "(a Hugging Face dataset)",
    ),
    "hf: without a name": (
        TRAIN + ["--data", "hf:"],
        None,
        "--data hf: names no dataset; pass --data hf:NAME[:CONFIG] (e.g. hf:wmt/wmt14:de-en) or "
        "hf:/path/to/a/dataset saved with save_to_disk",
    ),
    "hf: of a missing local dataset": (
        TRAIN + ["--data", "hf:{tmp}/none"],
        None,
        "--data hf:{tmp}/none: no directory {tmp}/none; pass --data hf:PATH of a "
        "dataset saved with save_to_disk, or of a directory of parquet/json/csv files",
    ),
    "unknown logger": (
        TRAIN + ["--logger", "csv,tensorbord"],
        None,
        "--logger: unknown logger 'tensorbord'; pass a comma-separated subset of csv, tensorboard, mlflow, wandb",
    ),
    "no periodic checkpoints": (
        TRAIN + ["--keep-last", "0"],
        None,
        "argument --keep-last: expected a positive integer, got 0; see `aiayn train --help`",
    ),
    "zero steps": (
        TRAIN + ["--max-steps", "0"],
        None,
        "argument --max-steps: expected a positive integer, got 0; see `aiayn train --help`",
    ),
    "negative BLEU sentences": (
        TRAIN + ["--val-bleu-sentences", "-1"],
        None,
        "--val-bleu-sentences must be 0 or more, got -1; pass 0 for no BLEU during training",
    ),
    "max tokens below max len": (
        TRAIN + ["--max-tokens", "100"],
        None,
        "--max-tokens 100 must be larger than the preset's max_len 256 so that a sentence of "
        "max_len tokens plus bos/eos fits in a batch; raise --max-tokens",
    ),
    "unknown table3 row": (
        T3 + ["--rows", "base,Q"],
        None,
        f"unknown row or group 'Q' in --rows; rows are {ROWS}; groups are {GROUPS}",
    ),
    "zero seeds": (
        T3 + ["--seeds", "0"],
        None,
        "argument --seeds: expected a positive integer, got 0; see `aiayn table3 --help`",
    ),
    # --- configs (--set)
    "d_model not divisible by h": (
        TRAIN + ["--set", "d_model=100 h=8"],
        None,
        "invalid model config: d_k must be set explicitly: d_model=100 is not divisible "
        "by h=8 (--set d_model=100 h=8); change the --set value",
    ),
    "negative dropout": (
        TRAIN + ["--set", "P_drop=-0.1"],
        None,
        "invalid model config: P_drop must be in [0, 1), got -0.1 (--set P_drop=-0.1); change the --set value",
    ),
    "dropout over 1": (
        TRAIN + ["--set", "P_drop=1.5"],
        None,
        "invalid model config: P_drop must be in [0, 1), got 1.5 (--set P_drop=1.5); change the --set value",
    ),
    "unknown pe": (
        TRAIN + ["--set", "pe=fourier"],
        None,
        f"invalid model config: pe must be one of {', '.join(PE_KINDS)}, got 'fourier' "
        "(--set pe=fourier); change the --set value",
    ),
    # every number bounded by its kind where the option is declared (aiayn.common.options.LIMITS, INT_LIMIT):
    # 2^64 loader workers forked 1,345 processes; 2^64 steps overflowed range(); 2^64 tokens asked for one batch
    "num workers 2^64": (
        TRAIN + ["--num-workers", str(2**64)],
        None,
        f"argument --num-workers: expected an integer of at most 256, got {2**64}; see `aiayn train --help`",
    ),
    "max steps 2^64": (
        ["train", "--out", "{tmp}/runs", "--max-steps", str(2**64)],
        None,
        f"argument --max-steps: expected an integer of at most 1000000000, got {2**64}; see `aiayn train --help`",
    ),
    "max tokens 2^64": (
        TRAIN + ["--max-tokens", str(2**64)],
        None,
        f"argument --max-tokens: expected an integer of at most 10000000, got {2**64}; see `aiayn train --help`",
    ),
    "translate beam 2^64": (
        ["translate", "--run", "{tmp}/nothing", "--beam", str(2**64)],
        None,
        f"argument --beam: expected an integer of at most 256, got {2**64}; see `aiayn translate --help`",
    ),
    "first seed negative": (
        ["table3", "--out", "{tmp}/runs", "--first-seed", "-3", "--dry-run"],
        None,
        "argument --first-seed: expected an integer of at least 0, got -3; see `aiayn table3 --help`",
    ),
    "compile graphs, removed": (
        TRAIN + ["--compile", "graphs"],
        None,
        "argument --compile: invalid choice: 'graphs' (choose from 'auto', 'none', 'layers', 'model'); see "
        "`aiayn train --help`",
    ),
    "pack seeds, removed": (
        TRAIN + ["--pack-seeds", "0,1"],
        None,
        "--pack-seeds was removed: packs were removed; train each seed as its own run (`aiayn table3 --jobs K` "
        "runs K at once) (docs/changelog.md)",
    ),
    "unknown --set key": (
        TRAIN + ["--set", "dropout=0.1"],
        None,
        f"--set dropout: unknown key; use one of {', '.join((*MODEL_KEYS, *SCHEDULE_KEYS))}",
    ),
    "--set without =": (
        TRAIN + ["--set", "d_model"],
        None,
        "--set d_model: expected KEY=VALUE; e.g. --set d_model=256",
    ),
    "fp16 precision": (
        TRAIN + ["--precision", "16-mixed"],
        None,
        "--precision 16-mixed: the fused loss computes its gradients in the forward pass, where fp16's "
        "gradient scaler cannot scale them; use bf16-mixed or 32-true (or auto)",
    ),
    "--set not a number": (TRAIN + ["--set", "N=two"], None, "--set N=two: N must be an integer; e.g. --set N=1"),
    "--set zero lr factor": (
        TRAIN + ["--set", "lr_factor=0"],
        None,
        "--set lr_factor=0.0: lr_factor must be positive; change the --set value",
    ),
    "--set negative warmup": (
        TRAIN + ["--set", "warmup=-5"],
        None,
        "--set warmup=-5: warmup must be positive; change the --set value",
    ),
    # --- corpora
    "empty corpus file": (
        TRAIN + FILES,
        lambda t: corpus(t, "empty"),
        "{tmp}/corpus/test.en is empty; provide a non-empty file with one sentence per line",
    ),
    "mismatched line counts": (
        TRAIN + FILES,
        lambda t: corpus(t, "mismatch"),
        "{tmp}/corpus/train.en has 50 lines but {tmp}/corpus/train.de has 40; the files must "
        "be line-aligned translations (same number of lines)",
    ),
    "missing corpus file": (
        TRAIN + FILES,
        lambda t: corpus(t, "missing"),
        "corpus directory {tmp}/corpus has no file dev.de (expected dev.en/dev.de, plain or .gz); "
        "pass --data-dir pointing at a directory with train/dev/test files",
    ),
    "non-UTF-8 corpus": (
        TRAIN + FILES,
        lambda t: corpus(t, "utf8"),
        "{tmp}/corpus/train.en line 2 is not valid UTF-8 (invalid start byte); re-encode the file as "
        "UTF-8 (e.g. iconv -t utf-8)",
    ),
    # --- run directories and checkpoints
    "run directory of another config": (
        TRAIN + FILES,
        lambda t: (corpus(t), other_run(t)),
        "run directory {tmp}/runs/tiny/files/base/seed0 holds a run of another config "
        f"(model differs: {{'d_model': ({base_d_model() + 2}, {base_d_model()})}}); "
        "use another --out or delete that directory",
    ),
    "run directory in use": (
        TRAIN + FILES,
        busy_run,
        "run directory {tmp}/runs/tiny/files/base/seed0 is being trained by another process; "
        "wait for it to finish or stop it",
    ),
    "truncated checkpoint": (
        ["eval", "--ckpt", "{tmp}/model.ckpt"],
        lambda t: checkpoint(t, "truncated"),
        "checkpoint {tmp}/model.ckpt is unreadable (RuntimeError); it is truncated or not an aiayn checkpoint",
    ),
    "a checkpoint carrying a random tokenizer": (
        ["translate", "--ckpt", "{tmp}/model.ckpt", "--input", "{tmp}/in.txt"],
        lambda t: (checkpoint(t, "random tokenizer"), (t / "in.txt").write_text("a man\n")),
        "checkpoint {tmp}/model.ckpt: the tokenizer it carries is not a SentencePiece model (RuntimeError); the "
        "file is damaged, use another checkpoint of the run",
    ),
    "checkpoint smuggling a callable": (
        ["eval", "--ckpt", "{tmp}/model.ckpt"],
        lambda t: checkpoint(t, "smuggled"),
        "checkpoint {tmp}/model.ckpt holds a pickled Python object (posix.system), "
        "which could run code when loaded; aiayn loads tensors and plain data only: "
        "use a checkpoint that aiayn wrote",
    ),
    "translate into a directory": (
        ["translate", "--ckpt", "{tmp}/model.ckpt", "--output", "{tmp}"],
        None,
        "--output {tmp} is a directory; pass a file name (e.g. {tmp}/out.txt)",
    ),
    "average into a directory": (
        ["average", "--run", "{tmp}", "--out", "{tmp}"],
        None,
        "--out {tmp} is a directory; pass a file name (e.g. {tmp}/out.txt)",
    ),
    "checkpoint of another config": (
        ["eval", "--ckpt", "{tmp}/model.ckpt"],
        lambda t: checkpoint(t, "other-config"),
        "checkpoint {tmp}/model.ckpt does not match its own config (Error(s) in loading state_dict for Transformer:)",
    ),
    "checkpoint of a later format": (
        ["eval", "--ckpt", "{tmp}/model.ckpt"],
        lambda t: checkpoint(t, "format 99"),
        "checkpoint {tmp}/model.ckpt is of format 99, which this aiayn does not read (it "
        "reads 1); use the aiayn that wrote it",
    ),
    "checkpoint not by aiayn": (
        ["eval", "--ckpt", "{tmp}/model.ckpt"],
        lambda t: checkpoint(t, "foreign"),
        "checkpoint {tmp}/model.ckpt was not written by `aiayn train` (no run config "
        "under checkpoint['aiayn']); pass a checkpoint from a run directory's "
        "checkpoints/",
    ),
    "missing checkpoint": (
        ["eval", "--ckpt", "{tmp}/none.ckpt"],
        None,
        "checkpoint {tmp}/none.ckpt does not exist; pass the path of a .ckpt file (see RUN/checkpoints/)",
    ),
    "average without checkpoints": (
        ["average", "--run", "{tmp}", "--out", "{tmp}/avg.ckpt"],
        None,
        "no periodic checkpoints (stepNNNNNNN.ckpt) in {tmp}; pass a run directory that has trained",
    ),
    "missing tokenizer": (
        TRAIN + ["--tokenizer", "{tmp}/none.model"],
        None,
        "tokenizer {tmp}/none.model does not exist; pass --tokenizer with a SentencePiece .model file",
    ),
    "tokenizer that is not one": (
        TRAIN + ["--tokenizer", "{tmp}/afile"],
        regular_file,
        "tokenizer {tmp}/afile is not a SentencePiece model (RuntimeError); pass a .model file",
    ),
    # --- config files (train --config)
    "missing config": (
        TRAIN + ["--config", "{tmp}/none.json"],
        None,
        "config {tmp}/none.json does not exist; pass a run's config.json or a YAML file of `aiayn "
        "train` options (e.g. `row: C3`)",
    ),
    "config with an unknown option": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table("row: C1\nmax_step: 3\n"),
        "config {tmp}/t.csv: unknown option 'max_step' (did you mean 'max_steps'?); "
        "use the option names of `aiayn train --help` (e.g. max_steps, set)",
    ),
    "config option of the wrong type": (
        T3 + ["--config", "{tmp}/t.csv"],
        table("select:\n  seeds: [1, 2]\n"),
        "config {tmp}/t.csv: select.seeds must be an integer or null, not [1, 2]; fix the file",
    ),
    "config boolean that is not one": (
        T3 + ["--config", "{tmp}/t.csv"],
        table("fail_on_diverged: maybe\n"),
        "config {tmp}/t.csv: fail_on_diverged must be true or false, not 'maybe'; fix the file",
    ),
    "config option in another group": (
        T3 + ["--config", "{tmp}/t.csv"],
        table("train:\n  rows: A1\n"),
        "config {tmp}/t.csv: unknown option 'train.rows' (did you mean 'select.rows'?); "
        "use the option names of `aiayn table3 --help` (e.g. jobs, max_steps or "
        "train.max_steps)",
    ),
    "mistyped flag": (
        T3 + ["--max-step", "5"],
        None,
        "unrecognized arguments: --max-step 5 (did you mean --max-steps?); see `aiayn table3 --help`",
    ),
    "a run's own option on a sweep": (
        T3 + ["--no-progress"],
        None,
        "aiayn table3 sets --no-progress for each of its runs (its runs print one line "
        "each as they end, without progress bars); leave it out",
    ),
    "trainer value of the wrong type": (
        TRAIN + ["--trainer", "gradient_clip_val=abc"],
        None,
        "--trainer gradient_clip_val=abc: lightning.pytorch.Trainer's "
        "gradient_clip_val must be a number or null, not 'abc'; e.g. --trainer "
        "gradient_clip_val=1.0",
    ),
    "trainer value not finite": (
        TRAIN + ["--trainer", "gradient_clip_val=.nan"],
        None,
        "--trainer gradient_clip_val=.nan: not a finite number; e.g. --trainer gradient_clip_val=1.0",
    ),
    "trainer value of YAML aliases": (
        TRAIN + ["--trainer", "gradient_clip_val=[&a [1, 1, 1], [*a, *a, *a]]"],
        None,
        "--trainer gradient_clip_val: YAML anchors and aliases (&, *) are not read; write the value out",
    ),
    "trainer value of 300 characters": (
        TRAIN + ["--trainer", "limit_val_batches=" + "1" * 300],
        None,
        "--trainer limit_val_batches: a value of 300 characters; a Trainer argument "
        "takes at most 200, e.g. --trainer limit_val_batches=1.0",
    ),
    "trainer argument mistyped": (
        TRAIN + ["--trainer", "gradient_clip_vall=1"],
        None,
        "--trainer gradient_clip_vall: not an argument of lightning.pytorch.Trainer (did "
        "you mean 'gradient_clip_val'?); see its documentation (e.g. log_every_n_steps, "
        "gradient_clip_val, limit_val_batches)",
    ),
    "config that is not a mapping": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table("- C1\n"),
        "config {tmp}/t.csv is not a mapping of options; pass a run's config.json or a "
        "YAML file of `aiayn train` options (e.g. `row: C3`)",
    ),
    "config that is not JSON": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table('{"row": "C1",\n'),
        "config {tmp}/t.csv is neither JSON nor YAML (expected the node content, but found "
        "'<stream end>' at line 2); fix the file",
    ),
    "config with a bad value": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table("vocab_size: -5\n"),
        "argument --vocab-size: expected a positive integer, got -5; see `aiayn train --help`",
    ),
    # --- a user's table file (--table)
    # (each through a command that would train or sweep little if the check were missing)
    "table with an unknown column": (
        T3 + ["--table", "{tmp}/t.csv", "--rows", "x", "--max-steps", "1", "--eval-subset", "1"],
        table("row,group,dff\nx,mine,4096\n"),
        f"table {{tmp}}/t.csv line 1: unknown column 'dff'; the columns are {', '.join(COLUMNS)}",
    ),
    "table redefining a paper row": (
        ["rows", "--table", "{tmp}/t.csv"],
        table("row,group,N\nbase,mine,2\n"),
        f"table {{tmp}}/t.csv line 2: row 'base' is already defined ({TABLE_FILES[0]} "
        "line 2); give the row another name",
    ),
    "table with a duplicate row": (
        TRAIN + ["--table", "{tmp}/t.csv", "--row", "x"],
        table("row,group,N\nx,mine,2\nx,mine,3\n"),
        "table {tmp}/t.csv line 3: row 'x' is already defined ({tmp}/t.csv line 2); give the row another name",
    ),
    "table with a bad cell": (
        ["rows", "--table", "{tmp}/t.csv"],
        table("row,group,N\nx,mine,two\n"),
        "table {tmp}/t.csv line 2: N must be an integer, got 'two'; fix that cell",
    ),
    # names are data, never paths: a row or group name that would leave --out, on every command that
    # reads a table (each would train or write where it must not if the check were missing)
    **{
        f"{what} row name through {cmd[0]}{' --print-config' if '--print-config' in cmd else ''}": (
            [*cmd, "--table", "{tmp}/t.csv"],
            table(f"row,group,N\n{name},mine,2\n"),
            f"table {{tmp}}/t.csv line 2: row name {name!r} is not a name (letters, digits, '.', '_', '+' or '-', "
            "starting with a letter or digit, at most 64 characters); rename it",
        )
        for what, name in (("a traversal", "../../../../escape"), ("an absolute", "/abs/x"))
        for cmd in (
            TRAIN + ["--row", name],
            T3 + ["--rows", name, "--max-steps", "1"],
            ["train", "--row", name, "--print-config"],
            ["rows"],
        )
    },
    "a group name that is a path": (
        ["rows", "--table", "{tmp}/t.csv"],
        table("row,group,N\nx,../g,2\n"),
        "table {tmp}/t.csv line 2: group name '../g' is not a name (letters, digits, '.', "
        "'_', '+' or '-', starting with a letter or digit, at most 64 characters); "
        "rename it",
    ),
    "a negative seed": (
        TRAIN + ["--seed", "-1"],
        None,
        "argument --seed: expected an integer of at least 0, got -1; see `aiayn train --help`",
    ),
    "a negative seed in a config": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table("seed: -1\n"),
        "argument --seed: expected an integer of at least 0, got -1; see `aiayn train --help`",
    ),
    "missing table": (
        ["rows", "--table", "{tmp}/none.csv"],
        None,
        "table {tmp}/none.csv does not exist; pass --table with a UTF-8 CSV file in the layout of "
        "ablations/extended.csv",
    ),
    # --- round 6: files that never end, names that mean something else
    "a device as the config": (
        TRAIN + ["--config", "/dev/zero"],
        None,
        "config /dev/zero is a device, not a file; pass a run's config.json or a YAML file of "
        "`aiayn train` options (e.g. `row: C3`)",
    ),
    "a device as the table": (
        ["rows", "--table", "/dev/urandom"],
        None,
        "table /dev/urandom is a device, not a file; pass --table with a UTF-8 CSV file in the "
        "layout of ablations/extended.csv",
    ),
    "a FIFO as the table": (
        ["rows", "--table", "{tmp}/fifo"],
        lambda t: os.mkfifo(t / "fifo"),
        "table {tmp}/fifo is a FIFO, not a file; pass --table with a UTF-8 CSV file in the layout "
        "of ablations/extended.csv",
    ),
    "a directory as the search space": (
        ["hpo", "--out", "{tmp}/o", "--space", "{tmp}"],
        None,
        "config {tmp} is a directory, not a file; pass a YAML file like `P_drop: {low: "
        "0.0, high: 0.3}` (see `aiayn hpo --help`)",
    ),
    "a search space that reaches N = 0": (
        ["hpo", "--out", "{tmp}/o", "--space", "{tmp}/s.yaml"],
        garbled("s.yaml", b"N: {low: 0, high: 2}\n"),
        "--space {tmp}/s.yaml: N must be {low: L, high: H} (optionally log: true, "
        "step: S) or {choices: [...]} (N must be a positive integer)",
    ),
    "a numeric range for the positional encoding": (
        ["hpo", "--out", "{tmp}/o", "--space", "{tmp}/s.yaml"],
        garbled("s.yaml", b"pe: {low: 1, high: 2}\n"),
        "--space {tmp}/s.yaml: pe takes named values, not a range; give them as {choices: [...]} (see `aiayn hpo "
        "--help`)",
    ),
    "a table with a column twice": (
        TRAIN + ["--table", "{tmp}/t.csv", "--row", "mine"],
        table("row,d_model,d_model\nmine,64,128\n"),
        "table {tmp}/t.csv line 1: column 'd_model' appears twice; keep one",
    ),
    "an --out that is a link to nowhere": (
        TRAIN + ["--out", "{tmp}/dl"],
        lambda t: (t / "dl").symlink_to(t / "nowhere"),
        "--out {tmp}/dl: {tmp}/dl is a symbolic link to {tmp}/nowhere, which does not exist; create it or pass "
        "another --out",
    ),
    "a sweep's --out that is a link around a loop": (
        T3 + ["--out", "{tmp}/loop/runs", "--dry-run"],
        lambda t: (t / "loop").symlink_to(t / "loop"),
        "--out {tmp}/loop/runs: {tmp}/loop is a symbolic link that loops; remove it or pass another --out",
    ),
    "an export's --out that is a link to nowhere": (
        ["export", "--ckpt", "{tmp}/model.ckpt", "--format", "hf", "--out", "{tmp}/dl"],
        lambda t: (checkpoint(t, "good"), (t / "dl").symlink_to(t / "nowhere")),
        "--out {tmp}/dl: {tmp}/dl is a symbolic link to {tmp}/nowhere, which does not exist; create it or pass "
        "another --out",
    ),
    "an export's --out that is a link around a loop": (
        ["export", "--ckpt", "{tmp}/model.ckpt", "--format", "hf", "--out", "{tmp}/loop"],
        lambda t: (checkpoint(t, "good"), (t / "loop").symlink_to(t / "loop")),
        "--out {tmp}/loop: {tmp}/loop is a symbolic link that loops; remove it or pass another --out",
    ),
    "an export's --out that is a link to an empty folder": (
        ["export", "--ckpt", "{tmp}/model.ckpt", "--format", "hf", "--out", "{tmp}/ln"],
        lambda t: (checkpoint(t, "good"), (t / "empty").mkdir(), (t / "ln").symlink_to(t / "empty")),
        "--out {tmp}/ln is a symbolic link to {tmp}/empty; pass the directory it leads to, or a new one",
    ),
    "an hpo --out that is a file": (
        ["hpo", "--out", "{tmp}/f", "--trials", "1"],
        lambda t: (t / "f").write_text("x"),
        "output directory {tmp}/f cannot be created: {tmp}/f is not a directory; pass --out DIR",
    ),
    "a doctor --out that is a file": (
        ["doctor", "--out", "{tmp}/f", "--check", "sdpa"],
        lambda t: (t / "f").write_text("x"),
        "output directory {tmp}/f cannot be created: {tmp}/f is not a directory; pass --out DIR",
    ),
    "a SLURM sweep's --out that is a file": (
        ["slurm", "table3", "--out", "{tmp}/f", "--partition", "p", "--dry-run"],
        lambda t: (t / "f").write_text("x"),
        "output directory {tmp}/f cannot be created: {tmp}/f is not a directory; pass --out DIR",
    ),
    "a --cache-dir that is a link to nowhere": (
        TRAIN + ["--cache-dir", "{tmp}/dl"],
        lambda t: (t / "dl").symlink_to(t / "nowhere"),
        "--cache-dir {tmp}/dl: {tmp}/dl is a symbolic link to {tmp}/nowhere, which does not exist; create it or "
        "pass another --cache-dir",
    ),
    "a key the command does not take, in its config": (
        ["slurm", "table3", "--out", "{tmp}/runs", "--config", "{tmp}/t.csv"],
        table("jobs: 2\n"),
        "config {tmp}/t.csv: unknown option 'jobs'; use the option names of `aiayn slurm table3 --help` (e.g. "
        "max_steps, set or train.max_steps)",
    ),
    "a config key of control characters": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table('"a\\x1b[31mb\\0c\\nd": 1\n'),
        "config {tmp}/t.csv: unknown option 'a\\x1b[31mb\\x00c\\nd'; use the option names of `aiayn train --help` "
        "(e.g. max_steps, set)",
    ),
    "a config nested 100,000 deep": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table("[" * 100_000),
        "config {tmp}/t.csv is neither JSON nor YAML (nested more than 32 levels deep at line 1); fix the file",
    ),
    "a table3 config nested 100,000 deep": (
        T3 + ["--config", "{tmp}/t.csv"],
        table('{"a": ' * 100_000),
        "config {tmp}/t.csv is neither JSON nor YAML (nested more than 32 levels deep at line 1); fix the file",
    ),
    "a search space with a NaN end": (
        ["hpo", "--out", "{tmp}/o", "--space", "{tmp}/s.yaml"],
        garbled("s.yaml", b"P_drop: {low: .nan, high: 0.3}\n"),
        "--space {tmp}/s.yaml: P_drop must be {low: L, high: H} (optionally log: true, "
        "step: S) or {choices: [...]} (P_drop must be a finite number)",
    ),
    "an --out of a 300-byte name": (
        ["train", "--out", "/" + "x" * 300, "--max-steps", "2", "--no-progress"],
        None,
        "--out: a path of 301 bytes with a name of 300 (at most 4095 and 255); pass a shorter path",
    ),
    "a config's out: of 900 KB": (
        ["train", "--config", "{tmp}/t.csv", "--max-steps", "2"],
        table("out: " + "x/" * 450_000 + "\n"),
        "--out: a path of 900000 bytes with a name of 1 (at most 4095 and 255); pass a shorter path",
    ),
    "a cache directory under /proc": (
        TRAIN + ["--cache-dir", "/proc/aiayn-cache"],
        None,
        "cache directory /proc/aiayn-cache is not writable (nearest existing: /proc); "
        "point --cache-dir at a directory you can write",
    ),
    "an output directory under /proc": (
        ["table3", "--out", "/proc/aiayn-runs", "--max-steps", "2"],
        None,
        "output directory /proc/aiayn-runs is not writable (nearest existing: /proc); pass --out DIR",
    ),
    "bench --json under a file": (
        ["bench", "--json", "{tmp}/afile/b.json", "--steps", "1", "--trials", "1"],
        regular_file,
        "--json {tmp}/afile/b.json cannot be written: {tmp}/afile is not a "
        "directory you can write; pass --json a path you can write",
    ),
    "bench --trainer --json a directory": (
        ["bench", "--trainer", "--json", "{tmp}"],
        None,
        "--json {tmp} is a directory; pass a file name (e.g. {tmp}/out.txt)",
    ),
    "sweep export --out under /proc": (
        ["sweep", "export", "--wandb", "--out", "/proc/aiayn/s.yaml"],
        None,
        "--out /proc/aiayn/s.yaml cannot be written: /proc is not a directory you can "
        "write; pass --out a path you can write",
    ),
    "a device as a config's table": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table("table: [/dev/zero]\n"),
        "table /dev/zero is a device, not a file; pass --table with a UTF-8 CSV file in "
        "the layout of ablations/extended.csv",
    ),
    "a row named as a group": (
        ["rows", "--table", "{tmp}/t.csv"],
        table("row,group,N\nA,mine,2\n"),
        "table {tmp}/t.csv line 2: row 'A' has the name of group A (of row A1), which --rows A "
        "selects whole; give the row another name",
    ),
    "a row named all": (
        ["rows", "--table", "{tmp}/t.csv"],
        table("row,group,N\nall,mine,2\n"),
        "table {tmp}/t.csv line 2: a row cannot be named 'all', which --rows reads as every paper "
        "row; give the row another name",
    ),
    # --- storages
    "unknown storage scheme": (
        T3 + ["--storage", "redis://localhost/0"],
        None,
        "storage URL 'redis://localhost/0' has an unknown scheme; use sqlite:///PATH, "
        "journal:///PATH, postgresql://USER@HOST/DB or mysql://USER@HOST/DB",
    ),
    "unknown scheme with a password": (
        T3 + ["--storage", "mongodb://admin:s3cret@db/x"],
        None,
        "storage URL 'mongodb://admin:***@db/x' has an unknown scheme; use "
        "sqlite:///PATH, journal:///PATH, postgresql://USER@HOST/DB or "
        "mysql://USER@HOST/DB",
    ),
    "journal in a missing directory": (
        T3 + ["--storage", "journal://{tmp}/nowhere/j.log"],
        None,
        "journal storage journal://{tmp}/nowhere/j.log: directory {tmp}/nowhere does "
        "not exist; create it or pick another path",
    ),
    # --- output directories
    "unwritable run directory": (
        ["train", "--out", "{tmp}/afile/runs"],
        regular_file,
        "output directory {tmp}/afile/runs/tiny/synthetic/base/seed0 cannot be created: "
        "{tmp}/afile is not a directory; pass --out DIR",
    ),
    "unwritable sweep directory": (
        ["table3", "--out", "{tmp}/afile/runs"],
        regular_file,
        "output directory {tmp}/afile/runs cannot be created: {tmp}/afile is not a directory; pass --out DIR",
    ),
    "unwritable report directory": (
        ["report", "--runs", "{tmp}", "--out", "{tmp}/afile/rep"],
        regular_file,
        "output directory {tmp}/afile/rep cannot be created: {tmp}/afile is not a directory; pass --out DIR",
    ),
    "no runs to report": (
        ["report", "--runs", "{tmp}/runs", "--out", "{tmp}/rep"],
        None,
        "runs directory '{tmp}/runs' does not exist; train some rows first (`aiayn train`) or pass --runs DIR",
    ),
    # --- the last bad inputs of an earlier round, each a traceback or accepted though wrong before
    "a cache directory under a file": (
        TRAIN + ["--cache-dir", "{tmp}/afile/cache"],
        regular_file,
        "cache directory {tmp}/afile/cache cannot be used: {tmp}/afile is not a "
        "directory; point --cache-dir at a directory",
    ),
    "a GPU asked for where there is none": (
        TRAIN + ["--accelerator", "gpu"],
        None,
        "--accelerator gpu: no GPU is visible here (torch sees none); pass "
        "--accelerator cpu, or auto to use a GPU where there is one",
    ),
    # --- values that reach Lightning or the DataLoader (round 6): its ValueError came after the run dir
    "an unknown precision": (
        TRAIN + ["--precision", "bogus"],
        None,
        "--precision bogus: not a precision Lightning knows; use auto, 32-true, bf16-mixed, bf16-true or 64-true",
    ),
    "an unknown strategy": (
        TRAIN + ["--strategy", "bogus"],
        None,
        "--strategy bogus: not a strategy Lightning knows; use one of auto, ddp, ddp_spawn, "
        "deepspeed, fsdp, single_device (or another of Lightning's StrategyRegistry)",
    ),
    "a negative worker count": (
        TRAIN + ["--num-workers", "-1"],
        None,
        "--num-workers -1: a count of loader processes cannot be negative; pass 0 (load in the "
        "trainer's process) or more",
    ),
    "a language that is a path": (
        TRAIN + ["--tgt-lang", "d/../../../evil/t"],
        None,
        "--tgt-lang 'd/../../../evil/t' is not a language code (letters, digits, '.', '_', "
        "'+' or '-', starting with a letter or digit, at most 64 characters); pass the "
        "suffix of the corpus files, e.g. de",
    ),
    "checkpoints every nan minutes": (
        TRAIN + ["--ckpt-every-minutes", "nan"],
        None,
        "argument --ckpt-every-minutes: expected a finite number, got nan; see `aiayn train --help`",
    ),
    "checkpoints every -1 minutes": (
        TRAIN + ["--ckpt-every-minutes", "-1"],
        None,
        "--ckpt-every-minutes must be a positive number of minutes, got -1.0; pass e.g. --ckpt-every-minutes 10",
    ),
    "a table row of no layers": (
        ["rows", "--table", "{tmp}/t.csv"],
        table("row,group,N\nx,mine,0\n"),
        "table {tmp}/t.csv line 2: N must be a positive integer, got '0'; fix that cell",
    ),
    "a table row of no heads": (
        T3 + ["--table", "{tmp}/t.csv", "--rows", "x", "--max-steps", "1"],
        table("row,group,h\nx,mine,-2\n"),
        "table {tmp}/t.csv line 2: h must be a positive integer, got '-2'; fix that cell",
    ),
    "a run config.json of a newer schema": (
        TRAIN + ["--config", "{tmp}/c.json"],
        run_config_of_schema(99),
        "config {tmp}/c.json is a run config.json of schema 99, which this aiayn "
        "does not read (it reads schema 1); use the aiayn that wrote it, or pass "
        "a YAML file of `aiayn train` options",
    ),
    "a dev set of blank lines": (
        TRAIN + FILES,
        lambda t: corpus(t, "blank dev"),
        "{tmp}/corpus/dev.en holds 50 blank line(s) and no sentence; provide a file with one sentence per line",
    ),
    "a length penalty of nan": (
        ["translate", "--ckpt", "{tmp}/model.ckpt", "--alpha", "nan"],
        None,
        "argument --alpha: expected a finite number, got nan; see `aiayn translate --help`",
    ),
    "an infinite learning-rate factor": (
        TRAIN + ["--set", "lr_factor=inf"],
        None,
        "--set lr_factor=inf: lr_factor must be a finite number; e.g. --set lr_factor=1",
    ),
    "a config of YAML aliases": (
        TRAIN + ["--config", "{tmp}/t.csv"],
        table("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n"),
        "config {tmp}/t.csv is neither JSON nor YAML (an alias (*name): aliases are not read "
        "in a config file at line 2); fix the file",
    ),
    "a garbled journal storage": (
        T3 + ["--storage", "journal://{tmp}/j.log"],
        garbled("j.log", b"\xff\xfe\x00ok\n"),
        "journal storage {tmp}/j.log line 1 is not an Optuna journal entry "
        "(UnicodeDecodeError); delete {tmp}/j.log to start the sweep's books there again "
        "(its runs stay), or pass another --storage",
    ),
    "a journal of other JSON": (
        T3 + ["--storage", "journal://{tmp}/j.log"],
        garbled("j.log", b'{"a": 1}\n'),
        "journal storage {tmp}/j.log line 1 is not an Optuna journal entry (ValueError); "
        "delete {tmp}/j.log to start the sweep's books there again (its runs stay), or pass "
        "another --storage",
    ),
    "a journal that is a directory": (
        T3 + ["--storage", "journal://{tmp}/jdir"],
        lambda tmp: (tmp / "jdir").mkdir(),
        "storage {tmp}/jdir is a directory or a device, not a file; pass --storage a file's path",
    ),
    "a journal entry of no study": (
        T3 + ["--storage", "journal://{tmp}/j.log"],
        garbled("j.log", b'{"op_code": 0}\n'),
        "journal storage {tmp}/j.log does not replay as an Optuna journal (KeyError: "
        "'study_name'); delete {tmp}/j.log to start the sweep's books there again (its "
        "runs stay), or pass another --storage",
    ),
    "another program's SQLite database": (
        T3 + ["--storage", "sqlite:///{tmp}/o.db"],
        foreign_sqlite,
        "storage {tmp}/o.db is another program's SQLite database (tables: users); "
        "pass --storage a new file or an Optuna database",
    ),
    "a garbled SQLite storage": (
        T3 + ["--storage", "sqlite:///{tmp}/o.db"],
        garbled("o.db", b"garbage " * 200),
        "storage {tmp}/o.db is not a readable SQLite database (file is not a database); "
        "delete {tmp}/o.db to start the sweep's books there again (its runs stay), or pass "
        "another --storage",
    ),
}


def tree(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_exact_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
    argv, setup, message = CASES[case]
    if setup:
        setup(tmp_path)
    before = tree(tmp_path)
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines(keepends=True) if not line.startswith("INFO ")]
    assert (code, err) == (2, [f"aiayn: error: {message.replace('{tmp}', str(tmp_path))}\n"])
    assert tree(tmp_path) == before  # no run directory, report, database, lock or cache entry under it


@pytest.mark.parametrize(
    "record, metrics, expected",
    [
        (
            {"preset": "../../..", "corpus": "synthetic", "pairs": [["base", 0]]},
            None,
            "no sweep (its sweep record (x.json) cannot",
        ),
        ({"preset": "tiny", "corpus": "synthetic", "pairs": [["base"]]}, None, "holds no sweep"),
        ({"preset": "tiny", "corpus": "synthetic", "pairs": [[1, 2]]}, None, "holds no sweep"),
        ({"preset": "tiny", "corpus": "../x", "pairs": [["base", 0]]}, None, "holds no sweep"),
        (
            {"preset": "tiny", "corpus": "synthetic", "pairs": [["base", 0]]},
            {"dev_bleu": "high"},
            "failed     unreadable metrics.json (dev_bleu 'high' is not a number); delete it to run the pair again",
        ),
        (
            {"preset": "tiny", "corpus": "synthetic", "pairs": [["base", 0]]},
            {"status": "failed", "error": 5},
            "failed     unreadable metrics.json (error 5 is not text); delete it to run the pair again",
        ),
    ],
)
def test_status_on_odd_records_is_lines_never_a_traceback_and_writes_nothing(
    tmp_path, capsys, record, metrics, expected
):
    runs = tmp_path / "runs"
    (runs / "sweeps").mkdir(parents=True)
    (runs / "sweeps" / "x.json").write_text(json.dumps(record))
    if metrics is not None:
        run = runs / "tiny" / "synthetic" / "base" / "seed0"
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(
            json.dumps({"row": "base", "seed": 0, "preset": "tiny", "status": "completed", **metrics})
        )
    before = tree(tmp_path)
    code = main(["status", str(runs)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and expected in out + err
    assert code == (2 if "no sweep" in expected else 0)
    assert tree(tmp_path) == before and not (tmp_path.parent / ".locks").exists()


def test_a_report_skips_a_metrics_json_of_the_wrong_types_with_a_line(tmp_path, capsys):
    runs = tmp_path / "runs" / "tiny" / "synthetic"
    for row, ppl in (("base", 2.0), ("A1", "abc")):
        (runs / row / "seed0").mkdir(parents=True)
        (runs / row / "seed0" / "metrics.json").write_text(
            json.dumps(
                {"row": row, "seed": 0, "preset": "tiny", "status": "completed", "dev_ppl": ppl, "dev_bleu": 1.0}
            )
        )
    assert main(["report", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "table3-tiny.md").read_text(encoding="utf-8")
    assert "  - `tiny/synthetic/A1/seed0/metrics.json`: dev_ppl 'abc' is not a number" in md
    assert "Traceback" not in capsys.readouterr().err


def test_a_run_config_whose_row_is_a_path_is_refused_before_anything_is_written(tmp_path, capsys):
    spec = resolve("base", "tiny")
    config = RunConfig(
        spec,
        DataIdentity(SYNTHETIC, None, 1000),
        TrainPlan(0, 2, 1, 1, 1024, "32-true"),
        options={"row": "../../escape", "max_steps": 2, "accelerator": "cpu"},
    ).to_dict()
    config["spec"]["row"] = "../../escape"
    (tmp_path / "config.json").write_text(json.dumps(config))
    before = tree(tmp_path)
    code = main(["train", "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("aiayn: error: row name '../../escape' is not a name")
    assert tree(tmp_path) == before


def test_the_cache_named_by_aiayn_cache_is_checked_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """AIAYN_CACHE a regular file: NotADirectoryError from the corpus writer before; one line now."""
    (tmp_path / "afile").write_text("x\n")
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "afile"))
    before = tree(tmp_path)
    assert main(["train", "--out", str(tmp_path / "runs"), "--max-steps", "2", "--accelerator", "cpu"]) == 2
    afile = tmp_path / "afile"
    assert capsys.readouterr().err == (
        f"aiayn: error: cache directory {afile} cannot be used: {afile} is not a "
        "directory; point AIAYN_CACHE (or --cache-dir) at a directory\n"
    )
    assert tree(tmp_path) == before


def test_a_full_cache_disk_is_the_one_line_of_a_full_disk(tmp_path, capsys, monkeypatch):
    """The synthetic corpus written into a cache on a full disk: `OSError: No space left` before; now the line that
    names the cache and the fix."""
    import errno
    import pathlib

    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    assert main(["train", "--out", str(tmp_path / "runs"), "--max-steps", "2", "--accelerator", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"aiayn: error: no space left on the cache's disk ({tmp_path / 'cache'}")
    assert "point AIAYN_CACHE (or --cache-dir) at a disk with room" in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "runs").exists()


def test_a_row_too_big_for_this_machine_is_refused_before_it_is_built(tmp_path, capsys):
    """A table row whose weights, gradients and Adam state alone exceed the machine's memory: an allocation error
    (or the OOM killer) before; one line now, before anything is written."""
    (tmp_path / "t.csv").write_text("row,group,d_model,d_ff,h\nhuge,mine,262144,1048576,8\n")
    before = tree(tmp_path)
    assert (
        main(
            [
                "train",
                "--table",
                str(tmp_path / "t.csv"),
                *"--row huge --out".split(),
                str(tmp_path / "runs"),
                "--accelerator",
                "cpu",
            ]
        )
        == 2
    )
    *said, err = capsys.readouterr().err.splitlines()  # said: the log line of how the preset scaled the own row
    assert err.startswith("aiayn: error: row huge has ") and "more than this machine's" in err
    assert [line.split(":")[0] for line in said] == ["INFO aiayn.lightning_modules.run.spec"]
    assert tree(tmp_path) == before


def test_a_config_too_large_to_be_one_is_refused_at_once(tmp_path, capsys):
    """A 20 MB config took minutes and gigabytes before its error; a config file is at most 1 MB."""
    (tmp_path / "big.yaml").write_text("# " + "x" * (2 << 20) + "\nrow: C1\n")
    assert main(["train", "--config", str(tmp_path / "big.yaml"), "--print-config"]) == 2
    assert capsys.readouterr().err == (
        f"aiayn: error: config {tmp_path / 'big.yaml'} is 2.0 MB, more than such a "
        "file can be (at most 1 MB); pass a run's config.json or a YAML file "
        "of `aiayn train` options (e.g. `row: C3`)\n"
    )


def test_a_bogus_wandb_mode_is_refused_before_a_run_directory_exists(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "bogus")
    assert main(["train", "--out", str(tmp_path / "runs"), "--wandb", "--max-steps", "2", "--accelerator", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: WANDB_MODE=bogus is not a W&B mode; set it to online, offline or disabled, or unset it\n"
    )
    assert not (tmp_path / "runs").exists()


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly():
    """`aiayn rows ... | head -1`: a BrokenPipeError traceback before."""
    import subprocess
    import sys

    done = subprocess.run(
        f"{sys.executable} -m aiayn rows --preset tiny | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_runs_that_recorded_no_corpus_are_reported_beside_the_others_not_over_them(tmp_path):
    """A report over runs whose metrics.json lacks the corpus (an older aiayn) beside runs that have it wrote both
    groups to table3-tiny.*, the second over the first: a group of runs silently lost. They get their own name now."""
    from aiayn.reports.build import write_reports

    for row, data in (("base", "synthetic"), ("A1", None)):
        run = tmp_path / "runs" / "tiny" / "synthetic" / row / "seed0"
        run.mkdir(parents=True)
        metrics = {"row": row, "seed": 0, "preset": "tiny", "status": "completed", "dev_ppl": 2.0, "dev_bleu": 1.0}
        (run / "metrics.json").write_text(json.dumps({**metrics, **({"data": data} if data else {})}))
    written = {p.name for p in write_reports(tmp_path / "runs", tmp_path / "rep")}
    assert {"table3-tiny.csv", "table3-tiny-corpus-unrecorded.csv"} <= written
    assert "A1" in (tmp_path / "rep" / "table3-tiny-corpus-unrecorded.csv").read_text()
    assert "base" in (tmp_path / "rep" / "table3-tiny.csv").read_text()


def test_a_line_separator_inside_a_note_is_text_not_a_second_row(tmp_path, capsys):
    """A table was split with str.splitlines(), which also breaks at U+2028, so a note holding one made a
    phantom row of its second half."""
    header = (Path(__file__).resolve().parents[1] / "ablations" / "extended.csv").read_text().splitlines()[0]
    columns = header.split(",")
    cells = {"row": "mine", "group": "own", "N": "1", "note": '"first half\u2028second half"'}
    (tmp_path / "t.csv").write_text(
        header + "\n" + ",".join(cells.get(c, "") for c in columns) + "\n", encoding="utf-8"
    )
    assert main(["rows", "--table", str(tmp_path / "t.csv"), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    mine = [r for r in records if r["row"] == "mine"]
    assert len(mine) == 1 and mine[0]["note"] == "first half\u2028second half"
    assert not any(r["row"].startswith("second") for r in records)


@pytest.mark.parametrize("url", ["postgresql://aiayn@127.0.0.1:1/db", "mysql://aiayn@127.0.0.1:1/db"])
def test_a_storage_server_that_cannot_be_opened_leaves_no_setup_lock_behind(url, tmp_path, capsys):
    """The storage is opened under the sweep's setup lock, so its one-line error left `.locks/*setup.lock`
    (and the folders made for it) under --out. Whether the driver is missing or the server does not answer (port 1),
    the line names the storage and nothing is left."""
    before = tree(tmp_path)
    code = main(
        ["table3", "--out", f"{tmp_path}/runs", "--report", "", "--rows", "base", "--storage", url, "--max-steps", "2"]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("INFO ")]
    assert code == 2 and len(err) == 1, err
    extra = "postgres" if url.startswith("postgresql") else "mysql"
    try:
        __import__("psycopg2" if extra == "postgres" else "pymysql")
    except ImportError:  # the driver missing: its extra named
        assert (
            err[0] == f"aiayn: error: storage {url} needs its database driver, which is not installed; "
            f"pip install 'aiayn[{extra}]'"
        )
    else:  # the server does not answer
        assert err[0].startswith(f"aiayn: error: cannot open storage {url} (")
        assert err[0].endswith("); check the URL, the server and its driver")
    assert tree(tmp_path) == before


def test_a_sweeps_sqlite_books_with_a_hot_journal_are_read_not_refused(tmp_path):
    """A writer killed mid-transaction leaves a hot journal, which SQLite rolls back on a normal open; the
    read-only pre-check refused that healthy database and advised deleting it (a sweep's whole history)."""
    import subprocess
    import sys

    import optuna

    from aiayn.sweeps.storage import check_readable

    db = tmp_path / "o.db"
    optuna.create_study(storage=f"sqlite:///{db}", study_name="table3-tiny-synthetic")
    killed = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('begin immediate'); c.execute(\"update studies set study_name = 'half'\"); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", killed, str(db)], check=True)
    assert Path(f"{db}-journal").stat().st_size > 0  # the hot journal the killed writer left
    check_readable(f"sqlite:///{db}")  # no error
    names = [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{db}")]
    assert names == ["table3-tiny-synthetic"]  # rolled back: the books as they were before the killed write


def test_a_database_whose_optuna_schema_another_worker_is_still_creating_is_not_called_foreign(tmp_path):
    """CI at 9fb948a: two workers on one new SQLite file; Optuna creates its tables one at a time, so the second
    worker's check saw only `studies` and called the file another program's database."""
    import sqlite3

    from aiayn.sweeps.storage import check_readable

    db = tmp_path / "o.db"
    with sqlite3.connect(db) as c:
        c.execute("create table studies (study_id integer)")  # the first table Optuna makes, the rest still to come
    check_readable(f"sqlite:///{db}")  # no error
    with sqlite3.connect(db) as c:
        c.execute("create table users (id integer)")
    check_readable(f"sqlite:///{db}")  # a table of someone else's beside Optuna's is Optuna's to complain about


def test_the_storage_check_knows_every_table_optuna_makes():
    from optuna.storages._rdb import models

    from aiayn.sweeps.storage import OPTUNA_TABLES

    assert set(models.BaseModel.metadata.tables) <= OPTUNA_TABLES


def test_a_storage_on_a_read_only_mount_is_one_line_before_the_setup_lock(tmp_path, monkeypatch, capsys):
    """An existing study on a read-only mount went to Optuna's first write (a traceback under the setup
    lock). As root a read-only mount cannot be told by permission bits; the probe creates a file beside the storage,
    stood in here by a folder where nothing can be created."""
    import optuna

    from aiayn.sweeps import storage

    db = tmp_path / "ro" / "o.db"
    db.parent.mkdir()
    optuna.create_study(storage=f"sqlite:///{db}", study_name="table3-tiny-synthetic")
    monkeypatch.setattr(storage, "can_create_in", lambda folder: folder != db.parent)
    before = tree(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in T3] + ["--storage", f"sqlite:///{db}", "--rows", "base"]
    code = main(argv + ["--max-steps", "2"])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("INFO ")]
    assert (code, err) == (
        2,
        [
            f"aiayn: error: storage {db} cannot be written (a read-only file, folder or mount); "
            "copy it somewhere writable and pass --storage there"
        ],
    )
    assert tree(tmp_path) == before


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_output_to_a_full_disk_is_one_line_and_exit_2():
    """`aiayn completion bash > /dev/full` was a traceback."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "aiayn", "completion", "bash"], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "aiayn: error: cannot write the output: No space left on device; write it elsewhere"
    ]


def _numeric_flags(command: str) -> list[str]:
    """Every flag of `aiayn COMMAND` that takes a number (its argparse type an int or float parser)."""
    import argparse

    from aiayn.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    numeric = []
    for action in sub._actions:
        kind = getattr(action.type, "__name__", "") if action.type is not None else ""
        if action.option_strings and action.help != argparse.SUPPRESS and kind in NUMERIC_TYPES:
            numeric.append(action.option_strings[0])
    return numeric


NUMERIC_TYPES = ("int", "float", "positive_int", "finite_float", "parse")  # parse: int_at_least's
# what each command is asked to do with the number: resolve it and stop (nothing trained or written)
RESOLVE = {"train": ["--print-config"], "table3": ["--dry-run"]}


@pytest.mark.slow  # about 200 commands resolved (seconds in all): the slow tier
@pytest.mark.parametrize("command", list(RESOLVE))
def test_every_numeric_flag_takes_any_number_with_a_result_or_one_line(command, tmp_path, capsys):
    """The harness's sweep of every numeric flag with -1, 0, 10^30 and 2^64: each resolves (exit 0) or is refused
    in one line (exit 2), never a traceback, and nothing is written."""
    flags = _numeric_flags(command)
    assert "--max-steps" in flags and len(flags) > 8, flags
    out = tmp_path / "out"
    bad = []
    for flag in flags:
        for value in ("-1", "0", "1e30", str(2**64)):
            try:
                code = main([command, flag, value, "--out", str(out), *RESOLVE[command]])
            except SystemExit as e:  # argparse's own refusal goes through main as exit 2
                code = e.code
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if not line.startswith(("INFO ", "WARNING "))]
            one_line = code == 0 or (code == 2 and len(lines) == 1 and lines[0].startswith("aiayn: error: "))
            if not one_line or "Traceback" in err:
                bad.append(f"{flag} {value}: exit {code}: {err.strip()[-300:]}")
    assert not bad, "\n".join(bad)
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [(["train", "--row", "A7"], 2, "unknown row 'A7'"), (["table3", "--out", "look", "--dry-run"], 0, "4 pairs")],
    ids=["mistyped-row", "table3-dry-run"],
)
def test_answers_from_the_table_come_before_lightning_is_imported(tmp_path, argv, code, said):
    """`aiayn train --row A7` (a mistake) and `aiayn table3 --dry-run` (a plan) answer from the table, in a process
    that never imports lightning (its import was most of the 13 s and 9.5 s these took on a slow CPU)."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom aiayn.cli import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, 'lightning' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.split()[-2:] == [str(code), "False"], done.stdout + done.stderr[-2000:]
    assert said in done.stdout + done.stderr


NESTED = "[" * 5000  # json.loads raised RecursionError on it, which no reader caught


@pytest.mark.parametrize("where", ["metrics.json", "config.json"])
def test_a_record_nested_too_deep_is_read_as_unreadable_never_a_traceback(where, tmp_path, capsys):
    """Every JSON file aiayn reads goes through one reader with the config reader's guards: `aiayn status` and
    `aiayn report` name the record and go on; the run's own `aiayn train` is one line, exit 2, nothing written."""
    runs = tmp_path / "runs"
    run = runs / "tiny" / "synthetic" / "base" / "seed0"
    run.mkdir(parents=True)
    good = {"row": "base", "seed": 0, "preset": "tiny", "status": "completed", "dev_ppl": 2.0, "dev_bleu": 1.0}
    (run / "metrics.json").write_text(NESTED if where == "metrics.json" else json.dumps(good))
    (run / "config.json").write_text(NESTED if where == "config.json" else "{}")
    assert main(["status", str(runs)]) == 0
    if where == "metrics.json":
        assert main(["report", "--runs", str(runs), "--out", str(tmp_path / "rep")]) == 2  # nothing readable
        assert "1 file(s) skipped" in capsys.readouterr().err
    else:
        before = tree(tmp_path)
        assert main(["train", "--row", "base", "--preset", "tiny", "--out", str(runs), "--max-steps", "1"]) == 2
        err = capsys.readouterr().err
        assert f"cannot read {run / 'config.json'} (nested deeper than 32 levels" in err and tree(tmp_path) == before
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "beside, expected",
    [
        ("nested", "nested deeper than 32 levels"),
        ("fifo", "is a FIFO, not a file"),
        ("twice", "lists row(s) C1 twice"),
        ("newline", "has a row named"),
    ],
)
def test_a_reference_that_is_no_report_is_one_line_before_anything_is_written(beside, expected, tmp_path, capsys):
    """`aiayn report --against DIR`: the reference's table and the .json beside it are read, with the guards, before
    the report is written; a row listed twice (miscounted: "scored on one side only: C1, C4, C5, C1, ...") or named
    with a newline (a Markdown heading in -against.md) is refused."""
    ref = tmp_path / "ref"
    shutil.copytree(ROOT / "reports" / "reference", ref, ignore=shutil.ignore_patterns("*-plots", "real", "evidence"))
    csv = ref / "table3-quick.csv"
    if beside == "nested":
        (ref / "table3-quick.json").write_text(NESTED)
    elif beside == "fifo":
        (ref / "table3-quick.json").unlink()
        os.mkfifo(ref / "table3-quick.json")
    elif beside == "twice":
        lines = csv.read_text().splitlines()
        csv.write_text("\n".join([*lines, next(line for line in lines if ",C1," in line)]) + "\n")
    else:
        csv.write_text(csv.read_text().replace(",C1,", ',"C1\n## injected",', 1))
    runs = tmp_path / "runs" / "quick" / "synthetic-20" / "base" / "seed0"
    runs.mkdir(parents=True)
    (runs / "metrics.json").write_text(json.dumps({"row": "base", "seed": 0, "preset": "quick", "status": "completed"}))
    code = main(["report", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--against", str(ref)])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "rep").exists()
