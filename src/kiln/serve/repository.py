"""The model repository: `root/<model>/[config.toml]` and `root/<model>/<version>/model.plan|model.onnx`."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

from kiln.serve.config import DEFAULT_MAX_BATCH_SIZE, ModelConfig
from kiln.serve.errors import BadRequest, ModelLoadError, ModelNotFound, ModelNotReady
from kiln.serve.metrics import Metrics
from kiln.serve.model import ServedModel


@dataclass
class Entry:
    """A model's state in the repository: READY (with its ServedModel), LOADING or UNAVAILABLE (with a reason)."""

    name: str
    version: str = ""
    state: str = "UNAVAILABLE"
    reason: str = "unloaded"
    model: ServedModel | None = None


class ModelRepository:
    """Loads, serves and unloads the models under `root`; a model that fails to load never takes the others down."""

    def __init__(self, root: str | Path, *, device: str = "auto", policy: str = "strict",
                 metrics: Metrics | None = None):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ModelNotFound(f"model repository {str(root)!r} is not a folder")
        self.device, self.policy = device, policy
        self.metrics = metrics if metrics is not None else Metrics()
        self._entries: dict[str, Entry] = {}
        self._lock = threading.RLock()
        self._started = self._closing = False
        self._draining: set = set()

    def start(self, load_all: bool = True) -> None:
        """Mark the repository started, loading every model when `load_all` (failures become UNAVAILABLE)."""
        if load_all:
            for name in self.names():
                try:
                    self.load(name)
                except ModelLoadError:
                    pass
        self._started = True

    def names(self) -> list[str]:
        """The model folders under the root, sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def ready(self) -> bool:
        """Started and not shutting down."""
        return self._started and not self._closing

    def index(self) -> list[dict]:
        """Every model of the repository with its version, state and reason."""
        with self._lock:
            out = []
            for name in self.names():
                e = self._entries.get(name) or Entry(name, _latest_version(self.root / name) or "")
                out.append({"name": e.name, "version": e.version, "state": e.state,
                            "reason": "" if e.state == "READY" else e.reason})
            return out

    def load(self, name: str) -> ServedModel:
        """(Re)load model `name` (its highest version); ModelLoadError with the reason if that fails."""
        folder = self._folder(name)
        if self._closing:
            raise ModelNotReady("the server is shutting down; models cannot be loaded")
        with self._lock:
            old = self._entries.get(name)
            self._entries[name] = Entry(name, old.version if old else "", "LOADING", "loading", None)
        try:
            model = self._load(folder)
        except Exception as e:  # any failure is this model's, reported by index()
            reason = f"{type(e).__name__}: {e}"
            with self._lock:
                self._entries[name] = Entry(name, _latest_version(folder) or "", "UNAVAILABLE", reason)
            if old is not None and old.model is not None:
                self._drain(old.model)
            raise ModelLoadError(f"failed to load model {name!r}: {reason}") from e
        with self._lock:
            self._entries[name] = Entry(name, model.version, "READY", "", model)
        if old is not None and old.model is not None:
            self._drain(old.model)
        return model

    def unload(self, name: str) -> None:
        """Stop serving `name`; its queued requests still finish."""
        self._folder(name)
        with self._lock:
            old = self._entries.get(name)
            self._entries[name] = Entry(name, old.version if old else "", "UNAVAILABLE", "unloaded")
        if old is not None and old.model is not None:
            self._drain(old.model)

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The READY model `name` (at `version` if given): ModelNotFound / ModelNotReady otherwise."""
        self._folder(name)
        with self._lock:
            e = self._entries.get(name)
        if version not in (None, "") and not (self.root / name / str(version)).is_dir():
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        if e is None or e.model is None or self._closing:
            why = "the server is shutting down" if self._closing else (e.reason if e else "unloaded")
            raise ModelNotReady(f"model {name!r} is not ready: {why}")
        if version not in (None, "") and str(version) != e.version:
            raise ModelNotReady(f"model {name!r} version {version!r} is not loaded (version {e.version!r} is)")
        return e.model

    async def close(self) -> None:
        """Stop accepting requests and wait for every in-flight one to be answered."""
        self._closing = True
        with self._lock:
            models = [e.model for e in self._entries.values() if e.model is not None]
        await asyncio.gather(*(m.batcher.close() for m in models), *list(self._draining), return_exceptions=True)

    def _folder(self, name: str) -> Path:
        """The folder of model `name`: BadRequest for a name that is not a plain folder name."""
        if (not isinstance(name, str) or not name or name in (".", "..") or ".." in name
                or any(c in name for c in "/\\\0")):
            raise BadRequest(f"invalid model name {name!r}: use a folder name directly under the repository")
        folder = self.root / name
        if folder.resolve().parent != self.root:
            raise BadRequest(f"invalid model name {name!r}: it must be a folder directly under the repository")
        if not folder.is_dir():
            raise ModelNotFound(f"unknown model {name!r}; the repository has {self.names()}")
        return folder

    def _load(self, folder: Path) -> ServedModel:
        """Read the config, load (or build and cache) the engine of the highest version, and wrap it."""
        toml = folder / "config.toml"
        cfg = ModelConfig.from_toml(toml, folder) if toml.is_file() else ModelConfig(folder.name)
        version = _latest_version(folder)
        if version is None:
            raise ModelNotFound(f"model {folder.name!r} has no version folder (e.g. {folder.name}/1/model.plan)")
        engine = self._engine(folder / version, cfg)
        cfg = cfg.complete(engine) if toml.is_file() else ModelConfig.auto(folder.name, engine)
        return ServedModel(folder.name, version, cfg, engine, self.metrics)

    def _engine(self, vdir: Path, cfg: ModelConfig):
        """Load `model.plan`, else build `model.onnx` with the config's precision and profiles, caching the plan."""
        import kiln

        plan, onnx = vdir / "model.plan", vdir / "model.onnx"
        if plan.is_file() and (not onnx.is_file() or plan.stat().st_mtime >= onnx.stat().st_mtime):
            return kiln.load(plan, self.policy)
        if not onnx.is_file():
            raise ModelNotFound(f"{vdir} holds neither model.plan nor model.onnx")
        flags = {cfg.precision: True} if cfg.precision != "fp32" else {}
        profiles = cfg.profiles or _batch_profiles(onnx, cfg)
        engine = kiln.build(onnx, kiln.BuildConfig(device=self.device, profiles=profiles, **flags))
        engine.save(plan, force=True)
        return engine

    def _drain(self, model: ServedModel) -> None:
        """Close an unloaded model's batcher once its queued requests are answered."""
        fut = model.batcher.close_soon()
        if fut is not None:
            self._draining.add(fut)
            fut.add_done_callback(self._draining.discard)


def _latest_version(folder: Path) -> str | None:
    """The highest numeric version folder of a model."""
    versions = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()] if folder.is_dir() else []
    return str(max(versions)) if versions else None


def _batch_profiles(onnx: Path, cfg: ModelConfig) -> tuple:
    """A profile over batch 1..max_batch_size when every input has a dynamic first dim and static others."""
    import onnx as onnx_lib

    graph = onnx_lib.load(str(onnx), load_external_data=False).graph
    init = {i.name for i in graph.initializer}
    shapes = {}
    for vi in graph.input:
        if vi.name in init:
            continue
        dims = vi.type.tensor_type.shape.dim
        if not dims or dims[0].HasField("dim_value") or not all(d.HasField("dim_value") for d in dims[1:]):
            return ()
        shapes[vi.name] = [d.dim_value for d in dims[1:]]
    mbs = cfg.max_batch_size if cfg.max_batch_size is not None else DEFAULT_MAX_BATCH_SIZE
    if not shapes or mbs <= 0:
        return ()
    opt = max(1, mbs // 2)
    return ({n: ((1, *s), (opt, *s), (mbs, *s)) for n, s in shapes.items()},)
