"""Read and validate an untrusted ONNX model: parse, check fields and caps, load external data, infer shapes."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from kiln.errors import ModelError, ResourceLimitError, ShapeError, UnsupportedOpError
from kiln.frontend.onnx.external_data import external_tensors, load_external_data
from kiln.frontend.onnx.limits import PROTOBUF_LIMIT, ModelLimits
from kiln.frontend.onnx.weightless import adopt_shapes, weightless
from kiln.util import files


@dataclass
class LoadedModel:
    """A validated model, its sha256 (of the file bytes) and where it came from."""

    proto: onnx.ModelProto
    sha256: str
    source: str


def load_onnx(model: str | os.PathLike | bytes | onnx.ModelProto, limits: ModelLimits = ModelLimits(),
              input_shapes: dict[str, tuple[int, ...]] | None = None,
              base_dir: str | os.PathLike | None = None) -> LoadedModel:
    """Load `model` (path, bytes or ModelProto) into a checked, shape-inferred ModelProto.

    `input_shapes` fixes the named inputs' dimensions before shape inference (static profiles); `base_dir` is the
    folder external data is read from (default: a path's folder; required for bytes or a ModelProto that has some).
    """
    if isinstance(model, onnx.ModelProto):
        data, base, source = model.SerializeToString(), None, "<ModelProto>"
    elif isinstance(model, (bytes, bytearray)):
        data, base, source = bytes(model), None, "<bytes>"
    else:
        path = Path(model)
        data, base, source = read_model_bytes(path), path.parent, str(path)
    if len(data) > PROTOBUF_LIMIT:
        raise ModelError("model is over protobuf's 2 GiB limit; save it with external data")
    with ThreadPoolExecutor(max_workers=1) as hashing:  # hashlib lets go of Python's lock: it hashes as we parse
        digest = hashing.submit(lambda: hashlib.sha256(data).hexdigest())
        return LoadedModel(_checked(data, base, source, limits, input_shapes, base_dir), digest.result(), source)


def _checked(data: bytes, base: Path | None, source: str, limits: ModelLimits,
             input_shapes: dict[str, tuple[int, ...]] | None, base_dir: str | os.PathLike | None) -> onnx.ModelProto:
    """The model of `data` parsed, checked, its external data read and its shapes inferred (load_onnx's work)."""
    proto = parse(data, source)
    validate_fields(proto, source)
    check_caps(proto, limits)
    check_ops_supported(proto)
    if any(True for _ in external_tensors(proto)):
        load_external_data(proto, _data_folder(base_dir, base, source), limits.max_file_bytes)
    try:
        onnx.checker.check_model(weightless(proto))
    except (onnx.checker.ValidationError, Exception) as e:  # checker raises several types
        why = " ".join(str(e).split())[:500] or type(e).__name__  # the node's name is on the message's next lines
        raise ModelError(f"{source} failed ONNX validation: {why}") from None
    if input_shapes:
        set_input_shapes(proto, input_shapes)
        del proto.graph.value_info[:]  # exporters' stale symbolic dims would survive re-inference
    adopt_shapes(proto, infer_shapes(weightless(proto), source, limits))
    check_caps(proto, limits, inferred=True)  # again, now with every inferred intermediate shape
    return proto


def read_model_bytes(path: Path) -> bytes:
    """An .onnx file's bytes, refusing one over protobuf's limit before reading it (and reading no more)."""
    path = files.existing_file(path, "model file", ModelError)
    with open(path, "rb") as f:
        data = f.read(PROTOBUF_LIMIT + 1)
    if len(data) > PROTOBUF_LIMIT:
        raise ModelError(f"{path} is over protobuf's 2 GiB limit; save the model with external data "
                         "(onnx.save(model, path, save_as_external_data=True))")
    return data


def read_model(path: Path, limits: ModelLimits = ModelLimits()) -> onnx.ModelProto:
    """Parse an .onnx file and check its fields and caps, without external data or shape inference."""
    proto = parse(read_model_bytes(path), str(path))
    validate_fields(proto, str(path))
    check_caps(proto, limits)
    return proto


def _data_folder(base_dir: str | os.PathLike | None, default: Path | None, source: str) -> Path:
    """The folder external data is read from: `base_dir`, else the model file's folder."""
    if base_dir is None and default is None:
        raise ModelError(f"{source} has external data, but kiln was given the model's bytes, not its path; pass "
                         "base_dir= (the folder holding its data files) or the model's path")
    base = Path(default if base_dir is None else base_dir)
    if not base.is_dir():
        raise ModelError(f"base_dir {base} is not a folder; give the folder holding the model's external data")
    return base


def infer_shapes(proto: onnx.ModelProto, source: str, limits: ModelLimits = ModelLimits()) -> onnx.ModelProto:
    """ONNX shape inference in strict mode: shapes that cannot match are a ShapeError naming the node.

    A plain pass first: its shapes meet the caps before data propagation (~140 bytes per element of every 1-D
    tensor it reads) runs, and it is skipped where those tensors exceed `limits.max_shape_values`.
    """
    plain = _infer(proto, source, data_prop=False)
    check_caps(plain, limits, inferred=True)
    if _shape_values(plain.graph) > limits.max_shape_values:
        return plain
    return _infer(proto, source, data_prop=True)


def _shape_values(graph: onnx.GraphProto) -> int:
    """Elements of the 1-D tensors (and rank <= 1 integer initializers) data propagation would hold as dims."""
    n = 0
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].HasField("dim_value"):
            n += max(dims[0].dim_value, 0)
    for t in graph.initializer:
        if len(t.dims) <= 1 and t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            n += t.dims[0] if t.dims else 1
    for node in graph.node:
        for a in node.attribute:
            n += sum(_shape_values(g) for g in ([a.g] if a.HasField("g") else []) + list(a.graphs))
    return n


def _infer(proto: onnx.ModelProto, source: str, data_prop: bool) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=data_prop)
    except onnx.shape_inference.InferenceError as e:
        if str(e).count("Inference error(s)") > 1:  # inside a function body's expansion: onnx's limit, not ours
            return _infer_lenient(proto, source, data_prop)
        raise ShapeError(f"{source}: shapes in the model cannot match: {_first_line(e)}; "
                         "check the node's input shapes (or the shapes given with --shapes)") from None
    except Exception as e:
        raise ModelError(f"{source}: shape inference failed: {_first_line(e)}") from None


def _infer_lenient(proto: onnx.ModelProto, source: str, data_prop: bool) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=data_prop)
    except Exception as e:
        raise ModelError(f"{source}: shape inference failed: {_first_line(e)}") from None


def set_input_shapes(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    from kiln.errors import ConfigError

    inputs = {vi.name: vi for vi in proto.graph.input}
    for name, shape in shapes.items():
        if name not in inputs:
            raise ConfigError(f"shape given for {name!r}, but the model's inputs are {sorted(inputs)}")
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise ConfigError(f"shape {list(shape)} for input {name!r} has rank {len(shape)}; the model "
                              f"declares rank {len(dims)}")
        for d, value in zip(dims, shape):
            if d.HasField("dim_value") and d.dim_value != value:
                raise ConfigError(f"shape {list(shape)} for input {name!r} conflicts with the model's "
                                  f"fixed dimension {d.dim_value}")
            d.dim_value = int(value)


def parse(data: bytes, source: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelError(f"{source} is not a valid ONNX model (protobuf parse failed: {e}); "
                         "check that the file is an .onnx export and not truncated") from None
    if not data:
        raise ModelError(f"{source} is empty, not a valid ONNX model")
    return proto


def validate_fields(proto: onnx.ModelProto, source: str) -> None:
    """Required ModelProto fields, checked before anything else reads them."""
    if not proto.HasField("graph"):
        raise ModelError(f"{source} is not a valid ONNX model: field 'graph' is missing")
    if proto.ir_version <= 0:
        raise ModelError(f"{source} is not a valid ONNX model: field 'ir_version' is missing")
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelError(f"{source}: ir_version {proto.ir_version} is newer than the newest kiln reads "
                         f"({onnx.IR_VERSION}); re-export with an older exporter")
    if not proto.opset_import:
        raise ModelError(f"{source} is not a valid ONNX model: field 'opset_import' is empty")
    newest = onnx.defs.onnx_opset_version()
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > newest:
            raise UnsupportedOpError(f"{source} imports opset {o.version} of the default domain; kiln supports "
                                     f"up to opset {newest}; re-export with opset <= {newest}")


def check_caps(proto: onnx.ModelProto, limits: ModelLimits, inferred: bool = False) -> None:
    """Reject huge ranks, node counts and subgraph nesting before any deeper work."""
    def walk(graph: onnx.GraphProto, depth: int) -> int:
        if depth > limits.max_graph_depth:
            raise ResourceLimitError(f"subgraphs nested deeper than {limits.max_graph_depth} levels")
        count = len(graph.node)
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            if vi.type.HasField("tensor_type") and len(vi.type.tensor_type.shape.dim) > limits.max_rank:
                raise ResourceLimitError(f"tensor {vi.name!r} has rank {len(vi.type.tensor_type.shape.dim)}, "
                                         f"over kiln's limit of {limits.max_rank}")
            _check_bytes(vi, limits, inferred)
        for init in graph.initializer:
            if len(init.dims) > limits.max_rank:
                raise ResourceLimitError(f"initializer {init.name!r} has rank {len(init.dims)}, over {limits.max_rank}")
        for node in graph.node:
            for a in node.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    count += walk(g, depth + 1)
        if count > limits.max_nodes:
            raise ResourceLimitError(f"model has over {limits.max_nodes} nodes")
        return count

    walk(proto.graph, 0)


def _check_bytes(vi: onnx.ValueInfoProto, limits: ModelLimits, inferred: bool = False) -> None:
    """Declared dims must be non-negative; ONNX's own inference may write -1 for 'unknown' (then skipped)."""
    n = 1
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            if d.dim_value < 0 and inferred:
                continue
            if d.dim_value < 0:
                raise ModelError(f"tensor {vi.name!r} declares a negative dimension {d.dim_value}")
            n *= d.dim_value
    if n * 8 > limits.max_tensor_bytes:
        raise ResourceLimitError(f"tensor {vi.name!r} declares {n} elements, over the memory budget of "
                                 f"{limits.max_tensor_bytes} bytes (the build device's memory, at most 1 TiB); "
                                 "check its declared dimensions")


def check_ops_supported(proto: onnx.ModelProto) -> None:
    """Every node must have a kiln importer for its domain, op and opset (nodes in subgraphs too)."""
    from kiln.frontend.onnx import ops  # noqa: F401  (registers importers)
    from kiln.frontend.onnx.registry import lookup

    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}

    def walk(graph: onnx.GraphProto, where: str) -> None:
        for index, node in enumerate(graph.node):
            domain = "" if node.domain == "ai.onnx" else node.domain
            label = node.name or f"{node.op_type}_{index}"
            if domain not in opsets:
                raise ModelError(f"node {label!r}{where} ({node.op_type}) uses domain {domain!r}, which the model "
                                 "does not import (opset_import)")
            if lookup(domain, node.op_type, opsets[domain]) is None:
                raise UnsupportedOpError(
                    f"node {label!r}{where}: op {node.op_type!r} of domain {domain or 'ai.onnx'!r} at opset "
                    f"{opsets[domain]} is not supported by kiln; run `kiln inspect model.onnx` to list "
                    "unsupported ops, replace the op in the exporter, or supply it as a kiln plugin")
            for a in node.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(g, f" in subgraph {a.name!r} of node {label!r}{where}")

    walk(proto.graph, "")


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__
