"""Test helper: build a one-node ONNX model, run it through kiln and a reference (ONNX Runtime, or onnx's
ReferenceEvaluator where ORT is not exact on every CPU), compare.

Tolerance defaults are for fp32 arithmetic (rtol 1e-4, atol 1e-5): kiln and ORT may order
floating-point sums differently, which moves results by a few ulps.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper
from onnx.reference import ReferenceEvaluator

import kiln

# KILN_TEST_DEVICE=cuda runs the op tests on the GPU (ONNX Runtime on the CPU stays the reference)
DEVICE = os.environ.get("KILN_TEST_DEVICE", "cpu")
ORT_IR = 10  # ONNX Runtime 1.31 reads IR versions up to 13; 10 is enough for opset <= 21
# Integer dot products: ORT's u8s8 kernels sum pairs of products in int16 and saturate on x86 CPUs without VNNI,
# so ORT is not an exact oracle there; onnx's ReferenceEvaluator does numpy integer arithmetic, exact everywhere.
INTEGER_DOT_OPS = frozenset({"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul"})


def make_model(op_type: str, inputs: dict[str, np.ndarray], attrs: dict | None = None, *,
               constants: dict[str, np.ndarray] | None = None, n_outputs: int = 1, opset: int = 17,
               domain: str = "", input_order: list[str] | None = None) -> onnx.ModelProto:
    """One node; `inputs` become graph inputs, `constants` initializers; "" in input_order omits an input."""
    constants = constants or {}
    order = input_order if input_order is not None else list(inputs) + list(constants)
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, order, outs, name=f"{op_type.lower()}_node", domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ORT_IR)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def reference_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from the exact reference where ORT is not exact on every CPU, else from ORT."""
    if any(n.op_type in INTEGER_DOT_OPS for n in model.graph.node):
        return ReferenceEvaluator(model).run(None, feeds)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    want = reference_run(model, feeds)
    engine = kiln.build(model, kiln.BuildConfig(device=DEVICE))
    got = engine.create_context().run(feeds)
    return want, [got[o.name] for o in model.graph.output]


def check_op(op_type: str, inputs: dict[str, np.ndarray], attrs: dict | None = None, *, rtol=1e-4, atol=1e-5,
             **kw) -> None:
    """Assert kiln matches the reference on every output: same dtype, same shape, close values."""
    model = make_model(op_type, inputs, attrs, **kw)
    want, got = run_both(model, inputs)
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype} != ORT's {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape} != ORT's {w.shape}"
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i} of {op_type}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {i} of {op_type}")
