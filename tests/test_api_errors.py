"""Errors that say the right thing (issue 25 part 5): every public entry point turns a wrong argument into a
KilnError naming it, the CLI never reports a user's mistake as a bug in kiln, and a kernel's failure is never
blamed on the user's shapes."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import kiln
import kiln.onnx_backend as backend
from kiln.errors import InputError, KilnError
from kiln.runtime.context import KernelFallbackWarning
from kiln.tactics import registry
from test_cli import assert_one_error_line, invoke, tiny_model

X = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("api") / "tiny.onnx")


@pytest.fixture(scope="module")
def engine(model):
    return kiln.build(model, kiln.BuildConfig.with_shapes({"x": (2, 4)}, device="cpu"))


def _add_node(*inputs):
    return helper.make_node("Add", list(inputs), ["c"])


CASES = {  # (call(engine, model), words the message must hold: the argument it names)
    "run(list)": (lambda e, m: e.create_context().run([X]), ["feeds", "['x']"]),
    "run(None)": (lambda e, m: e.create_context().run(None), ["feeds"]),
    "run(str)": (lambda e, m: e.create_context().run("x"), ["feeds"]),
    "meta tensor": (lambda e, m: e.create_context().run({"x": torch.empty(2, 4, device="meta")}), ["'x'", "meta"]),
    "keep unknown": (lambda e, m: e.create_context().run({"x": X}, keep={"nope"}), ["keep", "nope"]),
    "keep str": (lambda e, m: e.create_context().run({"x": X}, keep="y"), ["keep"]),
    "build(None)": (lambda e, m: kiln.build(None), ["model", "NoneType"]),
    "build(123)": (lambda e, m: kiln.build(123), ["model", "int"]),
    "build(dict)": (lambda e, m: kiln.build({}), ["model", "dict"]),
    "build config dict": (lambda e, m: kiln.build(m, {"fp16": True}), ["config", "BuildConfig"]),
    "load(None)": (lambda e, m: kiln.load(None), ["plan file path", "NoneType"]),
    "opt_level str": (lambda e, m: kiln.BuildConfig(opt_level="3"), ["opt_level"]),
    "workspace str": (lambda e, m: kiln.BuildConfig(workspace_bytes="256M"), ["workspace_bytes"]),
    "fp16 int": (lambda e, m: kiln.BuildConfig(fp16=1), ["fp16"]),
    "profile pair": (lambda e, m: kiln.BuildConfig(profiles=({"x": ((1, 4), (2, 4))},)), ["profiles", "'x'"]),
    "profile str": (lambda e, m: kiln.BuildConfig(profiles=("x",)), ["profiles"]),
    "profile dict": (lambda e, m: kiln.BuildConfig(profiles={"x": ((1, 4),) * 3}), ["profiles"]),
    "profile dim str": (lambda e, m: kiln.BuildConfig(profiles=({"x": ((1, "a"),) * 3},)), ["profiles", "'x'"]),
    "profile dim huge": (lambda e, m: kiln.BuildConfig(profiles=({"x": ((2**64, 4),) * 3},)), ["'x'", "int64"]),
    "with_shapes str": (lambda e, m: kiln.BuildConfig.with_shapes({"x": "1x4"}), ["'x'", "'1x4'"]),
    "with_shapes list": (lambda e, m: kiln.BuildConfig.with_shapes([("x", (1, 4))]), ["shapes"]),
    "calib without int8": (lambda e, m: kiln.BuildConfig(calib="c.npz"), ["--calib", "--int8"]),
    "calibrator without int8": (lambda e, m: kiln.BuildConfig(calibrator="minmax"), ["--calibrator", "--int8"]),
    "backend device": (lambda e, m: backend.prepare(onnx.load(m), device="TPU"), ["'TPU'", "CPU"]),
    "backend run(None)": (lambda e, m: backend.prepare(onnx.load(m)).run(None), ["inputs", "['x']"]),
    "backend extra input": (lambda e, m: backend.prepare(onnx.load(m)).run([X, X]), ["2 inputs", "['x']"]),
    "run_node bad node": (lambda e, m: backend.run_node(_add_node("a"), [X]), ["Add"]),
    "run_node None": (lambda e, m: backend.run_node(None, [X]), ["node"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_argument_is_a_kiln_error_naming_it(case, engine, model):
    call, words = CASES[case]
    with pytest.raises(KilnError) as info:
        call(engine, model)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_big_endian_arrays_are_converted(engine):
    want = engine.run({"x": X})
    got = engine.run({"x": X.astype(">f4")})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_run_node_runs_the_node():
    (got,) = backend.run_node(_add_node("a", "b"), [X, 2 * X])
    np.testing.assert_array_equal(got, 3 * X)


# -- the command line -----------------------------------------------------------------------------------------
def test_negative_seed_is_a_usage_error(model):
    result = invoke("run", str(model), "--device", "cpu", "--seed", "-1")
    assert result.exit_code not in (0, 70) and "--seed" in result.output, result.output


@pytest.mark.parametrize("command", ["run", "build"])
def test_shapes_over_int64_are_a_user_error(command, model, tmp_path):
    extra = ["-o", str(tmp_path / "m.plan")] if command == "build" else []
    result = invoke(command, str(model), "--device", "cpu", "--shapes", "x:99999999999999999999x4", *extra)
    assert result.exit_code not in (0, 70)
    assert_one_error_line(result, "--shapes", "int64")


def test_running_out_of_host_memory_is_not_a_bug(model, tmp_path, monkeypatch):
    # the build refuses such a profile up front (test_limits.py); here it must get through, to reach the run
    monkeypatch.setattr(importlib.import_module("kiln.builder.build"), "check_profile_memory", lambda *a: None)
    plan = tmp_path / "dyn.plan"
    assert invoke("build", str(model), "-o", str(plan), "--device", "cpu", "--min-shapes", "x:1x4",
                  "--max-shapes", "x:9999999999999x4").exit_code == 0
    result = invoke("run", str(plan), "--shapes", "x:9999999999999x4")  # 291 TiB of random float64
    assert result.exit_code not in (0, 70)
    assert_one_error_line(result, "out of host memory")


@pytest.mark.parametrize("path, words", [("{tmp}", "is a directory"), ("/dev/zero", "is not a regular file")])
def test_a_plan_that_is_no_regular_file_says_what_it_is(path, words, tmp_path):
    result = invoke("run", path.format(tmp=tmp_path))
    assert_one_error_line(result, words)


def test_opt_level_on_the_cpu_says_it_has_no_effect(model, tmp_path):
    result = invoke("build", str(model), "-o", str(tmp_path / "m.plan"), "--device", "cpu", "--opt-level", "5",
                    "--json")
    assert result.exit_code == 0, result.output
    assert "--opt-level has no effect on the CPU backend" in result.stdout


def test_calib_without_int8_is_a_config_error(model, tmp_path):
    np.savez(tmp_path / "calib.npz", x=X)
    result = invoke("build", str(model), "-o", str(tmp_path / "m.plan"), "--device", "cpu",
                    "--calib", str(tmp_path / "calib.npz"))
    assert_one_error_line(result, "--calib needs --int8 or --fp8")


# -- random integer inputs and out-of-range indices ------------------------------------------------------------
def embedding_model(path):
    """BERT's embeddings in little: y = words[input_ids] + types[token_type_ids], a 2-row token-type table."""
    words = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "words")
    types = numpy_helper.from_array(np.array([[0.5] * 4, [-0.5] * 4], np.float32), "types")
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"]),
             helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
             helper.make_node("Add", ["w", "t"], ["y"])]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, [2, 8]) for n in ("input_ids", "token_type_ids")]
    graph = helper.make_graph(nodes, "emb", ids, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 4])],
                              initializer=[words, types])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


@pytest.mark.parametrize("seed", range(3))
def test_random_integer_inputs_stay_inside_the_tables_they_index(seed, tmp_path):
    result = invoke("run", str(embedding_model(tmp_path / "emb.onnx")), "--device", "cpu", "--seed", str(seed))
    assert result.exit_code == 0, result.output


def test_an_index_out_of_its_table_is_an_input_error_naming_the_input(tmp_path):
    engine = kiln.build(embedding_model(tmp_path / "emb.onnx"), kiln.BuildConfig(device="cpu"))
    ids = np.zeros((2, 8), np.int64)
    got = engine.run({"input_ids": ids - 1, "token_type_ids": ids + 1})["y"]  # -1: the last row
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(36, 40, dtype=np.float32) - 0.5, (2, 8, 4)))
    with pytest.raises(InputError, match=r"'token_type_ids'.*\[-2, 2\).*from 0 to 2"):
        engine.run({"input_ids": ids, "token_type_ids": ids + np.eye(2, 8, dtype=np.int64) * 2})


# -- a kernel failing at run time --------------------------------------------------------------------------------
def test_a_failing_kernel_falls_back_to_the_reference_and_says_it_is_ours(model):
    engine = kiln.build(model, kiln.BuildConfig.with_shapes({"x": (2, 4)}, device="cpu"))
    want = engine.run({"x": X})
    step = 0
    layer = engine.network.layers[step]

    def broken(inputs, out=None):
        raise RuntimeError("No available kernel. Aborting execution.")

    engine.kernels[step] = broken
    engine.compiled[layer.name] = registry.get("sdpa")
    with pytest.warns(KernelFallbackWarning, match=f"{layer.name}.*sdpa.*bug in kiln"):
        got = engine.run({"x": X})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


# -- int8 calibration -----------------------------------------------------------------------------------------
def test_entropy_calibration_with_nothing_below_the_first_edges_is_quiet():
    from kiln.quant import calibrators
    from kiln.quant.histogram import Histogram

    h = Histogram()
    h.add(torch.tensor([100.0, 200.0, 1000.0]))  # bins of 0.5: the first 128 (up to 64) are empty
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert calibrators.get("entropy").amax(h, 99.99) == 1000.0


def test_an_int8_build_prints_no_numpy_warning(tmp_path):
    g = np.random.default_rng(0)
    w = numpy_helper.from_array(g.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    w2 = numpy_helper.from_array(g.standard_normal((16, 8)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], initializer=[w, w2])
    path = tmp_path / "cnn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    np.savez(tmp_path / "calib.npz", x=g.standard_normal((8, 4, 8, 8)).astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "calib.npz")))
    assert engine.build_info["int8"]


# -- SDPA over a dynamic profile ------------------------------------------------------------------------------
def _attention_spec(dtype, d):
    from kiln.ir import DType
    from kiln.tactics.spec import LayerSpec, ValueSpec

    v = ValueSpec(DType.from_torch(dtype), ("b", 2, "s", d))
    attrs = {"scale": None, "is_causal": 0, "softcap": 0.0, "softmax_precision": None, "qk_matmul_output_mode": 0,
             "left_window_size": -1, "right_window_size": -1, "q_num_heads": 0, "kv_num_heads": 0}
    mask = ValueSpec(v.dtype, ("b", 1, "s", "s"))
    return LayerSpec("attn", "Attention", attrs, (v, v, v, mask), (v,) + (ValueSpec(None, None),) * 3)


def test_sdpa_offers_fp32_only_the_backends_that_take_fp32():
    """flash and cuDNN refuse fp32 at every shape: the untimed (first) config of an fp32 layer must not be one."""
    sdpa = registry.get("sdpa")
    assert [c["backend"] for c in sdpa.configs(_attention_spec(torch.float32, 4), None, 3)] == ["efficient", "math"]
    assert len(sdpa.configs(_attention_spec(torch.float16, 4), None, 3)) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, backend", [(torch.float32, "flash"), (torch.float32, "efficient"),
                                            (torch.float16, "cudnn"), (torch.float16, "efficient")])
def test_gpu_every_sdpa_config_runs_every_shape(dtype, backend):
    """A backend that cannot take a shape (flash: fp32; cuDNN: sequence length 1; efficient fp16: head size 4)
    hands it to the math kernel instead of failing with "No available kernel"."""
    from kiln.target.device import detect
    from kiln.kinds import run_reference

    spec = _attention_spec(dtype, 4)
    kernel = registry.get("sdpa").compile(spec, {"backend": backend}, detect("cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    for b, s in [(1, 1), (3, 7), (2, 64)]:
        q, k, v = (torch.randn(b, 2, s, 4, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        mask = torch.zeros(b, 1, s, s, device="cuda", dtype=dtype)
        want = run_reference("Attention", [q.float(), k.float(), v.float(), mask.float()], spec.attrs)[0]
        torch.testing.assert_close(kernel([q, k, v, mask])[0].float(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [{"backend": "flash"}, {"backend": "efficient"}, {"backend": "cudnn"}])
def test_gpu_every_fused_sdpa_config_runs_small_fp32_heads(config):
    """FusedAttention (BERT's attention once fused) at head size 4, fp32, with an additive mask."""
    from kiln.target.device import detect
    from kiln.ir import DType
    from kiln.kinds import run_reference
    from kiln.tactics.spec import LayerSpec, ValueSpec

    q = ValueSpec(DType.FLOAT32, ("b", 2, "s", 4))
    kt, mask = ValueSpec(DType.FLOAT32, ("b", 2, 4, "s")), ValueSpec(DType.FLOAT32, ("b", 1, 1, "s"))
    attrs = {"scale": None, "scale_on": "scores"}
    kernel = registry.get("sdpa_fused_attention").compile(LayerSpec("attn", "FusedAttention", attrs, (q, kt, q, mask),
                                                                    (q,)), config, detect("cuda"))
    for b, s in [(1, 1), (3, 7), (2, 64)]:
        inputs = [torch.randn(*shape, device="cuda") for shape in ((b, 2, s, 4), (b, 2, 4, s), (b, 2, s, 4))]
        inputs.append(torch.where(torch.rand(b, 1, 1, s, device="cuda") < 0.2, -1e4, 0.0))
        torch.testing.assert_close(kernel(inputs)[0], run_reference("FusedAttention", inputs, attrs)[0],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_sdpa_small_heads_fp32_mask_runs_over_the_whole_profile(tmp_path):
    """Head size 4, fp32, an additive mask, dynamic batch and sequence: every shape of the profile runs (the
    tuned SDPA backend, or math where that backend refuses the shape) and matches the CPU reference."""
    dims = ["b", 2, "s", 4]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("q", "k", "v")]
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["b", 1, "s", "s"])
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"])], "attn", io + [mask],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    path = tmp_path / "attn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10), path)
    ranges = {n: ((1, 2, 1, 4), (2, 2, 16, 4), (4, 2, 64, 4)) for n in ("q", "k", "v")}
    ranges["mask"] = ((1, 1, 1, 1), (2, 1, 16, 16), (4, 1, 64, 64))
    gpu = kiln.build(path, kiln.BuildConfig(device="cuda", profiles=(ranges,)))
    cpu = kiln.build(path, kiln.BuildConfig(device="cpu", profiles=(ranges,)))
    assert gpu.tactics[gpu.network.layers[0].name].tactic == "sdpa", gpu.tactics
    g = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        for b, s in [(1, 1), (2, 16), (3, 7), (4, 64), (1, 33)]:
            feeds = {n: g.standard_normal((b, 2, s, 4)).astype(np.float32) for n in ("q", "k", "v")}
            feeds["mask"] = np.where(g.random((b, 1, s, s)) < 0.2, -1e4, 0.0).astype(np.float32)
            np.testing.assert_allclose(gpu.run(feeds)["y"], cpu.run(feeds)["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("command", ["build", "inspect"])
def test_a_model_that_is_no_regular_file_says_what_it_is(tmp_path, command):
    folder = tmp_path / "m.onnx"
    folder.mkdir()
    assert_one_error_line(invoke(command, str(folder)), "is a directory")
    assert_one_error_line(invoke(command, "/dev/zero"), "not a regular file")
