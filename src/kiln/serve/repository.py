"""The model repository: `root/<model>/[config.toml]` and `root/<model>/<version>/model.plan|model.onnx`."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

from kiln.serve import INLINE_US
from kiln.serve.config import DEFAULT_MAX_BATCH_SIZE, ModelConfig, VersionPolicy, version_folders
from kiln.serve.errors import BadRequest, ModelLoadError, ModelNotFound, ModelNotReady, Unsupported
from kiln.serve.metrics import Metrics
from kiln.serve.model import ServedModel


@dataclass
class Entry:
    """A model version's state in the repository: READY (with its ServedModel), LOADING or UNAVAILABLE (with a
    reason). A model whose config cannot be read has one entry for its newest version folder."""

    name: str
    version: str = ""
    state: str = "UNAVAILABLE"
    reason: str = "unloaded"
    model: ServedModel | None = None


class ModelRepository:
    """Loads, serves and unloads the models under `root`, each at the versions its version_policy selects (default:
    the newest); a model (or version) that fails to load never takes the others down. `inline_us`: see
    `DynamicBatcher.inline_s`."""

    def __init__(self, root: str | Path, *, device: str = "auto", policy: str = "strict",
                 metrics: Metrics | None = None, control: str | None = None, inline_us: int = INLINE_US):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ModelNotFound(f"model repository {str(root)!r} is not a folder")
        self.device, self.policy, self.inline_us = device, policy, inline_us
        self.control_off = control  # why the load / unload API is refused (None: it is served)
        self.metrics = metrics if metrics is not None else Metrics()
        self._entries: dict[str, dict[str, Entry]] = {}  # model → version → entry, versions ascending
        self._lock = threading.RLock()
        self._started = self._closing = False
        self._draining: set = set()

    def check_control(self) -> None:
        """Refuse the repository's load / unload API where this server cannot apply it (`control` at creation)."""
        if self.control_off:
            raise Unsupported(f"model load and unload are off: {self.control_off}")

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
        """Every model of the repository, one entry per version it serves (or served), with state and reason."""
        with self._lock:
            out = []
            for name in self.names():
                entries = list(self._entries.get(name, {}).values()) or [Entry(name, _latest_version(self.root / name)
                                                                                or "")]
                out.extend({"name": e.name, "version": e.version, "state": e.state,
                            "reason": "" if e.state == "READY" else e.reason} for e in entries)
            return out

    def load(self, name: str) -> ServedModel:
        """(Re)load model `name` at the versions of its version_policy; returns the newest one that loaded.
        ModelLoadError with the reason if the config or any version fails (the versions that loaded serve)."""
        folder = self._folder(name)
        if self._closing:
            raise ModelNotReady("the server is shutting down; models cannot be loaded")
        with self._lock:
            old = self._entries.get(name, {})
            self._entries[name] = {v: Entry(name, e.version, "LOADING", "loading") for v, e in old.items()} or {
                "": Entry(name, "", "LOADING", "loading")}
        try:
            cfg, versions = self._select(folder)
        except Exception as e:  # the config or the version folders: the whole model fails
            reason = f"{type(e).__name__}: {e}"
            with self._lock:
                self._entries[name] = {"": Entry(name, _latest_version(folder) or "", "UNAVAILABLE", reason)}
            self._drain_all(old)
            raise ModelLoadError(f"failed to load model {name!r}: {reason}") from e
        new: dict[str, Entry] = {}
        failed = []
        for version, vdir in versions:
            try:
                model = self._load(folder, cfg, version, vdir)
            except Exception as e:  # this version's failure, reported by index()
                reason = f"{type(e).__name__}: {e}"
                new[version] = Entry(name, version, "UNAVAILABLE", reason)
                failed.append(f"version {version}: {reason}")
            else:
                new[version] = Entry(name, version, "READY", "", model)
        loaded = [e.model.version for e in new.values() if e.model is not None]
        for e in new.values():
            if e.model is not None:
                e.model.versions = loaded
        with self._lock:
            self._entries[name] = new
        self._drain_all(old)
        if failed:
            raise ModelLoadError(f"failed to load model {name!r}: {'; '.join(failed)}")
        return new[versions[-1][0]].model

    def unload(self, name: str) -> None:
        """Stop serving every version of `name`; their queued requests still finish."""
        self._folder(name)
        with self._lock:
            old = self._entries.get(name, {})
            self._entries[name] = {v: Entry(name, e.version, "UNAVAILABLE", "unloaded") for v, e in old.items()} or {
                "": Entry(name, _latest_version(self.root / name) or "", "UNAVAILABLE", "unloaded")}
        self._drain_all(old)

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The READY model `name` at `version` (None or "": its newest READY version). ModelNotFound for a version
        the model does not serve (no such folder, or not selected by its version_policy), ModelNotReady for one that
        is not loaded (unloaded, failed, loading)."""
        with self._lock:  # a loaded model's name was checked when it loaded: no path resolution per request
            entries = dict(self._entries.get(name, {})) if isinstance(name, str) else {}
        if not entries:
            self._folder(name)
        if self._closing:
            raise ModelNotReady(f"model {name!r} is not ready: the server is shutting down")
        if version in (None, ""):
            ready = [e for e in entries.values() if e.model is not None]
            if not ready:
                why = "; ".join(e.reason for e in entries.values()) or "unloaded"
                raise ModelNotReady(f"model {name!r} is not ready: {why}")
            return ready[-1].model
        version = str(version)
        if not (version.isascii() and version.isdigit()):
            raise BadRequest(f"model {name!r}: version {version[:40]!r} is not a version number (an integer)")
        version = str(int(version))
        e = entries.get(version)
        if e is None:
            served, present = [v for v in entries if v], sorted(version_folders(self.root / name))
            if served:
                raise ModelNotFound(f"model {name!r} has no version {version}; its version_policy serves versions "
                                    f"{served}")
            if int(version) not in present:
                raise ModelNotFound(f"model {name!r} has no version {version}; its version folders are {present}")
            raise ModelNotReady(f"model {name!r} version {version} is not ready: "
                                f"{'; '.join(e.reason for e in entries.values()) or 'unloaded'}")
        if e.model is None:
            raise ModelNotReady(f"model {name!r} version {version} is not ready: {e.reason}")
        return e.model

    def models(self, name: str | None = None, version: str | None = None) -> list[ServedModel]:
        """The READY served versions: of `name` (all of them, or just `version`), or of every model when `name` is
        None (for statistics, as Triton reports them)."""
        if name:
            if version not in (None, ""):
                return [self.get(name, version)]
            self.get(name)  # ModelNotFound / ModelNotReady when none is ready
            with self._lock:
                return [e.model for e in self._entries.get(name, {}).values() if e.model is not None]
        with self._lock:
            return [e.model for n in sorted(self._entries) for e in self._entries[n].values() if e.model is not None]

    async def close(self) -> None:
        """Stop accepting requests and wait for every in-flight one to be answered."""
        self._closing = True
        with self._lock:
            models = [e.model for es in self._entries.values() for e in es.values() if e.model is not None]
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

    def _select(self, folder: Path) -> tuple[ModelConfig | None, list[tuple[str, Path]]]:
        """The model's config (None: auto-completed) and the (version, folder) pairs its version_policy selects."""
        toml = folder / "config.toml"
        cfg = ModelConfig.from_toml(toml, folder) if toml.is_file() else None
        present = version_folders(folder)
        if not present:
            raise ModelNotFound(f"model {folder.name!r} has no version folder (e.g. {folder.name}/1/model.plan)")
        policy = cfg.version_policy if cfg is not None else VersionPolicy()
        return cfg, [(str(v), folder / present.get(v, str(v))) for v in policy.select(list(present))]

    def _load(self, folder: Path, cfg: ModelConfig | None, version: str, vdir: Path) -> ServedModel:
        """Load (or build and cache) the engine of one version and wrap it with its completed config."""
        engine = self._engine(vdir, cfg if cfg is not None else ModelConfig(folder.name))
        cfg = cfg.complete(engine) if cfg is not None else ModelConfig.auto(folder.name, engine)
        return ServedModel(folder.name, version, cfg, engine, self.metrics, inline_us=self.inline_us)

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

    def _drain_all(self, entries: dict[str, Entry]) -> None:
        """Drain the models of replaced entries."""
        for e in entries.values():
            if e.model is not None:
                self._drain(e.model)

    def _drain(self, model: ServedModel) -> None:
        """Close an unloaded model's batcher once its queued requests are answered."""
        fut = model.batcher.close_soon()
        if fut is not None:
            self._draining.add(fut)
            fut.add_done_callback(self._draining.discard)


def _latest_version(folder: Path) -> str | None:
    """The highest numeric version folder of a model."""
    versions = version_folders(folder)
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
