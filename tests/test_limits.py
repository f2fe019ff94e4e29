"""Issue 25 part 3: paths stay inside the model's folder and resource caps hold before any costly work."""

from __future__ import annotations

import importlib
import os
import time
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import kiln
from kiln.errors import InputError, ModelError, ResourceLimitError, SecurityError
from kiln.util import npyio
from kiln.frontend.onnx import external_data
from test_cli import assert_one_error_line, invoke


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _build(model, **kw):
    return kiln.build(model, kiln.BuildConfig(device="cpu"), **kw)


def _external(folder, location="w.bin"):
    """A model adding an external (2, 3) weight read from `location`, saved as folder/m.onnx."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    for k, v in {"location": location, "offset": "0", "length": "24"}.items():
        e = w.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add0")],
               [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
               [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])], inits=[w])
    folder.mkdir(exist_ok=True)
    (folder / "m.onnx").write_bytes(m.SerializeToString())
    return folder / "m.onnx"


def _write_weights(path, value=0.0):
    path.write_bytes((np.arange(6, dtype=np.float32) + value).tobytes())
    return path


# external data: open once, never follow a link --------------------------------------------------------------
@pytest.fixture
def unchecked(monkeypatch):
    """resolve_location passing everything lexical: what the file system holds is then for the open to refuse."""
    monkeypatch.setattr(external_data, "resolve_location",
                        lambda base, location, name: base.resolve() / location)


def test_open_refuses_a_symlink_the_check_let_through(tmp_path, unchecked):
    """The race: `w.bin` checked as a file, then swapped for a link to a secret before the open."""
    folder = tmp_path / "model"
    model = _external(folder)
    secret = _write_weights(tmp_path / "secret.bin", 100.0)
    os.symlink(secret, folder / "w.bin")
    with pytest.raises(SecurityError, match="symbolic link"):
        _build(model)


def test_open_refuses_a_linked_folder_hard_link_and_fifo(tmp_path, unchecked):
    outside = tmp_path / "outside"
    outside.mkdir()
    _write_weights(outside / "w.bin")
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(outside, folder / "sub")
    with pytest.raises(SecurityError, match="symbolic link"):
        _build(_external(folder, "sub/w.bin"))
    os.link(outside / "w.bin", folder / "hard.bin")
    with pytest.raises(SecurityError, match="hard-linked"):
        _build(_external(folder, "hard.bin"))
    os.mkfifo(folder / "fifo.bin")
    with pytest.raises(SecurityError, match="not a regular file"):
        _build(_external(folder, "fifo.bin"))


def test_plain_attacks_still_fail_and_a_good_file_reads(tmp_path):
    folder = tmp_path / "model"
    _write_weights(_external(folder).parent / "w.bin")
    y = _build(folder / "m.onnx").run({"x": np.zeros((2, 3), np.float32)})["y"]
    np.testing.assert_array_equal(y.reshape(-1), np.arange(6, dtype=np.float32))
    secret = _write_weights(tmp_path / "secret.bin", 100.0)
    os.symlink(secret, folder / "link.bin")
    for location, why in {"../secret.bin": "'..'", str(secret): "absolute", "link.bin": "symbolic"}.items():
        with pytest.raises(SecurityError, match=why):
            _build(_external(folder, location))


def test_external_data_over_the_byte_budget(tmp_path):
    folder = tmp_path / "model"
    _write_weights(_external(folder).parent / "w.bin")
    with pytest.raises(ResourceLimitError, match="limit of 10 bytes"):
        external_data.load_external_data(onnx.load(folder / "m.onnx", load_external_data=False), folder, 10)


# models given as bytes: external data needs base_dir ---------------------------------------------------------
def test_bytes_with_external_data_need_base_dir(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    _write_weights(_external(folder).parent / "w.bin")
    data = (folder / "m.onnx").read_bytes()
    monkeypatch.chdir(folder)  # the process's folder holds w.bin: kiln must still not read it from there
    with pytest.raises(ModelError, match="base_dir"):
        _build(data)
    with pytest.raises(ModelError, match="base_dir"):
        _build(onnx.load_from_string(data))
    y = _build(data, base_dir=folder).run({"x": np.zeros((2, 3), np.float32)})["y"]
    assert y.sum() == 15
    with pytest.raises(ModelError, match="not a folder"):
        _build(data, base_dir=folder / "w.bin")


# shape inference: caps first, data propagation bounded ------------------------------------------------------
def _constant_of_shape_add(n: int) -> onnx.ModelProto:
    """136 bytes: ConstantOfShape([n]) + Add, whose data propagation holds ~140 bytes per element."""
    s = numpy_helper.from_array(np.array([n], np.int64), "s")
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"], value=helper.make_tensor("v", T.FLOAT, [1], [1])),
             helper.make_node("Add", ["c", "c"], ["y"])]
    return _model(nodes, [], [helper.make_tensor_value_info("y", T.FLOAT, ["n"])], inits=[s])


@pytest.mark.parametrize("n", [10**9, 10**12])
def test_constant_of_shape_add_fails_fast(n, monkeypatch):
    """Within the 1 TiB cap (10**9) the build device's memory refuses it; either way before data propagation."""
    build_module = importlib.import_module("kiln.builder.build")
    monkeypatch.setattr(build_module, "memory_budget", lambda device: 1 << 30)
    start = time.perf_counter()
    with pytest.raises(ResourceLimitError, match="memory budget"):
        _build(_constant_of_shape_add(n))
    assert time.perf_counter() - start < 5


def test_data_propagation_skipped_over_its_budget(monkeypatch):
    """A 1-D tensor past max_shape_values is imported without data propagation, not refused."""
    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda *a, **kw: calls.append(kw["data_prop"]) or real(*a, **kw))
    _build(_constant_of_shape_add(2**20 + 1))
    assert calls == [False]
    calls.clear()
    _build(_constant_of_shape_add(8))
    assert calls == [False, True]


# .npy / .npz: headers and the zip directory are checked before any data is read -----------------------------
def _npy_claiming(path, shape, data=b"\0" * 16):
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.write(data)
    return path


def _relu(tmp_path):
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")],
               [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
               [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    onnx.save(m, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


@pytest.fixture
def no_data_read(monkeypatch):
    """Any array data read (or decompressed) fails the test."""
    def refuse(*a, **kw):
        raise AssertionError("array data was read before its header was checked")
    monkeypatch.setattr(np.lib.format, "read_array", refuse)


def test_npy_header_claiming_1e15_elements_is_an_input_error(tmp_path, no_data_read):
    path = _npy_claiming(tmp_path / "x.npy", (10**15,))
    with pytest.raises(InputError, match="header's shape"):
        npyio.read_npy(path)
    result = invoke("run", str(_relu(tmp_path)), "--device", "cpu", "--input", f"x={path}")
    assert_one_error_line(result, "header's shape")
    assert result.exit_code == 1


def test_npz_sizes_and_names_checked_before_decompressing(tmp_path, no_data_read):
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, x=np.zeros(4_000_000, np.uint8))  # 4 MB from a few KB
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ResourceLimitError, match="over the limit of 1000000 bytes"):
        npyio.read_npz(bomb, max_bytes=1_000_000)
    with pytest.raises(InputError, match="not inputs"):
        npyio.read_npz(bomb, names=["input"], others_ok=False)
    assert npyio.read_npz(bomb, names=["input"]) == {}  # skipped, never read
    model = str(_relu(tmp_path))  # its one input x takes 6 float32s: 48 bytes at 8 bytes an element
    assert_one_error_line(invoke("run", model, "--device", "cpu", "--input", str(bomb)), "over the limit of 48 bytes")
    np.savez_compressed(tmp_path / "named.npz", wrong=np.zeros((2, 3), np.float32))
    assert_one_error_line(invoke("run", model, "--device", "cpu", "--input", str(tmp_path / "named.npz")),
                          "['wrong'] that are not inputs")


def test_npz_member_with_lying_header(tmp_path):
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", _npy_claiming(tmp_path / "x.npy", (10**15,)).read_bytes())
    with pytest.raises(InputError, match="header's shape"):
        npyio.read_npz(path)


def test_npy_and_npz_still_read(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "a.npz", x=x)
    np.testing.assert_array_equal(npyio.read_npy(tmp_path / "x.npy"), x)
    np.testing.assert_array_equal(npyio.read_npy(tmp_path / "x.npy", mmap=True), x)
    np.testing.assert_array_equal(npyio.read_npz(tmp_path / "a.npz")["x"], x)
    result = invoke("run", str(_relu(tmp_path)), "--device", "cpu", "--input", str(tmp_path / "a.npz"), "--json")
    assert result.exit_code == 0, result.output


def test_calibration_reads_only_the_inputs_and_checks_headers(tmp_path):
    from kiln.quant.calibrate import calibration_data
    np.savez(tmp_path / "c.npz", x=np.ones((4, 3), np.float32), other=np.ones(10, np.float32))
    data = calibration_data(str(tmp_path / "c.npz"), ["x"], batch=2)
    assert [b["x"].shape for b in data.batches] == [(2, 3), (2, 3)]
    with pytest.raises(InputError, match="header's shape"):
        calibration_data(str(_npy_claiming(tmp_path / "x.npy", (10**15, 3))), ["x"])


# bench: bounded runs, and the model read with the loader's limits -------------------------------------------
@pytest.mark.parametrize("flag, value, words", [
    ("--duration", "inf", "--duration must be"), ("--duration", "1e300", "86,400"), ("--duration", "nan", "--duration"),
    ("--iterations", "99999999999999999999", "10,000,000"), ("--warmup", "99999999999", "--warmup")])
def test_bench_run_length_is_bounded(tmp_path, flag, value, words):
    assert_one_error_line(invoke("bench", str(_relu(tmp_path)), "--device", "cpu", flag, value), words)


def test_bench_batch_reads_the_model_with_the_loader_limits(tmp_path):
    p = tmp_path / "huge.onnx"
    with open(p, "wb") as f:  # sparse: costs no disk
        f.truncate(2**31 + 10)
    assert_one_error_line(invoke("bench", str(p), "--device", "cpu", "--batch", "2"), "2 GiB")


# run time: shapes fed as data ask for too much ------------------------------------------------------------
def _shape_fed(op):
    vi = helper.make_tensor_value_info
    if op == "ConstantOfShape":
        nodes = [helper.make_node(op, ["n"], ["y"], value=helper.make_tensor("v", T.FLOAT, [1], [1]))]
        inputs = [vi("n", T.INT64, [1])]
    elif op == "Range":
        nodes = [helper.make_node(op, ["s", "n", "d"], ["y"])]
        inputs = [vi("s", T.FLOAT, []), vi("n", T.FLOAT, []), vi("d", T.FLOAT, [])]
    else:
        nodes = [helper.make_node(op, ["x", "n"], ["y"])]
        inputs = [vi("x", T.FLOAT, [1]), vi("n", T.INT64, [1])]
    return _build(_model(nodes, inputs, [vi("y", T.FLOAT, ["a"])]))


CASES = [(op, v) for op in ("ConstantOfShape", "Expand", "Tile") for v in (10**12, 2**62, -1)] + \
    [("Range", v) for v in (1e12, float("nan"), float("inf"))]


@pytest.mark.parametrize("op, value", CASES)
def test_input_driven_shapes_are_input_errors(op, value):
    engine = _shape_fed(op)
    if op == "Range":
        feeds = {"s": np.float32(0), "n": np.float32(value), "d": np.float32(1)}
    else:
        feeds = {"n": np.array([value], np.int64), **({} if op == "ConstantOfShape" else {"x": np.ones(1, np.float32)})}
    with pytest.raises(InputError, match=rf"{op}.*reading \[.*'n'.*(negative|memory budget|finite)"):
        engine.create_context().run(feeds)


def test_range_with_zero_delta_and_empty_range():
    engine = _shape_fed("Range")
    with pytest.raises(InputError, match="delta non-zero"):
        engine.create_context().run({"s": np.float32(0), "n": np.float32(1), "d": np.float32(0)})
    assert engine.create_context().run({"s": np.float32(0), "n": np.float32(-1), "d": np.float32(1)})["y"].size == 0


def test_input_driven_shape_in_the_cli_exits_1(tmp_path):
    vi = helper.make_tensor_value_info
    m = _model([helper.make_node("ConstantOfShape", ["n"], ["y"], value=helper.make_tensor("v", T.FLOAT, [1], [1]))],
               [vi("n", T.INT64, [1])], [vi("y", T.FLOAT, ["a"])])
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "n.npy", np.array([2**62], np.int64))
    result = invoke("run", str(tmp_path / "m.onnx"), "--device", "cpu", "--input", f"n={tmp_path / 'n.npy'}")
    assert_one_error_line(result, "memory budget", "'n'")
    assert result.exit_code == 1


def test_input_driven_pads_are_input_errors():
    vi = helper.make_tensor_value_info
    engine = _build(_model([helper.make_node("Pad", ["x", "n"], ["y"])], [vi("x", T.FLOAT, [1]), vi("n", T.INT64, [2])],
                           [vi("y", T.FLOAT, ["a"])]))
    x = np.ones(1, np.float32)
    assert engine.create_context().run({"x": x, "n": np.array([1, 2], np.int64)})["y"].tolist() == [0, 1, 0, 0]
    with pytest.raises(InputError, match=r"Pad.*reading \[.*'n'.*memory budget"):
        engine.create_context().run({"x": x, "n": np.array([0, 2**60], np.int64)})


def test_a_profile_larger_than_the_device_is_refused_before_the_build(tmp_path):
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")],
               [helper.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
               [helper.make_tensor_value_info("y", T.FLOAT, ["n", 4])])
    onnx.save(m, tmp_path / "m.onnx")
    huge = {"x": ((1, 4), (1, 4), (9_999_999_999_999, 4))}
    with pytest.raises(ResourceLimitError, match="input 'x' at its max shape"):
        kiln.build(m, kiln.BuildConfig(device="cpu", profiles=(huge,)))
    r = invoke("build", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.plan"), "--min-shapes", "x:1x4",
               "--opt-shapes", "x:1x4", "--max-shapes", "x:9999999999999x4")
    assert_one_error_line(r, "lower --max-shapes")
    assert not (tmp_path / "m.plan").exists()
