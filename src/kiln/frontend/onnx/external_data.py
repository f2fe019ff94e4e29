"""Safe loading of ONNX external data: every location must stay inside the model's folder.

kiln reads external tensors itself instead of onnx.load_external_data_for_model, rejecting
absolute paths, `..`, symlinks, hard links and ranges past the end of the file (the ONNX
path-traversal CVEs 2022-25882, 2024-27318). Unknown keys are ignored, never interpreted.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import onnx

from kiln.errors import ModelError, ResourceLimitError, SecurityError

_KNOWN_KEYS = {"location", "offset", "length", "checksum"}


def external_tensors(model: onnx.ModelProto):
    """Every TensorProto of the model (initializers, Constant attributes, subgraphs) stored externally."""
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL:
            yield t


def _entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data if e.key in _KNOWN_KEYS}


def resolve_location(base_dir: Path, location: str, tensor_name: str) -> Path:
    """Return the real path of `location`, or raise SecurityError if it leaves `base_dir`."""
    what = f"external data of tensor {tensor_name!r} (location {location!r})"
    if not location or "\x00" in location:
        raise SecurityError(f"{what}: empty or invalid location")
    p = Path(location)
    if p.is_absolute() or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise SecurityError(f"{what}: absolute paths are not allowed; keep data files beside the model")
    if ".." in p.parts or ".." in location.replace("\\", "/").split("/"):
        raise SecurityError(f"{what}: '..' is not allowed; keep data files beside the model")
    base = base_dir.resolve()
    full = base / p
    # refuse a symlink at any step between base and the file
    cur = base
    for part in p.parts:
        cur = cur / part
        if cur.is_symlink():
            raise SecurityError(f"{what}: symbolic links are not allowed")
    if not full.resolve().is_relative_to(base):
        raise SecurityError(f"{what}: resolves outside the model's folder {base}")
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        raise ModelError(f"{what}: file {full} does not exist; copy it beside the model") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecurityError(f"{what}: not a regular file")
    if st.st_nlink > 1:
        raise SecurityError(f"{what}: hard-linked files are not allowed; copy the data file instead")
    return full


def open_inside(base_dir: Path, path: Path, what: str) -> int:
    """Open `path` (under `base_dir`) read-only with O_NOFOLLOW at every step below the folder: the only handle
    read, so a file swapped for a link after `resolve_location` checked it is refused, not followed."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    *folders, name = path.relative_to(base_dir.resolve()).parts
    try:
        if os.open not in os.supports_dir_fd:  # no openat (Windows): O_NOFOLLOW-less open, then fstat below
            return os.open(path, flags | getattr(os, "O_BINARY", 0))
        fd = os.open(base_dir.resolve(), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            for part in folders:
                nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nxt
            return os.open(name, flags | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)  # NONBLOCK: a FIFO never hangs
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise ModelError(f"{what}: file {path} does not exist; copy it beside the model") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise SecurityError(f"{what}: symbolic links are not allowed") from None
        raise ModelError(f"{what}: cannot open {path}: {e.strerror}") from None


def _read_range(fd: int, what: str, offset_text: str | None, length_text: str | None, used: int,
                max_bytes: int) -> bytes:
    """Check the open file (regular, one link, the range inside it, `used` + its length within `max_bytes`) and
    read the range through `fd`."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SecurityError(f"{what}: not a regular file")
    if st.st_nlink > 1:
        raise SecurityError(f"{what}: hard-linked files are not allowed; copy the data file instead")
    try:
        offset = int(offset_text or 0)
        length = int(length_text) if length_text is not None else st.st_size - offset
    except ValueError:
        raise ModelError(f"{what}: offset/length are not integers") from None
    if offset < 0 or length < 0 or offset + length > st.st_size:
        raise SecurityError(f"{what}: range offset={offset} length={length} is outside the file "
                            f"({st.st_size} bytes)")
    if used + length > max_bytes:
        raise ResourceLimitError(f"{what}: external data exceeds kiln's limit of {max_bytes} bytes in all; "
                                 "check the model's data files")
    with os.fdopen(fd, "rb", closefd=False) as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise ModelError(f"{what}: the file shrank while kiln read it; read the model again")
    return data


def load_external_data(model: onnx.ModelProto, base_dir: Path, max_bytes: int) -> int:
    """Read every external tensor into raw_data after validating its location and range; return bytes read."""
    total = 0
    for t in list(external_tensors(model)):
        e = _entries(t)
        what = f"external data of tensor {t.name!r} (location {e.get('location', '')!r})"
        path = resolve_location(base_dir, e.get("location", ""), t.name)
        fd = open_inside(base_dir, path, what)
        try:
            data = _read_range(fd, what, e.get("offset"), e.get("length"), total, max_bytes)
        finally:
            os.close(fd)
        total += len(data)
        t.raw_data = data
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    return total
