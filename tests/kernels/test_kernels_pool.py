"""kernels/pool.py's Triton max pooling against torch (float) and kiln's reference MaxPool (int8, fp8), in both
memory formats; runs under TRITON_INTERPRET=1 on the CPU."""

import pytest
import torch

from kiln.kernels import pool
from kiln.kinds.pool import max_pool

CASES = [  # shape, kernel, strides, pads (top, left, bottom, right), dilations, ceil
    ((2, 5, 9, 8), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),
    ((1, 3, 7, 8), (3, 2), (2, 2), (1, 0, 0, 1), (1, 1), 1),
    ((1, 4, 8, 8), (2, 3), (1, 2), (0, 0, 0, 0), (2, 2), 0),
]


def _reference(x, kernel, strides, pads, dilations, ceil):
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads), "dilations": list(dilations),
             "ceil_mode": ceil, "auto_pad": "NOTSET", "storage_order": 0}
    return max_pool([x], attrs)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_max_pool_equals_the_reference(case, dtype, channels_last):
    shape, kernel, strides, pads, dilations, ceil = case
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 60).clamp(-127, 127)
    x = x.round().to(dtype) if dtype == torch.int8 else x.to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    want = _reference(x.contiguous(), kernel, strides, pads, dilations, ceil)
    got = pool.max_pool2d(x, kernel, strides, pads[:2], dilations, tuple(want.shape[2:]), pool.CONFIGS[2])
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert torch.equal(got.float(), want.float())


def test_max_pool_writes_into_a_given_buffer():
    x = torch.randint(-128, 128, (1, 8, 6, 6), dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    buf = torch.zeros(1 * 8 * 3 * 3 + 16, dtype=torch.uint8)
    y = pool.max_pool2d(x, (2, 2), (2, 2), (0, 0), (1, 1), (3, 3), out=buf)
    assert y.data_ptr() == buf.data_ptr()
    assert torch.equal(y, torch.nn.functional.max_pool2d(x.float(), 2).to(torch.int8))


@pytest.mark.parametrize("op", ["avg", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_global_pool_equals_torch(op, dtype, channels_last):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 70, 5, 7, generator=g).to(dtype)  # ragged channel and pixel blocks
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    want = x.float().amax((2, 3), keepdim=True) if op == "max" else x.float().mean((2, 3), keepdim=True)
    for cfg in pool.GLOBAL_CONFIGS:
        got = pool.global_pool2d(x, op, cfg)
        assert got.shape == (3, 70, 1, 1) and got.dtype == dtype
        torch.testing.assert_close(got.float(), want, rtol=1e-3 if dtype == torch.float16 else 1e-5, atol=1e-3)


def test_global_pool_refuses_maps_whose_pixels_do_not_flatten():
    x = torch.randn(1, 4, 6, 6)[:, :, :, :3]
    with pytest.raises(ValueError, match="flatten"):
        pool.global_pool2d(x, "avg")


@pytest.mark.parametrize("kind", ["GlobalAveragePool", "GlobalMaxPool"])
def test_triton_global_pool_tactic_runs_an_engine_like_the_reference(tmp_path, kind):
    """An engine with the pool on triton_global_pool (writing into its arena place) matches the reference engine."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    import kiln
    from test_memory_plan import _forced, _named

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node(kind, ["r"], ["p"]),
                           helper.make_node("Relu", ["p"], ["y"])], "gp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 40, 6, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 40, 1, 1])])
    path = tmp_path / "gp.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    ref = kiln.build(str(path), kiln.BuildConfig.with_shapes({"x": (2, 40, 6, 5)}, device="cpu"))
    eng = _forced(ref, _named("triton_global_pool", "triton_pointwise"))
    pool = next(la.name for la in eng.network.layers if la.kind == kind)
    assert eng.tactics[pool].tactic == "triton_global_pool"
    x = np.random.default_rng(0).normal(size=(2, 40, 6, 5)).astype(np.float32)
    np.testing.assert_allclose(eng.run({"x": x})["y"], ref.run({"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_padding_taps_read_the_window_s_own_pixels_only_where_every_window_meets_the_map():
    meet = pool._windows_meet_the_map
    assert meet((3, 3), (2, 2), (1, 1), (1, 1), (112, 112), (56, 56))  # ResNet's stem pool
    assert not meet((3, 3), (2, 2), (1, 1), (2, 2), (112, 112), (55, 55))  # dilated: taps skip pixels
    assert not meet((2, 2), (2, 2), (0, 0), (1, 1), (4, 4), (3, 3))  # the last window lies in the end padding
    assert not meet((2, 2), (1, 1), (2, 0), (1, 1), (4, 4), (5, 3))  # the first one in the begin padding


_WORDS_AOT = """
import inspect
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kiln.kernels import pool
fn = pool._max_pool_words_kernel
names = list(inspect.signature(fn.fn).parameters)
consts = {"KH": 3, "KW": 3, "BLOCK_P": 128, "BLOCK_C": 64}
sig = {"x": "*i8", "y": "*i8"} | {k: "i32" for k in names if k not in ("x", "y", *consts)}
attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in "x y C4 s_xn s_xh s_xw s_yn s_yh s_yw".split()}
k = triton.compile(ASTSource(fn=fn, signature=sig | dict.fromkeys(consts, "constexpr"), constexprs=consts,
                             attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
ptx = k.asm["ptx"]
print(ptx.count("max.s16x2"), "ld.global.v4.b32" in ptx, "st.global.v4.b32" in ptx)
"""


def test_int8_words_kernel_compiles_to_packed_16_bit_maxima_for_hopper():
    """AOT for sm90 with the ptxas Triton ships (no GPU; a subprocess, as this session's kernels are interpreted):
    16-byte loads and stores, one max.s16x2 per two values and tap."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    r = subprocess.run([sys.executable, "-c", _WORDS_AOT], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode and ("ptxas" in r.stderr and "not found" in r.stderr or "ImportError" in r.stderr):
        pytest.skip(f"no Triton CUDA toolchain here: {r.stderr.strip().splitlines()[-1][:200]}")
    words = 128 * 64 // 4 // 256  # per thread
    assert r.returncode == 0 and r.stdout.split() == [str(2 * 9 * words), "True", "True"], r.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,low", [((3, 64, 23, 18), -128), ((2, 8, 9, 9), -128), ((2, 16, 12, 10), -120)])
def test_gpu_int8_max_pool_on_words_equals_torch(shape, low):
    """The packed int8 kernel (NHWC, whole words) on ragged maps, negative values at the edges included."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(6)
    x = torch.randint(low, 128, shape, generator=g, dtype=torch.int8)
    x[:, :, 0, :] = torch.randint(-128, -100, x[:, :, 0, :].shape, generator=g, dtype=torch.int8)  # padding's row
    x = x.cuda().contiguous(memory_format=torch.channels_last)
    want = torch.nn.functional.max_pool2d(x.float(), 3, 2, 1).to(torch.int8)
    assert pool._words(x, torch.empty_like(want, memory_format=torch.channels_last))
    for cfg in pool.CONFIGS:
        got = pool.max_pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1), tuple(want.shape[2:]), cfg)
        assert got.is_contiguous(memory_format=torch.channels_last) and torch.equal(got, want), cfg
