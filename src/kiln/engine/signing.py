"""Optional Ed25519 signatures on plans, with keys the user holds (the `cryptography` package).

The signature covers the plan header, which holds the payload's sha256, so it covers the whole plan.
`kiln keygen -o KEY` writes KEY (private, PEM PKCS#8, mode 0600) and KEY.pub (public, PEM).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

try:  # signing is optional: a machine without `cryptography` loads and runs unsigned plans
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
except ImportError as e:  # pragma: no cover - exercised only where the package is missing
    _MISSING = e
else:
    _MISSING = None

from kiln.errors import ConfigError, SignatureError

DOMAIN = b"kiln-plan-signature-v1\n"
MAX_KEY_FILE = 64 << 10


def _canonical(header: dict) -> bytes:
    body = {k: v for k, v in header.items() if k != "signature"}
    return DOMAIN + json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _read_key_file(path: str | os.PathLike, what: str) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist or is not a file; create one with `kiln keygen -o KEY`")
    if path.stat().st_size > MAX_KEY_FILE:
        raise ConfigError(f"{what} {path} is too large to be a key file")
    return path.read_bytes()


def _need_cryptography() -> None:
    if _MISSING is not None:
        raise ConfigError(f"plan signing needs the `cryptography` package, which does not import here ({_MISSING}); "
                          "install it with `pip install cryptography`")


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """An unencrypted Ed25519 private key in PEM (as `kiln keygen` writes it)."""
    _need_cryptography()
    try:
        key = serialization.load_pem_private_key(_read_key_file(path, "signing key"), password=None)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"signing key {path} is not an unencrypted PEM private key ({e}); "
                          "create one with `kiln keygen -o KEY`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"signing key {path} is not an Ed25519 key; create one with `kiln keygen -o KEY`")
    return key


def load_public_key(key: str | os.PathLike | Ed25519PublicKey) -> Ed25519PublicKey:
    """An Ed25519 public key: a PEM file path, or a key object."""
    _need_cryptography()
    if isinstance(key, Ed25519PublicKey):
        return key
    try:
        pub = serialization.load_pem_public_key(_read_key_file(key, "verify key"))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"verify key {key} is not a PEM public key ({e}); give the KEY.pub that "
                          "`kiln keygen` wrote") from None
    if not isinstance(pub, Ed25519PublicKey):
        raise ConfigError(f"verify key {key} is not an Ed25519 public key; give the KEY.pub that `kiln keygen` wrote")
    return pub


def generate(path: str | os.PathLike) -> tuple[Path, Path]:
    """Write a new key pair: `path` (private, 0600) and `path`.pub; never overwrites an existing file."""
    _need_cryptography()
    private, public = Path(path), Path(str(path) + ".pub")
    for p in (private, public):
        if p.exists() or p.is_symlink():
            raise ConfigError(f"{p} already exists; choose another name or delete it first")
    if not private.parent.is_dir():
        raise ConfigError(f"folder {private.parent} does not exist; create it first")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def sign(header: dict, key: Ed25519PrivateKey) -> dict:
    """The header with a `signature` entry over everything else in it."""
    sig = key.sign(_canonical(header))
    return dict(header, signature={"alg": "ed25519", "key_id": key_id(key.public_key()), "value": sig.hex()})


def verify(header: dict, key: Ed25519PublicKey, source: str) -> None:
    """Raise SignatureError unless `header` carries a valid signature by `key`."""
    sig = header.get("signature")
    if not isinstance(sig, dict):
        raise SignatureError(f"{source} is not signed, and a verify key is configured; sign plans with "
                             "`kiln build ... --sign-key KEY`, or load without --verify-key")
    if sig.get("alg") != "ed25519" or not isinstance(sig.get("value"), str):
        raise SignatureError(f"{source}: signature uses {sig.get('alg')!r}, kiln verifies ed25519 only; rebuild "
                             "and sign it with `kiln build ... --sign-key KEY`")
    try:
        key.verify(bytes.fromhex(sig["value"]), _canonical(header))
    except (InvalidSignature, ValueError):
        signer = sig.get("key_id")
        which = (f"signed by another key ({signer}, not {key_id(key)})" if signer != key_id(key)
                 else "its signature does not match its contents (the plan was modified)")
        raise SignatureError(f"{source}: {which}; refusing to load it. Rebuild and sign it with your key "
                             "(`kiln build ... --sign-key KEY`)") from None
