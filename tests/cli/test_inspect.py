"""`kiln inspect`: on ONNX, the fusions the build will apply and the parameter count; on a plan, per-layer tactic,
config and format, memory and the file size broken down by what it holds."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.tactics.choice import Choice
from kiln.engine import plan as planfile
from test_compare import chain_model, invoke


def conv_bn_relu(path):
    """conv → BatchNormalization → Relu → GlobalAveragePool: the build folds the BN and fuses the ReLU into one
    FusedConv (3 ONNX nodes), leaving the pool alone."""
    rng = np.random.default_rng(0)
    f32 = lambda name, a: numpy_helper.from_array(np.asarray(a, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")]
    graph = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])], initializer=[
        f32("w", rng.standard_normal((4, 3, 3, 3))), f32("b", np.zeros(4)), f32("g", np.ones(4)),
        f32("beta", np.zeros(4)), f32("mean", np.zeros(4)), f32("var", np.ones(4))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def inspect_json(path) -> dict:
    result = invoke("inspect", path, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_onnx_reports_the_fusions_the_build_applies(tmp_path):
    d = inspect_json(chain_model(tmp_path / "chain.onnx"))
    f = d["fusions"]
    assert f["imported_layers"] == 6 and f["layers"] == 3
    assert f["fused_kinds"] == {"FusedGemm": {"count": 2, "onnx_nodes": 4},
                                "PointwiseChain": {"count": 1, "onnx_nodes": 2}}
    assert {x["name"]: x["origin"] for x in f["fused_layers"]}["mm1"] == ["mm1", "relu"]
    assert d["parameters"] == 8 * 8 * 2 + 8 + 2
    # what inspect predicts is what the build does
    engine = kiln.build(tmp_path / "chain.onnx", kiln.BuildConfig(device="cpu"))
    assert sorted(l.kind for l in engine.network.layers) == ["FusedGemm", "FusedGemm", "PointwiseChain"]


def test_onnx_conv_bn_relu_becomes_one_fused_conv(tmp_path):
    path = conv_bn_relu(tmp_path / "cbr.onnx")
    d = inspect_json(path)
    assert d["fusions"]["fused_kinds"] == {"FusedConv": {"count": 1, "onnx_nodes": 3}}
    assert d["fusions"]["passes"].get("fold_batchnorm", 0) >= 1
    assert d["parameters"] == 4 * 3 * 3 * 3 + 5 * 4
    text = invoke("inspect", path)
    assert text.exit_code == 0 and "Fusions the build will apply" in text.stdout and "FusedConv" in text.stdout


def test_onnx_lists_the_passes_a_build_runs_in_order_with_their_conditions(tmp_path):
    """The float passes first (always, in the order default_passes() gives), then the precision passes, labelled
    with the flags and device they run under; the same in the table."""
    from kiln.passes import default_passes
    path = conv_bn_relu(tmp_path / "cbr.onnx")
    steps = inspect_json(path)["pass_pipeline"]
    optimize = [s["pass"] for s in steps if s["stage"] == "optimize"]
    assert optimize == [p.__name__ for p in default_passes()]
    assert all(s["runs"] == "always" for s in steps if s["stage"] == "optimize")
    assert [s["stage"] for s in steps] == ["optimize"] * len(optimize) + ["precision"] * (len(steps) - len(optimize))
    precision = {s["pass"]: s["runs"] for s in steps if s["stage"] == "precision"}
    assert list(precision) == ["fold_quantize", "fuse_conv_pair", "fuse_conv_chain", "attention_keep_mask",
                               "sink_transpose", "gemm_rows", "collapse_views", "eliminate_dead"]
    assert precision["collapse_views"] == "always"
    assert precision["fold_quantize"] == "--int8 or --fp8" and "Hopper" in precision["fuse_conv_chain"]
    text = invoke("inspect", path)
    assert text.exit_code == 0 and "Passes a build runs" in text.stdout and "fuse_conv_chain" in text.stdout


def test_onnx_with_an_unknown_op_says_why_there_are_no_fusions(tmp_path):
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], "g",
                              [io("x")], [io("y")])
    path = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]), path)
    assert "cannot import" in inspect_json(path)["fusions"]["error"]


@pytest.fixture
def fp16_plan(tmp_path):
    """The chain model built fp16 on the CPU, one layer given a made-up tuned tactic (as a GPU build records)."""
    engine = kiln.build(chain_model(tmp_path / "chain.onnx"), kiln.BuildConfig(device="cpu", fp16=True))
    engine.tactics["mm1"] = Choice("torch.fused_gemm", {"layout": "nhwc", "block": 64}, 12.5, "timed",
                                   [("triton_x{}", "failed: out of resources")],
                                   [("torch.fused_gemm{'layout': 'nhwc', 'block': 64}", 12.5),
                                    ("triton_gemm{}", 20.25)])
    return engine.save(tmp_path / "chain.plan")


def test_plan_layers_show_tactic_config_and_format(fp16_plan):
    d = inspect_json(fp16_plan)
    rows = {r["name"]: r for r in d["layers"]}
    mm1 = rows["mm1"]
    assert mm1["tactic"] == "torch.fused_gemm" and mm1["tactic_config"] == {"layout": "nhwc", "block": 64}
    assert mm1["format"] == "NHWC" and mm1["tactic_us"] == 12.5 and mm1["tactic_source"] == "timed"
    assert mm1["tactic_timed"][1] == ["triton_gemm{}", 20.25] and mm1["tactic_rejected"][0][0] == "triton_x{}"
    assert mm1["precision"] == "float16" and mm1["origin"] == ["mm1", "relu"]
    assert mm1["weight_bytes"] == 8 * 8 * 2  # w1 in fp16
    assert rows["mm2"]["tactic"] == "reference" and rows["mm2"]["format"] == "linear"
    text = invoke("inspect", fp16_plan)
    assert text.exit_code == 0
    for words in ("torch.fused_gemm", "layout=nhwc", "block=64", "weights float16", "workspace",
                  "best of 2; next 20.2 µs triton_gemm"):
        assert words in text.stdout, words


def test_plan_size_is_broken_down_by_what_it_holds(fp16_plan):
    d = inspect_json(fp16_plan)
    size, memory = d["size"], d["memory"]
    assert size["total"] == fp16_plan.stat().st_size == memory["plan_bytes"]
    assert size["header"] + size["manifest"] + size["weights"] + size["other"] == size["total"]
    stored = planfile.read(fp16_plan).tensors
    by_dtype: dict[str, int] = {}
    for t in stored.values():
        key = str(t.dtype).removeprefix("torch.")
        by_dtype[key] = by_dtype.get(key, 0) + t.numel() * t.element_size()
    assert size["weights_by_dtype"] == by_dtype and "float16" in by_dtype
    assert 0 <= size["other"] < 4096  # the safetensors index and its padding
    assert isinstance(memory["arena_bytes"], int) and memory["workspace_limit_bytes"] is None
    assert memory["arena"].endswith("activations at planned offsets") or "in memory their kernels allocate" in \
        memory["arena"]


def test_arena_line_says_how_many_activations_it_holds():
    from kiln.cli.output import fmt_arena

    assert fmt_arena({"arena_bytes": 4096, "offsets": {"a": 0, "b": 256}, "unplaced": 0}) == \
        "4.0 KiB: all 2 activations at planned offsets"
    assert fmt_arena({"arena_bytes": 2048, "offsets": {"a": 0}, "unplaced": 3}).startswith(
        "2.0 KiB: 1 activations at planned offsets, 3 in memory their kernels allocate")
    assert fmt_arena({"arena_bytes": None}).startswith("sized at run time")


def test_plan_reports_the_workspace_limit(tmp_path):
    model = chain_model(tmp_path / "chain.onnx")
    out = tmp_path / "ws.plan"
    assert invoke("build", model, "-o", out, "--device", "cpu", "--memory-pool", "workspace=1M").exit_code == 0
    assert inspect_json(out)["memory"]["workspace_limit_bytes"] == 1 << 20
