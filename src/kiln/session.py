"""`kiln.InferenceSession`: ONNX Runtime's `InferenceSession` API over a kiln engine, for users switching from it.

    sess = kiln.InferenceSession("model.onnx", fp16=True, providers=["CUDAExecutionProvider"])
    [y] = sess.run(["y"], {"x": x})

An `.onnx` model (path or bytes) is built when the session opens (BuildConfig from the options); a `.plan` is loaded.
`run` returns numpy arrays, like ONNX Runtime, for numpy or torch inputs. Each thread runs in its own execution
context, so one session may be shared between threads, as ONNX Runtime's may.

IOBinding: kiln's execution contexts compute into their own memory (no caller output buffers), so an output bound to a
buffer is copied into it after the run; one bound without a buffer is handed back as kiln computed it (a torch tensor
on the GPU for `device_type="cuda"`, a numpy array for "cpu").
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import torch

from kiln.config import BuildConfig
from kiln.errors import ConfigError, InputError
from kiln.frontend.onnx.loader import read_model_bytes
from kiln.ir import DType, Tensor
from kiln.ir.dtype import to_numpy
from kiln.runtime import Engine
from kiln.version import __version__

# ONNX Runtime's provider names → kiln devices; the first of each device is what get_providers() reports
PROVIDERS = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}
_PROVIDER_OF = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
_META_FIELDS = (2, 3, 4, 5, 6, 14)  # ModelProto: producer_name/version, domain, model_version, doc_string, metadata


@dataclass(frozen=True)
class NodeArg:
    """An input or output as ONNX Runtime describes it: name, shape (ints, symbolic dim names, None for unknown;
    None for a sequence) and type ("tensor(float)", "seq(tensor(int64))", "optional(tensor(float))")."""

    name: str
    shape: list | None
    type: str

    @classmethod
    def of(cls, t: Tensor) -> "NodeArg":
        return cls(t.name, None if t.shape is None or t.kind in ("sequence", "optional_sequence") else list(t.shape),
                   onnx_type_str(t))


@dataclass(frozen=True)
class ModelMetadata:
    """ONNX Runtime's ModelMetadata: the model's own fields where the session was opened from an .onnx model."""

    producer_name: str = "kiln"
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


def onnx_type_str(t: Tensor) -> str:
    """ONNX's type string of a value, as ONNX Runtime's NodeArg.type gives it: tensor(float), seq(tensor(int64))."""
    s = f"tensor({onnx.TensorProto.DataType.Name(t.dtype.onnx).lower()})"
    if t.kind in ("sequence", "optional_sequence"):
        s = f"seq({s})"
    return f"optional({s})" if t.kind.startswith("optional") else s


def provider_device(providers: Sequence[Any] | None) -> str | None:
    """The kiln device for ONNX Runtime's provider list (a priority list of names or (name, options) pairs): the first
    one available here; a GPU provider without a GPU falls back to the CPU with a warning, as ONNX Runtime does."""
    if providers is None:
        return None
    if isinstance(providers, (str, bytes)) or not isinstance(providers, Sequence):
        raise ConfigError(f"providers must be a list of provider names, e.g. ['CUDAExecutionProvider'], "
                          f"got {providers!r}")
    devices = []
    for p in providers:
        name = p[0] if isinstance(p, (tuple, list)) and p else p
        if name not in PROVIDERS:
            raise ConfigError(f"execution provider {name!r} is not one kiln runs on; use one of {sorted(PROVIDERS)}")
        devices.append(PROVIDERS[name])
    if not devices:
        return None
    for d in devices:
        if d == "cpu" or torch.cuda.is_available():
            return d
    warnings.warn(f"providers {list(providers)} ask for a GPU but no CUDA GPU is visible; running on the CPU",
                  RuntimeWarning, stacklevel=3)
    return "cpu"


def _is_plan(model: Any) -> bool:
    return isinstance(model, (str, os.PathLike)) and Path(model).suffix.lower() == ".plan"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return value, i


def model_metadata_proto(data: bytes) -> onnx.ModelProto:
    """The model's top-level metadata fields alone, read from its bytes without parsing its graph."""
    keep, i = bytearray(), 0
    while i < len(data):
        start = i
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        elif wire == 2:
            length, i = _varint(data, i)
            i += length
        else:
            raise ValueError(f"unexpected wire type {wire}")
        if i > len(data):
            raise ValueError("truncated field")
        if key >> 3 in _META_FIELDS:
            keep += data[start:i]
    return onnx.ModelProto.FromString(bytes(keep))


class IOBinding:
    """ONNX Runtime's IOBinding: inputs bound once, outputs bound to caller buffers (copied into after the run, see
    the module's docstring) or left for kiln to allocate."""

    def __init__(self, session: "InferenceSession"):
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, tuple[Any, str | None]] = {}  # name → (buffer or None, device_type)
        self._results: list[Any] | None = None

    def bind_input(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """Bind a numpy array or torch tensor (on the CPU or the engine's device) to input `name`."""
        if args or kwargs or isinstance(value, str):
            raise ConfigError("bind_input takes the array or tensor itself: bind_input(name, value); raw device "
                              "pointers (device_type, device_id, element_type, shape, buffer_ptr) are not supported")
        self._session._input_tensor(name)
        self._inputs[name] = value

    bind_cpu_input = bind_input

    def bind_output(self, name: str, buffer: Any = None, *, device_type: str | None = None, device_id: int = 0,
                    **kwargs: Any) -> None:
        """Bind output `name` to `buffer` (a numpy array or torch tensor of the output's dtype and shape, which the run
        fills), or with no buffer to an output kiln allocates: numpy for `device_type="cpu"` (the default, or given
        as the second argument as ONNX Runtime takes it), a torch tensor on the engine's device for "cuda"."""
        if kwargs:
            raise ConfigError(f"bind_output: {sorted(kwargs)} not supported; pass a numpy array or torch tensor as "
                              "`buffer` to have the output written into it")
        if isinstance(buffer, str):
            buffer, device_type = None, buffer
        if device_type is not None and device_type.lower() not in ("cpu", "cuda"):
            raise ConfigError(f"bind_output: device_type {device_type!r} must be 'cpu' or 'cuda'")
        if buffer is not None and not isinstance(buffer, (np.ndarray, torch.Tensor)):
            raise InputError(f"bind_output {name!r}: buffer must be a numpy array or torch tensor, "
                             f"got {type(buffer).__name__}")
        if isinstance(buffer, np.ndarray) and not buffer.flags.writeable:
            raise InputError(f"bind_output {name!r}: the numpy buffer is read-only")
        self._session._output_index(name)
        self._outputs[name] = (buffer, device_type.lower() if device_type else None)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = None

    def synchronize_inputs(self) -> None:
        pass  # inputs are read on the run's stream, ordered after the caller's

    def synchronize_outputs(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()

    def get_outputs(self) -> list[Any]:
        """The bound outputs of the last run, in the order they were bound: the caller's buffers where given."""
        if self._results is None:
            raise InputError("no outputs yet: call session.run_with_iobinding(io_binding) first")
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """The bound outputs of the last run as numpy arrays (copies), in the order they were bound."""
        return [np.array(to_numpy(v.detach()) if isinstance(v, torch.Tensor) else v, copy=True)
                for v in self.get_outputs()]


class InferenceSession:
    """ONNX Runtime's InferenceSession over a kiln engine: build an .onnx model (path or bytes) or load a .plan.

    Build options (`fp16`, `bf16`, `int8`, `calib`: a data path or calibration arrays, `profiles`, `shapes`: one
    static profile {input: shape}, `timing_cache`, `device`) are BuildConfig's; `policy` is `kiln.load`'s for a plan.
    `providers` (ONNX Runtime's names) choose the device; `sess_options` and `run_options` are accepted and ignored.
    """

    def __init__(self, path_or_bytes: str | os.PathLike | bytes | onnx.ModelProto, sess_options: Any = None, *,
                 fp16: bool = False, bf16: bool = False, int8: bool = False, calib: Any = None, profiles=None,
                 shapes: Mapping[str, Sequence[int]] | None = None, timing_cache: str | os.PathLike | None = None,
                 device: str = "auto", providers: Sequence[Any] | None = None, policy: str = "strict"):
        chosen = provider_device(providers)
        if chosen is not None and device not in ("auto", chosen):
            raise ConfigError(f"device={device!r} and providers={list(providers)} disagree; give one of them")
        device = chosen or device
        self._source = path_or_bytes
        if _is_plan(path_or_bytes):
            given = [n for n, v in (("fp16", fp16), ("bf16", bf16), ("int8", int8), ("calib", calib),
                                    ("profiles", profiles), ("shapes", shapes)) if v]
            if given:
                raise ConfigError(f"{', '.join(given)} are build options, but {path_or_bytes} is a built plan; "
                                  "rebuild it from the .onnx model with them")
            self.engine = Engine.load(path_or_bytes, policy, timing_cache=timing_cache)
            if device != "auto" and self.engine.device.backend != device:
                raise ConfigError(f"{path_or_bytes} was built for {self.engine.device.backend}, not {device}; build "
                                  f"it from the .onnx model with device={device!r}")
        else:
            self.engine = Engine.build(path_or_bytes, self._config(fp16, bf16, int8, calib, profiles, shapes,
                                                                   timing_cache, device),
                                       calib_data=None if calib is None or isinstance(calib, (str, os.PathLike))
                                       else calib)
        self._inputs = [NodeArg.of(t) for t in self.engine.inputs]
        self._outputs = [NodeArg.of(t) for t in self.engine.outputs]
        self._local = threading.local()
        self._meta: ModelMetadata | None = None

    @staticmethod
    def _config(fp16, bf16, int8, calib, profiles, shapes, timing_cache, device) -> BuildConfig:
        if shapes is not None and profiles:
            raise ConfigError("give shapes (one static profile) or profiles, not both")
        if shapes is not None:
            if not isinstance(shapes, Mapping):
                raise ConfigError(f"shapes must be a dict of input name → shape, got {type(shapes).__name__}")
            profiles = ({k: (v, v, v) for k, v in shapes.items()},)
        return BuildConfig(fp16=fp16, bf16=bf16, int8=int8, profiles=tuple(profiles or ()), device=device,
                           calib=str(calib) if isinstance(calib, (str, os.PathLike)) else None,
                           timing_cache=str(timing_cache) if timing_cache is not None else None)

    # -- what ONNX Runtime's session describes --------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return []  # kiln folds initializers into the engine

    def get_providers(self) -> list[str]:
        return [_PROVIDER_OF[self.engine.device.backend]]

    def get_provider_options(self) -> dict[str, dict]:
        return {p: {} for p in self.get_providers()}

    def get_modelmeta(self) -> ModelMetadata:
        """The model's producer, domain, version, description and metadata properties where it was opened from an
        .onnx model (read from its bytes, its graph unparsed); kiln's own for a plan."""
        if self._meta is None:
            graph = self.engine.network.name
            meta = ModelMetadata(graph_name=graph, custom_metadata_map={"kiln_version": __version__})
            src = self._source
            if not _is_plan(src):
                try:
                    if isinstance(src, onnx.ModelProto):
                        m = src
                    else:
                        m = model_metadata_proto(bytes(src) if isinstance(src, (bytes, bytearray))
                                                 else read_model_bytes(Path(src)))
                    meta = ModelMetadata(m.producer_name, graph, m.domain, m.doc_string, "", int(m.model_version),
                                         {p.key: p.value for p in m.metadata_props})
                except Exception:  # the model file changed or went away since the build: kiln's own
                    pass
            self._meta = meta
        return self._meta

    # -- running -----------------------------------------------------------------------------
    @property
    def _context(self):
        ctx = getattr(self._local, "context", None)
        if ctx is None:
            ctx = self._local.context = self.engine.create_context()
        return ctx

    def _input_tensor(self, name: str) -> Tensor:
        names = [a.name for a in self._inputs]
        if name not in names:
            raise InputError(f"unknown input name {name!r}; the model's inputs are {names}")
        return self.engine.network.tensors[name]

    def _output_index(self, name: Any) -> int:
        names = [a.name for a in self._outputs]
        try:
            return names.index(name)
        except ValueError:
            raise InputError(f"unknown output name {name!r}; the model's outputs are {names}") from None

    def _output_names(self, output_names: Sequence[str] | None) -> list[str]:
        if output_names is None or (isinstance(output_names, (list, tuple)) and not output_names):
            return [a.name for a in self._outputs]  # ONNX Runtime: None or [] → every output
        if isinstance(output_names, (str, bytes)) or not isinstance(output_names, Sequence):
            raise InputError(f"output_names must be a list of output names or None, got {output_names!r}")
        for n in output_names:
            self._output_index(n)
        return list(output_names)

    def _execute(self, input_feed: Mapping[str, Any]) -> dict[str, Any]:
        """Device values of every output."""
        ctx = self._context
        tensors, _ = ctx.check(input_feed)
        return ctx.execute(ctx.upload(tensors))

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
            ) -> list[Any]:
        """The outputs named (None: all, in the model's order) as numpy arrays, for numpy or torch inputs."""
        names = self._output_names(output_names)
        result = self._execute(input_feed)
        host = self._context.download({n: result[n] for n in dict.fromkeys(names)})
        return [host[n] for n in names]

    def io_binding(self) -> IOBinding:
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: Any = None) -> None:
        """Run on the bound inputs; fill the bound outputs (every output, as numpy, when none is bound)."""
        if not isinstance(iobinding, IOBinding) or iobinding._session is not self:
            raise InputError("run_with_iobinding takes an IOBinding made by this session's io_binding()")
        bound = dict(iobinding._outputs) or {a.name: (None, None) for a in self._outputs}
        result = self._execute(iobinding._inputs)
        out = []
        for name, (buffer, device_type) in bound.items():
            value = result[name]
            if buffer is not None:
                out.append(self._fill(name, buffer, value))
            elif device_type == "cuda" and isinstance(value, torch.Tensor):
                out.append(value)
            else:
                out.append(self._context.download({name: value})[name])
        iobinding._results = out

    def _fill(self, name: str, buffer: Any, value: Any) -> Any:
        """Copy output `value` into the caller's `buffer` after checking dtype and shape."""
        if not isinstance(value, torch.Tensor):
            raise InputError(f"output {name!r} is not a tensor ({type(value).__name__}); bind it without a buffer")
        want, shape = DType.from_torch(value.dtype), tuple(value.shape)
        got = DType.from_torch(buffer.dtype) if isinstance(buffer, torch.Tensor) else DType.from_numpy(buffer.dtype)
        if got != want or tuple(buffer.shape) != shape:
            raise InputError(f"bind_output {name!r}: the buffer is {got}{list(buffer.shape)}, but the output is "
                             f"{want}{list(shape)}; bind a buffer of that dtype and shape")
        if isinstance(buffer, torch.Tensor):
            if want.carrier is not want.torch:  # sub-byte shell dtypes copy as their carrier bytes
                buffer.view(want.carrier).copy_(value.view(want.carrier))
            else:
                buffer.copy_(value)
        else:
            np.copyto(buffer, self._context.download({name: value})[name])
        return buffer
