"""`aiayn completion bash|zsh|tcsh|fish`: shell completion from the command line's own parsers (shtab, a maintained
generator of completion scripts from argparse), with the values that are names (rows, presets, loggers, corpora)
completed from the data, and files and directories where an option takes a path."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from aiayn.common.options import option

SHELLS = ("bash", "zsh", "tcsh", "fish")


@dataclass
class CompletionOptions:
    """`aiayn completion SHELL`: the completion script of which shell."""

    shell: str = option(positional=True, choices=SHELLS)
    """the shell the script is for"""


# what an option's value completes to: names (rows, presets, loggers, corpora) or paths
# (`--row` takes one row; `--rows` rows, groups, all and scored, as `aiayn table3` reads them)
NAME_OPTIONS = {"--row": "row", "--rows": "rows", "--preset": "presets", "--logger": "loggers", "--data": "corpora"}
FILE_OPTIONS = (
    "--table",
    "--config",
    "--ckpt",
    "--tokenizer",
    "--input",
    "--output",
    "--space",
    "--hyp",
    "--ref",
    "--src",
    "--json",
)
DIR_OPTIONS = ("--out", "--runs", "--run", "--data-dir", "--cache-dir", "--ct2", "--report")
POSITIONAL_DIRS = ("out",)  # an argument without a flag that names a folder


def _completion_names() -> dict[str, list[str]]:
    from aiayn.ablations.presets import PRESETS
    from aiayn.ablations.table import load_rows
    from aiayn.lightning_modules.data.corpora import COMPLETIONS
    from aiayn.lightning_modules.run.loggers import KINDS

    rows = load_rows()
    return {
        "row": list(rows),
        "rows": [*rows, *sorted({r.group for r in rows.values()} - set(rows)), "all", "scored"],
        "presets": list(PRESETS),
        "loggers": list(KINDS),
        "corpora": list(COMPLETIONS),
    }


def _mark_completions(parser: argparse.ArgumentParser, shtab, names: dict[str, list[str]]) -> None:
    """Tell shtab what each option's value is: one of `names` (a completion function per kind, below), a file or
    a directory; every subcommand's parser likewise."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _mark_completions(sub, shtab, names)
            continue
        flags = set(action.option_strings)
        if not flags and action.dest in POSITIONAL_DIRS:  # `aiayn status OUT`
            action.complete = shtab.DIRECTORY
            continue
        kind = next((NAME_OPTIONS[f] for f in flags if f in NAME_OPTIONS), None)
        if kind is not None:
            words = " ".join(names[kind])
            action.complete = {"bash": f"_aiayn_{kind}", "zsh": f"({words})", "fish": words}
        elif flags & set(FILE_OPTIONS):
            action.complete = shtab.FILE
        elif flags & set(DIR_OPTIONS):
            action.complete = shtab.DIRECTORY


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser` (the `aiayn` parser) for `shell`."""
    import shtab

    names = _completion_names()
    _mark_completions(parser, shtab, names)
    preamble = {
        "bash": "\n".join(
            f'_aiayn_{kind}() {{ compgen -W "{" ".join(words)}" -- "$1"; }}' for kind, words in names.items()
        )
    }
    return shtab.complete(parser, shell=shell, preamble=preamble)
