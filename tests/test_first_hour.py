"""The README's first hour, executed: its commands in the order it gives them, each as a user types it, in
a fresh folder, with cheap flags appended where they train; then every run directory and report it names must be
there. A path, flag or name that drifts from what the code does fails here (the README's translate and export used a
run directory no earlier step created). The install lines' `pip` parts are not run; their `aiayn` parts are."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.ablations.presets import get_preset

pytestmark = pytest.mark.cold_cache  # a fresh machine: its cache starts empty (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
CHEAP = ["--val-every", "4", "--eval-subset", "10"]
BLEU_SENTENCES = 4  # val/bleu's decodes a validation, where a preset's are more (laptop's 200 were most of its run)
STEPS, LOOK = "12", "6"  # a plain command's steps; a look's (--max-steps in the README): fewer, as the README's are
# commands the README shows as mistakes, and the exit status it says they get
MISTAKES = {"aiayn train --row A7": 2}
# what a placeholder in the README stands for here
PLACES = {"DIR": str(MULTI30K), "my-rows.csv": "my-rows.csv", "reports/reference": str(ROOT / "reports" / "reference")}


def section(text: str) -> str:
    start = text.index("## Your first hour")
    return text[start : text.index("\n## ", start + 1)]


def first_hour(text: str) -> list[str]:
    """The commands, in order: the main job of the first install line, then every `aiayn ...` code span and every
    indented command line of the section (comments dropped)."""
    top = text.splitlines()[0].strip().split("&&")[-1].strip()
    found = [top]
    pattern = re.compile(r"`(aiayn [^`]+)`|^ {4,}(\S.*?)\s*(?:#.*)?$", re.M)
    for m in pattern.finditer(section(text)):
        command = (m.group(1) or m.group(2)).strip()
        if command.startswith("aiayn ") or " aiayn " in command:
            found.append(command)
    return found


def cheap(command: str) -> str:
    """The command with cheap flags where it trains: a look's --max-steps made smaller, a plain training command's
    steps capped a little above that, the dev evaluation cut; placeholders filled in."""
    words = shlex.split(command) if "|" not in command else None
    for place, value in PLACES.items():
        command = re.sub(rf"(?<![\w.-]){re.escape(place)}(?![\w.-])", value, command)
    if words is None or words[1] not in ("train", "table3") or "--dry-run" in words or command in MISTAKES:
        return command
    quiet = ["--no-progress"] if words[1] == "train" else []  # a sweep's runs print no bars anyway
    preset = words[words.index("--preset") + 1] if "--preset" in words else None
    few = preset and get_preset(preset).val_bleu_sentences > BLEU_SENTENCES  # the path, not 200 untrained decodes
    bleu = ["--val-bleu-sentences", str(BLEU_SENTENCES)] if few else []
    if "--max-steps" in words:
        return re.sub(r"--max-steps \d+", f"--max-steps {LOOK}", command) + " " + " ".join([*CHEAP, *quiet, *bleu])
    return command + " " + " ".join(["--max-steps", STEPS, *CHEAP, *quiet, *bleu])


def test_the_first_hour_is_read_in_order():
    commands = first_hour(README.read_text(encoding="utf-8"))
    assert commands[0] == "aiayn table3" and len(commands) >= 10, commands
    assert not [c for c in commands if "\n" in c], "a command wrapped inside its code span cannot be copied"
    assert any("translate --run runs/tiny/synthetic/C3/seed0" in c for c in commands)
    assert cheap("aiayn train --row C3 --preset tiny").endswith(
        "--max-steps 12 --val-every 4 --eval-subset 10 --no-progress"
    )
    assert "--max-steps 6 " in cheap("aiayn table3 --max-steps 60 --out look")
    assert cheap("aiayn train --row base --preset laptop --data-dir DIR").endswith("--val-bleu-sentences 4")


def _shell(line: str, cwd: Path, env: dict, timeout: int = 900) -> tuple[int, str, str]:
    """The command line in a shell of its own process group; past the timeout the whole group is killed (a shell's
    timeout alone would leave its aiayn child training)."""
    proc = subprocess.Popen(
        line,
        shell=True,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"`{line}` still running after {timeout} s:\n{stderr[-3000:]}")
    return proc.returncode, stdout, stderr


@pytest.mark.slow
def test_the_first_hour_runs_on_a_fresh_folder(cache, tmp_path):
    text = README.read_text(encoding="utf-8")
    header = (ROOT / "ablations" / "extended.csv").read_text(encoding="utf-8").splitlines()[0]
    values = {"row": "my-row", "group": "mine", "P_drop": "0.2"}  # the README's "one line of CSV in the layout"
    line = ",".join(values.get(column, "") for column in header.split(","))
    (tmp_path / "my-rows.csv").write_text(f"{header}\n{line}\n", encoding="utf-8")
    env = {**os.environ, "AIAYN_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    python = shlex.quote(sys.executable)
    for command in first_hour(text):
        if "DIR" in command.split() and not MULTI30K.is_dir():
            continue  # the shared Multi30k copy is not here
        line = cheap(command).replace("aiayn ", f"{python} -m aiayn ", 1)
        returncode, stdout, stderr = _shell(line, tmp_path, env)
        expected = MISTAKES.get(command, 0)
        assert returncode == expected, f"`{command}` exited {returncode}:\n{stderr[-3000:]}"
        if "translate" in command:  # one line in, one line out (a model of 12 steps may say little)
            assert stdout.count("\n") == 1, f"`{command}` printed {stdout!r}"
    # every run directory, report and export the section names is where it says
    for path in re.findall(r"`((?:runs|look|my-marian)[^`\s]*)`", section(text)):
        assert (tmp_path / path).exists(), f"the README names {path}, which the first hour did not make"
    assert (tmp_path / "my-marian" / "config.json").is_file() and (tmp_path / "runs/reports/table3-quick.md").is_file()
