"""Options are dataclasses; the command line is generated from them, so a default lives in one place.

A field made with :func:`option` is documented by the string literal under it, as an attribute's docstring (its
--help text; `help=` only where the text is computed, e.g. from a registry's names), and carries, where the type does
not say it, its choices or a positivity check. :func:`add_options` turns a dataclass into argparse arguments
(`--max-steps` for `max_steps`; booleans that default to True get `--no-…`; a field whose type is
itself an options dataclass, e.g. a sweep's `train: TrainOptions`, adds that class's options too);
:func:`from_args` builds the dataclass back from the parsed namespace; :func:`to_argv` writes an
instance as the arguments that :func:`from_args` would read back, for the few places that must start
a separate process (DDP ranks, `srun`, `wandb agent`).

Config files go through the same dataclasses: :func:`config_values` reads a mapping (YAML or JSON, nested by
option group or with dotted keys such as `train.max_steps`) into the parser's defaults, so the command line's
flags override the file, and :func:`to_config` writes an instance back as that mapping (`--print-config`).
Every option of a group is also accepted as its dotted path on the command line (`--train.max_steps 5`).

Written here rather than taken from jsonargparse (on which LightningCLI is built), tyro or simple-parsing: the
behaviour users and scripts rely on would change with any of them: the flat flags (`--max-steps`, not
`--train.max_steps` only), `--set KEY=VALUE` typed per knob, `--no-…` booleans, one-line errors with exit 2,
a run's own config.json as a config file, and `to_argv`, which DDP ranks, `srun` and `wandb agent` need to
rebuild the same options in another process. It covers exactly the types our options use.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import types
import typing
from dataclasses import MISSING, field, fields

from aiayn.common.errors import UserError

_KEY = "aiayn.option"


def option(
    default=MISSING,
    help: str = "",
    *,
    choices: tuple | None = None,
    positive: bool = False,
    at_least: int | None = None,
    at_most: int | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    parse=None,
    render=None,
    default_factory=MISSING,
    cli: bool = True,
    positional: bool = False,
):
    """A dataclass field that is also a command-line option, its help text the docstring under it (`help`: a text
    computed where the field is made, instead). `parse` turns the repeated string values of a `dict` field into the
    dict, `render` the dict back into those strings; `cli=False` keeps a field off the command line; `positional`
    makes it an argument without a flag (`aiayn status OUT`). A field without a default is required: on the command
    line or in a --config file (checked by :func:`from_args`)."""
    meta = {
        _KEY: dict(
            help=help,
            choices=choices,
            positive=positive,
            at_least=at_least,
            at_most=at_most,
            flag=flag,
            metavar=metavar,
            parse=parse,
            render=render,
            cli=cli,
            positional=positional,
        )
    }
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _meta(f: dataclasses.Field) -> dict:
    return f.metadata.get(
        _KEY,
        {
            "cli": True,
            "help": "",
            "choices": None,
            "positive": False,
            "at_least": None,
            "at_most": None,
            "flag": None,
            "metavar": None,
            "parse": None,
            "render": None,
            "positional": False,
        },
    )


@functools.cache
def attribute_docs(cls) -> dict[str, str]:
    """field name -> the string literal right under the field in its class body (an attribute docstring, as Sphinx
    and PEP 257 read them), whitespace folded as --help folds it; fields of base classes too."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (a class made at run time): no docstrings
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(doc, str):
                docs[node.target.id] = " ".join(doc.split())
    return docs


def help_of(cls, f: dataclasses.Field) -> str:
    """An option's --help text: its `help=`, else its attribute docstring."""
    return _meta(f)["help"] or attribute_docs(cls).get(f.name, "")


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


def finite_float(text: str) -> float:
    """An argparse type: a finite number (float() alone takes "nan" and "inf", which no option of aiayn means)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


# Every whole-number option's largest value where it declares none (`option(at_most=...)`): steps, tokens, counts
# and intervals past a billion are a mistake (2^64 steps overflowed range(); 2^64 tokens asked for the corpus as one
# batch), said in one line instead of tried
INT_LIMIT = 10**9
# the largest values of the options whose kind bounds them lower: each kind's options name it (`at_most=LIMITS[...]`)
LIMITS = {"seed": 9999, "workers": 256, "beam": 256, "jobs": 1024, "tokens": 10**7}


def int_between(least: int | None, most: int):
    """An argparse type: an integer from `least` (None: any) to `most` (`--seed`: 0 to 9999)."""
    kind = "a positive integer" if least == 1 else f"an integer of at least {least}" if least is not None else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind or 'an integer'}, got {text!r}") from None
        if least is not None and value < least:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {value}")
        if value > most:
            raise argparse.ArgumentTypeError(f"expected an integer of at most {most}, got {value}")
        return value

    return parse


def flag_of(f: dataclasses.Field) -> str:
    return _meta(f)["flag"] or "--" + f.name.replace("_", "-")


def _dest(prefix: str, name: str) -> str:
    return f"{prefix}{name}".replace(".", "__")


def groups_of(cls) -> dict[str, str]:
    """field name -> the title of the --help section it is listed in, from the class's `OPTION_GROUPS` ((title,
    (field, ...)), ...); a field of none is listed under the parser's own "options"."""
    return {name: title for title, names in getattr(cls, "OPTION_GROUPS", ()) for name in names}


def _section(parser: argparse.ArgumentParser, title: str | None):
    """The parser's --help section `title` (made once, in the order first asked for), or the parser itself."""
    if title is None:
        return parser
    made = parser.__dict__.setdefault("_aiayn_sections", {})
    if title not in made:
        made[title] = parser.add_argument_group(title)
    return made[title]


def add_options(
    parser: argparse.ArgumentParser, cls, *, skip=(), defaults=None, prefix: str = "", instance=None
) -> None:
    """Add `cls`'s option fields to `parser`, each in its --help section (`OPTION_GROUPS`). `skip` and `defaults`
    name fields by their dotted path from `cls` (e.g. "train.row"); `defaults` replaces a field's default for this
    parser only. A group's defaults are its default instance's (a sweep's `train` defaults to
    `TrainOptions(progress=False)`, so its flags do too)."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    sections = groups_of(cls)
    for title in dict.fromkeys(sections.values()):  # in OPTION_GROUPS' order
        _section(parser, title)
    for f in fields(cls):
        path, meta = f"{prefix}{f.name}", _meta(f)
        base = _base_type(hints[f.name])
        if path in skip or not meta["cli"]:
            continue
        own = _default(f) if instance is None else getattr(instance, f.name)
        if dataclasses.is_dataclass(base):
            add_options(
                parser,
                base,
                skip=skip,
                defaults=defaults,
                prefix=f"{path}.",
                instance=own if dataclasses.is_dataclass(own) else None,
            )
            continue
        default = defaults.get(path, own)
        kw = {"dest": _dest("", path), "help": help_of(cls, f), "default": default}
        if base is not bool and not meta["choices"]:
            kw["metavar"] = meta["metavar"] or f.name.upper()
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
        elif base in (tuple, list, dict):
            kw.update(action="append", default=None)
        else:
            least = 1 if meta["positive"] else meta.get("at_least")
            kw["type"] = (
                int_between(least, meta.get("at_most") or INT_LIMIT)
                if base is int
                else finite_float
                if base is float
                else base
            )
            if meta["choices"]:
                kw["choices"] = meta["choices"]
        kw["help"] = kw["help"].replace("%", "%%")  # argparse formats help with %
        if default is MISSING:  # required, but a --config file may give it: from_args checks that one did
            kw["default"] = None
            kw["help"] += " (required)" if kw["help"] else "required"
        if meta["positional"]:
            kw["nargs"] = "?"  # a --config file may give it; from_args says when nothing did
            parser.add_argument(kw.pop("dest"), **kw)
            continue
        _section(parser, sections.get(f.name)).add_argument(flag_of(f), **kw)
        if prefix:  # the dotted path too (`--train.max_steps`), kept out of --help: the same option
            alias = {k: v for k, v in kw.items() if k != "required"}
            parser.add_argument(f"--{path}", **{**alias, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS})


def from_args(cls, namespace: argparse.Namespace, *, prefix: str = "", instance=None, **fixed):
    """An instance of `cls` from a namespace that `add_options` parsed; `fixed` sets fields directly
    (skipped ones, or ones a command decides). A field the command skips keeps its default: its group's default
    instance's (`instance`), else its class's. A required field that neither the command line nor a --config file
    gave is a UserError naming every one missing, as argparse's own."""
    missing = [
        flag_of(f) if not _meta(f)["positional"] else (_meta(f)["metavar"] or f.name.upper())
        for f in fields(cls)
        if f.name not in fixed
        and _meta(f)["cli"]
        and _default(f) is MISSING
        and getattr(namespace, _dest(prefix, f.name), None) is None
    ]
    if missing:
        prog = getattr(getattr(namespace, "parser_of", None), "prog", "aiayn")
        raise UserError(
            f"the following arguments are required: {', '.join(missing)}; give them on the command line "
            f"or in a --config file, see `{prog} --help`"
        )
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        if f.name in fixed:
            values[f.name] = fixed[f.name]
            continue
        base, meta = _base_type(hints[f.name]), _meta(f)
        own = _default(f) if instance is None else getattr(instance, f.name)
        if dataclasses.is_dataclass(base):
            values[f.name] = from_args(
                base, namespace, prefix=f"{prefix}{f.name}.", instance=own if dataclasses.is_dataclass(own) else None
            )
            continue
        dest = _dest(prefix, f.name)
        if not hasattr(namespace, dest):
            if instance is not None:
                values[f.name] = own
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
        if meta["positional"]:
            argv.append(str(value))
        elif isinstance(value, bool):
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


# ---------------------------------------------------------------- config files


def _leaves(cls, prefix: str = "", skip=()):
    """(dotted path, field, base type) of every command-line option of `cls`, nested groups included."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        path, base = f"{prefix}{f.name}", _base_type(hints[f.name])
        if path in skip or not _meta(f)["cli"]:
            continue
        if dataclasses.is_dataclass(base):
            yield from _leaves(base, f"{path}.", skip)
        else:
            yield path, f, base


def _hints(cls, prefix: str = "", skip=(), instance=None):
    """(dotted path, full type hint) of every command-line option of `cls`, as :func:`_leaves` walks them; a field
    whose default is None (in its group's default instance, e.g. `aiayn slurm`'s devices) also takes None."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        path, hint = f"{prefix}{f.name}", hints[f.name]
        if path in skip or not _meta(f)["cli"]:
            continue
        own = _default(f) if instance is None else getattr(instance, f.name)
        if dataclasses.is_dataclass(_base_type(hint)):
            yield from _hints(_base_type(hint), f"{path}.", skip, own if dataclasses.is_dataclass(own) else None)
        else:
            yield path, (hint | None if own is None and not isinstance(hint, str) else hint)


CONFIG_MAX_BYTES = 1 << 20  # a config file of options is a few KB; a run's config.json about 10
CONFIG_MAX_DEPTH = 32  # a config nests by group at most 3 deep (train: {trainer: {...}}); a run's config.json 4


def _no_alias_loader():
    """PyYAML's SafeLoader without aliases, nested at most CONFIG_MAX_DEPTH deep: a config file of options needs
    neither, a few nested aliases (a "billion laughs" of 1 KB) expand to gigabytes and hang the reader, and 100,000
    nested `[` exhaust Python's recursion in the composer."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(
                    None, None, "an alias (*name): aliases are not read in a config file", event.start_mark
                )
            if self.depth >= CONFIG_MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {CONFIG_MAX_DEPTH} levels deep", event.start_mark
                )
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return NoAliases


def read_mapping(path, what: str) -> dict:
    """A config file (YAML, or JSON, which is YAML) that must hold a mapping; each way it can fail is one line that
    names the file and ends in `pass {what}` or `fix the file`. At most CONFIG_MAX_BYTES, and no YAML aliases (a
    20 MB file took minutes and gigabytes before its error; a 1 KB alias bomb hung)."""
    from pathlib import Path

    import yaml  # lazily: building the parsers needs no YAML

    from aiayn.common.files import read_user_text

    path = Path(path)
    text = read_user_text(path, f"config {path}", CONFIG_MAX_BYTES, f"pass {what}")
    try:
        doc = yaml.load(text, Loader=_no_alias_loader())  # a SafeLoader
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        raise UserError(
            f"config {path} is neither JSON nor YAML ({getattr(e, 'problem', None) or e}{at}); fix the file"
        ) from None
    if not isinstance(doc, dict):
        raise UserError(f"config {path} is not a mapping of options; pass {what}")
    return doc


def yaml_values(cls, path, prog: str, *, skip=()) -> dict:
    """One `--config FILE` of a YAML mapping of `cls`'s options, as {dotted path: value} (`config_values`)."""
    doc = read_mapping(path, f"a YAML file of `{prog}` options (e.g. what --print-config prints)")
    return config_values(cls, doc, f"config {path}", prog, skip=skip)


def config_values(cls, doc: dict, where: str, command: str, *, skip=()) -> dict:
    """A config file's mapping as {dotted path: value}. Keys may nest by group (`train: {max_steps: 5}`), be dotted
    (`train.max_steps: 5`), or be an option's own name anywhere (`max_steps`, `max-steps`, `set`), as its flag is on
    the command line; an unknown or skipped key is a UserError naming it."""
    leaves = {path: f for path, f, _ in _leaves(cls, skip=skip)}
    hints = {path: hint for path, hint in _hints(cls, skip=skip)}
    groups = {path.rsplit(".", 1)[0] for path in leaves if "." in path}
    by_name: dict[str, list[str]] = {}
    for path, f in leaves.items():
        for name in {f.name, flag_of(f)[2:], flag_of(f)[2:].replace("-", "_")}:
            by_name.setdefault(name, []).append(path)
    present = [name for name in ("jobs", "max_steps", "set") if name in by_name]  # names this command takes
    example = ", ".join(present[:2]) + (" or train.max_steps" if "train.max_steps" in leaves else "")
    out = {}

    def walk(mapping: dict, prefix: str) -> None:
        for key, value in mapping.items():
            dotted = f"{prefix}{str(key).replace('-', '_')}"
            if dotted in groups and isinstance(value, dict):
                walk(value, f"{dotted}.")
            elif not prefix and str(key) in LIGHTNING_BLOCKS and (dotted not in leaves or isinstance(value, dict)):
                raise UserError(
                    f"{where}: `{key}:` is a LightningCLI config block; {LIGHTNING_BLOCKS[str(key)]} "
                    f"(`{command} --print-config` prints a config of its own options)"
                )
            elif dotted in leaves:
                out[dotted] = value
            elif len(named := [q for q in by_name.get(str(key), ()) if q.startswith(prefix)]) == 1:
                out[named[0]] = value  # an option by its own name or flag, as on the command line
            else:
                last = dotted.rsplit(".", 1)[-1]
                same = [q for q in leaves if q.rsplit(".", 1)[-1] == last]  # in another group than written
                near = f"'{same[0]}'" if len(same) == 1 else did_you_mean(dotted, [*leaves, *by_name])
                raise UserError(
                    f"{where}: unknown option '{prefix}{key}'"
                    + (f" (did you mean {near}?)" if near else "")
                    + f"; use the option names of `{command} --help` (e.g. {example})"
                )

    walk(doc, "")
    for path, value in out.items():
        check_value(value, hints[path], f"{where}: {path}")
    return out


def did_you_mean(word: str, candidates) -> str:
    """The candidate closest to `word` (a mistyped option), quoted, or ''."""
    import difflib

    near = difflib.get_close_matches(word, list(dict.fromkeys(candidates)), n=1, cutoff=0.6)
    return f"'{near[0]}'" if near else ""


def value_matches(value, hint) -> bool | None:
    """Whether `value` (as YAML reads it) is of type `hint`; None where the type is not one a YAML value can be
    checked against (a class such as a Profiler), so the caller lets the library that owns it decide."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if origin in (typing.Union, types.UnionType):
        seen = [value_matches(value, a) for a in args]
        return True if any(seen) else None if None in seen else False
    if origin is typing.Literal:
        return value in args
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if (origin or hint) in (tuple, list, typing.Sequence):
        if not isinstance(value, (list, tuple)):
            return False
        inner = [a for a in args if a is not Ellipsis][:1]
        return all(value_matches(v, inner[0]) is not False for v in value) if inner else True
    if (origin or hint) is dict:
        return isinstance(value, dict)
    return None


def type_name(hint) -> str:
    """`int | None` -> 'an integer or null', for messages."""
    words = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        type(None): "null",
        dict: "a mapping",
        tuple: "a list",
        list: "a list",
    }
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in args if not (a is int and float in args)]  # a number covers the integers
        return " or ".join(dict.fromkeys(type_name(a) for a in args))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    return words.get(origin or hint, getattr(hint, "__name__", str(hint)))


def check_value(value, hint, where: str) -> None:
    """A UserError naming `where` unless `value` has the type `hint` (a YAML string for a number is checked when
    the command line's own parser reads it, as if typed)."""
    base = _base_type(hint)
    if isinstance(value, str) and base in (int, float) and not isinstance(value, bool):
        return  # '5' from YAML quoting: argparse converts and checks it as it would the flag's text
    if base in (tuple, list) and not isinstance(value, (list, tuple, dict)):
        value = [value]  # one item, as a repeated flag given once
    if base is dict and isinstance(value, (list, tuple)):
        return  # KEY=VALUE strings, parsed (and checked) by the option's own parser
    if value_matches(value, hint) is False:
        raise UserError(f"{where} must be {type_name(hint)}, not {value!r}; fix the file")


def defaults_of(cls, values: dict, *, skip=()) -> dict:
    """{dotted path: value} (from :func:`config_values`) as the parser's defaults by dest, in the form its actions
    store them: dicts rendered to their `KEY=VALUE` strings and tuples to lists (a repeated flag on the command line
    then extends them), numbers to strings (argparse checks a string default with the option's type, as if typed)."""
    out = {}
    for path, f, base in _leaves(cls, skip=skip):
        if path not in values:
            continue
        value = values[path]
        if base is dict:
            if isinstance(value, dict):
                render = _meta(f)["render"] or (lambda d: [f"{k}={v}" for k, v in d.items()])
                value = render(value)
            else:
                value = list(value) if isinstance(value, (list, tuple)) else [value]
        elif base in (tuple, list):
            value = list(value) if isinstance(value, (list, tuple)) else [value]
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = str(value)
        out[_dest("", path)] = value
    return out


def to_config(obj, *, skip=(), prefix: str = "") -> dict:
    """`obj`'s command-line options as a nested mapping (groups as sub-mappings, tuples as lists), every value
    written out: the file that `--config` reads back as `obj`."""
    out = {}
    for f in fields(obj):
        path, value = f"{prefix}{f.name}", getattr(obj, f.name)
        if path in skip or not _meta(f)["cli"]:
            continue
        if dataclasses.is_dataclass(value):
            group = to_config(value, skip=skip, prefix=f"{path}.")
            if group:  # a group whose every option the command skips is not one of its options
                out[f.name] = group
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        elif isinstance(value, dict):
            out[f.name] = dict(value)
        else:
            out[f.name] = value
    return out


# LightningCLI's config blocks (`model: {class_path: ..., init_args: ...}` and the like), and what aiayn has instead
LIGHTNING_BLOCKS = {
    "model": "aiayn's model is a Table 3 row: `row: C3`, its knobs changed with `set: {d_model: 256, h: 4}`",
    "data": "aiayn's data is a corpus name, `data: multi30k` (with `data_dir:` for its files)",
    "optimizer": "the paper's Adam is fixed; its schedule's `set: {lr_factor: 0.5, warmup: 4000}` change",
    "lr_scheduler": "the paper's schedule is fixed; `set: {lr_factor: 0.5, warmup: 4000}` change it",
    "ckpt_path": "a run resumes from its own directory by itself; `--config RUN/config.json` trains a run again",
    "seed_everything": "aiayn's is `seed:`",
}
# the same answers in the spelling of the command line, for a LightningCLI flag (`--model.d_model 64`)
LIGHTNING_FLAGS = {
    "model": "aiayn's model is a Table 3 row: `--row C3`, its knobs changed with `--set d_model=256 --set h=4`",
    "data": "aiayn's data is a corpus name, `--data multi30k` (with `--data-dir` for its files)",
    "optimizer": "the paper's Adam is fixed; its schedule's `--set lr_factor=0.5 --set warmup=4000` change",
    "lr_scheduler": "the paper's schedule is fixed; `--set lr_factor=0.5 --set warmup=4000` change it",
    "ckpt_path": LIGHTNING_BLOCKS["ckpt_path"],
    "seed_everything": "aiayn's is `--seed`",
}

# LightningCLI's subcommands, and what aiayn has instead
LIGHTNING_COMMANDS = {"fit": "train", "validate": "eval", "test": "eval", "predict": "translate"}


def _lightning_block(word: str) -> str | None:
    """The LightningCLI block a flag spells (`--model.KEY`, `--data.KEY`, `--seed_everything`), or None; aiayn's own
    `--data` is not one."""
    name = word.removeprefix("--").split("=")[0] if word.startswith("--") else ""
    block = name.split(".")[0]
    return block if block in LIGHTNING_BLOCKS and ("." in name or "_" in block) else None


def lightning_spellings(argv: list[str]) -> list[str]:
    """A Lightning user's spellings in aiayn's: `--trainer.KEY VALUE` and `--trainer.KEY=VALUE` (LightningCLI's
    dotted Trainer arguments) as `--trainer KEY=VALUE`, `--print_config` as `--print-config`; LightningCLI's `fit`
    (and `validate`, `test`, `predict`) answered with aiayn's command."""
    if argv and argv[0] in LIGHTNING_COMMANDS:
        raise UserError(
            f"aiayn has no `{argv[0]}` command (LightningCLI's); `aiayn {LIGHTNING_COMMANDS[argv[0]]}` "
            f"does that here (`aiayn --help` lists the commands)"
        )
    out, words = [], iter(argv)
    for word in words:
        if word.startswith("--trainer."):
            key, eq, value = word.removeprefix("--trainer.").partition("=")
            if not eq:
                value = next(words, None)
                if value is None or value.startswith("--"):
                    raise UserError(f"{word} needs a value: `--trainer.{key} VALUE` (or `--trainer {key}=VALUE`)")
            out += ["--trainer", f"{key}={value}"]
        elif word == "--print_config":
            out.append("--print-config")
        elif word.startswith("--print_config=") or word.startswith("--print-config="):
            raise UserError(
                f"{word}: aiayn's --print-config takes no value (LightningCLI's comments and skip_null are not "
                "kept: its YAML has every value, and --help says what each means); pass --print-config"
            )
        elif _lightning_block(word):  # `--model.d_model 64`, `--seed_everything 3`: its config blocks as flags
            raise UserError(
                f"{word.split('=')[0]} is LightningCLI's spelling; {LIGHTNING_FLAGS[_lightning_block(word)]}"
            )
        else:
            out.append(word)
    return out
