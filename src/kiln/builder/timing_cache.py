"""The persistent timing cache: sqlite, one row per (device, software versions, layer signature).

Shared across builds and models. Every write is a short transaction under a file lock, so
concurrent builds never corrupt it; a damaged file is reported, never trusted. kiln writes only to caches it
created (marked with PRAGMA application_id), checked read-only before the first write.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from kiln.errors import ConfigError
from kiln.util.safe_json import loads_json

SCHEMA = """CREATE TABLE IF NOT EXISTS timings (
    env TEXT NOT NULL, signature TEXT NOT NULL, tactic TEXT NOT NULL, config TEXT NOT NULL,
    microseconds REAL, PRIMARY KEY (env, signature))"""
MAX_ROWS_READ = 1_000_000
MAX_FILE_BYTES = 1 << 30
MAX_TACTIC_CHARS = 128
MAX_CONFIG_BYTES = 64 << 10
COLUMNS = ["env", "signature", "tactic", "config", "microseconds"]
APPLICATION_ID = 0x4B494C4E  # "KILN"; 0 in caches of kiln versions before the marker
OBJECTS = {("table", "timings"), ("index", "sqlite_autoindex_timings_1")}


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
        if self.path.exists() and self.path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"timing cache {self.path} is over {MAX_FILE_BYTES >> 20} MiB; delete it and rebuild")
        lock = Path(str(self.path) + ".lock")
        if lock.is_symlink() or (lock.exists() and not lock.is_file()):
            raise ConfigError(f"lock file {lock} of timing cache {self.path} is not a regular file; remove it")
        self.lock = FileLock(str(lock), timeout=60)
        self.hits = self.misses = self.invalid = 0
        with self.lock:
            if self.path.exists() and self.path.stat().st_size:
                self._check_ours()
            with self._connect() as db:
                self._query(db, SCHEMA)
                self._query(db, f"PRAGMA application_id = {APPLICATION_ID}")
                self._check_schema(db)

    def _check_ours(self) -> None:
        """Refuse, reading only, a file kiln did not create: kiln's application_id (or 0) and kiln's table alone."""
        uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode=ro"
        try:
            db = sqlite3.connect(uri, uri=True, timeout=30)
            try:
                db.execute("PRAGMA trusted_schema = OFF")
                app_id = db.execute("PRAGMA application_id").fetchone()[0]
                objects = set(db.execute("SELECT type, name FROM sqlite_master").fetchall())
                cols = [r[1] for r in db.execute("PRAGMA table_info(timings)").fetchall()]
            finally:
                db.close()
        except sqlite3.DatabaseError as e:
            raise self._damaged(e) from None
        extra = sorted(objects - OBJECTS)
        if app_id not in (APPLICATION_ID, 0):
            why = f"its application_id is {app_id:#x}, not kiln's"
        elif extra:
            why = f"it holds {extra[0][0]} {extra[0][1]!r}"
        elif cols != COLUMNS:
            why = f"table timings has columns {cols}" if cols else "it lacks kiln's timings table"
        else:
            return
        raise ConfigError(f"timing cache {self.path} is not a kiln timing cache ({why}: another program's database, "
                          "or one changed since kiln made it); kiln left it untouched: pass a new path with "
                          "--timing-cache")

    def _damaged(self, e) -> ConfigError:
        return ConfigError(f"timing cache {self.path} is not a kiln timing cache ({e}); "
                           "delete it or give another path")

    def _connect(self) -> sqlite3.Connection:
        """A connection that never runs SQL stored in the file (triggers, views: trusted_schema off)."""
        try:
            db = sqlite3.connect(self.path, timeout=30)
            db.execute("PRAGMA trusted_schema = OFF")
            db.execute("SELECT name FROM sqlite_master LIMIT 1")
            return db
        except sqlite3.DatabaseError as e:
            raise self._damaged(e) from None

    def _query(self, db: sqlite3.Connection, sql: str, args=()) -> sqlite3.Cursor:
        try:
            return db.execute(sql, args)
        except sqlite3.Error as e:  # a damaged or foreign file found mid-use
            raise self._damaged(e) from None

    def _check_schema(self, db: sqlite3.Connection) -> None:
        """Only kiln's table, with kiln's columns: a file holding triggers or views is refused."""
        kinds = self._query(db, "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view')").fetchall()
        if kinds:
            raise self._damaged(f"it holds {kinds[0][0]} {kinds[0][1]!r}")
        cols = [r[1] for r in self._query(db, "PRAGMA table_info(timings)").fetchall()]
        if cols != COLUMNS:
            raise self._damaged(f"table timings has columns {cols}")

    def _valid(self, row) -> CachedChoice | None:
        """The row as a CachedChoice if every value has the type and size kiln writes, else None."""
        tactic, config, us = row
        if not isinstance(tactic, str) or not 0 < len(tactic) <= MAX_TACTIC_CHARS:
            return None
        if not isinstance(config, str) or len(config) > MAX_CONFIG_BYTES:
            return None
        if us is not None and (not isinstance(us, (int, float)) or not math.isfinite(us) or us < 0):
            return None
        try:
            value = loads_json(config, max_bytes=MAX_CONFIG_BYTES, max_depth=4, max_values=1000)
        except ConfigError:
            return None
        if not all(isinstance(v, (str, int, float, bool)) or v is None for v in value.values()):
            return None
        return CachedChoice(tactic, value, None if us is None else float(us))

    def get(self, env: str, signature: str) -> CachedChoice | None:
        """The cached choice, or None (a miss; a row with values of the wrong type or size counts as invalid)."""
        with self._connect() as db:
            row = self._query(db, "SELECT tactic, config, microseconds FROM timings WHERE env=? AND signature=?",
                              (env, signature)).fetchone()
        choice = None if row is None else self._valid(row)
        if choice is None:
            self.misses += 1
            self.invalid += row is not None
            return None
        self.hits += 1
        return choice

    def put(self, env: str, signature: str, choice: CachedChoice) -> None:
        with self.lock, self._connect() as db:
            self._query(db, SCHEMA)
            self._query(db, "INSERT OR REPLACE INTO timings VALUES (?, ?, ?, ?, ?)",
                        (env, signature, choice.tactic, json.dumps(choice.config, sort_keys=True),
                         choice.microseconds))

    def __len__(self) -> int:
        with self._connect() as db:
            return self._query(db, "SELECT COUNT(*) FROM timings").fetchone()[0]
