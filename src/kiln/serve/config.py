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
class Padding:
    """`[dynamic_batching.padding]`: requests whose `inputs` differ only along `axis` (0 is the batch dim) are merged,
    each input right-padded to the longest with its pad value; `outputs` follow the padded length along `axis` and
    are sliced back to each request's own length."""

    axis: int
    inputs: dict[str, int | float]
    outputs: list[str] = field(default_factory=list)
    length_multiple: int | None = None  # padded lengths rounded up to a multiple (None: 16 on a GPU, else 1)


@dataclass
class DynamicBatching:
    """Dynamic batcher settings (Triton's names); max_queue_size 0 = unbounded, timeout 0 = none."""

    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_microseconds: int = 0
    max_queue_size: int = 0
    reject_status: int = 503
    default_timeout_microseconds: int = 0
    padding: Padding | None = None
    # kiln's own: a batch is padded up to the smallest of these row counts that holds it, so a GPU engine meets few
    # shapes (one CUDA graph each) instead of every count up to max_batch_size; None: the powers of two, the
    # preferred sizes and max_batch_size on a GPU, nothing on the CPU; [] never pads
    batch_buckets: list[int] | None = None
    # kiln's own (Triton's model_warmup): on load, run every execution context once at each batch bucket (zeros), so
    # no request pays a bucket's first call (CUDA graph capture, plans); None: on wherever there are buckets and no
    # padding (each bucket is then one shape)
    warmup: bool | None = None


@dataclass(frozen=True)
class VersionPolicy:
    """Triton's version_policy: the `latest` N versions (default 1), `all` of them, or the `specific` ones."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of the `available` version folders, ascending."""
        ordered = sorted(set(available))
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return sorted(set(self.versions))
        return ordered[-self.num_versions:]

    def to_json(self) -> dict:
        """Triton's model-config form."""
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": sorted(set(self.versions))}}
        return {"latest": {"num_versions": self.num_versions}}


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
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)

    @classmethod
    def from_toml(cls, path: str | Path, model_path: str | Path) -> ModelConfig:
        """Read `path` (config.toml) of the model folder `model_path`; missing fields are completed on load."""
        path, folder = Path(path), Path(model_path)
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the model config: {e}") from e
        known = {"name", "platform", "max_batch_size", "input", "output", "dynamic_batching", "instance_count",
                 "instance_group", "precision", "profiles", "version_policy"}
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
                  precision=raw.get("precision", "fp32"), profiles=_profiles(raw.get("profiles", []), path),
                  version_policy=_version_policy(raw.get("version_policy"), path, folder))
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
        done = replace(self, max_batch_size=mbs, input=self.input or ins, output=self.output or outs)
        if done.dynamic_batching is not None and done.dynamic_batching.padding is not None:
            _check_padding(done, done.dynamic_batching.padding, ins, outs)
        return done

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
                               or db.default_timeout_microseconds < 0 or any(p < 1 for p in db.preferred_batch_size)
                               or any(not _is_int(b) or b < 1 for b in db.batch_buckets or ())):
            raise ConfigError(f"{where}: dynamic_batching values must be >= 0 (preferred sizes and batch buckets "
                              ">= 1)")
        if db is not None and db.warmup not in (None, True, False):
            raise ConfigError(f"{where}: dynamic_batching.warmup must be true or false, got {db.warmup!r}")
        if db is not None and db.reject_status not in (429, 503):
            raise ConfigError(f"{where}: dynamic_batching.reject_status must be 429 or 503, got {db.reject_status}")

    def to_json(self) -> dict:
        """Triton's model configuration JSON."""
        out = {"name": self.name, "platform": self.platform, "backend": "kiln",
               "max_batch_size": self.max_batch_size or 0,
               "input": [t.to_json() for t in self.input], "output": [t.to_json() for t in self.output],
               "instance_group": [{"count": self.instance_count, "kind": "KIND_AUTO"}],
               "version_policy": self.version_policy.to_json()}
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
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: dynamic_batching must be a table ([dynamic_batching])")
    raw = dict(raw)
    padding = raw.pop("padding", None)
    if not isinstance(raw.get("batch_buckets", []), list):
        raise ConfigError(f"{path}: [dynamic_batching]: batch_buckets must be a list of row counts, e.g. [1, 8, 64]")
    try:
        db = DynamicBatching(**raw)
    except TypeError as e:
        raise ConfigError(f"{path}: [dynamic_batching]: {e}") from e
    db.padding = None if padding is None else _padding(padding, path)
    return db


def _padding(raw, path: Path) -> Padding:
    """[dynamic_batching.padding] axis = 1, inputs = {name = pad value}, outputs = [names], checked for form."""
    where = f"{path}: [dynamic_batching.padding]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table with axis, inputs and outputs")
    if unknown := sorted(set(raw) - {"axis", "inputs", "outputs", "length_multiple"}):
        raise ConfigError(f"{where}: unknown keys {unknown}; expected axis, inputs, outputs, length_multiple")
    multiple = raw.get("length_multiple")
    if multiple is not None and (not _is_int(multiple) or multiple < 1):
        raise ConfigError(f"{where}: length_multiple must be an integer >= 1, got {multiple!r}")
    axis = raw.get("axis")
    if not _is_int(axis) or axis < 1:
        raise ConfigError(f"{where}: axis must be an integer >= 1 (axis 0 is the batch dim), got {axis!r}")
    inputs = raw.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        raise ConfigError(f"{where}: inputs must be a non-empty table of input name = pad value, "
                          "e.g. inputs = {input_ids = 0, attention_mask = 0}")
    for name, value in inputs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: inputs.{name}: the pad value must be a number, got {value!r}")
    outputs = raw.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise ConfigError(f"{where}: outputs must be a list of output names, got {outputs!r}")
    if len(set(outputs)) != len(outputs):
        raise ConfigError(f"{where}: outputs lists a name twice: {outputs}")
    return Padding(axis, dict(inputs), list(outputs), multiple)


def _check_padding(cfg: ModelConfig, pad: Padding, ins: list[TensorConfig], outs: list[TensorConfig]) -> None:
    """ConfigError where the padding does not fit the engine: batched model, inputs and outputs with that axis
    dynamic, pad values of the input's type."""
    where = f"model {cfg.name!r}: [dynamic_batching.padding]"
    if not cfg.max_batch_size:
        raise ConfigError(f"{where} needs a batched model (max_batch_size > 0)")
    given = {t.name: t for t in cfg.input}
    engine_in, engine_out = {t.name: t for t in ins}, {t.name: t for t in outs}
    for name, value in pad.inputs.items():
        if name not in engine_in:
            raise ConfigError(f"{where}: inputs.{name}: no such input; the model's inputs are {sorted(engine_in)}")
        dims = engine_in[name].dims
        if len(dims) < pad.axis or dims[pad.axis - 1] != -1 or given[name].dims[pad.axis - 1] != -1:
            raise ConfigError(f"{where}: inputs.{name}: axis {pad.axis} must be a dynamic dim of the input, whose "
                              f"shape is {[-1, *given[name].dims]}")
        kind = np.dtype(V2_TO_NUMPY[engine_in[name].data_type]).kind
        if kind in "iub" and float(value) != int(value):
            raise ConfigError(f"{where}: inputs.{name}: pad value {value!r} is not a whole number, and the input is "
                              f"{engine_in[name].data_type}")
    for name in pad.outputs:
        if name not in engine_out:
            raise ConfigError(f"{where}: outputs: no output {name!r}; the model's outputs are {sorted(engine_out)}")
        dims = engine_out[name].dims
        if len(dims) < pad.axis or dims[pad.axis - 1] != -1:
            raise ConfigError(f"{where}: outputs: axis {pad.axis} of output {name!r} (shape {[-1, *dims]}) is not "
                              "dynamic, so it cannot follow the padded length")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def version_folders(folder: Path) -> dict[int, str]:
    """The numeric version folders of a model: version → folder name."""
    if not folder.is_dir():
        return {}
    return {int(p.name): p.name for p in folder.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit()}


def _version_policy(raw, path: Path, folder: Path) -> VersionPolicy:
    """[version_policy] with exactly one of latest = {num_versions = N}, all = {}, specific = {versions = [...]}."""
    if raw is None:
        return VersionPolicy()
    kinds = ("latest", "all", "specific")
    if not isinstance(raw, dict) or len(raw) != 1:
        got = sorted(raw) if isinstance(raw, dict) else repr(raw)
        raise ConfigError(f"{path}: version_policy needs exactly one of {', '.join(kinds)}, got {got}")
    (kind, body), = raw.items()
    where = f"{path}: version_policy.{kind}"
    if kind not in kinds:
        raise ConfigError(f"{path}: version_policy: unknown policy {kind!r}; use one of {', '.join(kinds)}")
    if not isinstance(body, dict):
        raise ConfigError(f"{where} must be a table, e.g. {kind} = {{}}")
    allowed = {"latest": {"num_versions"}, "all": set(), "specific": {"versions"}}[kind]
    if unknown := sorted(set(body) - allowed):
        raise ConfigError(f"{where}: unknown keys {unknown}" + (f"; expected {sorted(allowed)}" if allowed else ""))
    if kind == "latest":
        n = body.get("num_versions", 1)
        if not _is_int(n) or n < 1:
            raise ConfigError(f"{where}.num_versions must be an integer >= 1, got {n!r}")
        return VersionPolicy("latest", n)
    if kind == "all":
        return VersionPolicy("all")
    versions = body.get("versions")
    if not isinstance(versions, list) or not versions or not all(_is_int(v) and v >= 0 for v in versions):
        raise ConfigError(f"{where}.versions must be a non-empty list of version numbers (integers), got {versions!r}")
    present = version_folders(folder)
    if missing := sorted(set(versions) - set(present)):
        raise ConfigError(f"{where}.versions: version {missing[0]} has no folder {folder.name}/{missing[0]}/; the "
                          f"model's versions are {sorted(present)}")
    return VersionPolicy("specific", versions=tuple(sorted(set(versions))))


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
