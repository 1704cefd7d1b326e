"""Atomic writes: a reader (or a kill) sees the old file or the new one, never half of one."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from aiayn.common.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


PATH_MAX, NAME_MAX = 4095, 255  # bytes, Linux's limits on a path and on one of its names


def check_path_length(path: str | os.PathLike, flag: str) -> None:
    """A UserError (that does not echo the path) for a path the system refuses by its length alone: an OSError
    ENAMETOOLONG from the first stat otherwise, with the whole path (a 900 KB `out:` in a config) in it."""
    raw = os.fsencode(os.fspath(path))
    longest = max((len(name) for name in raw.split(b"/")), default=0)
    if len(raw) > PATH_MAX or longest > NAME_MAX:
        raise UserError(
            f"{flag}: a path of {len(raw)} bytes with a name of {longest} (at most {PATH_MAX} and "
            f"{NAME_MAX}); pass a shorter path"
        )


def check_links(path: str | os.PathLike, flag: str) -> None:
    """A UserError when `path` or a folder above it is a symbolic link that leads nowhere (to a path that does not
    exist, or around a loop): making the folder would fail with a traceback (FileExistsError, ELOOP)."""
    import errno

    for p in (Path(path).absolute(), *Path(path).absolute().parents):
        if not p.is_symlink():
            continue
        try:
            os.stat(p)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UserError(
                    f"{flag} {path}: {p} is a symbolic link that loops; remove it or pass another {flag}"
                ) from None
            raise UserError(
                f"{flag} {path}: {p} is a symbolic link to {os.readlink(p)}, which does not exist; create it or "
                f"pass another {flag}"
            ) from None


def check_writable_dir(directory: str | os.PathLike, flag: str = "--out") -> None:
    """A UserError unless `directory` exists as a writable directory or can be created (checked on the
    nearest existing ancestor, so nothing is created here). A regular file in the path is caught even
    as root, where permission bits do not stop writes; so is a symbolic link that leads nowhere."""
    check_path_length(directory, flag)
    check_links(directory, flag)
    directory = Path(directory)
    probe = nearest_existing(directory)
    if not probe.is_dir():
        raise UserError(f"output directory {directory} cannot be created: {probe} is not a directory; pass {flag} DIR")
    if not can_create_in(probe):
        raise UserError(f"output directory {directory} is not writable (nearest existing: {probe}); pass {flag} DIR")


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path` made absolute, or its nearest ancestor that exists: where a check of what would be created looks."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def can_create_in(directory: Path) -> bool:
    """Whether a file can be created in `directory`, by creating one and removing it: os.access says yes to root
    where the filesystem says no (/proc, /sys, a read-only mount)."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".aiayn-probe.")
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file `.NAME.XXXX.tmp` in the target's directory (so os.replace is atomic), with
    the permissions a plain open() would give (mkstemp's are owner-only). A kill leaves such files
    behind; they are never read, and `remove_stale_temps` matches this name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o666 & ~_umask())
    return fd, tmp


def remove_stale_temps(directory: Path) -> list[Path]:
    """Temporary files of atomic writes that a kill left behind under `directory`."""
    stale = [p for p in Path(directory).rglob(".*.tmp") if p.is_file() or p.is_symlink()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def atomic_symlink(target: str | os.PathLike, link: str | os.PathLike) -> None:
    """Point `link` at `target`, replacing any link there in one rename."""
    link = Path(link)
    fd, tmp = temp_beside(link)
    os.close(fd)
    os.unlink(tmp)  # the name only: a symlink cannot be created over a file
    os.symlink(target, tmp)
    os.replace(tmp, link)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", need: int | None = None):
    """A file to write `path` through: on success it is fsynced and renamed over `path`; on any error
    (or a kill) `path` keeps its old content or stays absent, and the temporary file is removed. A write the disk
    has no room for is a `DiskFull` naming the path and what it needed (`need`: bytes, where the caller knows)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_beside(path)
    os.close(fd)  # opened again by name, so that the file object's name is the temporary file's path, not a number
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            written = os.path.getsize(tmp)
        except OSError:
            written = None
        Path(tmp).unlink(missing_ok=True)
        full = disk_full(path, e, need, written) if isinstance(e, Exception) and not isinstance(e, UserError) else None
        if full is not None:
            raise full from None
        raise


def check_new_directory(directory: str | os.PathLike, flag: str = "--out") -> None:
    """A UserError unless `directory` is absent (and can be created) or an empty directory: what is
    written there never replaces anything; not a symbolic link (the final rename replaces a name, not what a link
    leads to: one that leads nowhere or loops was a traceback after everything was built)."""
    check_links(directory, flag)
    directory = Path(directory)
    if directory.is_symlink():
        raise UserError(
            f"{flag} {directory} is a symbolic link to {os.readlink(directory)}; pass the directory it leads to, or "
            "a new one"
        )
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{flag} {directory} exists and is not a directory; pass a new directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise UserError(f"{flag} {directory} is not empty; pass a new or empty directory (nothing is overwritten)")
    check_writable_dir(directory.parent, flag)


@contextmanager
def atomic_directory(path: str | os.PathLike, flag: str = "--out"):
    """A temporary directory to build `path` in, beside it (`.NAME.XXXX.tmp`), renamed to `path` when the
    block succeeds (its files fsynced, with the permissions a plain open() gives); on any error, or a kill,
    `path` stays as it was (absent or empty) and the temporary directory is removed (a kill leaves it, under
    that name). `path` must be absent or empty (`check_new_directory`)."""
    path = Path(path)
    check_new_directory(path, flag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():  # as open() would make it (some writers make their files owner-only)
                os.chmod(file, 0o666 & ~_umask())
                fd = os.open(file, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        os.rename(tmp, path)  # over an empty directory too (POSIX rename)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # a third-party writer's full disk (safetensors' SafetensorError, a tokenizer's OSError) as aiayn's own
        full = disk_full(path, e, None) if isinstance(e, Exception) and not isinstance(e, UserError) else None
        if full is not None:
            raise full from None
        raise


def read_user_text(path: str | os.PathLike, what: str, limit: int, fix: str) -> str:
    """The UTF-8 text of a file a user names (a config, a table, a search space): one line when it is not a regular
    file (a directory, /dev/zero or /dev/urandom, a FIFO: read whole, those never end or ran out of memory), when it
    is larger than `limit` bytes, or when it cannot be read; `what` names it ("config x.yaml"), `fix` ends the line."""
    import stat

    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UserError(f"{what} does not exist; {fix}") from None
    except OSError as e:
        raise UserError(f"cannot read {what} ({e.strerror or type(e).__name__}); {fix}") from None
    if not stat.S_ISREG(st.st_mode):
        mode = st.st_mode
        kind = (
            "a directory"
            if stat.S_ISDIR(mode)
            else "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise UserError(f"{what} is {kind}, not a file; {fix}")
    if st.st_size > limit:
        raise UserError(
            f"{what} is {st.st_size / 2**20:.1f} MB, more than such a file can be (at most {limit / 2**20:g} MB); {fix}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(limit + 1)[:limit]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what} ({getattr(e, 'strerror', None) or type(e).__name__}); {fix}") from None


def read_record(path: str | os.PathLike, limit: int) -> str:
    """The UTF-8 text of a file a run or a report left (metrics.json, a curve, dev.hyp), read as `read_user_text`
    reads a user's: a ValueError with the one-line reason when it is not a regular file (a link to /dev/zero was read
    forever), is larger than `limit` bytes or cannot be read, so that its reader skips it and says why."""
    try:
        return read_user_text(path, Path(path).name, limit, "skipped")
    except UserError as e:
        raise ValueError(str(e).removesuffix("; skipped")) from None


JSON_MAX_DEPTH = 32  # the deepest JSON aiayn writes is 5 levels; a record nested deeper is no record of ours


def parse_json(text: str, kind: type = dict):
    """JSON that aiayn reads (a record, a reference's provenance, a sweep's books): a ValueError with one line where it
    is not JSON, nests deeper than JSON_MAX_DEPTH (5,000 `[` made the parser raise RecursionError, which no reader
    caught), or is not a `kind` at its top (a mapping, for every file aiayn writes)."""
    import json

    depth = deepest = 0
    in_string = escaped = False
    for c in text:  # the nesting, counted before parsing: the parser's own recursion is what must not be reached
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > JSON_MAX_DEPTH:
                raise ValueError(f"nested deeper than {JSON_MAX_DEPTH} levels: not a file aiayn writes")
        elif c in "]}":
            depth -= 1
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    if not isinstance(doc, kind):
        raise ValueError(f"not a JSON {'object' if kind is dict else kind.__name__} at its top")
    return doc


def read_json(path: str | os.PathLike, limit: int = 1 << 24, kind: type = dict):
    """A JSON file aiayn reads (`read_record`'s guards: a regular file, at most `limit` bytes; `parse_json`'s: JSON,
    not nested deeper than JSON_MAX_DEPTH, a `kind` at its top): a ValueError with the one-line reason otherwise."""
    return parse_json(read_record(path, limit), kind)


def check_writable_file(path: str | os.PathLike, flag: str) -> None:
    """A UserError unless `path` can be written as a file: its directory exists or can be created, and it is not a
    directory itself (checked before any work, so a command does not compute everything and then fail to write)."""
    check_path_length(path, flag)
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory; pass a file name (e.g. {path / 'out.txt'})")
    probe = nearest_existing(path.absolute().parent)
    if not probe.is_dir() or not can_create_in(probe):
        raise UserError(
            f"{flag} {path} cannot be written: {probe} is not a directory you can write; pass {flag} a "
            "path you can write"
        )


class DiskFull(UserError):
    """A write that the filesystem refused for want of space: one line naming the file and what it needed."""


def file_size_limit() -> int | None:
    """This process's largest file in bytes (`ulimit -f`), or None where there is none."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def disk_full(path: Path, error: BaseException, need: int | None, written: int | None = None) -> DiskFull | None:
    """The DiskFull a failed write of `path` means, or None when space is not what failed: an OSError ENOSPC, or any
    error of a writer (torch's zip writer says "unexpected pos") on a filesystem left with less than it needed; or a
    file larger than the process may write (EFBIG, or a writer's error once `written` bytes reached `ulimit -f`)."""
    limit = file_size_limit()
    too_big = isinstance(error, OSError) and error.errno == errno.EFBIG
    if limit is not None and (too_big or (written or 0) >= limit or (need or 0) > limit):
        needs = f" (it needs about {_size(need)})" if need else ""
        return DiskFull(
            f"cannot write {path}: larger than this process's file-size limit, {_size(limit)} (ulimit -f)"
            f"{needs}; raise the limit (ulimit -f unlimited) or write somewhere without one"
        )
    if isinstance(error, OSError) and error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if not (isinstance(error, OSError) or (free is not None and free < max(need or 0, 1 << 20))):
        return None
    needs = f"about {_size(need)}" if need else "more space"
    left = f", {_size(free)} free" if free is not None else ""
    return DiskFull(
        f"no space left to write {path} (it needs {needs}{left}); free space on that disk or write "
        "somewhere with room (e.g. --out on another disk)"
    )


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_open(path) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def atomic_torch_save(obj, path: str | os.PathLike) -> Path:
    import torch  # lazily: the CLI's light commands import this module without torch

    with atomic_open(path, "wb", need=_tensor_bytes(obj)) as f:
        torch.save(obj, f)
    return Path(path)


def _tensor_bytes(obj) -> int:
    """The bytes of the tensors in `obj` (nested dicts, lists, tuples): about what torch.save writes."""
    if hasattr(obj, "nbytes") and hasattr(obj, "untyped_storage"):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


class UnsafeFile(UserError):
    """A torch file that holds more than tensors and plain data (a pickled object would run code on loading)."""


def load_torch_file(path: str | os.PathLike, **kwargs):
    """`torch.load` with weights_only=True: tensors, numbers, strings, bytes, lists, tuples and dicts only, so
    that a file from someone else cannot run code here (a pickled object can: its class is called on loading).
    A file that holds anything else is an :class:`UnsafeFile` naming what it holds; other errors (a truncated
    or foreign file) pass through."""
    import pickle

    import torch  # lazily, as atomic_torch_save

    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        # torch words the refusal by what it met: "Unsupported global: GLOBAL mod.Class was not an allowed global"
        # for a class, "Trying to load unsupported GLOBAL posix.system whose module posix is blocked" for a callable
        # a __reduce__ smuggles in (torch 2.13); both name it after GLOBAL
        found = re.search(r"\bGLOBAL (\S+)", str(e))
        if found is None and "Weights only load failed" not in str(e):  # random bytes and other damage
            raise
        what = f" ({found[1]})" if found else ""
        raise UnsafeFile(
            f"{path} holds a pickled Python object{what}, which could run code when loaded; aiayn loads tensors and "
            f"plain data only: use a checkpoint that aiayn wrote"
        ) from None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    return sha256_bytes(Path(path).read_bytes())
