"""Plan file v2: fixed prefix + JSON header (readable alone) + payload (manifest JSON + safetensors).

    b"KILNPLAN" | u32 format | u32 header_len | header sha256 | header JSON | u64 manifest_len | manifest JSON
    | safetensors

The header carries versions, the device fingerprint, the source model's and the payload's
sha256; header and payload are each hashed before any of them is parsed. Plans are data: no pickle, ever.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import safetensors.torch
import torch

from kiln.engine import signing
from kiln.util.safe_json import loads_json, printable
from kiln.errors import PlanError
from kiln.util import files
from kiln.version import __version__

MAGIC = b"KILNPLAN"
KIND = files.magic_kind("kiln plan", "model.plan", MAGIC)
FORMAT_VERSION = 2
PREFIX = struct.Struct("<8sII32s")  # magic, format, header length, sha256 of the header bytes
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
    return pack_header(header) + payload


def pack_header(header: dict) -> bytes:
    """The fixed prefix (with the header's sha256) and the header JSON."""
    h = _json_dumps(header)
    return PREFIX.pack(MAGIC, FORMAT_VERSION, len(h), hashlib.sha256(h).digest()) + h


def unpack(data: bytes) -> tuple[dict, bytes]:
    """(header, payload) of a well-formed plan's bytes, unchecked: for tools and tests that edit plans."""
    hlen = PREFIX.unpack(data[:PREFIX.size])[2]
    return json.loads(data[PREFIX.size:PREFIX.size + hlen]), data[PREFIX.size + hlen:]


def write(path: str | os.PathLike, data: bytes, force: bool = False) -> Path:
    """Write `data` to `path` under kiln's write policy (kiln.util.files): atomic, no links, replaces only a plan
    unless `force`."""
    return files.write(path, data, KIND, force=force, what="plan file", error=PlanError)


def _explain_foreign(start: bytes) -> str:
    if start[:2] == b"PK":
        return "it is a zip archive (torch.save checkpoints are zip files holding pickles); kiln refuses pickled files"
    if start[:1] == b"\x80":
        return "it looks like a Python pickle; kiln refuses pickled files"
    if start[:1] == b"\x08":
        return "it looks like an ONNX model; build it first with `kiln build`"
    return "bad magic bytes"


def plan_file(path) -> Path:
    """`path` as a Path to an existing regular file, or a PlanError saying what it is instead."""
    return files.existing_file(path, "plan file", PlanError)


def read_header(path: str | os.PathLike) -> dict:
    """Read and check only the header; the payload is not touched."""
    path = plan_file(path)
    with open(path, "rb") as f:
        return _read_header(f, path)[0]


# every header key, with its type; the device fingerprint's keys are checked by compat.py
HEADER_KEYS = {"format": int, "kiln": str, "created": (int, float), "payload_bytes": int, "payload_sha256": str,
               "device": dict, "source_sha256": str, "hardware_compat": str, "rebuild": str}
OPTIONAL_HEADER_KEYS = {"retuned_from": (str, type(None)), "signature": dict}


def _read_header(f, path: Path) -> tuple[dict, int]:
    prefix = f.read(PREFIX.size)
    if len(prefix) < 12:
        raise PlanError(f"{path} is not a kiln plan: file is empty or truncated ({len(prefix)} bytes)")
    magic, version = struct.unpack("<8sI", prefix[:12])
    if magic != MAGIC:
        raise PlanError(f"{path} is not a kiln plan: {_explain_foreign(prefix)}")
    if version != FORMAT_VERSION:
        raise PlanError(f"{path} uses plan format {version}; this kiln reads format {FORMAT_VERSION} only; "
                        "rebuild the plan from its ONNX model with this kiln (`kiln build MODEL.onnx -o PLAN`)")
    if len(prefix) < PREFIX.size:
        raise PlanError(f"{path} is truncated inside its header")
    hlen, digest = PREFIX.unpack(prefix)[2:]
    if hlen > MAX_HEADER:
        raise PlanError(f"{path}: header length {hlen} is over the {MAX_HEADER} byte limit (corrupted plan)")
    raw = f.read(hlen)
    if len(raw) != hlen:
        raise PlanError(f"{path} is truncated inside its header")
    if hashlib.sha256(raw).digest() != digest:
        raise PlanError(f"{path}: header checksum mismatch (the file is corrupted or was edited); "
                        "rebuild or re-copy the plan")
    header = loads_json(raw, what=f"{path}: header", max_bytes=MAX_HEADER, max_depth=8, max_values=10_000,
                        error=PlanError, fix="the plan is corrupted; rebuild it")
    _check_header(header, path, version)
    return header, PREFIX.size + hlen


def _check_header(header: dict, path: Path, version: int) -> None:
    """Every header key present with its type, and no other: a misspelt key is never silently ignored."""
    types = HEADER_KEYS | OPTIONAL_HEADER_KEYS
    missing, unknown = [k for k in HEADER_KEYS if k not in header], [k for k in header if k not in types]
    if missing or unknown:
        what = f"lacks {missing}" if missing else f"has unknown keys {printable(unknown)}"
        raise PlanError(f"{path}: header {what} (the plan is corrupted or was edited); rebuild the plan")
    for key, value in header.items():
        if isinstance(value, bool) or not isinstance(value, types[key]):
            raise PlanError(f"{path}: header {key!r} is a {type(value).__name__}, which is not valid; "
                            "rebuild the plan")
    if header["format"] != version or header["payload_bytes"] < 0:
        raise PlanError(f"{path}: header format {header['format']} or payload size {header['payload_bytes']} "
                        "is invalid (corrupted plan); rebuild the plan")


def read(path: str | os.PathLike, verify_key=None, check_header: Callable[[dict], None] | None = None) -> Plan:
    """Read a whole plan: header, its signature (when `verify_key` is given), `check_header(header)` (e.g. device
    compatibility, decided from the header alone), payload checksum, then manifest and tensors."""
    path = plan_file(path)
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
