"""The command-line engine: subcommands as data (`Command`), their parsers generated from options dataclasses
(aiayn.common.options), --config layering and --print-config, and argparse's errors as one line and exit 2.

aiayn/cli.py is the table of commands and the functions that call the layers; how a command line becomes an options
object is here, the same for every command. Nothing here knows a command: an options class that reads its --config
files its own way (a run's config.json) says so with a classmethod `config_layer(path, prog, skip)`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiayn.common.errors import UserError, print_error
from aiayn.common.options import (
    HelpFormatter,
    add_options,
    defaults_of,
    did_you_mean,
    from_args,
    lightning_spellings,
    to_config,
    yaml_values,
)


@dataclass(frozen=True)
class Command:
    """One subcommand. `name` is its words after the program's ("slurm table3"); its parser is `options`'s fields
    (`skip`: those it does not take, by dotted path), plus --config/--print-config unless `config` is False;
    `fixed`: (field, value) pairs the command itself sets (slurm's kind); `sets`: (flag, what to use instead) for the
    flags of the options it sets itself, each answered with that line; `refuses`: (flag, why) for flags a sibling
    command takes that this one cannot honour (a back end's: `aiayn table3 --jobs` under SLURM); `own_print`: `run`
    answers --print-config itself (train prints the resolved config.json)."""

    name: str
    help: str
    options: type
    run: Callable[[Any, argparse.Namespace], int | None]  # its exit status (None: 0)
    skip: tuple[str, ...] = ()
    config: bool = True
    own_print: bool = False
    fixed: tuple[tuple[str, Any], ...] = ()
    sets: tuple[tuple[str, str], ...] = ()
    refuses: tuple[tuple[str, str], ...] = ()
    config_help: str = ""
    print_help: str = ""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (`aiayn: error: …; <fix>`, exit 2), not usage + error, and no abbreviations."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # `--max-step` is a typo answered with "did you mean", not a guess
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message}; see `{self.prog} --help`")


def _config_arguments(p, command: Command) -> None:
    """--config FILE and --print-config for `command`."""
    p.add_argument(
        "--config",
        metavar="FILE",
        action="append",
        default=None,
        help=command.config_help
        or (
            "a YAML file of these options (what --print-config prints; nested by group or dotted, e.g. "
            "train.max_steps); repeatable, later files over earlier ones; flags given here override them all"
        ),
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help=command.print_help
        or (
            "print these options as YAML (every value, the config file included) and exit: `--config` of that file "
            "runs the same command"
        ),
    )


def build_parser(
    commands: tuple[Command, ...], groups: dict[str, str], *, prog: str, description: str, version: str
) -> argparse.ArgumentParser:
    """The program's parser, every subcommand built from `commands` (`groups`: the help of each first word that has
    subcommands, e.g. "slurm")."""
    p = Parser(prog=prog, description=description)
    p.add_argument("--version", action="version", version=f"{prog} {version}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    nested = {}
    for command in commands:
        words = command.name.split()
        where = sub
        if len(words) == 2:
            if words[0] not in nested:
                group = sub.add_parser(words[0], help=groups.get(words[0], f"the {words[0]} back end's commands"))
                nested[words[0]] = group.add_subparsers(dest=f"{words[0]}_command", required=True, parser_class=Parser)
            where = nested[words[0]]
        cp = where.add_parser(words[-1], help=command.help)
        add_options(cp, command.options, skip=command.skip)
        if command.config:
            _config_arguments(cp, command)
        cp.set_defaults(command_of=command)
    _own_parsers(p)
    return p


def _own_parsers(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's parser records itself (`args.parser_of`), so an unknown flag is matched against its options."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                sub.set_defaults(parser_of=sub)
                _own_parsers(sub)


def config_layer(cls, path: str, prog: str, skip=()) -> tuple[dict, Any]:
    """One --config file's values for options `cls` (and what else it recorded, e.g. a run's spec; None), by the
    class's own `config_layer` where it has one, else as a YAML mapping of its options."""
    own = getattr(cls, "config_layer", None)
    if own is not None:
        return own(path, prog, skip)
    return yaml_values(cls, path, prog, skip=skip), None


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The parsed command line. `--config FILE` (repeatable): each FILE's options, in order, become the command's
    parser's defaults (argparse's own layering; a later file's value replaces an earlier one's, and mappings such as
    `set` merge key by key), so the flags given on the command line override them all. `args.recorded`: the last
    thing a config file recorded beside its options (a run's config.json), or None."""
    argv = lightning_spellings(argv)
    args = _parse_known(parser, argv)
    command = getattr(args, "command_of", None)
    args.recorded = None
    if getattr(args, "config", None) and command is not None and command.config:
        sub, values, recorded = args.parser_of, {}, None
        for path in args.config:
            layer, seen = config_layer(command.options, path, sub.prog, command.skip)
            recorded = seen if seen is not None else recorded
            for key, value in layer.items():
                both = isinstance(value, dict) and isinstance(values.get(key), dict)
                values[key] = {**values[key], **value} if both else value
        sub.set_defaults(**defaults_of(command.options, values, skip=command.skip))
        args = _parse_known(parser, argv)
        args.recorded = recorded
    return args


# Flags a release removed, each answered with what to use instead (docs/changelog.md)
REMOVED_FLAGS = {
    "--pack-seeds": "packs were removed; train each seed as its own run (`aiayn table3 --jobs K` runs K at once)",
    "--pack": "packs were removed; --jobs K trains K runs at once (docs/training.md, filling a GPU with small runs)",
    "--dropout-rng": "the counter stream left with packs; dropout draws from torch's generator, seeded by --seed",
    "--batch-order-seed": "it left with packs; each run draws its batch order from its own --seed",
}


def _parse_known(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args`, with an unknown flag answered by the nearest option of its own subcommand (or, for a
    flag the command sets itself, what to use instead)."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    sub = getattr(args, "parser_of", parser)
    word = next((w for w in extra if w.startswith("-")), extra[0]).split("=")[0]
    command = getattr(args, "command_of", None)
    sets, refuses = dict(getattr(command, "sets", ())), dict(getattr(command, "refuses", ()))
    if word in sets:
        raise UserError(f"{sub.prog} sets {word} for each of its runs ({sets[word]}); leave it out")
    if word in refuses:
        raise UserError(f"{sub.prog} does not take {word}: {refuses[word]}; leave it out")
    if word in REMOVED_FLAGS:
        raise UserError(f"{word} was removed: {REMOVED_FLAGS[word]} (docs/changelog.md)")
    flags = [f for p in (sub, parser) for a in p._actions for f in a.option_strings if a.help != argparse.SUPPRESS]
    near = did_you_mean(word, flags) if word.startswith("--") else ""
    raise UserError(
        f"unrecognized arguments: {' '.join(extra)}"
        + (f" (did you mean {near[1:-1]}?)" if near else "")
        + f"; see `{sub.prog} --help`"
    )


def print_config(opts, command: Command) -> None:
    """Print `opts` as the YAML that --config reads back, secrets masked."""
    import yaml

    from aiayn.common.secrets import redact

    text = yaml.safe_dump(to_config(opts, skip=command.skip), sort_keys=False)
    masked = redact(text)  # a password in --storage, a key in --setup: never printed, so never in a file from it
    sys.stdout.write(masked)
    if masked != text:
        print(
            "aiayn: secrets in these options are printed as ***: put them back where the file is read (e.g. "
            "--storage 'postgresql://user:$PGPASSWORD@host/db', expanded from the environment)",
            file=sys.stderr,
        )


def run(command: Command, args: argparse.Namespace) -> int:
    """`command` with its options built from `args` (and checked: a required one missing is one line), or, with
    --print-config, those options printed; its exit status (what its function returns, 0 for None)."""
    opts = from_args(command.options, args, **dict(command.fixed))
    if command.config and args.print_config and not command.own_print:
        print_config(opts, command)
        return 0
    return command.run(opts, args) or 0


def route(argv: list[str], command: str, flag: str, command_of: Callable[[str], str | None]) -> list[str]:
    """`PROG COMMAND ... FLAG NAME ...` as the command NAME has of its own (`command_of(NAME)`, e.g. `aiayn table3
    --backend slurm ...` is `aiayn slurm table3 ...`), FLAG dropped; NAME from the last `--config` file that names one
    (`backend: slurm`) where FLAG is not given; any other command line as it is."""
    i = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    if i is None or argv[i] != command:
        return argv
    rest, name, configs, j = [], None, [], i + 1
    while j < len(argv):
        word = argv[j]
        if word == flag and j + 1 < len(argv):
            name, j = argv[j + 1], j + 2
            continue
        if word.startswith(f"{flag}="):
            name = word.split("=", 1)[1]
        else:
            rest.append(word)
            if word == "--config" and j + 1 < len(argv):
                configs.append(argv[j + 1])
            elif word.startswith("--config="):
                configs.append(word.split("=", 1)[1])
        j += 1
    if name is None:
        name = _named_in(configs, flag[2:].replace("-", "_"))
    own = command_of(name) if name else None
    return argv if own is None else argv[:i] + own.split() + rest


def _named_in(paths: list[str], key: str) -> str | None:
    """The value of top-level `key` in the last of the YAML files `paths` that has one (a file that cannot be read
    names nothing here: the parser reads it again and says what is wrong with it)."""
    import yaml

    found = None
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):  # the parser says what is wrong
            continue
        if isinstance(doc, dict) and isinstance(doc.get(key), str):
            found = doc[key]
    return found


def closed_stdout() -> int:
    """After the reader of stdout closed the pipe: point stdout at /dev/null so that Python's own flush at exit does
    not raise again, and exit as a program killed by SIGPIPE does (128 + 13), silently."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def unwritable_stdout(e: OSError) -> int:
    """An OSError that reached the command line: where standard output refuses what is written to it (a full disk),
    one line and exit 2, stdout pointed at /dev/null so that Python's flush at exit does not fail again; any other
    OSError is raised again."""
    try:
        sys.stdout.write("")
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return print_error(UserError(f"cannot write the output: {e.strerror}; write it elsewhere"))
    raise e
