"""Bad inputs 1–20 of shared/reference/bad-inputs.md: each gets a clear KilnError, never a crash or a hang."""

from __future__ import annotations

import importlib
import json
import os
import pickle  # only to craft a hostile file in a test; kiln itself never imports pickle
import re
import struct

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto as T, helper, numpy_helper

import kiln
from kiln.engine import plan as planfile
from kiln.errors import (EngineCompatibilityError, InputError, KilnError, ModelError, PlanError, ResourceLimitError,
                         SecurityError, ShapeError, UnsupportedOpError)
from kiln.ir import DType
from kiln.runtime.io import check_byte_length
from test_cli import assert_one_error_line, invoke


def _model(nodes=None, inputs=None, outputs=None, inits=(), opset=17, **kw):
    nodes = nodes or [helper.make_node("Relu", ["x"], ["y"], name="relu0")]
    inputs = inputs or [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])]
    outputs = outputs or [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])]
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], **kw)


def _build(model):
    return kiln.build(model, kiln.BuildConfig(device="cpu"))


# 1 ------------------------------------------------------------------------------------------
def test_1_garbage_and_truncated_bytes(tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(b"\x00\xffnot a model at all\x12\x99")
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        _build(p)
    good = _model().SerializeToString()
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelError):
        _build(p)
    p.write_bytes(b"")
    with pytest.raises(ModelError, match="empty|not a valid"):
        _build(p)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512), st.integers(0, 400), st.integers(0, 255))
def test_1_fuzz_bytes_and_mutations(data, pos, byte):
    """Random bytes, and single-byte mutations of a valid model: only KilnError ever comes out."""
    for blob in (data, _mutate(_model().SerializeToString(), pos, byte)):
        try:
            _build(blob)
        except KilnError:
            pass


def _mutate(blob: bytes, pos: int, byte: int) -> bytes:
    pos %= len(blob)
    return blob[:pos] + bytes([byte]) + blob[pos + 1:]


# 2 ------------------------------------------------------------------------------------------
def test_2_missing_fields():
    m = _model()
    m.ClearField("graph")
    with pytest.raises(ModelError, match="graph"):
        _build(m)
    m = _model()
    m.ir_version = 0
    with pytest.raises(ModelError, match="ir_version"):
        _build(m)
    m = _model()
    del m.opset_import[:]
    with pytest.raises(ModelError, match="opset_import"):
        _build(m)


# 3 ------------------------------------------------------------------------------------------
def test_3_dangling_input_and_cycle():
    m = _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")])
    with pytest.raises(ModelError, match="adder|ghost"):
        _build(m)
    cyc = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
           helper.make_node("Relu", ["a"], ["y"], name="n3")]
    with pytest.raises(ModelError, match="n1|n2|cycle|topolog"):
        _build(_model(cyc))


def test_3_inspect_fails_on_a_cycle(tmp_path):
    """`kiln inspect` exits non-zero with the error naming the node, not a table row ending in exit 0."""
    cyc = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
           helper.make_node("Relu", ["a"], ["y"], name="n3")]
    onnx.save(_model(cyc), tmp_path / "cyc.onnx")
    for args in ([], ["--json"]):
        result = invoke("inspect", str(tmp_path / "cyc.onnx"), *args)
        assert_one_error_line(result, "topologically sorted", "n1")
        assert result.stdout == ""


# 4 ------------------------------------------------------------------------------------------
def test_4_unknown_op_and_newer_opset():
    m = _model([helper.make_node("FancyOp", ["x"], ["y"], name="fancy0", domain="com.acme")])
    m.opset_import.append(helper.make_opsetid("com.acme", 3))
    with pytest.raises(UnsupportedOpError) as e:
        _build(m)
    assert all(s in str(e.value) for s in ("fancy0", "FancyOp", "com.acme", "3", "plugin"))
    m = _model(opset=onnx.defs.onnx_opset_version() + 1)
    with pytest.raises(UnsupportedOpError, match="opset"):
        _build(m)


# 5 ------------------------------------------------------------------------------------------
def test_5_bad_attribute_and_input_count():
    bad_attr = helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky0")
    bad_attr.attribute.append(helper.make_attribute("alpha", "not a float"))
    with pytest.raises(ModelError, match="leaky0|alpha|LeakyRelu"):
        _build(_model([bad_attr]))
    with pytest.raises(ModelError, match="adder3|Add|input"):
        _build(_model([helper.make_node("Add", ["x", "x", "x"], ["y"], name="adder3")]))


# 6 ------------------------------------------------------------------------------------------
def test_6_shapes_that_cannot_match():
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
    mm = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm0")], inits=[w],
                outputs=[helper.make_tensor_value_info("y", T.FLOAT, [2, 5])])
    with pytest.raises(ShapeError, match="mm0|MatMul"):
        _build(mm)
    k = numpy_helper.from_array(np.ones((1, 2, 3, 3, 3), np.float32), "k")
    conv = _model([helper.make_node("Conv", ["x", "k"], ["y"], name="conv0")], inits=[k],
                  inputs=[helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 8, 8])],
                  outputs=[helper.make_tensor_value_info("y", T.FLOAT, [1, 1, 6, 6])])
    with pytest.raises(ShapeError, match="conv0|Conv"):
        _build(conv)
    # channels that disagree with the weight (found by the fuzzer): refused at build, never a failing kernel later
    k3 = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "k3")
    for channels in (0, 2):
        conv_c = _model([helper.make_node("Conv", ["x", "k3"], ["y"], name="convc")], inits=[k3],
                        inputs=[helper.make_tensor_value_info("x", T.FLOAT, [1, channels, 8, 8])],
                        outputs=[helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])])
        with pytest.raises(ShapeError, match="convc"):
            _build(conv_c)
    # a bias that is not one value per output channel (ONNX's shape inference does not check it)
    wrong_bias = numpy_helper.from_array(np.ones((4, 5), np.float32), "wb")
    conv_b = _model([helper.make_node("Conv", ["x", "k3", "wb"], ["y"], name="convb")], inits=[k3, wrong_bias],
                    inputs=[helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                    outputs=[helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])])
    with pytest.raises(ShapeError, match="convb.*bias"):
        _build(conv_b)


# 7 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand"])
def test_7_enormous_shapes_rejected_before_allocating(op):
    shape = numpy_helper.from_array(np.array([2**62, 4], np.int64), "s")
    if op == "ConstantOfShape":
        nodes = [helper.make_node("ConstantOfShape", ["s"], ["big"], name="cos0")]
        inputs = [helper.make_tensor_value_info("x", T.FLOAT, [1])]
    else:
        nodes = [helper.make_node("Expand", ["x", "s"], ["big"], name="exp0")]
        inputs = [helper.make_tensor_value_info("x", T.FLOAT, [1, 1])]
    nodes.append(helper.make_node("ReduceSum", ["big"], ["y"], name="sum0", keepdims=0))
    m = _model(nodes, inputs=inputs, outputs=[helper.make_tensor_value_info("y", T.FLOAT, [])], inits=[shape])
    with pytest.raises(ResourceLimitError):
        _build(m)


def test_7_declared_dims_overflow():
    m = _model(inputs=[helper.make_tensor_value_info("x", T.FLOAT, [2**40, 2**40])],
               outputs=[helper.make_tensor_value_info("y", T.FLOAT, [2**40, 2**40])])
    with pytest.raises(ResourceLimitError):
        _build(m)


def test_7_tensor_larger_than_the_build_device_memory(monkeypatch):
    """Within the 1 TiB cap but beyond this machine's memory: refused at build, never a failed allocation later."""
    build_module = importlib.import_module("kiln.builder.build")  # the package exports a function of that name
    monkeypatch.setattr(build_module, "memory_budget", lambda device: 1 << 30)
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    conv = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv0", pads=[2**24, 1, 2**24, 1])],
                  inits=[w], inputs=[helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                  outputs=[helper.make_tensor_value_info("y", T.FLOAT, ["n", "c", "h", "w"])])
    with pytest.raises(ResourceLimitError, match="memory budget"):
        _build(conv)


# 8 ------------------------------------------------------------------------------------------
def test_8_huge_rank_and_deep_nesting():
    m = _model(inputs=[helper.make_tensor_value_info("x", T.FLOAT, [1] * 5000)],
               outputs=[helper.make_tensor_value_info("y", T.FLOAT, [1] * 5000)])
    with pytest.raises(ResourceLimitError, match="rank"):
        _build(m)
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                             [helper.make_tensor_value_info("z", T.FLOAT, [2, 3])])
    body = leaf
    for depth in range(20):  # protobuf itself refuses nesting past ~100 message levels
        node = helper.make_node("If", ["c"], ["z"], name=f"if{depth}", then_branch=body, else_branch=leaf)
        body = helper.make_graph([node], f"b{depth}", [], [helper.make_tensor_value_info("z", T.FLOAT, [2, 3])])
    top = helper.make_node("If", ["c"], ["y"], name="top", then_branch=body, else_branch=leaf)
    m = _model([top], inputs=[helper.make_tensor_value_info("c", T.BOOL, []),
                              helper.make_tensor_value_info("x", T.FLOAT, [2, 3])])
    with pytest.raises(ResourceLimitError, match="nested"):
        _build(m)


# 9 ------------------------------------------------------------------------------------------
def test_9_over_2gib_without_external_data(tmp_path):
    p = tmp_path / "huge.onnx"
    with open(p, "wb") as f:  # sparse: costs no disk
        f.truncate(2**31 + 10)
    with pytest.raises(ModelError, match="external data"):
        _build(p)


# 10, 11 --------------------------------------------------------------------------------------
def _external_model(tmp_path, location: str, offset=0, length=24, extra=None):
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    entries = {"location": location, "offset": str(offset), "length": str(length), **(extra or {})}
    for k, v in entries.items():
        e = w.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add0")], inits=[w])
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(m.SerializeToString())
    return path


def _weights(path):
    path.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    return path


def test_10_external_data_ok_then_each_attack(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    _weights(model_dir / "w.bin")
    x = np.ones((2, 3), np.float32)
    y = _build(_external_model(tmp_path, "w.bin")).run({"x": x})["y"]
    np.testing.assert_array_equal(y, x + np.arange(6, dtype=np.float32).reshape(2, 3))

    secret = _weights(tmp_path / "secret.bin")
    cases = {"../secret.bin": "'\\.\\.'", str(secret): "absolute"}
    os.symlink(secret, model_dir / "link.bin")
    cases["link.bin"] = "symbolic"
    os.link(secret, model_dir / "hard.bin")
    cases["hard.bin"] = "hard"
    for location, why in cases.items():
        with pytest.raises(SecurityError, match=why):
            _build(_external_model(tmp_path, location))
    with pytest.raises(SecurityError, match="range"):
        _build(_external_model(tmp_path, "w.bin", offset=16, length=24))


def test_10_inspect_refuses_dotdot_external_data(tmp_path):
    """`kiln inspect` exits non-zero on a `..` location, before printing a report; a good location inspects."""
    (tmp_path / "model").mkdir()
    _weights(tmp_path / "model" / "w.bin")
    assert invoke("inspect", str(_external_model(tmp_path, "w.bin"))).exit_code == 0
    _weights(tmp_path / "secret.bin")
    result = invoke("inspect", str(_external_model(tmp_path, "../secret.bin")))
    assert_one_error_line(result, "'..' is not allowed")
    assert result.stdout == ""


def test_11_unknown_external_data_keys_are_ignored(tmp_path):
    (tmp_path / "model").mkdir()
    _weights(tmp_path / "model" / "w.bin")
    path = _external_model(tmp_path, "w.bin", extra={"basepath": "/etc", "exec": "rm -rf /"})
    assert _build(path).run({"x": np.zeros((2, 3), np.float32)})["y"].sum() == 15


# 12 ------------------------------------------------------------------------------------------
def test_12_save_never_follows_symlinks(tmp_path):
    engine = _build(_model())
    target = tmp_path / "outside.txt"
    target.write_text("keep me")
    (tmp_path / "out").mkdir()
    os.symlink(target, tmp_path / "out" / "m.plan")
    with pytest.raises(SecurityError):
        engine.save(tmp_path / "out" / "m.plan")
    assert target.read_text() == "keep me"
    with pytest.raises(PlanError, match="does not exist"):
        engine.save(tmp_path / "missing_dir" / "m.plan")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["m.plan"]  # no temp files left


# 13 ------------------------------------------------------------------------------------------
def test_13_truncated_flipped_empty_plans(tmp_path):
    p = tmp_path / "m.plan"
    _build(_model()).save(p)
    data = p.read_bytes()
    hdr = planfile.PREFIX.size + 10  # a byte inside the header JSON
    for bad, why in [(b"", "empty|truncated"), (data[:-7], "truncated"), (data[:20], "truncated"),
                     (data[:-3] + bytes([data[-3] ^ 0x40]) + data[-2:], "checksum"),
                     (data[:hdr] + bytes([data[hdr] ^ 0x01]) + data[hdr + 1:], "header checksum"),
                     (data[:20] + bytes([data[20] ^ 0x80]) + data[21:], "header checksum"),  # the stored digest
                     (data[:8] + struct.pack("<I", 1) + data[12:], "format 1.*rebuild")]:  # an old-format plan
        p.write_bytes(bad)
        with pytest.raises(PlanError, match=why):
            kiln.load(p)
    for k in range(200):  # 200 single-bit flips spread over the prefix and header: all refused
        pos = k * 7 % (planfile.PREFIX.size + planfile.PREFIX.unpack(data[:planfile.PREFIX.size])[2])
        p.write_bytes(data[:pos] + bytes([data[pos] ^ (1 << k % 8)]) + data[pos + 1:])
        with pytest.raises(PlanError):
            kiln.load(p)


# 14 ------------------------------------------------------------------------------------------
def _rewrite_header(path, **changes):
    header, payload = planfile.unpack(path.read_bytes())
    header["device"].update(changes)
    path.write_bytes(planfile.pack_header(header) + payload)


def test_14_other_versions_strict_and_warn(tmp_path):
    p = tmp_path / "m.plan"
    _build(_model()).save(p)
    _rewrite_header(p, kiln="0.0.1", torch="1.0.0")
    with pytest.raises(EngineCompatibilityError) as e:
        kiln.load(p)
    assert "0.0.1" in str(e.value) and "1.0.0" in str(e.value) and "rebuild" in str(e.value)
    with pytest.warns(UserWarning, match="0.0.1"):
        engine = kiln.load(p, policy="warn")
    assert engine.run({"x": -np.ones((2, 3), np.float32)})["y"].max() == 0
    _rewrite_header(p, backend="cuda", name="NVIDIA H100 80GB HBM3", cc="9.0", sms=132, memory=80 << 30,
                    cuda="12.8", driver="570.1")
    if not __import__("torch").cuda.is_available():
        with pytest.raises(EngineCompatibilityError, match="H100"):
            kiln.load(p, policy="warn")


def test_14_fingerprint_keys_are_all_required_and_known(tmp_path):
    """A misspelt or missing compatibility key is refused under every policy, never silently ignored."""
    p = tmp_path / "m.plan"
    _build(_model()).save(p)
    good = p.read_bytes()
    header, payload = planfile.unpack(good)
    device = header["device"]
    for bad, why in [({k if k != "torch" else "tOrch": v for k, v in device.items()}, r"lacks \['torch'\].*'tOrch'"),
                     ({k: v for k, v in device.items() if k not in ("kiln", "torch", "triton")}, "lacks"),
                     (dict(device, torch=2), "mistypes"), (dict(device, cc="9.0"), "unknown keys")]:
        p.write_bytes(planfile.pack_header(dict(header, device=bad)) + payload)
        for policy in ("strict", "warn", "retune"):
            with pytest.raises(EngineCompatibilityError, match=why):
                kiln.load(p, policy=policy)
    for edit, why in [({"tOrch": "1"}, "unknown keys"), ({"rebuild": None}, "'rebuild' is a NoneType"),
                      ({"format": 1}, "format 1")]:
        p.write_bytes(planfile.pack_header(dict(header, **edit)) + payload)
        with pytest.raises(PlanError, match=why):
            kiln.load(p)
    p.write_bytes(planfile.pack_header({k: v for k, v in header.items() if k != "source_sha256"}) + payload)
    with pytest.raises(PlanError, match="lacks"):
        kiln.load(p)


# 15 ------------------------------------------------------------------------------------------
def test_15_pickles_and_foreign_files_refused(tmp_path):
    p = tmp_path / "evil.plan"
    p.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(PlanError, match="pickle"):
        kiln.load(p)
    p.write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # a torch.save zip
    with pytest.raises(PlanError, match="pickle|zip"):
        kiln.load(p)
    # a well-formed plan whose weights section is a pickle: refused, never unpickled
    manifest = b"{}"
    payload = struct.pack("<Q", len(manifest)) + manifest + pickle.dumps(os.system)
    import hashlib

    header = dict(planfile.unpack(_build(_model()).serialize())[0], payload_bytes=len(payload),
                  payload_sha256=hashlib.sha256(payload).hexdigest())
    p.write_bytes(planfile.pack_header(header) + payload)
    with pytest.raises(PlanError, match="safetensors|pickle"):
        kiln.load(p)


# 16–20: inference inputs, through the Python API and `kiln run` --------------------------------
def _io_model(batch="b"):
    """y = relu(x + k), n = -x, all [batch, 4]: two inputs, to check names, dtypes, shapes and IEEE values."""
    io = lambda n: helper.make_tensor_value_info(n, T.FLOAT, [batch, 4])  # noqa: E731
    return _model([helper.make_node("Add", ["x", "k"], ["s"], name="add0"),
                   helper.make_node("Relu", ["s"], ["y"], name="relu0"),
                   helper.make_node("Neg", ["x"], ["n"], name="neg0")],
                  [io("x"), io("k")], [io("y"), io("n")])


def _profiled():
    """The io model for batches 0..4 (its only profile)."""
    r = kiln.ShapeRange((0, 4), (2, 4), (4, 4))
    return kiln.build(_io_model(), kiln.BuildConfig(device="cpu", profiles=({"x": r, "k": r},)))


@pytest.fixture
def io_plan(tmp_path):
    onnx.save(_io_model(), tmp_path / "io.onnx")
    result = invoke("build", str(tmp_path / "io.onnx"), "-o", str(tmp_path / "io.plan"), "--device", "cpu",
                    "--min-shapes", "x:0x4,k:0x4", "--max-shapes", "x:4x4,k:4x4")
    assert result.exit_code == 0, result.output
    return str(tmp_path / "io.plan")


def _files(folder, **arrays) -> list[str]:
    """`--input name=file.npy` arguments for `arrays`, saved in `folder`."""
    args = []
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
        args += ["--input", f"{name}={folder / f'{name}.npy'}"]
    return args


def _strict_json(text: str):
    """Parse as strict JSON: NaN, Infinity and -Infinity literals are not JSON."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON output"))


def test_16_wrong_missing_or_extra_input_names(io_plan, tmp_path):
    ctx = _profiled().create_context()
    x = np.ones((2, 4), np.float32)
    for feeds, why in [({"x": x}, "missing ['k']"), ({"x": x, "k": x, "z": x}, "unexpected ['z']"),
                       ({"X": x, "k": x}, "missing ['x'], unexpected ['X']")]:
        with pytest.raises(InputError, match=re.escape(why)) as e:
            ctx.run(feeds)
        assert "the engine expects ['x', 'k']" in str(e.value)
    assert_one_error_line(invoke("run", io_plan, *_files(tmp_path, x=x)), "missing ['k']", "expects ['x', 'k']")
    assert_one_error_line(invoke("run", io_plan, *_files(tmp_path, x=x, k=x, z=x)), "unexpected ['z']",
                          "expects ['x', 'k']")


def test_17_wrong_dtype_or_byte_length(io_plan, tmp_path):
    ctx = _profiled().create_context()
    x = np.ones((2, 4), np.float32)
    for bad, got in [(x.astype(np.float64), "float64"), (x.astype(np.int32), "int32"),
                     (torch.ones(2, 4, dtype=torch.float16), "float16")]:
        with pytest.raises(InputError, match=f"input 'k': expected dtype float32, got {got}"):
            ctx.run({"x": x, "k": bad})
    # raw buffers (what a server receives): byte length must be prod(shape) x itemsize
    with pytest.raises(InputError, match=r"31 bytes given, but shape \[2, 4\] of float32 needs 32 bytes"):
        check_byte_length("x", bytes(31), DType.FLOAT32, (2, 4))
    check_byte_length("x", bytes(32), DType.FLOAT32, (2, 4))
    # CLI: a .npy of another dtype, one cut short, one with bytes past its header's shape
    assert_one_error_line(invoke("run", io_plan, *_files(tmp_path, x=x, k=x.astype(np.float64))),
                          "expected dtype float32, got float64")
    blob = (tmp_path / "k.npy").read_bytes()
    (tmp_path / "k.npy").write_bytes(blob[:-5])
    args = ["run", io_plan, "--input", f"x={tmp_path / 'x.npy'}", "--input", f"k={tmp_path / 'k.npy'}"]
    assert_one_error_line(invoke(*args), "k.npy")
    (tmp_path / "k.npy").write_bytes(blob + bytes(8))
    assert_one_error_line(invoke(*args), "k.npy", "72 data bytes", "[2, 4] of float64 needs 64")


def test_18_shape_outside_every_profile(io_plan, tmp_path):
    """An error naming the profile's range, never a rebuild; the context still runs shapes inside it."""
    engine = _profiled()
    ctx = engine.create_context()
    big = np.ones((8, 4), np.float32)
    with pytest.raises(InputError, match="outside every optimization profile") as e:
        ctx.run({"x": big, "k": big})
    assert "x 0x4..4x4" in str(e.value) and "x 8x4" in str(e.value)
    assert engine.config.profiles[0]["x"].max == (4, 4)
    assert ctx.run({"x": big[:4], "k": big[:4]})["y"].shape == (4, 4)
    static = _build(_model()).create_context()
    with pytest.raises(InputError, match=re.escape("expected shape [2,3], got [2, 5]")):
        static.run({"x": np.ones((2, 5), np.float32)})
    assert_one_error_line(invoke("run", io_plan, *_files(tmp_path, x=big, k=big)),
                          "outside every optimization profile", "x 0x4..4x4")


def test_19_empty_batch_and_zero_size_dims(io_plan, tmp_path):
    empty = np.zeros((0, 4), np.float32)
    for engine in (_profiled(), _build(_io_model(batch=0))):
        out = engine.create_context().run({"x": empty, "k": empty})
        assert {k: (v.shape, v.dtype) for k, v in out.items()} == {"y": ((0, 4), np.float32), "n": ((0, 4), np.float32)}
    result = invoke("run", io_plan, *_files(tmp_path, x=empty, k=empty), "--json")
    assert result.exit_code == 0, result.output
    assert _strict_json(result.stdout)["y"] == {"shape": [0, 4], "dtype": "float32", "file": None}


def test_20_nan_and_inf_follow_ieee_and_json_stays_parseable(io_plan, tmp_path):
    nan, inf = np.nan, np.inf
    x = np.array([[nan, inf, -inf, 1], [-0.0, 3e38, inf, -1]], np.float32)
    k = np.array([[1, 1, inf, -inf], [0, 3e38, -inf, 0]], np.float32)  # 3e38 + 3e38 overflows to inf
    out = _profiled().create_context().run({"x": x, "k": k})
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(out["y"], np.maximum(x + k, 0))  # NaN where IEEE says (inf - inf, NaN + 1)
    np.testing.assert_array_equal(out["n"], -x)
    assert np.isnan(out["y"][0, 0]) and np.isnan(out["y"][1, 2]) and out["y"][1, 1] == inf
    # --json: NaN is null, ±Inf the strings "Infinity" / "-Infinity"; no warning lines on stderr
    x, k = np.array([[-inf, inf, 0, 1]], np.float32), np.zeros((1, 4), np.float32)
    result = invoke("run", io_plan, *_files(tmp_path, x=x, k=k), "--json")
    assert result.exit_code == 0 and result.stderr == "", result.output
    d = _strict_json(result.stdout)
    assert (d["y"]["min"], d["y"]["max"], d["y"]["mean"]) == (0.0, "Infinity", "Infinity")
    assert (d["n"]["min"], d["n"]["max"], d["n"]["mean"]) == ("-Infinity", "Infinity", None)  # inf - inf: NaN
    x[0, 0] = nan
    d = _strict_json(invoke("run", io_plan, *_files(tmp_path, x=x, k=k), "--json").stdout)
    assert d["n"]["min"] is None and d["n"]["max"] is None and d["n"]["mean"] is None
