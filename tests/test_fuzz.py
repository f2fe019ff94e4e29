"""Fuzz the loaders: mutated ONNX models (bytes and structure) and mutated plans (bytes, header, manifest
with a valid checksum) must build/load or raise a KilnError subclass, never anything else; bounded in time
(hypothesis deadline, example count) and memory (peak RSS growth).

Longer run: KILN_FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py (each test runs that many examples).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import struct
import traceback

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st
from onnx import TensorProto as T, helper, numpy_helper

import kiln
from kiln.engine import plan as planfile
from kiln.util.safe_json import loads_json
from kiln.errors import KilnError

EXAMPLES = int(os.environ.get("KILN_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=10_000, derandomize=EXAMPLES <= 150, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MEMORY_GROWTH_LIMIT = 2 << 30  # bytes of peak RSS a fuzz test may add


def _seed_model() -> onnx.ModelProto:
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
             numpy_helper.from_array(r.standard_normal((64, 5)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc"], ["g"], name="fc"),
             helper.make_node("Softmax", ["g"], ["y"], name="sm", axis=-1)]
    g = helper.make_graph(nodes, "seed", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 5])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


SEED = _seed_model()
SEED_BYTES = SEED.SerializeToString()
FEEDS = {"x": np.ones((1, 3, 8, 8), np.float32)}
CRASHES: list[str] = []


def _only_kiln_errors(fn):
    """Run fn; a KilnError is a correct answer to bad input, anything else is a crash (recorded, then raised)."""
    try:
        out = fn()
        event("accepted")
        return out
    except KilnError as e:
        event(f"refused: {type(e).__name__}")  # the mix shows in --hypothesis-show-statistics
        return None
    except Exception as e:
        CRASHES.append("".join(traceback.format_exception(e))[-3000:])
        raise


@pytest.fixture(autouse=True)
def bounded_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < MEMORY_GROWTH_LIMIT, f"fuzzing grew peak memory by {grown >> 20} MiB"


def _build_and_run(data: bytes):
    """Build on the CPU (import, passes, precision, plan), then run the engine on the seed's inputs: a model
    that builds must either run or refuse the inputs with a KilnError."""
    engine = kiln.build(data, kiln.BuildConfig(device="cpu"))
    engine.create_context().run(FEEDS)
    return engine


# -- byte-level mutations of the model file --------------------------------------------------------------------
_edits = st.lists(st.tuples(st.sampled_from(["flip", "set", "cut", "insert", "delete"]),
                            st.integers(0, len(SEED_BYTES) - 1), st.integers(0, 255)), min_size=1, max_size=8)


def _mutate_bytes(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for op, pos, val in edits:
        pos = pos % max(len(b), 1)
        if op == "flip" and b:
            b[pos] ^= 1 << (val % 8)
        elif op == "set" and b:
            b[pos] = val
        elif op == "cut":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = bytes([val]) * (1 + val % 7)
        elif op == "delete":
            del b[pos:pos + 1 + val % 16]
    return bytes(b)


@FUZZ
@given(_edits)
def test_fuzz_onnx_bytes(edits):
    _only_kiln_errors(lambda: _build_and_run(_mutate_bytes(SEED_BYTES, edits)))


# -- structural mutations of the model -------------------------------------------------------------------------
_OPS = ["Conv", "Relu", "Gemm", "MatMul", "Reshape", "Softmax", "Add", "Concat", "Transpose", "Expand",
        "ConstantOfShape", "Slice", "Gather", "Loop", "If", "Resize", "NoSuchOp", "Flatten", "MaxPool", ""]
_INTS = st.sampled_from([-(2**63), -(2**31), -2, -1, 0, 1, 2, 3, 7, 64, 2**31 - 1, 2**40, 2**62, 2**63 - 1])


@st.composite
def _structural(draw):
    m = onnx.ModelProto()
    m.CopyFrom(SEED)
    g = m.graph
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["dim", "op", "attr", "input", "init_dims", "init_type", "init_data", "opset",
                                     "drop_node", "dup_node", "output", "elem_type", "ir"]))
        node = g.node[draw(st.integers(0, len(g.node) - 1))] if len(g.node) else None
        if what == "dim":
            vi = draw(st.sampled_from(list(g.input) + list(g.output)))
            dims = vi.type.tensor_type.shape.dim
            if dims:
                dims[draw(st.integers(0, len(dims) - 1))].dim_value = max(draw(_INTS), 0)
        elif what == "op" and node is not None:
            node.op_type = draw(st.sampled_from(_OPS))
        elif what == "attr" and node is not None and node.attribute:
            a = node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
            if a.ints:
                a.ints[draw(st.integers(0, len(a.ints) - 1))] = draw(_INTS)
            elif a.type == onnx.AttributeProto.INT:
                a.i = draw(_INTS)
            a.name = draw(st.sampled_from([a.name, a.name, "axis", "pads", "kernel_shape", "bogus"]))
        elif what == "input" and node is not None and node.input:
            names = [n for n2 in g.node for n in n2.output] + [i.name for i in g.initializer] + ["", "nowhere"]
            node.input[draw(st.integers(0, len(node.input) - 1))] = draw(st.sampled_from(names))
        elif what == "init_dims" and g.initializer:
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            if t.dims:
                t.dims[draw(st.integers(0, len(t.dims) - 1))] = draw(_INTS)
        elif what == "init_type" and g.initializer:
            g.initializer[draw(st.integers(0, len(g.initializer) - 1))].data_type = draw(st.integers(0, 30))
        elif what == "init_data" and g.initializer:
            t = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            t.raw_data = t.raw_data[:draw(st.integers(0, max(len(t.raw_data), 1)))]
        elif what == "opset":
            m.opset_import[0].version = draw(st.sampled_from([0, 1, 6, 11, 13, 17, 21, 99, 2**40]))
        elif what == "drop_node" and len(g.node):
            del g.node[draw(st.integers(0, len(g.node) - 1))]
        elif what == "dup_node" and node is not None:
            g.node.append(node)
        elif what == "output":
            g.output[0].name = draw(st.sampled_from(["y", "c", "r", "x", "missing"]))
        elif what == "elem_type":
            vi = draw(st.sampled_from(list(g.input) + list(g.output)))
            vi.type.tensor_type.elem_type = draw(st.integers(0, 30))
        elif what == "ir":
            m.ir_version = draw(st.sampled_from([0, 1, 3, 8, 10, 99]))
    return m.SerializeToString()


@FUZZ
@given(_structural())
def test_fuzz_onnx_structure(data):
    _only_kiln_errors(lambda: _build_and_run(data))


# -- plans -----------------------------------------------------------------------------------------------------
def _seed_plan() -> bytes:
    return kiln.build(SEED_BYTES, kiln.BuildConfig(device="cpu")).serialize()


SEED_PLAN = _seed_plan()


def _split(data: bytes) -> tuple[dict, dict, bytes]:
    header, payload = planfile.unpack(data)
    (mlen,) = struct.unpack("<Q", payload[:8])
    return header, json.loads(payload[8:8 + mlen]), payload[8 + mlen:]


def _join(header: dict, manifest: dict | bytes, weights: bytes) -> bytes:
    m = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    payload = struct.pack("<Q", len(m)) + m + weights
    header = dict(header, payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest())
    return planfile.pack_header(header) + payload  # both checksums recomputed: a hostile but well-formed plan


_JSON_VALUES = st.recursive(st.none() | st.booleans() | _INTS | st.floats() | st.text(max_size=8),
                            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                            max_leaves=6)


def _paths(value, prefix=()):
    """Every path into a JSON value (dict keys and list indices)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:20]):
            yield from _paths(v, prefix + (i,))


_MANIFEST_PATHS = [p for p in _paths(_split(SEED_PLAN)[1]) if p]


@st.composite
def _plan_mutation(draw):
    header, manifest, weights = _split(SEED_PLAN)
    kind = draw(st.sampled_from(["manifest", "manifest", "manifest", "weights", "header", "bytes"]))
    if kind == "bytes":
        return _mutate_bytes(SEED_PLAN, draw(_edits))
    if kind == "weights":
        return _join(header, manifest, _mutate_bytes(weights, draw(_edits)))
    if kind == "header":
        key = draw(st.sampled_from(["device", "hardware_compat", "format", "rebuild", "signature", "payload_bytes"]))
        header[key] = draw(_JSON_VALUES)
        return _join(header, manifest, weights)[: None if key != "payload_bytes" else None]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_MANIFEST_PATHS))
        parent = manifest
        try:
            for p in path[:-1]:
                parent = parent[p]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(_JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            pass
    return _join(header, manifest, weights)


@FUZZ
@given(_plan_mutation())
def test_fuzz_plans(tmp_path_factory, data):
    p = tmp_path_factory.getbasetemp() / "fuzz.plan"
    p.write_bytes(data)

    def load_and_run():
        kiln.load(p, policy="warn")

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _only_kiln_errors(load_and_run)


@FUZZ
@given(st.binary(max_size=200) | _JSON_VALUES.map(lambda v: json.dumps(v).encode()))
def test_fuzz_json_loader(data):
    _only_kiln_errors(lambda: loads_json(data, max_bytes=150, max_depth=3, max_values=20, expect=None))


def test_seed_inputs_are_valid():
    """The seeds themselves build, load and run: mutations start from working inputs."""
    np.testing.assert_allclose(_build_and_run(SEED_BYTES).create_context().run(FEEDS)["y"].sum(), 1.0, rtol=1e-5)
    header, manifest, weights = _split(SEED_PLAN)
    assert _join(header, manifest, weights) != b"" and planfile.FORMAT_VERSION == 2
