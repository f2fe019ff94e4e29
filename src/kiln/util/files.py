"""The one policy for every file kiln writes at a path the user named (plans, outputs, exports, caches).

kiln writes a new path, an empty file, or a regular file of the same kind that kiln wrote (a plan over a plan);
any other existing file only with `force` (`--force`). Symbolic links, directories, devices, pipes and sockets
are always refused. A write is atomic (a temp file in the same folder renamed over the path), gets the mode of
the file it replaces, else 0666 less the umask, and first removes temp files an interrupted write left behind.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from kiln.errors import ConfigError, SecurityError

TEMP_PREFIX, TEMP_SUFFIX = ".kiln-", ".tmp"
STALE_SECONDS = 10 * 60
HEAD_BYTES = 4096


@dataclass(frozen=True)
class Kind:
    """A kind of file kiln writes: `name` for messages, `example` a file name, `ours(head)` whether a file starting
    with the bytes `head` is one."""

    name: str
    example: str
    ours: Callable[[bytes], bool]


def magic_kind(name: str, example: str, magic: bytes) -> Kind:
    """Files that start with `magic`."""
    return Kind(name, example, lambda head: head.startswith(magic))


def json_kind(name: str, example: str, marker: str, key: str = "kiln") -> Kind:
    """JSON files whose first entry is `"key": "marker"` (write them as `{key: marker, ...}`)."""
    start = re.compile(rb'\A\s*\{\s*"' + re.escape(key.encode()) + rb'"\s*:\s*"' + re.escape(marker.encode()) + rb'"')
    return Kind(name, example, lambda head: start.match(head) is not None)


def _head(path: Path, what: str, error: type[Exception]) -> bytes:
    """The first bytes of the regular file `path` (b"" if it is not one by now; never blocks on a pipe)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as e:
        raise error(f"cannot read {what} {path} ({e.strerror}) to tell whether kiln wrote it; name a new path, or "
                    "pass --force (force=True) to replace it") from None
    try:
        return os.read(fd, HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


def check(path: str | os.PathLike, kind: Kind, *, force: bool = False, what: str = "output file",
          error: type[Exception] = ConfigError) -> Path:
    """`path` as a Path if the policy lets kiln write it, else the error saying why and what to do instead."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    if st is None:
        pass
    elif stat.S_ISLNK(st.st_mode):
        raise SecurityError(f"{what} {path} is a symbolic link; kiln never writes through links: remove the link "
                            "or name another path")
    elif stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path} is a directory; name a file, e.g. {path / kind.example}")
    elif not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path} is not a regular file (a device, pipe or socket); kiln writes only regular "
                    "files: name a new file")
    elif st.st_size and not force and not kind.ours(_head(path, what, error)):
        raise error(f"{what} {path} already exists and is not a {kind.name} written by kiln; name a new path, "
                    "or pass --force (force=True) to replace it")
    folder = path.parent
    if not folder.is_dir():
        raise error(f"folder {folder} for {what} {path} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error(f"cannot write {what} {path}: folder {folder} is not writable; name a path in a folder you can "
                    "write to")
    return path


def _mode(path: Path) -> int:
    """The replaced file's permission bits, else 0666 less the umask (what open() would give a new file)."""
    try:
        return stat.S_IMODE(os.lstat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0o22)
        os.umask(umask)
        return 0o666 & ~umask


def clean_stale(folder: Path) -> None:
    """Remove the temp files of interrupted kiln writes in `folder`: regular, ours (same user), older than
    STALE_SECONDS (a write still running keeps its file fresh)."""
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        if not (e.name.startswith(TEMP_PREFIX) and e.name.endswith(TEMP_SUFFIX)):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and now - st.st_mtime > STALE_SECONDS:
                os.unlink(e.path)
        except OSError:
            pass


def write(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], None], kind: Kind, *,
          force: bool = False, what: str = "output file", error: type[Exception] = ConfigError) -> Path:
    """Write `data` (bytes, or a function writing to a binary file) to `path` under the policy above."""
    path = check(path, kind, force=force, what=what, error=error)
    clean_stale(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as e:
        raise error(f"cannot write {what} {path}: {e.strerror}; name a path in a folder you can write to") from None
    try:
        with os.fdopen(fd, "wb") as f:
            data(f) if callable(data) else f.write(data)
        check(path, kind, force=force, what=what, error=error)  # again: it may have changed while we wrote
        os.chmod(tmp, _mode(path))
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise error(f"cannot write {what} {path}: {e.strerror or e}; free space or name another path") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def existing_file(path, what: str, error: type[Exception]) -> Path:
    """`path` as a Path to an existing regular file, or `error` saying what it is instead (a folder, a device)."""
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"{what} path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a directory; give the path of a file inside it")
    if not path.exists():
        raise error(f"{what} {path} does not exist")
    if not path.is_file():
        raise error(f"{what} {path} is not a regular file (a device, pipe or socket); give a file")
    return path
