"""The replay fast path: device feeds at a signature a context has checked and captured skip the checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.errors import InputError
from kiln.runtime.context import feed_key

PROFILE = ((1, 8), (4, 8), (16, 8))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    path = tmp_path_factory.mktemp("fast_path") / "mlp.onnx"
    torch.onnx.export(net, (torch.randn(2, 8),), str(path), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=18)
    return path, net


def test_feed_key_names_device_tensors_only():
    cpu = {"x": torch.zeros(2, 8)}
    assert feed_key(cpu) is None
    assert feed_key({"x": np.zeros((2, 8), np.float32)}) is None
    assert feed_key([torch.zeros(2)]) is None


@pytest.fixture
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
def test_gpu_feed_key_tells_shapes_dtypes_and_order_apart(gpu):
    a, b = torch.zeros(2, 8, device="cuda"), torch.zeros(3, 8, device="cuda")
    assert feed_key({"x": a}) == feed_key({"x": a.clone()})
    assert feed_key({"x": a}) != feed_key({"x": b})
    assert feed_key({"x": a}) != feed_key({"x": a.half()})
    assert feed_key({"x": a, "y": b}) != feed_key({"y": b, "x": a})


@pytest.mark.gpu
def test_gpu_seen_signatures_skip_the_checks_and_match_the_first_call(gpu, model, monkeypatch):
    path, net = model
    engine = kiln.build(str(path), kiln.BuildConfig(profiles=({"x": PROFILE},)))
    ctx = engine.create_context()
    x = torch.randn(5, 8, device="cuda")
    first = ctx.run({"x": x})["y"]
    torch.testing.assert_close(ctx.run({"x": x})["y"], first)  # a dynamic engine captures a shape's second run
    assert len(ctx._seen) == 1
    monkeypatch.setattr(ctx, "check", lambda feeds: pytest.fail("a seen signature was checked again"))
    again = ctx.run({"x": x})["y"]
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(again.cpu(), net(x.cpu()).detach(), rtol=1e-3, atol=1e-3)
    assert again.data_ptr() != first.data_ptr()  # each call gets outputs of its own
    buf = torch.empty_like(first)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = ctx.run({"x": x}, stream=stream, outputs={"y": buf})
    stream.synchronize()
    assert out["y"] is buf
    torch.testing.assert_close(buf, first)


@pytest.mark.gpu
def test_gpu_new_dtypes_and_evicted_graphs_take_the_checked_path(gpu, model):
    path, net = model
    engine = kiln.build(str(path), kiln.BuildConfig(profiles=({"x": PROFILE},)))
    ctx = engine.create_context(max_cuda_graphs=1)
    xs = [torch.randn(b, 8, device="cuda") for b in (2, 7)]
    for _ in range(3):  # one graph kept: each call evicts the other signature's graph
        for x in xs:
            torch.testing.assert_close(ctx.run({"x": x})["y"].cpu(), net(x.cpu()).detach(), rtol=1e-3, atol=1e-3)
    assert len(ctx._seen) == 1 and ctx.graphs.captures >= 4  # rounds 2 and 3 capture at every call
    with pytest.raises(InputError, match="dtype"):
        ctx.run({"x": xs[1].half()})
    with pytest.raises(InputError, match="unexpected"):
        ctx.run({"x": xs[1], "z": xs[1]})
