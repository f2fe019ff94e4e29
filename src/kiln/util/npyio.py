"""Bounded, pickle-free reading of .npy and .npz files: names and sizes come from the headers (and the zip
directory) and are checked before any array data is read or decompressed."""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import IO, Collection

import numpy as np

from kiln.errors import InputError, ResourceLimitError

MAX_MEMBERS = 1024


def host_memory() -> int:
    """Bytes of physical memory: the most a file's arrays may take once read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows)
        return 2**40


def _header(f: IO[bytes], what: str, available: int) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from the .npy header at `f`, whose data must be exactly the `available` bytes after it."""
    try:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise InputError(f"{what} is not a readable .npy array ({' '.join(str(e).split())[:200]}); save it with "
                         "numpy.save") from None
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects (dtype {dtype}); kiln never unpickles, save numbers or text")
    need = math.prod(shape) * dtype.itemsize
    got = available - f.tell()
    if got != need:
        raise InputError(f"{what} holds {got} data bytes, but its header's shape {list(shape)} of {dtype} needs "
                         f"{need}; save it again with numpy.save")
    return shape, dtype


def _budget(what: str, need: int, max_bytes: int) -> None:
    if need > max_bytes:
        raise ResourceLimitError(f"{what} holds {need} bytes of arrays, over the limit of {max_bytes} bytes (what "
                                 "the engine's inputs take at most, or this machine's memory); use smaller arrays")


def read_npy(path: Path, max_bytes: int | None = None, mmap: bool = False) -> np.ndarray:
    """One array, its header checked against the file's size (and `max_bytes`, default the host's memory) first;
    `mmap` maps it read-only instead of reading it."""
    try:
        with open(path, "rb") as f:
            shape, dtype = _header(f, str(path), os.fstat(f.fileno()).st_size)
            if mmap:
                return np.load(path, allow_pickle=False, mmap_mode="r")
            _budget(str(path), math.prod(shape) * dtype.itemsize, host_memory() if max_bytes is None else max_bytes)
            f.seek(0)
            return np.lib.format.read_array(f, allow_pickle=False)
    except (FileNotFoundError, IsADirectoryError):
        raise InputError(f"{path} does not exist or is not a file") from None
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"{path} is not a readable .npy array ({' '.join(str(e).split())[:200]}); save it with "
                         "numpy.save") from None


def read_npz(path: Path, max_bytes: int | None = None, names: Collection[str] | None = None,
             others_ok: bool = True) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive (those in `names` if given; any other is an InputError unless `others_ok`),
    each member's name, header and declared size checked from the zip directory before anything is decompressed."""
    limit = host_memory() if max_bytes is None else max_bytes
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if len(infos) > MAX_MEMBERS:
                raise InputError(f"{path} holds {len(infos)} arrays, over kiln's limit of {MAX_MEMBERS}")
            members = {}
            for info in infos:
                name = info.filename.removesuffix(".npy")
                if name == info.filename or name in members:
                    raise InputError(f"{path}: member {info.filename!r} is not one NAME.npy array; save the file "
                                     "with numpy.savez")
                members[name] = info
            others = sorted(set(members) - set(names)) if names is not None else []
            if others and not others_ok:
                raise InputError(f"{path} holds arrays {others[:10]} that are not inputs; the inputs are "
                                 f"{sorted(names)[:10]}")
            wanted = [n for n in members if names is None or n in names]
            total = 0
            for n in wanted:
                with z.open(members[n]) as f:
                    shape, dtype = _header(f, f"{path} (array {n!r})", members[n].file_size)
                total += math.prod(shape) * dtype.itemsize
                _budget(str(path), total, limit)
            out = {}
            for n in wanted:
                with z.open(members[n]) as f:
                    out[n] = np.lib.format.read_array(f, allow_pickle=False)
            return out
    except (FileNotFoundError, IsADirectoryError):
        raise InputError(f"{path} does not exist or is not a file") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError) as e:
        raise InputError(f"{path} is not a readable .npz archive ({' '.join(str(e).split())[:200]}); save it with "
                         "numpy.savez") from None
