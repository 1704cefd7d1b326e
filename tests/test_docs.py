"""The README and docs/ say what the code does: every `aiayn` command line they show parses with the flags it
uses, and the README's presets table is the presets' own numbers."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from aiayn.ablations.presets import PRESETS
from aiayn.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "ARCHITECTURE.md"]
# BENCHMARKS.md's commands too (its prose also names scripts' flags): each current result's command runs today
COMMAND_PAGES = [*PAGES, ROOT / "BENCHMARKS.md"]


def _subparsers(parser, prefix=()):
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[(*prefix, name)] = sub
                out.update(_subparsers(sub, (*prefix, name)))
    return out


COMMANDS = _subparsers(build_parser())


def command_lines(text: str):
    """Each `aiayn ...` command of the page's code blocks (indented lines; continuation lines joined), as words."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        if not line.startswith("    "):
            continue
        for part in re.split(r"&&|\||;|\$\(", line.split(" # ")[0]):
            words = part.replace(")", " ").split()
            if words[:1] in (["from"], ["import"]):  # Python, not a command line
                continue
            if "aiayn" in words and words.index("aiayn") + 1 < len(words):
                yield words[words.index("aiayn") + 1 :]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=[p.name for p in COMMAND_PAGES])
def test_every_aiayn_command_shown_uses_flags_that_exist(page):
    seen = 0
    for words in command_lines(page.read_text(encoding="utf-8")):
        key = tuple(words[:2]) if tuple(words[:2]) in COMMANDS else (words[0],)
        assert key in COMMANDS, f"{page.name}: `aiayn {' '.join(words)}`: no command {words[0]!r}"
        flags = {s for a in COMMANDS[key]._actions for s in a.option_strings}
        for word in words[len(key) :]:
            flag = word.split("=")[0]
            if flag.startswith("--") and flag != "--" and not flag.startswith("---"):
                assert flag in flags, f"{page.name}: `aiayn {' '.join(words)}`: {flag} is not an option of {key}"
        seen += 1
    if page.name in ("README.md", "sweeps.md", "models.md", "training.md"):
        assert seen >= 5, f"{page.name}: found only {seen} aiayn command lines; the parser of this test is wrong"


def test_the_readmes_excerpt_of_the_main_jobs_report_is_in_the_committed_report():
    """The README shows what the main job writes by quoting the committed report; a regenerated report that changes
    those lines makes the quote stale, and this fails."""
    readme = (ROOT / "README.md").read_text()
    source, excerpt = re.search(r"<!-- excerpt: (\S+) -->\n(.*?)<!-- end excerpt -->", readme, re.S).groups()
    report = (ROOT / source).read_text().splitlines()
    lines = [line for line in excerpt.splitlines() if line]
    assert len(lines) >= 5 and all(line in report for line in lines)


def test_the_readmes_results_are_the_committed_reports_scores():
    """Each table the README sums up ("the paper passes 9 of 10", "'more parameters help, ...' passes 10", "43 runs",
    "stage 1 (42 runs") says what its committed report says: a regenerated report that moves a count makes the summary
    stale, and this fails."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## What the tables show") :].split("\n## ", 1)[0]
    checked = 0
    for preset, text in re.findall(r"^- \*\*[^*]+\*\* \(`([\w-]+)`(.*?)(?=^- |\Z)", section, re.M | re.S):
        text = " ".join(text.split())
        claims = re.findall(r"the paper passes (\d+) of (\d+)", text)
        baselines = re.findall(r'"([^"]+)" passes (\d+)', text)
        if not claims and not baselines:
            continue
        (found,) = [
            p for p in (ROOT / "reports" / "reference").rglob(f"table3-{preset}.json") if "history" not in p.parts
        ]
        score = json.loads(found.read_text(encoding="utf-8"))["score"]
        runs = pd.read_csv(found.with_name(f"table3-{preset}-runs.csv"))
        for stage, n in re.findall(r"(?:stage (\d) \(|, )(\d+) runs[,)]", text):  # ", 43 runs)", "stage 1 (42 runs,"
            assert int(n) == len(runs[runs["stage"] == int(stage)] if stage else runs), f"{preset}: {n} runs"
            checked += 1
        for passed, scored in claims:
            assert (int(passed), int(scored)) == (score["passed"], score["scored"]), f"{preset}: {text}"
        labels = {b["label"]: b["passed"] for b in score["baselines"].values()}
        for label, passed in baselines:
            assert int(passed) == labels[label], f"{preset}: {label}"
        checked += len(claims) + len(baselines)
    assert checked >= 3, f"found only {checked} counts in the README's results; the parser of this test is wrong"


def test_the_docs_name_the_wb_project_as_runs_are_logged():
    """docs/sweeps.md named the W&B project `aiayn-<preset>`, without the corpus the runs' project has."""
    from aiayn.lightning_modules.data.corpora import CorpusRef
    from aiayn.lightning_modules.run.spec import experiment_name

    text = (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    pattern, example = re.search(r"project `(aiayn-[^`]+)`, e\.g\. `([^`]+)`", text).groups()
    assert example == experiment_name("tiny", CorpusRef.parse("synthetic"))
    assert pattern.replace("<preset>", "tiny").replace("<corpus>", "synthetic") == example


def test_the_presets_table_is_the_presets_numbers():
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    text = text[text.index("## Presets") :].split("\n## ", 1)[0]
    rows = {
        m.group(1): [c.strip() for c in m.group(2).split("|")]
        for m in re.finditer(r"^\| `([\w-]+)` \|(.*)\|$", text, re.M)
    }
    assert set(rows) == set(PRESETS), "every preset has a row in docs/training.md's table, and only they"
    for name, (corpus, width, heads, depth, steps, tokens, vocab, seeds) in rows.items():
        p = PRESETS[name]
        assert (float(width), float(heads), int(steps), int(tokens), int(vocab)) == (
            p.width,
            p.heads,
            p.train_steps,
            p.tokens_per_step,
            p.vocab_size,
        ), name
        assert eval(depth) == pytest.approx(p.depth), name
        assert seeds == (f"{p.seeds} ({p.base_seeds})" if p.base_seeds else str(p.seeds)), name
        assert {
            "synthetic": "synthetic",
            "synthetic-20": "synthetic, sentences of 5-20",
            "multi30k": "Multi30k",
            "wmt14": "WMT14",
        }[p.corpus] in corpus, name


def _registries() -> dict[str, set[str]]:
    """What each name-taking flag accepts, read from the registries the code reads (a placeholder in capitals, a
    shell variable or a path is not a name)."""
    from aiayn.ablations.table import SELECTION_WORDS, load_rows
    from aiayn.lightning_modules.run.loggers import KINDS
    from aiayn.sweeps.backends import load

    rows = load_rows()
    row_names = {*rows, *(r.group for r in rows.values()), *SELECTION_WORDS}
    return {
        "--preset": set(PRESETS),
        "--row": set(rows),
        "--rows": row_names,
        "--backend": set(load()),
        "--logger": set(KINDS),
    }


def _named_values(text: str):
    """(flag, value) for each name-taking flag the page shows with a value: in its command lines and in its prose's
    code spans (`--preset quick`, `--rows base,A`)."""
    spans = [" ".join(w) for w in command_lines(text)] + re.findall(r"`([^`\n]*--[a-z][^`\n]*)`", text)
    for span in spans:
        words = span.split()
        own_rows = "--table" in words  # the user's own table names rows of its own
        pairs = [(f.partition("=")[0], f.partition("=")[2] or v) for f, v in zip(words, words[1:])]
        pairs += [tuple(w.split("=", 1)) for w in words[-1:] if w.startswith("--") and "=" in w]
        yield from ((f, v) for f, v in pairs if not (own_rows and f in ("--row", "--rows")))


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=[p.name for p in COMMAND_PAGES])
def test_every_name_a_page_passes_to_a_flag_is_in_its_registry(page):
    """A preset, row, group, back end or logger a page shows (`--preset quick`, `--rows base,A`, `--backend
    slurm`) is one the code has today: renaming or dropping one in the code without the docs fails here."""
    registries, wrong, seen = _registries(), [], 0
    for flag, value in _named_values(page.read_text(encoding="utf-8")):
        seen += flag in registries
        if flag not in registries or not re.fullmatch(r"[a-z0-9][\w,.-]*", value) or value.isupper():
            continue  # not a name-taking flag, or a placeholder (ROW, $rows, "$x"), a path, a glob
        names = value.split(",") if flag in ("--rows", "--logger") else [value]
        wrong += [f"{flag} {value}" for n in names if n and n not in registries[flag]]
    assert not wrong, f"{page.name} passes names the code does not have: {sorted(set(wrong))}"
    if page.name in ("README.md", "sweeps.md", "training.md"):
        assert seen >= 10, f"{page.name}: found only {seen} named values; the parser of this test is wrong"


# flags of other tools that the pages show (sbatch/srun directives, pip, tensorboard, mlflow, pytest, pytest-xdist)
FOREIGN = {
    "--dist",
    "--pdb",
    "--dependency",
    "--logdir",
    "--index-url",
    "--backend-store-uri",
    "--requeue",
    "--array",
    "--kill-on-bad-exit",
    "--job-name",
    "--ntasks-per-node",
    "--open-mode",
    "--signal",
    "--ntasks",
}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_flag_the_prose_names_is_an_option_of_some_command(page):
    """A flag a page names is one some command takes; the changelog's may be a removed one, which the commands answer
    with what to use instead (REMOVED_FLAGS), and every removed flag is in the changelog."""
    from aiayn.common.commands import REMOVED_FLAGS

    every = {s for p in COMMANDS.values() for a in p._actions for s in a.option_strings}
    named = set(re.findall(r"(?<![\w-])--[a-z][\w.-]*", page.read_text(encoding="utf-8")))
    removed = set(REMOVED_FLAGS) if page.name == "changelog.md" else set()
    assert named - every - FOREIGN - removed == set(), f"{page.name} names flags no aiayn command has"
    if page.name == "changelog.md":
        assert set(REMOVED_FLAGS) <= named, "a removed flag is not in the changelog"


PACKAGE_DIRS = ("aiayn", "ablations", "lightning_modules", "sweeps", "reports")


def _modules() -> list[Path]:
    """Every module of the package; a package's __init__.py where it holds code (a definition), not just a name."""
    return sorted(
        p
        for d in PACKAGE_DIRS
        for p in (ROOT / d).rglob("*.py")
        if p.name != "__init__.py" or re.search(r"^(?:def|class) ", p.read_text(encoding="utf-8"), re.M)
    )


def _defined_names() -> set[str]:
    names = set()
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        names |= set(re.findall(r"^\s*(?:def|class)\s+(\w+)", text, re.M))
        names |= set(re.findall(r"^(\w+)\s*(?::[^=\n]*)?=", text, re.M))  # module-level names
        names |= set(re.findall(r"^    (\w+)\s*:", text, re.M))  # dataclass fields
    return names


def test_architecture_names_every_module_and_only_what_exists():
    """ARCHITECTURE.md is kept in step with the code: every module of the package is named there (by its
    path, or by its file name in a row that names its directory), every .py path it cites exists, and every
    code name it cites (`RunSpec`, `Selection.pairs()`, `spec.resolve`) is defined somewhere in the package."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in _modules()
        if p.relative_to(ROOT).as_posix() not in text and f"`{p.name}`" not in text
    ]
    assert not missing, f"ARCHITECTURE.md does not name {missing}"
    for cited in re.findall(r"`([\w/<>.-]+\.py)`", text):
        if "<" not in cited:
            assert (ROOT / cited).is_file() or any(p.name == cited for p in _modules()), f"no file {cited}"
    defined = _defined_names()
    for span in re.findall(r"`([^`\s]+)`", text):
        if span.startswith("aiayn."):  # a module path: aiayn.X is X/ for the top-level directories, else aiayn/X
            parts = span.removesuffix("()").split(".")[1:]
            where, rest = (ROOT, parts) if parts[0] in PACKAGE_DIRS else (ROOT / "aiayn", parts)
            while rest and ((where / rest[0]).is_dir() or (where / f"{rest[0]}.py").is_file()):
                where = where / rest[0] if (where / rest[0]).is_dir() else where / f"{rest[0]}.py"
                rest = rest[1:]
            assert where.exists() and all(r in defined for r in rest), f"ARCHITECTURE.md cites `{span}`: not found"
            continue
        m = re.fullmatch(r"(?:[a-z_]+\.)*([A-Za-z_]\w*)(?:\(\w*\))?", span)
        if not m or span.endswith((".py", ".md", ".csv", ".json", ".model", ".toml")) or "/" in span:
            continue
        name = m.group(1)
        if name.islower() and "_" not in name and "." not in span and "(" not in span:
            continue  # a plain word in code style (a command, a row, a preset): not a code name
        if span in ARCHITECTURE_FOREIGN or span.endswith((".hyp", ".ref")):
            continue
        assert name in defined, f"ARCHITECTURE.md cites `{span}`, which the package does not define"


# names ARCHITECTURE.md cites that live outside the package: another library's, a test's
ARCHITECTURE_FOREIGN = {"MarianMTModel", "MarianTokenizer", "RunnerBackend"}


# An issue number (the work's history: git and docs/history keep it), except an upstream project's
# ("Lightning issue #21406" names a bug elsewhere); and, in the package's code, a table's version ("evidence v6"):
# the code says what it does now. Committed reports (reports/reference/) are records of their time and keep their words.
ISSUE = re.compile(r"(?<!Lightning )(?<!PyTorch )\b[Ii]ssues? #?\d+")
TABLE_VERSION = re.compile(r"\b[Ee]vidence v\d+")
HISTORY = ("docs/history/", "reports/reference/")


def _tracked(*suffixes: str) -> list[Path]:
    import subprocess

    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if n.endswith(suffixes) and not n.startswith(HISTORY)]


def test_no_issue_number_in_code_help_comments_or_docs_outside_history():
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]}"
        for path in _tracked(".py", ".md", ".sh", ".toml", ".cfg", ".yaml", ".ipynb", "run")
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not found, "history belongs in git and docs/history:\n" + "\n".join(found)


def test_the_packages_code_names_no_table_version():
    code = [p for p in _tracked(".py", ".sh") if not p.relative_to(ROOT).as_posix().startswith("tests/")]
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()[:80]}"
        for path in code
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TABLE_VERSION.search(line)
    ]
    assert not found, "the code says what it does now:\n" + "\n".join(found)
