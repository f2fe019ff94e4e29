"""The persistent timing cache: sqlite, one row per (device, software versions, layer signature).

Shared across builds and models. Every write is a short transaction under a file lock, so
concurrent builds never corrupt it; a damaged file is reported, never trusted.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from kiln.errors import ConfigError

SCHEMA = """CREATE TABLE IF NOT EXISTS timings (
    env TEXT NOT NULL, signature TEXT NOT NULL, tactic TEXT NOT NULL, config TEXT NOT NULL,
    microseconds REAL, PRIMARY KEY (env, signature))"""
MAX_ROWS_READ = 1_000_000


@dataclass(frozen=True)
class CachedChoice:
    tactic: str
    config: dict
    microseconds: float | None


def environment_key(fingerprint: dict) -> str:
    """Everything outside the layer that can change the answer: device and kiln/torch/triton/CUDA versions."""
    keys = ("name", "cc", "sms", "kiln", "torch", "triton", "cuda", "driver")
    env = {k: fingerprint.get(k) for k in keys}
    if fingerprint.get("hardware_compat", "none") != "none":  # a compat build searches fewer configs
        env["hardware_compat"] = fingerprint["hardware_compat"]
    return json.dumps(env, sort_keys=True)


class TimingCache:
    """Best tactic per layer signature, read at build start and written as layers are tuned."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise ConfigError(f"timing cache {self.path} is not a regular file; give a file path")
        if not self.path.parent.is_dir():
            raise ConfigError(f"folder of timing cache {self.path} does not exist; create it first")
        self.lock = FileLock(str(self.path) + ".lock", timeout=60)
        self.hits = self.misses = 0
        with self.lock, self._connect() as db:
            db.execute(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=30)
            db.execute("SELECT name FROM sqlite_master LIMIT 1")
            return db
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"timing cache {self.path} is not a kiln timing cache ({e}); "
                              "delete it or give another path") from None

    def get(self, env: str, signature: str) -> CachedChoice | None:
        with self._connect() as db:
            row = db.execute("SELECT tactic, config, microseconds FROM timings WHERE env=? AND signature=?",
                             (env, signature)).fetchone()
        if row is None:
            self.misses += 1
            return None
        try:
            config = json.loads(row[1])
            if not isinstance(config, dict) or not isinstance(row[0], str):
                raise ValueError
        except ValueError:
            self.misses += 1
            return None
        self.hits += 1
        return CachedChoice(row[0], config, row[2])

    def put(self, env: str, signature: str, choice: CachedChoice) -> None:
        with self.lock, self._connect() as db:
            db.execute(SCHEMA)
            db.execute("INSERT OR REPLACE INTO timings VALUES (?, ?, ?, ?, ?)",
                       (env, signature, choice.tactic, json.dumps(choice.config, sort_keys=True),
                        choice.microseconds))

    def __len__(self) -> int:
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM timings").fetchone()[0]
