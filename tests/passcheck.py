"""Test helper for passes: import an ONNX model without optimizing, apply one pass, compare before/after."""

from __future__ import annotations

import copy

import numpy as np
import onnx

from kiln.target import detect
from kiln.config import BuildConfig
from kiln.runtime import Engine
from kiln.frontend.onnx import import_onnx, load_onnx
from kiln.ir import Network
from kiln.passes import PassContext, run_passes


def imported(model: onnx.ModelProto) -> Network:
    """The network exactly as the importer makes it, before any pass."""
    return import_onnx(load_onnx(model).proto)


def run(net: Network, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return Engine(net, BuildConfig(device="cpu"), detect("cpu")).run(feeds)


def apply(net: Network, *passes, **ctx_kw) -> tuple[Network, PassContext]:
    """A copy of `net` with `passes` run to a fixpoint (the original is left as it was)."""
    after = copy.deepcopy(net)
    ctx = PassContext(**ctx_kw)
    run_passes(after, list(passes), ctx)
    return after, ctx


def kinds(net: Network) -> list[str]:
    return [layer.kind for layer in net.layers]


def assert_same_outputs(before: Network, after: Network, feeds, rtol=1e-5, atol=1e-6) -> None:
    """Both networks give the same outputs (fp32 reassociation moves results by a few ulps)."""
    want, got = run(before, feeds), run(after, feeds)
    assert set(want) == set(got)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


def attention_nodes(i: int, mask: str, q: str = "q", kt: str = "kt", v: str = "v", scale: str = "c") -> list:
    """Attention as exporters write it, block `i`: y{i} = Softmax(q @ kt · scale + mask) @ v."""
    from onnx import helper

    return [helper.make_node("MatMul", [q, kt], [f"s{i}"]), helper.make_node("Mul", [f"s{i}", scale], [f"t{i}"]),
            helper.make_node("Add", [f"t{i}", mask], [f"u{i}"]),
            helper.make_node("Softmax", [f"u{i}"], [f"p{i}"], axis=-1),
            helper.make_node("MatMul", [f"p{i}", v], [f"y{i}"])]
