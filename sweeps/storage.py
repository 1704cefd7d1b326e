"""Optuna storages by URL: SQLite for one machine, a journal file for a shared filesystem, any RDB
(PostgreSQL, MySQL) for many nodes. Passwords never appear in messages."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from aiayn.common.errors import UserError
from aiayn.common.secrets import redact

RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql")


def check_url(url: str) -> str:
    """The URL's scheme, or a UserError for an unknown scheme or a journal in a missing directory
    (checked before anything is created)."""
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
    return scheme


def expand(url: str) -> str:
    """A storage URL with `$NAME` / `${NAME}` taken from the environment, so that a config file (and what
    --print-config prints) can name a password without holding it: postgresql://user:$PGPASSWORD@host/db."""
    return os.path.expandvars(url)


def open_storage(url: str, create_dir: Path | None = None) -> optuna.storages.BaseStorage:
    """`sqlite:///PATH`, `postgresql://USER:PASS@HOST/DB`, `mysql://…`, or `journal:///PATH` (a file); `$NAME` in it
    is taken from the environment."""
    url = expand(url)
    scheme = check_url(url)
    if scheme == "journal":
        return JournalStorage(JournalFileBackend(url.split(":", 1)[1].removeprefix("//")))
    if scheme == "sqlite" and create_dir is not None:
        Path(create_dir).mkdir(parents=True, exist_ok=True)
    try:
        return RDBStorage(url, engine_kwargs={"pool_pre_ping": True} if scheme != "sqlite" else None)
    except Exception as e:  # driver missing, host unreachable, bad credentials, malformed URL
        reason = redact(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__
        raise UserError(
            f"cannot open storage {redact(url)} ({reason}); check the URL, the server and its driver"
        ) from e
