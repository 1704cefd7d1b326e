"""ARCHITECTURE.md's "How to extend" recipes, tried: in a copy of the repository, a knob, a positional
encoding, a corpus, a report column and a sweep back end are each added by editing only the files its recipe
lists, and then used from the command line as a user would. A recipe that needs another file, or a registry that
does not reach a place that needs it (the deviations, the parameter count, export's refusals, `--data`'s
choices, the report's CSV, `--backend`), fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--max-steps", "2", "--val-bleu-sentences", "4", "--eval-subset", "4", "--no-progress", "--accelerator", "cpu"]


def recipe_files(title: str) -> set[str]:
    """The files a recipe of ARCHITECTURE.md names after "Files:" (tests aside)."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    body = text.split(f"**{title}", 1)[1].split("\n\n", 1)[0]
    files = re.findall(r"`([\w/<>.-]+\.py)`", body.split("Files:", 1)[1])
    return {f for f in files if not f.startswith("tests/")}


def edit(root: Path, path: str, old: str, new: str) -> None:
    p = root / path
    text = p.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path}: the recipe's anchor {old!r} is not there once"
    p.write_text(text.replace(old, new), encoding="utf-8")


def changed(root: Path) -> set[str]:
    """The files of the copy that differ from the repository's (or are new)."""
    out = set()
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if "__pycache__" in rel:
            continue
        mine = ROOT / rel
        if not mine.is_file() or mine.read_bytes() != p.read_bytes():
            out.add(rel)
    return out


def aiayn(root: Path, *argv: str, code: int = 0) -> subprocess.CompletedProcess:
    """`python -m aiayn ARGV` in the copy (its working directory comes first on sys.path, so the copy is imported)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", *argv], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == code, f"aiayn {' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture
def copy(tmp_path, cache):
    root = tmp_path / "aiayn"
    shutil.copytree(
        ROOT, root, ignore=shutil.ignore_patterns(".git", "runs", "*.egg-info", "__pycache__", "*_cache", "reference")
    )
    return root


def run_dir(out: Path, row: str = "base", corpus: str = "synthetic") -> Path:
    return out / "tiny" / corpus / row / "seed0"


@pytest.mark.slow
def test_a_knob_by_its_recipe(copy, tmp_path):
    edit(
        copy,
        "ablations/knobs.py",
        """        Knob("pe", str,""",
        """        Knob("act", str, "model", None, "s", "act", "the FFN's activation: relu or gelu", paper="relu"),
        Knob("pe", str,""",
    )
    edit(
        copy,
        "lightning_modules/transformer/config.py",
        "    vocab_size: int = 37000",
        """    act: str = "relu"
    vocab_size: int = 37000""",
    )
    edit(
        copy,
        "lightning_modules/transformer/config.py",
        "        _require(self.pe in PE_KINDS,",
        """        _require(self.act in ("relu", "gelu"), "act", f"relu or gelu, got {self.act!r}")
        _require(self.pe in PE_KINDS,""",
    )
    edit(
        copy,
        "lightning_modules/transformer/model.py",
        "    def __init__(self, d_model: int, d_ff: int):\n        super().__init__()",
        """    def __init__(self, d_model: int, d_ff: int, act: str = "relu"):
        super().__init__()
        self.act = {"relu": F.relu, "gelu": F.gelu}[act]""",
    )
    edit(
        copy,
        "lightning_modules/transformer/model.py",
        "self.w_2(F.relu(self.w_1(x)))",
        "self.w_2(self.act(self.w_1(x)))",
    )
    model = (copy / "lightning_modules/transformer/model.py").read_text()
    (copy / "lightning_modules/transformer/model.py").write_text(
        model.replace("FeedForward(cfg.d_model, cfg.d_ff)", "FeedForward(cfg.d_model, cfg.d_ff, cfg.act)")
    )
    assert changed(copy) <= recipe_files("A knob")

    rows = json.loads(aiayn(copy, "rows", "--preset", "tiny", "--rows", "base", "--format", "json").stdout)
    assert rows[0]["act"] == "relu"  # base's value: the paper's, from the knob
    out = tmp_path / "runs"
    aiayn(copy, "train", "--out", str(out), "--set", "act=gelu", *FAST)
    metrics = json.loads((run_dir(out) / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["config"]["act"] == "gelu"
    assert any("act=gelu (paper: relu)" in d for d in metrics["deviations"])
    refused = aiayn(copy, "export", "--run", str(run_dir(out)), "--format", "hf", "--out", str(tmp_path / "hf"), code=2)
    assert "act=gelu" in refused.stderr and "Marian has the paper's act=relu only" in refused.stderr
    bad = aiayn(copy, "train", "--out", str(out), "--set", "act=tanh", *FAST, code=2)
    assert "act must be relu or gelu" in bad.stderr


@pytest.mark.slow
def test_a_positional_encoding_by_its_recipe(copy, tmp_path):
    edit(
        copy,
        "lightning_modules/transformer/config.py",
        """        PositionalEncoding("none", False,""",
        """        PositionalEncoding("constant", False, "one learned vector added at every position",
                           params=lambda c: c.d_model),
        PositionalEncoding("none", False,""",
    )
    edit(
        copy,
        "lightning_modules/transformer/model.py",
        "POSITIONAL_ENCODINGS = {",
        '''class ConstantPositions(Positions):
    """One learned vector, the same at every position (it carries no order: a test of the recipe)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.vector = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.vector


POSITIONAL_ENCODINGS = {"constant": ConstantPositions, ''',
    )
    assert changed(copy) <= recipe_files("A positional encoding")

    check = (
        "from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig; "
        "c = TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=50, max_len=64, pe='constant'); "
        "print(c.params(), sum(p.numel() for p in Transformer(c).parameters()))"
    )
    env = {**os.environ, "PYTHONPATH": str(copy)}
    counted = subprocess.run([sys.executable, "-c", check], cwd=copy, env=env, capture_output=True, text=True)
    ours, model = counted.stdout.split()
    assert ours == model, counted.stderr  # the parameter count knows the new encoding's vector
    out = tmp_path / "runs"
    aiayn(copy, "train", "--out", str(out), "--set", "pe=constant", *FAST)
    metrics = json.loads((run_dir(out) / "metrics.json").read_text())
    assert metrics["status"] == "completed" and any("positional encoding constant" in d for d in metrics["deviations"])
    refused = aiayn(copy, "export", "--run", str(run_dir(out)), "--format", "hf", "--out", str(tmp_path / "hf"), code=2)
    assert "pe=constant" in refused.stderr


@pytest.mark.slow
def test_a_corpus_by_its_recipe(copy, tmp_path):
    edit(
        copy,
        "lightning_modules/data/corpora.py",
        "CORPORA: dict[str, Corpus] = {",
        '''class Counting(Corpus):
    """Fifty numbered sentences, written into the cache (a test of the recipe)."""

    name = "counting"

    def find(self, data_dir, cache_dir, src_lang, tgt_lang) -> Path:
        d = cache_dir / "corpora" / "counting"
        d.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            (d / f"{split}.{src_lang}").write_text("".join(f"sentence number {i} .\\n" for i in range(50)))
            (d / f"{split}.{tgt_lang}").write_text("".join(f"satz nummer {i} .\\n" for i in range(50)))
        return d


CORPORA: dict[str, Corpus] = {''',
    )
    edit(
        copy,
        "lightning_modules/data/corpora.py",
        "Multi30k(), WMT14(), Files())",
        "Multi30k(), WMT14(), Files(), Counting())",
    )
    assert changed(copy) <= recipe_files("A corpus")

    assert "counting" in aiayn(copy, "train", "--help").stdout  # --data's help lists it
    out = tmp_path / "runs"
    aiayn(copy, "train", "--out", str(out), "--data", "counting", "--vocab-size", "60", *FAST)
    metrics = json.loads((run_dir(out, corpus="counting") / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["data"] == "counting"


@pytest.mark.slow
def test_a_report_column_by_its_recipe(copy, tmp_path):
    edit(
        copy,
        "reports/table.py",
        '    "params_m",\n    "paper_ppl",\n',
        '    "params_m",\n    "tokens_per_s",\n    "paper_ppl",\n',
    )
    edit(
        copy,
        "reports/table.py",
        '"params_m": params / 1e6,',
        '"params_m": params / 1e6, "tokens_per_s": _mean_std([r.metrics.tokens_per_s for r in done])[0],',
    )
    edit(
        copy,
        "reports/render.py",
        '''            "params ×10⁶": table["params_m"].map(lambda x: fmt_number(x, ".2f")),
            "paper PPL"''',
        '''            "params ×10⁶": table["params_m"].map(lambda x: fmt_number(x, ".2f")),
            "tokens/s": table["tokens_per_s"].map(lambda x: fmt_number(x, ".0f")),
            "paper PPL"''',
    )
    assert changed(copy) <= recipe_files("A report column")

    out = tmp_path / "runs"
    aiayn(copy, "train", "--out", str(out), *FAST)
    aiayn(copy, "report", "--runs", str(out), "--out", str(tmp_path / "rep"))
    csv = (tmp_path / "rep" / "table3-tiny.csv").read_text().splitlines()
    header, base = csv[0].split(","), next(line for line in csv if ",base," in line).split(",")
    assert "tokens_per_s" in header and float(base[header.index("tokens_per_s")]) > 0
    assert "tokens/s" in (tmp_path / "rep" / "table3-tiny.html").read_text()


@pytest.mark.slow
def test_a_sweep_back_end_by_its_recipe(copy, tmp_path):
    (
        copy / "sweeps/backends/inline.py"
    ).write_text('''"""A back end of one fresh `aiayn train` per pair, in the foreground (a test of the recipe)."""

import subprocess

from aiayn.sweeps.backends import register, write_resolved
from aiayn.sweeps.backends.processes import train_process_command
from aiayn.sweeps.backends.queue import QueueBackend
from aiayn.sweeps.folders import resolved_file


@register
class InlineBackend(QueueBackend):
    name = "inline"

    def run_one(self, sweep, row, seed, slot):
        run = sweep.run(row, seed)
        resolved = write_resolved(resolved_file(run), sweep.specs[row], "inline")
        code = subprocess.run(train_process_command(sweep.run_options(row, seed), resolved)).returncode
        return run.read_metrics() or sweep.failed(row, seed, f"exit {code}")
''')
    assert (
        changed(copy) <= {"sweeps/backends/inline.py"}
        and "sweeps/backends/<name>.py" in (ROOT / "ARCHITECTURE.md").read_text()
    )

    out = tmp_path / "runs"
    done = aiayn(
        copy,
        "table3",
        "--backend",
        "inline",
        "--rows",
        "base,C1",
        "--out",
        str(out),
        "--report",
        "",
        *FAST[:6],
        "--accelerator",
        "cpu",
        "--jobs",
        "1",
    )
    assert "2 completed, 0 failed" in done.stdout
    status = aiayn(copy, "status", str(out)).stdout
    assert "2 pairs (2 completed)" in status
    unknown = aiayn(copy, "table3", "--backend", "inlin", "--out", str(out), code=2)
    assert "invalid choice: 'inlin'" in unknown.stderr and "inline" in unknown.stderr  # the choices: the registry's


GREETING = '''"""The local back end with an option of its own (a test of the recipe: a back end with options)."""

from dataclasses import dataclass

from aiayn.common.options import option
from aiayn.sweeps.backends import register
from aiayn.sweeps.backends.local import LocalBackend


@dataclass
class GreetingOptions:
    greeting: str = option("hello")
    """the first word of the sweep's summary"""


@register
class GreetingBackend(LocalBackend):
    """the local back end, greeting"""

    name = "greeting"
    options = GreetingOptions
    refuses = (("storage", "--storage", "its books are this machine's SQLite under --out"),)

    def __init__(self, opts):
        self.greeting = opts.greeting

    def summary_lines(self, summary, sweep):
        return [f"{self.greeting}: {summary.completed} completed"]
'''


@pytest.mark.slow
def test_a_back_end_with_an_option_by_its_recipe(copy, tmp_path):
    """A back end with options of its own is one file; `aiayn table3 --backend NAME` takes the sweep's
    options and its own (--help, --config, --print-config and its refusals), with no edit to aiayn/cli.py."""
    (copy / "sweeps/backends/greeting.py").write_text(GREETING)
    assert changed(copy) <= {"sweeps/backends/greeting.py"}
    out = tmp_path / "runs"
    sweep = [
        *"table3 --preset tiny --backend greeting --rows base --out".split(),
        str(out),
        "--report",
        "",
        *FAST[:6],
        "--jobs",
        "1",
    ]
    assert "--greeting GREETING" in aiayn(copy, "table3", "--backend", "greeting", "--help").stdout
    assert "hi: 1 completed" in aiayn(copy, *sweep, "--greeting", "hi").stdout
    printed = aiayn(copy, *sweep, "--greeting", "hey", "--print-config").stdout
    assert "backend: greeting" in printed and "greeting: hey" in printed
    (tmp_path / "sweep.yaml").write_text(printed)
    again = aiayn(copy, "table3", "--config", str(tmp_path / "sweep.yaml")).stdout
    assert "hey: 0 completed" in again  # the file's back end and option; the books: the pair is not run twice
    refused = aiayn(copy, *sweep, "--storage", "sqlite:///x.db", code=2).stderr
    assert "does not take --storage: its books are this machine's SQLite" in refused


DETACHED = '''"""Each pending pair as an `aiayn train` process of its own that outlives the command, holding its pair
while it lives (a test of the recipe: a back end that keeps its own books, as SLURM's does)."""

import json
import os
import subprocess
import time

from aiayn.common.files import atomic_write_json
from aiayn.sweeps import books
from aiayn.sweeps.backends import Backend, SweepSummary, register, write_resolved
from aiayn.sweeps.backends.processes import train_process_command
from aiayn.sweeps.folders import resolved_file


class PidClaims(books.Claims):
    """OUT/detached/KEY.json names the process that holds the pair, alive while the process is."""

    def __init__(self, out):
        self.folder = out.backend("detached")

    def holder(self, key):
        try:
            held = json.loads((self.folder / f"{key}.json").read_text())
            os.kill(held["pid"], 0)
        except (OSError, ValueError, KeyError):
            return None
        return {"holder": f"pid {held['pid']}", "since": held["since"]}


@register
class DetachedBackend(Backend):
    """each pair a detached process of its own; the report: `aiayn report` once they have ended"""

    name = "detached"

    def claims(self, sweep):
        return PidClaims(sweep.out)

    @classmethod
    def status_claims(cls, out):
        return PidClaims(out)

    def launch(self, sweep, pairs):
        sweep.record(self.name)  # the books: `aiayn status` finds the sweep before its processes have run directories
        started = 0
        for state in self.status(sweep):
            if state.state in ("completed", "running"):
                continue
            run = sweep.run(state.row, state.seed)
            resolved = write_resolved(resolved_file(run), sweep.specs[state.row], "detached")
            command = train_process_command(sweep.run_options(state.row, state.seed), resolved)
            proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            key = sweep.pair_key(state.row, state.seed)
            atomic_write_json(self.claims(sweep).folder / f"{key}.json", {"pid": proc.pid, "since": time.time()})
            started += 1
        completed = sum(s.state == "completed" for s in self.status(sweep))
        return SweepSummary(pairs=len(pairs), completed=completed, details={"started": started})

    def summary_lines(self, summary, sweep):
        return [f"detached {sweep.preset.name}: {summary.details['started']} started, {summary.completed} "
                f"completed of {summary.pairs}; `aiayn status {sweep.out.root}` follows them"]

    def report_now(self, summary):
        return False
'''


@pytest.mark.slow
def test_a_back_end_that_keeps_its_own_books_by_its_recipe(copy, tmp_path):
    """The recipe's second kind: a Backend with `launch`, `claims` and `status_claims`, in one file. What a user
    gets without another line: `--backend detached` in the choices, its pairs shown as held by their process in
    `aiayn status`, the books skipping what completed on a rerun, and the report of the runs."""
    (copy / "sweeps/backends/detached.py").write_text(DETACHED)
    assert changed(copy) <= {"sweeps/backends/detached.py"}
    out = tmp_path / "runs"
    sweep = [
        *"table3 --preset tiny --backend detached --rows base,C1 --out".split(),
        str(out),
        *FAST[:6],
        "--jobs",
        "1",
    ]
    assert "detached tiny: 2 started, 0 completed of 2" in aiayn(copy, *sweep).stdout
    assert not (out / "reports").exists()  # report_now: its runs have not ended when the command does
    first = aiayn(copy, "status", str(out)).stdout
    assert re.search(r"running.*pid \d+", first), first  # held by the processes it started (two Lightning imports)
    for _ in range(300):
        status = aiayn(copy, "status", str(out)).stdout
        if "2 pairs (2 completed)" in status:
            break
        assert "failed" not in status, status
        time.sleep(1)
    assert "2 pairs (2 completed)" in status, status
    again = aiayn(copy, *sweep).stdout
    assert "detached tiny: 0 started, 2 completed of 2" in again  # the books: nothing run twice
    aiayn(copy, "report", "--runs", str(out), "--out", str(tmp_path / "rep"))
    assert (tmp_path / "rep" / "table3-tiny.csv").is_file()


PARAMS = '''"""`aiayn params`: each row's parameter count at a preset (a test of the recipe for a command)."""

from dataclasses import dataclass

from aiayn.common.options import option


@dataclass
class ParamsOptions:
    """What `aiayn params` counts."""

    preset: str = option("tiny")
    """the preset whose widths count"""
    rows: str = option("base,big")
    """comma-separated rows"""


def params_lines(opts: ParamsOptions) -> list[str]:
    from aiayn.lightning_modules.run.spec import resolve

    return [f"{row} {resolve(row, opts.preset).model.params()}" for row in opts.rows.split(",")]
'''


@pytest.mark.slow
def test_a_command_by_its_recipe(copy, tmp_path):
    """A command: its options and function in its layer, one Command in COMMANDS; --help, --config, --print-config,
    completion and the one-line errors come with it."""
    (copy / "reports/params.py").write_text(PARAMS)
    edit(
        copy,
        "aiayn/cli.py",
        "from aiayn.reports.rows import RowsOptions\n",
        "from aiayn.reports.params import ParamsOptions\nfrom aiayn.reports.rows import RowsOptions\n",
    )
    edit(
        copy,
        "aiayn/cli.py",
        "def cmd_rows(opts, args) -> None:",
        """def cmd_params(opts, args) -> None:
    from aiayn.reports.params import params_lines

    print("\\n".join(params_lines(opts)))


def cmd_rows(opts, args) -> None:""",
    )
    edit(
        copy,
        "aiayn/cli.py",
        "COMMANDS = (\n",
        """COMMANDS = (
    Command("params", "each row's parameter count at a preset", ParamsOptions, cmd_params),
""",
    )
    assert changed(copy) <= {"reports/params.py"} | recipe_files("A command")

    from aiayn.lightning_modules.run.spec import resolve

    lines = aiayn(copy, "params", "--preset", "small", "--rows", "base,big").stdout.splitlines()
    assert lines == [f"base {resolve('base', 'small').model.params()}", f"big {resolve('big', 'small').model.params()}"]
    assert "--rows" in aiayn(copy, "params", "--help").stdout
    config = tmp_path / "params.yaml"
    config.write_text(aiayn(copy, "params", "--preset", "small", "--rows", "C1", "--print-config").stdout)
    assert aiayn(copy, "params", "--config", str(config)).stdout.split() == [
        "C1",
        str(resolve("C1", "small").model.params()),
    ]
    assert "params" in aiayn(copy, "completion", "bash").stdout
    bad = aiayn(copy, "params", "--rowz", "base", code=2)
    assert bad.stderr.count("\n") == 1 and "did you mean --rows" in bad.stderr
