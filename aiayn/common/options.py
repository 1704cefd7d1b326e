"""Options are dataclasses; the command line is generated from them, so a default lives in one place.

A field made with :func:`option` carries its help text (and, where the type does not say it, its
choices or a positivity check). :func:`add_options` turns a dataclass into argparse arguments
(`--max-steps` for `max_steps`; booleans that default to True get `--no-…`; a field whose type is
itself an options dataclass, e.g. a sweep's `train: TrainOptions`, adds that class's options too);
:func:`from_args` builds the dataclass back from the parsed namespace; :func:`to_argv` writes an
instance as the arguments that :func:`from_args` would read back, for the few places that must start
a separate process (DDP ranks, `srun`, `wandb agent`).

Written here rather than taken from a library (simple-parsing, tyro, jsonargparse) to keep the
dependency list to the stack the project names; it covers exactly the types our options use.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import MISSING, field, fields

_KEY = "aiayn.option"


def option(
    default=MISSING,
    help: str = "",
    *,
    choices: tuple | None = None,
    positive: bool = False,
    flag: str | None = None,
    metavar: str | None = None,
    parse=None,
    render=None,
    default_factory=MISSING,
    cli: bool = True,
):
    """A dataclass field that is also a command-line option. `parse` turns the repeated string values
    of a `dict` field into the dict, `render` the dict back into those strings; `cli=False` keeps a
    field off the command line."""
    meta = {_KEY: dict(help=help, choices=choices, positive=positive, flag=flag, metavar=metavar,
                       parse=parse, render=render, cli=cli)}  # fmt: skip
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _meta(f: dataclasses.Field) -> dict:
    return f.metadata.get(_KEY, {"cli": True, "help": "", "choices": None, "positive": False, "flag": None,
                                 "metavar": None, "parse": None, "render": None})  # fmt: skip


def _base_type(hint):
    """`int | None` -> int; `tuple[str, ...]` -> tuple; anything else as it is."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _base_type(args[0]) if len(args) == 1 else str
    return origin or hint


def _default(f: dataclasses.Field):
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


class HelpFormatter(argparse.HelpFormatter):
    """--help shows each option's default where it has one worth showing (not None, False or empty)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        empty = isinstance(d, (list, tuple, dict)) and not d
        shown = not (d is None or isinstance(d, bool) or d == argparse.SUPPRESS or empty)
        if shown and action.option_strings and "default" not in text:
            text += " (default: %(default)s)"
        return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def flag_of(f: dataclasses.Field) -> str:
    return _meta(f)["flag"] or "--" + f.name.replace("_", "-")


def _dest(prefix: str, name: str) -> str:
    return f"{prefix}{name}".replace(".", "__")


def add_options(parser: argparse.ArgumentParser, cls, *, skip=(), defaults=None, prefix: str = "") -> None:
    """Add `cls`'s option fields to `parser`. `skip` and `defaults` name fields by their dotted path
    from `cls` (e.g. "train.row"); `defaults` replaces a field's default for this parser only."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for f in fields(cls):
        path, meta = f"{prefix}{f.name}", _meta(f)
        base = _base_type(hints[f.name])
        if path in skip or not meta["cli"]:
            continue
        if dataclasses.is_dataclass(base):
            add_options(parser, base, skip=skip, defaults=defaults, prefix=f"{path}.")
            continue
        default = defaults.get(path, _default(f))
        kw = {"dest": _dest("", path), "help": meta["help"], "default": default}
        if base is not bool and not meta["choices"]:
            kw["metavar"] = meta["metavar"] or f.name.upper()
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
        elif base in (tuple, list, dict):
            kw.update(action="append", default=None)
        else:
            kw["type"] = positive_int if meta["positive"] else base
            if meta["choices"]:
                kw["choices"] = meta["choices"]
        kw["help"] = kw["help"].replace("%", "%%")  # argparse formats help with %
        if default is MISSING:
            kw.pop("default")
            kw["required"] = True
        parser.add_argument(flag_of(f), **kw)


def from_args(cls, namespace: argparse.Namespace, *, prefix: str = "", **fixed):
    """An instance of `cls` from a namespace that `add_options` parsed; `fixed` sets fields directly
    (skipped ones, or ones a command decides)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        if f.name in fixed:
            values[f.name] = fixed[f.name]
            continue
        base, meta = _base_type(hints[f.name]), _meta(f)
        if dataclasses.is_dataclass(base):
            values[f.name] = from_args(base, namespace, prefix=f"{prefix}{f.name}.")
            continue
        dest = _dest(prefix, f.name)
        if not hasattr(namespace, dest):
            continue  # skipped by this command: the field keeps its default
        value = getattr(namespace, dest)
        if base in (tuple, list) and value is not None:
            value = base(value)
        elif base is dict:
            value = meta["parse"](value or ()) if meta["parse"] else dict(value or {})
        elif value is None and base in (tuple, list):
            value = _default(f)
        values[f.name] = value
    return cls(**values)


def parser_defaults(cls, values: dict, *, prefix: str = "") -> dict:
    """`values` (field name -> value, as in an instance of `cls`) as the parser's defaults by dest, in
    the form its actions store them: dicts rendered to their `KEY=VALUE` strings and tuples to lists,
    which a repeated flag on the command line then extends, and numbers to strings, which argparse
    checks with the option's type as if they were typed. For a config file under the command line."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        if f.name not in values or not _meta(f)["cli"]:
            continue
        value, base = values[f.name], _base_type(hints[f.name])
        if base is dict:
            render = _meta(f)["render"] or (lambda d: [f"{k}={v}" for k, v in d.items()])
            value = render(dict(value or {}))
        elif base in (tuple, list):
            value = list(value) if isinstance(value, (list, tuple)) else [value]
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = str(value)  # argparse converts (and checks) a string default with the option's type
        out[_dest(prefix, f.name)] = value
    return out


def to_argv(obj, *, always=()) -> list[str]:
    """The command-line arguments that `from_args` reads back as `obj` (fields at their default are
    left out, except those named in `always`)."""
    argv = []
    for f in fields(obj):
        meta, value = _meta(f), getattr(obj, f.name)
        if not meta["cli"] or dataclasses.is_dataclass(value):
            continue
        if value == _default(f) and f.name not in always:
            continue
        flag = flag_of(f)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            for item in (meta["render"] or (lambda d: [f"{k}={v}" for k, v in d.items()]))(value):
                argv += [flag, item]
        elif isinstance(value, (tuple, list)):
            for item in value:
                argv += [flag, str(item)]
        elif value is None:
            raise ValueError(f"{type(obj).__name__}.{f.name} is None, which has no command-line form")
        else:
            argv += [flag, str(value)]
    return argv
