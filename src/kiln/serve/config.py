"""A served model's configuration: read from `config.toml`, or auto-completed from the engine."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kiln.errors import ConfigError
from kiln.serve.dtypes import V2_TO_NUMPY, numpy_to_v2, to_v2, v2_to_config

PLATFORM = "kiln_plan"
DEFAULT_MAX_BATCH_SIZE = 32
PRECISIONS = ("fp32", "fp16", "bf16", "tf32")


@dataclass
class TensorConfig:
    """One input or output: v2 datatype and dims (without the batch dim when max_batch_size > 0; -1 = dynamic)."""

    name: str
    data_type: str
    dims: list[int]

    def to_json(self) -> dict:
        """Triton's model-config form."""
        return {"name": self.name, "data_type": v2_to_config(self.data_type), "dims": list(self.dims)}


@dataclass
class DynamicBatching:
    """Dynamic batcher settings (Triton's names); max_queue_size 0 = unbounded, timeout 0 = none."""

    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_microseconds: int = 0
    max_queue_size: int = 0
    reject_status: int = 503
    default_timeout_microseconds: int = 0


@dataclass
class ModelConfig:
    """Everything the server needs to know about one model; `max_batch_size` None until completed."""

    name: str
    platform: str = PLATFORM
    max_batch_size: int | None = None
    input: list[TensorConfig] = field(default_factory=list)
    output: list[TensorConfig] = field(default_factory=list)
    dynamic_batching: DynamicBatching | None = None
    instance_count: int = 1
    precision: str = "fp32"
    profiles: tuple = ()

    @classmethod
    def from_toml(cls, path: str | Path, model_path: str | Path) -> ModelConfig:
        """Read `path` (config.toml) of the model folder `model_path`; missing fields are completed on load."""
        path, folder = Path(path), Path(model_path)
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the model config: {e}") from e
        known = {"name", "platform", "max_batch_size", "input", "output", "dynamic_batching", "instance_count",
                 "instance_group", "precision", "profiles"}
        if unknown := sorted(set(raw) - known):
            raise ConfigError(f"{path}: unknown keys {unknown}; expected some of {sorted(known)}")
        name = raw.get("name", folder.name)
        if name != folder.name:
            raise ConfigError(f"{path}: name {name!r} differs from the model folder {folder.name!r}")
        count = raw.get("instance_count", 1)
        if "instance_group" in raw:  # Triton's form: [[instance_group]] count = N
            count = sum(int(g.get("count", 1)) for g in raw["instance_group"])
        db = raw.get("dynamic_batching")
        cfg = cls(name=name, platform=raw.get("platform", PLATFORM), max_batch_size=raw.get("max_batch_size"),
                  input=[_tensor(t, path, "input") for t in raw.get("input", [])],
                  output=[_tensor(t, path, "output") for t in raw.get("output", [])],
                  dynamic_batching=None if db is None else _batching(db, path), instance_count=count,
                  precision=raw.get("precision", "fp32"), profiles=_profiles(raw.get("profiles", []), path))
        cfg.check(path)
        return cfg

    @classmethod
    def auto(cls, name: str, engine) -> ModelConfig:
        """Auto-complete from the engine: batched (with a dynamic batcher) when every tensor's first dim is dynamic."""
        tensors = [*engine.inputs, *engine.outputs]
        batched = all(t.shape and not isinstance(t.shape[0], int) for t in tensors)
        mbs = _profile_max_batch(engine) if batched else 0
        skip = 1 if mbs > 0 else 0
        return cls(name=name, max_batch_size=mbs,
                   input=[_from_engine(t, skip) for t in engine.inputs],
                   output=[_from_engine(t, skip) for t in engine.outputs],
                   dynamic_batching=DynamicBatching() if mbs > 0 else None)

    def complete(self, engine) -> ModelConfig:
        """This config with what it leaves out filled from the engine, checked against the engine."""
        auto = ModelConfig.auto(self.name, engine)
        mbs = auto.max_batch_size if self.max_batch_size is None else self.max_batch_size
        if mbs > 0 and auto.max_batch_size == 0:
            raise ConfigError(f"model {self.name!r}: max_batch_size {mbs} needs a dynamic first dim on every input "
                              "and output of the engine")
        if 0 < auto.max_batch_size < mbs:
            raise ConfigError(f"model {self.name!r}: max_batch_size {mbs} exceeds the engine's profile maximum "
                              f"{auto.max_batch_size}")
        skip = 1 if mbs > 0 else 0
        ins = [_from_engine(t, skip) for t in engine.inputs]
        outs = [_from_engine(t, skip) for t in engine.outputs]
        _match(self.input, ins, self.name, "input")
        _match(self.output, outs, self.name, "output")
        return replace(self, max_batch_size=mbs, input=self.input or ins, output=self.output or outs)

    def check(self, where: object = "model config") -> None:
        """ConfigError for values out of range."""
        if self.max_batch_size is not None and self.max_batch_size < 0:
            raise ConfigError(f"{where}: max_batch_size must be >= 0, got {self.max_batch_size}")
        if self.instance_count < 1:
            raise ConfigError(f"{where}: instance count must be >= 1, got {self.instance_count}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"{where}: precision must be one of {PRECISIONS}, got {self.precision!r}")
        db = self.dynamic_batching
        if db is not None and (db.max_queue_delay_microseconds < 0 or db.max_queue_size < 0
                               or db.default_timeout_microseconds < 0 or any(p < 1 for p in db.preferred_batch_size)):
            raise ConfigError(f"{where}: dynamic_batching values must be >= 0 (preferred sizes >= 1)")
        if db is not None and db.reject_status not in (429, 503):
            raise ConfigError(f"{where}: dynamic_batching.reject_status must be 429 or 503, got {db.reject_status}")

    def to_json(self) -> dict:
        """Triton's model configuration JSON."""
        out = {"name": self.name, "platform": self.platform, "backend": "kiln",
               "max_batch_size": self.max_batch_size or 0,
               "input": [t.to_json() for t in self.input], "output": [t.to_json() for t in self.output],
               "instance_group": [{"count": self.instance_count, "kind": "KIND_AUTO"}]}
        if self.dynamic_batching is not None:
            db = self.dynamic_batching
            out["dynamic_batching"] = {"preferred_batch_size": list(db.preferred_batch_size),
                                       "max_queue_delay_microseconds": db.max_queue_delay_microseconds}
        return out


def _tensor(raw: dict, path: Path, kind: str) -> TensorConfig:
    try:
        t = TensorConfig(str(raw["name"]), to_v2(str(raw["data_type"])), [int(d) for d in raw["dims"]])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: each [[{kind}]] needs name, data_type and dims (integers): {raw}") from e
    if t.data_type not in V2_TO_NUMPY or t.data_type == "BYTES":
        raise ConfigError(f"{path}: {kind} {t.name!r}: unsupported data_type {raw['data_type']!r}")
    return t


def _batching(raw: dict, path: Path) -> DynamicBatching:
    try:
        return DynamicBatching(**raw)
    except TypeError as e:
        raise ConfigError(f"{path}: [dynamic_batching]: {e}") from e


def _profiles(raw: list, path: Path) -> tuple:
    """[[profiles]] x = {min = [1, 4], opt = [4, 4], max = [64, 4]} → BuildConfig profiles."""
    try:
        return tuple({name: (tuple(r["min"]), tuple(r.get("opt", r["max"])), tuple(r["max"]))
                      for name, r in p.items()} for p in raw)
    except (KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: each [[profiles]] maps input name → {{min, opt, max}} shapes") from e


def _profile_max_batch(engine) -> int:
    """The largest first dim every profile of the engine admits (DEFAULT_MAX_BATCH_SIZE without profiles)."""
    profiles = engine.config.profiles
    if not profiles:
        return DEFAULT_MAX_BATCH_SIZE
    return max(min(r.max[0] for r in p.values() if len(r.max) > 0) for p in profiles)


def _from_engine(t, skip: int) -> TensorConfig:
    dims = [d if isinstance(d, int) else -1 for d in (t.shape or ())[skip:]]
    return TensorConfig(t.name, numpy_to_v2(np.dtype(t.dtype.value)), dims)


def _match(given: list[TensorConfig], actual: list[TensorConfig], model: str, kind: str) -> None:
    """ConfigError where the config's tensors disagree with the engine's."""
    if not given:
        return
    by_name = {t.name: t for t in actual}
    if sorted(by_name) != sorted(t.name for t in given):
        raise ConfigError(f"model {model!r}: config {kind}s {[t.name for t in given]} differ from the engine's "
                          f"{sorted(by_name)}")
    for t in given:
        a = by_name[t.name]
        if t.data_type != a.data_type:
            raise ConfigError(f"model {model!r}: {kind} {t.name!r} is {a.data_type} in the engine, not {t.data_type}")
        if len(t.dims) != len(a.dims) or any(x != y and -1 not in (x, y) for x, y in zip(t.dims, a.dims)):
            raise ConfigError(f"model {model!r}: {kind} {t.name!r} dims {t.dims} do not match the engine's {a.dims}")
