"""Plan file v1: fixed prefix + JSON header (readable alone) + payload (manifest JSON + safetensors).

    b"KILNPLAN" | u32 format | u32 header_len | header JSON | u64 manifest_len | manifest JSON | safetensors

The header carries versions, the device fingerprint, the source model's and the payload's
sha256; the payload is hashed before any of it is parsed. Plans are data: no pickle, ever.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import safetensors.torch
import torch

from kiln.engine import signing
from kiln.engine.safe_json import loads_json
from kiln.errors import PlanError, SecurityError
from kiln.version import __version__

MAGIC = b"KILNPLAN"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sII")
MAX_HEADER = 1 << 20
MAX_MANIFEST = 256 << 20
MAX_PLAN = 64 << 30
MAX_MANIFEST_DEPTH = 256  # control-flow bodies nest (capped at 16 levels on import), each a few JSON levels
MAX_TENSORS = 1_000_000


@dataclass
class Plan:
    """The parsed parts of a plan file."""

    header: dict
    manifest: dict
    tensors: dict[str, torch.Tensor]


def _json_dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def encode(header: dict, manifest: dict, tensors: dict[str, torch.Tensor], sign_key=None) -> bytes:
    """The plan's bytes; `sign_key` (an Ed25519 private key) adds a signature over the header."""
    m = _json_dumps(manifest)
    weights = safetensors.torch.save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    payload = struct.pack("<Q", len(m)) + m + weights
    header = {k: v for k, v in header.items() if k != "signature"}
    header = dict(header, format=FORMAT_VERSION, kiln=__version__, created=header.get("created", time.time()),
                  payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest())
    if sign_key is not None:
        header = signing.sign(header, sign_key)
    h = _json_dumps(header)
    return PREFIX.pack(MAGIC, FORMAT_VERSION, len(h)) + h + payload


def write(path: str | os.PathLike, data: bytes) -> Path:
    """Atomically write `data` to `path` (a temp file in the same folder, then rename); never follows a symlink."""
    path = Path(path)
    if path.is_symlink():
        raise SecurityError(f"{path} is a symbolic link; kiln writes plans only to regular paths")
    if path.exists() and path.is_dir():
        raise PlanError(f"{path} is a directory; give a file name such as model.plan")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise PlanError(f"folder {folder} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=".kiln-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _explain_foreign(start: bytes) -> str:
    if start[:2] == b"PK":
        return "it is a zip archive (torch.save checkpoints are zip files holding pickles); kiln refuses pickled files"
    if start[:1] == b"\x80":
        return "it looks like a Python pickle; kiln refuses pickled files"
    if start[:1] == b"\x08":
        return "it looks like an ONNX model; build it first with `kiln build`"
    return "bad magic bytes"


def read_header(path: str | os.PathLike) -> dict:
    """Read and check only the header; the payload is not touched."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"plan file {path} does not exist")
    with open(path, "rb") as f:
        return _read_header(f, path)[0]


def _read_header(f, path: Path) -> tuple[dict, int]:
    prefix = f.read(PREFIX.size)
    if len(prefix) < PREFIX.size:
        raise PlanError(f"{path} is not a kiln plan: file is empty or truncated ({len(prefix)} bytes)")
    magic, version, hlen = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise PlanError(f"{path} is not a kiln plan: {_explain_foreign(prefix)}")
    if version != FORMAT_VERSION:
        raise PlanError(f"{path} uses plan format {version}; this kiln reads format {FORMAT_VERSION}; "
                        "rebuild the plan with this kiln")
    if hlen > MAX_HEADER:
        raise PlanError(f"{path}: header length {hlen} is over the {MAX_HEADER} byte limit (corrupted plan)")
    raw = f.read(hlen)
    if len(raw) != hlen:
        raise PlanError(f"{path} is truncated inside its header")
    header = loads_json(raw, what=f"{path}: header", max_bytes=MAX_HEADER, max_depth=8, max_values=10_000,
                        error=PlanError, fix="the plan is corrupted; rebuild it")
    if not isinstance(header.get("payload_bytes"), int) or header["payload_bytes"] < 0 \
            or not isinstance(header.get("payload_sha256"), str) or not isinstance(header.get("device", {}), dict):
        raise PlanError(f"{path}: header is corrupted (payload_bytes, payload_sha256 or device missing or mistyped); "
                        "rebuild the plan")
    return header, PREFIX.size + hlen


def read(path: str | os.PathLike, verify_key=None, check_header: Callable[[dict], None] | None = None) -> Plan:
    """Read a whole plan: header, its signature (when `verify_key` is given), `check_header(header)` (e.g. device
    compatibility, decided from the header alone), payload checksum, then manifest and tensors."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"plan file {path} does not exist")
    size = path.stat().st_size
    if size > MAX_PLAN:
        raise PlanError(f"{path} is {size} bytes, over kiln's plan size limit")
    with open(path, "rb") as f:
        header, offset = _read_header(f, path)
        if verify_key is not None:
            signing.verify(header, signing.load_public_key(verify_key), str(path))
        if check_header is not None:
            check_header(header)
        expected = int(header["payload_bytes"])
        if offset + expected != size:
            raise PlanError(f"{path} is truncated or has trailing bytes: header says {offset + expected} "
                            f"bytes, file has {size}; rebuild or re-copy the plan")
        payload = f.read()
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise PlanError(f"{path}: payload checksum mismatch (the file is corrupted); rebuild or re-copy the plan")
    if len(payload) < 8:
        raise PlanError(f"{path}: payload too short")
    (mlen,) = struct.unpack("<Q", payload[:8])
    if mlen > min(MAX_MANIFEST, len(payload) - 8):
        raise PlanError(f"{path}: manifest length {mlen} is invalid")
    manifest = loads_json(payload[8:8 + mlen], what=f"{path}: manifest", max_bytes=MAX_MANIFEST,
                          max_depth=MAX_MANIFEST_DEPTH, allow_nan=True, error=PlanError, fix="rebuild the plan")
    blob = payload[8 + mlen:]
    try:
        tensors = safetensors.torch.load(blob)
    except Exception as e:  # safetensors raises its own error types; a pickle or zip is named as such
        foreign = _explain_foreign(blob[:8])
        detail = foreign if foreign != "bad magic bytes" else str(e)
        raise PlanError(f"{path}: weights section is not valid safetensors ({detail})") from None
    if len(tensors) > MAX_TENSORS:
        raise PlanError(f"{path} holds {len(tensors)} tensors, over the {MAX_TENSORS} limit (corrupted plan)")
    return Plan(header, manifest, tensors)
