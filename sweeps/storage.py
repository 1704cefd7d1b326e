"""Optuna storages by URL: SQLite for one machine, a journal file for a shared filesystem, any RDB
(PostgreSQL, MySQL) for many nodes. Passwords never appear in messages."""

from __future__ import annotations

import os
import re
from pathlib import Path

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from aiayn.common.errors import UserError
from aiayn.common.files import can_create_in
from aiayn.common.secrets import redact

# Optuna's lines (a study created, a trial finished) printed by aiayn's handler in aiayn's format (common/logs.py)
optuna.logging.disable_default_handler()

RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql")
DRIVER_EXTRAS = {"postgresql": "postgres", "postgres": "postgres", "mysql": "mysql"}  # pyproject.toml's extras


def check_url(url: str, creates: Path | None = None) -> str:
    """The URL's scheme, or a UserError for an unknown scheme, an in-memory SQLite database (no books across the
    runs' processes) or a journal in a missing directory (checked before anything is created); with `creates` (the
    folder a sweep makes before it opens its storage: its --out), a SQLite file in a missing directory elsewhere."""
    scheme = url.split(":", 1)[0].split("+", 1)[0] if ":" in url else ""
    if scheme == "journal":
        path = Path(url.split(":", 1)[1].removeprefix("//"))
        if not path.parent.is_dir():
            raise UserError(
                f"journal storage {redact(url)}: directory {path.parent} does not exist; create it or pick another path"
            )
    elif scheme not in RDB_SCHEMES:
        raise UserError(
            f"storage URL {redact(url)!r} has an unknown scheme; use sqlite:///PATH, journal:///PATH, "
            f"postgresql://USER@HOST/DB or mysql://USER@HOST/DB"
        )
    elif scheme == "sqlite":
        rest = url.split(":", 1)[1]
        path = rest.removeprefix("///")
        if not rest.startswith("///") or path in ("", ":memory:"):
            raise UserError(
                f"storage {redact(url)}: an in-memory database keeps no books for the runs' processes or a rerun; "
                "pass sqlite:///PATH (a file)"
            )
        parent = Path(path).parent
        if creates is not None and not parent.is_dir() and parent.resolve() != Path(creates).resolve():
            raise UserError(
                f"sqlite storage {redact(url)}: directory {parent} does not exist; create it or pick another path"
            )
    return scheme


_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][\w+.-]*://[^:/@]*:)(?P<password>[^@]*)(?P<tail>@.*)$")


def expand(url: str) -> str:
    """A storage URL with `$NAME` / `${NAME}` in its password taken from the environment, so that a config file (and
    what --print-config prints) can name a password without holding it: postgresql://user:$PGPASSWORD@host/db. Only
    the password is expanded (and never printed): a variable elsewhere in the URL stays as written, so a shared
    config cannot put any variable's value in a printed URL or send it to a host it names. A variable that is not
    set is one line."""
    m = _PASSWORD.match(url)
    if not m or "$" not in m["password"]:
        return url
    password = os.path.expandvars(m["password"])
    missing = re.search(r"\$\{?(\w+)", password)
    if missing:
        raise UserError(
            f"storage {redact(url)}: its password names ${missing[1]}, which is not set; export {missing[1]}=... "
            "or write the password there"
        )
    return f"{m['head']}{password}{m['tail']}"


def check_driver(url: str) -> None:
    """The database driver a server's URL needs is importable (what open_storage would find missing, said as it
    says it, without connecting): a dry run refuses what the real run would."""
    url = expand(url)
    _require_driver(url, check_url(url))


def _require_driver(url: str, scheme: str) -> None:
    """check_driver, of a URL already expanded and checked."""
    extra = DRIVER_EXTRAS.get(scheme)
    if extra is None:
        return
    from sqlalchemy import create_engine

    try:
        create_engine(url).dispose()  # loads the dialect and its DBAPI module; connects to nothing
    except ImportError:
        raise UserError(
            f"storage {redact(url)} needs its database driver, which is not installed; pip install 'aiayn[{extra}]'"
        ) from None
    except Exception as e:  # a malformed URL
        raise _cannot_open(url, e) from None


def _cannot_open(url: str, e: Exception) -> UserError:
    reason = redact(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__
    return UserError(f"cannot open storage {redact(url)} ({reason}); check the URL, the server and its driver")


# Optuna's RDB schema (optuna/storages/_rdb/models.py), created in this order, "studies" first
OPTUNA_TABLES = frozenset(
    "studies study_directions study_user_attributes study_system_attributes trials trial_user_attributes "
    "trial_system_attributes trial_params trial_values trial_intermediate_values trial_heartbeats version_info "
    "alembic_version".split()
)


def check_readable(url: str) -> None:
    """An existing SQLite database or journal file that Optuna cannot read (garbled, truncated, not Optuna's) is a
    UserError naming the fix, found before anything is created beside it (a lock, a new schema): the journal's lines
    must be JSON objects with an `op_code`, the database must open as SQLite. A server's database is the server's
    to answer for (open_storage's error)."""
    import json
    import sqlite3

    url = expand(url)
    scheme = check_url(url)
    path = Path(url.split(":", 1)[1].removeprefix("//")) if scheme in ("journal", "sqlite") else None
    if scheme == "sqlite":
        path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
    if path is None or not path.exists():
        return
    if not path.is_file():
        raise UserError(f"storage {path} is a directory or a device, not a file; pass --storage a file's path")
    if not (os.access(path, os.W_OK) and can_create_in(path.parent)):  # a read-only file, folder or mount
        raise UserError(
            f"storage {path} cannot be written (a read-only file, folder or mount); copy it somewhere "
            "writable and pass --storage there"
        )
    fix = f"delete {path} to start the sweep's books there again (its runs stay), or pass another --storage"
    if scheme == "journal":
        number = 0
        try:
            with open(path, "rb") as f:
                for raw in f:
                    number += 1
                    if raw.strip() and not isinstance(json.loads(raw.decode("utf-8")).get("op_code"), int):
                        raise ValueError("no op_code")
        except (UnicodeDecodeError, ValueError, AttributeError) as e:
            raise UserError(
                f"journal storage {path} line {number} is not an Optuna journal entry ({type(e).__name__}); {fix}"
            ) from None
        try:  # each entry as Optuna replays it (reading only): `{"op_code": 0}` alone has none of a study's fields
            JournalStorage(JournalFileBackend(str(path)))
        except Exception as e:  # KeyError, TypeError, ValueError: whatever a bad entry raises
            raise UserError(
                f"journal storage {path} does not replay as an Optuna journal ({type(e).__name__}: "
                f"{str(e)[:80]}); {fix}"
            ) from None
        return
    # a hot journal beside the database (a writer killed mid-transaction) is rolled back by a normal open, as
    # Optuna's will; a read-only open would refuse that healthy database
    mode = "rw" if Path(f"{path}-journal").exists() else "ro"
    try:
        with sqlite3.connect(f"file:{path}?mode={mode}", uri=True) as db:
            tables = {name for (name,) in db.execute("select name from sqlite_master where type = 'table'")}
    except sqlite3.DatabaseError as e:
        raise UserError(f"storage {path} is not a readable SQLite database ({e}); {fix}") from None
    # another program's database, which Optuna would add its tables to; any of Optuna's tables is Optuna's schema,
    # perhaps half made: a second worker on a new file sees the tables another's Optuna is creating one by one
    if tables and tables.isdisjoint(OPTUNA_TABLES):
        names = ", ".join(sorted(tables)[:5])
        raise UserError(
            f"storage {path} is another program's SQLite database (tables: {names}); pass --storage a "
            "new file or an Optuna database"
        )


def open_storage(url: str, create_dir: Path | None = None) -> optuna.storages.BaseStorage:
    """`sqlite:///PATH`, `postgresql://USER:PASS@HOST/DB`, `mysql://…`, or `journal:///PATH` (a file); `$NAME` in it
    is taken from the environment."""
    url = expand(url)
    scheme = check_url(url)
    _require_driver(url, scheme)  # a server's driver missing: the extra that installs it, in one line
    if scheme == "journal":
        return JournalStorage(JournalFileBackend(url.split(":", 1)[1].removeprefix("//")))
    if scheme == "sqlite" and create_dir is not None:
        Path(create_dir).mkdir(parents=True, exist_ok=True)
    try:
        return RDBStorage(url, engine_kwargs={"pool_pre_ping": True} if scheme != "sqlite" else None)
    except Exception as e:  # host unreachable, bad credentials, malformed URL
        raise _cannot_open(url, e) from e
