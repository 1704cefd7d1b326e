"""The import layers (README, Architecture): each layer imports only the layers below it.

    aiayn.common  <  aiayn.ablations  <  aiayn.lightning_modules  <  aiayn.sweeps | aiayn.reports  <  aiayn.cli

sweeps and reports sit side by side and import neither each other nor the CLI. Every import counts,
also one inside a function (a lazy import is still a dependency), and there are no import cycles
between modules. Read from the source (ast), so nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
# bench (speed, over one run's pieces), completion (shell completion, from the registries) and doctor (which runs
# bench's steps) are ranked as their imports put them: above the one-run layer, below the command line
RANK = {
    "common": 0,
    "ablations": 1,
    "lightning_modules": 2,
    "sweeps": 3,
    "reports": 3,
    "bench": 3,
    "completion": 3,
    "doctor": 3.5,
    "cli": 4,
}


def package_dirs() -> dict[str, Path]:
    """Import name -> directory, from pyproject.toml's package-dir mapping (the one source of the layout)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / path for name, path in mapping.items()}


def modules() -> dict[str, Path]:
    """Every aiayn module: dotted name -> file."""
    out = {}
    dirs = package_dirs()
    for package, directory in dirs.items():
        for path in directory.rglob("*.py"):  # subpackages too (lightning_modules/run/, sweeps/backends/)
            parts = path.relative_to(directory).with_suffix("").parts
            out[".".join((package, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])))] = path
    for sub in (ROOT / "aiayn").iterdir():  # aiayn's own subpackages (aiayn.common)
        if sub.is_dir() and (sub / "__init__.py").exists() and f"aiayn.{sub.name}" not in dirs:
            for path in sub.glob("*.py"):
                out[f"aiayn.{sub.name}" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in RANK:
        return parts[1]
    return "cli"  # aiayn, aiayn.cli, aiayn.__main__


def imports(path: Path) -> set[str]:
    """The aiayn modules `path` imports (module level or inside functions), plus any top-level names
    it imports that shadow our directories (`import sweeps` would be W&B's package, not ours)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] == "aiayn" or n.split(".")[0] in RANK}
    return found


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module an imported name refers to (`aiayn.x.y.Thing` -> `aiayn.x.y`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def edges() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for module, path in known.items():
        targets = {resolve(n, known) or n for n in imports(path)}
        graph[module] = {t for t in targets if t != module}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target.split(".")[0] != "aiayn":
                bad.append(f"{module} imports {target}: not an aiayn module (install names are aiayn.*)")
                continue
            below = RANK[layer(target)] < RANK[layer(module)]
            if target == "aiayn" or layer(target) == layer(module) or below:  # the root only holds __version__
                continue
            bad.append(f"{module} ({layer(module)}) imports {target} ({layer(target)})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_module_is_found():
    found = modules()
    for name in (
        "aiayn.cli",
        "aiayn.common.files",
        "aiayn.ablations.table",
        "aiayn.lightning_modules.run.train",
        "aiayn.sweeps.table3",
        "aiayn.reports.build",
    ):
        assert name in found, name
    assert len(found) > 30


def test_each_layer_imports_only_the_layers_below():
    assert violations(edges()) == []


def test_no_import_cycles():
    assert cycles(edges()) == []


@pytest.mark.parametrize("layer_name", ["common", "ablations"])
def test_the_bottom_layers_import_no_torch_or_lightning_at_module_level(layer_name):
    """`aiayn rows`, the sweep driver and reports read tables and run directories without torch."""
    for module, path in modules().items():
        if layer(module) != layer_name:
            continue
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert not {n for n in names if n.split(".")[0] in ("torch", "lightning")}, module


def test_the_command_line_starts_without_torch_or_lightning():
    """`aiayn --help`, completion and every parser are built without importing torch or Lightning (seconds of a
    start): the modules above that import them only inside the command that needs them. Transitive imports count
    (SLURM's script module reached torch through run/devices.py's top-level import: `aiayn --help` took 3 s)."""
    import subprocess
    import sys

    probe = "import sys, aiayn.cli; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_command_line_is_a_table_of_commands_in_at_most_300_lines():
    """aiayn/cli.py is the commands as data and the functions that call the layers; what a command decides (a sweep's
    report writer, train's --print-config, the options a command skips) lives with its options. Counted as the
    formatter lays it out (the house style: 289 lines when its markers went)."""
    assert len((ROOT / "aiayn" / "cli.py").read_text().splitlines()) <= 300


def test_no_function_of_the_reports_is_longer_than_60_lines():
    """reports/ says one thing a function: its notes are typed notes from one writer each (reports/notes.py, NOTES),
    the table a line a row and a line a run. Counted as the formatter lays them out, decorators aside."""
    long = []
    for path in sorted((ROOT / "reports").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_the_one_run_layer_imports_no_optuna():
    """HPO is a caller's concern (sweeps/hpo.py hands train() its hooks): the one-run layer knows nothing of Optuna."""
    for module, path in modules().items():
        if layer(module) == "lightning_modules":
            assert not {n for n in imports_all(path) if n.split(".")[0] in ("optuna", "optuna_integration")}, module


@pytest.mark.parametrize(
    "name", ["transformer.config", "run.spec", "run.rundir", "run.options", "data.corpora", "run.disk", "run.loggers"]
)
def test_the_one_run_layers_descriptions_import_no_torch_at_module_level(name):
    """The command line builds its parsers, and sweeps resolve and order their runs, without importing torch."""
    tree = ast.parse(modules()[f"aiayn.lightning_modules.{name}"].read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
    assert not {n for n in names if n.split(".")[0] in ("torch", "lightning")}


def test_the_model_file_imports_no_lightning():
    names = {n for n in imports_all(modules()["aiayn.lightning_modules.transformer.model"])}
    assert not {n for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")}


def imports_all(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_checker_catches_an_upward_import_and_a_cycle():
    """The checks above can fail: a fake graph with a forbidden import and a cycle."""
    graph = {
        "aiayn.ablations.table": {"aiayn.lightning_modules.transformer.model"},  # up: forbidden
        "aiayn.sweeps.table3": {"aiayn.reports.build"},  # sideways between sweeps and reports: forbidden
        "aiayn.lightning_modules.a": {"aiayn.lightning_modules.b"},
        "aiayn.lightning_modules.b": {"aiayn.lightning_modules.a"},
        "aiayn.cli": {"aiayn.sweeps.table3", "aiayn.common.files"},  # down: allowed
    }
    assert violations(graph) == [
        "aiayn.ablations.table (ablations) imports aiayn.lightning_modules.transformer.model (lightning_modules)",
        "aiayn.sweeps.table3 (sweeps) imports aiayn.reports.build (reports)",
    ]
    assert cycles(graph) == [["aiayn.lightning_modules.a", "aiayn.lightning_modules.b", "aiayn.lightning_modules.a"]]


# The modules that make tensors on the device a run uses: each constructor says where (`device=`), so none lands on
# the CPU by default beside a model on a GPU (aiayn bench --device cuda once decoded CPU sources with CUDA models).
DEVICE_EXPLICIT = [
    "lightning_modules/transformer/model.py",
    "lightning_modules/transformer/decoding.py",
    "lightning_modules/run/evaluate.py",
    "lightning_modules/use/translate.py",
    "lightning_modules/run/module.py",
    "lightning_modules/use/ct2.py",
    "lightning_modules/use/export.py",
    "aiayn/bench/run.py",
    "aiayn/bench/trainer.py",
]
CONSTRUCTORS = {
    "tensor",
    "zeros",
    "ones",
    "full",
    "empty",
    "arange",
    "randint",
    "rand",
    "randn",
    "randperm",
    "eye",
    "linspace",
    "as_tensor",
}
ALLOWED: set = set()  # (file, constructor) pairs a reason would name; none today


@pytest.mark.parametrize("path", DEVICE_EXPLICIT)
def test_tensor_constructors_say_their_device(path):
    tree = ast.parse((ROOT / path).read_text())
    missing = [
        f"{path}:{node.lineno} torch.{node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CONSTRUCTORS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "torch"
        and not any(k.arg == "device" for k in node.keywords)
        and (path, node.func.attr) not in ALLOWED
    ]
    assert missing == []


def test_the_model_room_imports_no_other_room_and_no_lightning():
    """lightning_modules/transformer/ (the model, its config, loss and decoding) is the bottom room of the one-run
    layer: it imports nothing of data/, run/ or use/, and no Lightning, so the model can be read (and used) alone."""
    room = "aiayn.lightning_modules.transformer"
    for module, path in modules().items():
        if module.startswith(room):
            ours = {n for n in imports(path) if n.startswith("aiayn.lightning_modules.")}
            assert all(n.startswith(room) for n in ours), (module, ours)
            assert not {n for n in imports_all(path) if n.split(".")[0] in ("lightning", "pytorch_lightning")}, module


# The rooms of the one-run layer, bottom to top: each imports only the rooms below it (run/ imported
# use/evaluate.py while use/ imported run/ ten times: two rooms pointing both ways)
ROOMS = ("transformer", "data", "run", "use")


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "lightning_modules" and parts[2] in ROOMS else None


def two_way_rooms(graph: dict[str, set[str]]) -> list[str]:
    """'A imports B (room) and C imports D (room)' for every pair of rooms that import each other, and every import
    of a room above."""
    pointing = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = room_of(module), room_of(target)
            if a and b and a != b:
                pointing.setdefault((a, b), f"{module} imports {target}")
    bad = [f"{pointing[(a, b)]}; {pointing[(b, a)]}" for a, b in pointing if (b, a) in pointing and a < b]
    bad += [why for (a, b), why in pointing.items() if ROOMS.index(b) > ROOMS.index(a)]
    return sorted(set(bad))


def test_the_rooms_of_the_one_run_layer_point_one_way():
    assert two_way_rooms(edges()) == []


def test_the_room_checker_catches_two_rooms_that_point_both_ways():
    graph = {
        "aiayn.lightning_modules.run.module": {"aiayn.lightning_modules.use.evaluate"},
        "aiayn.lightning_modules.use.translate": {"aiayn.lightning_modules.run.rundir"},
    }
    found = two_way_rooms(graph)
    assert any("run.module imports aiayn.lightning_modules.use.evaluate" in line for line in found)
    assert any(";" in line for line in found)  # the pair named both ways


# what reads a corpus name's spelling: data/'s alone (the corpus is one typed value, CorpusRef, parsed once)
CORPUS_PARSERS = {"is_hf", "HFRef", "parse_splits", "hf_corpus"}


def corpus_parsing(path: Path) -> list[str]:
    """Where `path` reads a corpus name's spelling itself: hf_corpus's parsers by name, or the hf: prefix."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name | ast.Attribute | ast.alias):
            name = {ast.Name: "id", ast.Attribute: "attr", ast.alias: "name"}[type(node)]
            if getattr(node, name).split(".")[-1] in CORPUS_PARSERS:
                found.append(f"{path.name}:{getattr(node, 'lineno', '?')} {getattr(node, name)}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("hf_corpus"):
            found.append(f"{path.name}:{node.lineno} imports {node.module}")
        elif isinstance(node, ast.Constant) and node.value == "hf:":
            found.append(f"{path.name}:{node.lineno} spells 'hf:'")
    return found


def test_no_layer_but_the_data_room_parses_a_corpus_name():
    """A corpus crosses the layers as a CorpusRef (name, folder name, source, splits), parsed once in data/; no other
    module tests a name's hf: prefix or calls the parsers of hf_corpus."""
    data = ROOT / "lightning_modules" / "data"
    outside = [path for path in sorted(modules().values()) if not path.is_relative_to(data)]
    found = [hit for path in outside for hit in corpus_parsing(path)]
    assert not found, found


def test_the_corpus_parsing_checker_sees_a_prefix_test_and_a_parser(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from aiayn.lightning_modules.data.hf_corpus import is_hf\n"
        "def f(name):\n    return name.startswith('hf:') or is_hf(name)\n"
    )
    assert len(corpus_parsing(bad)) == 4  # the import (module, name), the prefix, the call


def test_the_one_run_layer_lays_out_run_directories_and_the_sweeps_their_own_folders():
    """OutDir (lightning_modules/run/rundir.py) knows OUT/PRESET/CORPUS/ROW/seedS; the sweeps' folders
    (locks, studies, HPO trials, a back end's folder, sweep records, reports) are sweeps/folders.py's SweepOut."""
    from aiayn.lightning_modules.run.rundir import OutDir
    from aiayn.sweeps.folders import SweepOut

    sweeps_own = ("lock", "study_url", "backend", "sweep_record", "sweep_records", "hpo_trial", "hpo_best", "reports")
    assert [name for name in sweeps_own if hasattr(OutDir, name)] == []
    assert all(hasattr(SweepOut, name) for name in sweeps_own) and issubclass(SweepOut, OutDir)
