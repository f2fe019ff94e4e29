"""Safe loading of ONNX external data: every location must stay inside the model's folder.

kiln reads external tensors itself instead of onnx.load_external_data_for_model, rejecting
absolute paths, `..`, symlinks, hard links and ranges past the end of the file (the ONNX
path-traversal CVEs 2022-25882, 2024-27318). Unknown keys are ignored, never interpreted.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import onnx

from kiln.errors import ModelError, SecurityError

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


def load_external_data(model: onnx.ModelProto, base_dir: Path, max_bytes: int) -> int:
    """Read every external tensor into raw_data after validating its location and range; return bytes read."""
    plans = []
    total = 0
    for t in external_tensors(model):
        e = _entries(t)
        path = resolve_location(base_dir, e.get("location", ""), t.name)
        size = path.stat().st_size
        try:
            offset = int(e.get("offset", 0))
            length = int(e["length"]) if "length" in e else size - offset
        except ValueError:
            raise ModelError(f"external data of tensor {t.name!r}: offset/length are not integers") from None
        if offset < 0 or length < 0 or offset + length > size:
            raise SecurityError(f"external data of tensor {t.name!r}: range offset={offset} length={length} "
                                f"is outside {path.name} ({size} bytes)")
        total += length
        if total > max_bytes:
            raise ModelError(f"external data exceeds the {max_bytes} byte limit")
        plans.append((t, path, offset, length))
    for t, path, offset, length in plans:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        t.raw_data = data
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    return total
