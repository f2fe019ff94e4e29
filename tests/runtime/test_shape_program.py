"""The shape program: a dynamic engine evaluates its shape arithmetic once per input signature, on the host."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch.overrides import TorchFunctionMode

import kiln
from kiln.builder.specialize import SHAPE_INPUTS
from kiln.errors import InputError
from kiln.runtime.shape_program import HOST_SUFFIX, input_signature

HEADS, DIM = 2, 8
PROFILE = ((1, 1, HEADS * DIM), (2, 8, HEADS * DIM), (4, 32, HEADS * DIM))


class Encoder(torch.nn.Module):
    """Attention with reshapes to heads and positions from arange: the shape arithmetic exporters write."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pos = torch.nn.Embedding(64, HEADS * DIM)
        self.qkv = torch.nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
        self.out = torch.nn.Linear(HEADS * DIM, HEADS * DIM)

    def forward(self, x):
        b, s, _ = x.shape
        x = x + self.pos(torch.arange(s).unsqueeze(0).expand(b, s))
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, DIM).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.softmax(q @ k.transpose(-1, -2) / DIM ** 0.5, -1) @ v
        return self.out(a.transpose(1, 2).reshape(b, s, HEADS * DIM))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("shape_program") / "encoder.onnx"
    axes = {"x": {0: "b", 1: "s"}, "y": {0: "b", 1: "s"}}
    torch.onnx.export(Encoder().eval(), (torch.randn(2, 5, HEADS * DIM),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes=axes, opset_version=18)
    return path


@pytest.fixture(scope="module")
def engine(model):
    return kiln.build(str(model), kiln.BuildConfig(profiles=({"x": PROFILE},)))


class HostReads(TorchFunctionMode):
    """Every tensor whose values are read into Python (`tolist`, `item`, `int(t)` ...) while the mode is active."""

    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__index__,
             torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.numpy}

    def __init__(self):
        super().__init__()
        self.read = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.read.append(args[0])
        return func(*args, **(kwargs or {}))


def test_the_shape_arithmetic_leaves_the_run_path(engine):
    program = engine.shape_program
    kinds = {layer.kind for k, layer in enumerate(engine.network.layers) if k in program.steps}
    assert {"Shape", "Concat"} <= kinds, kinds
    assert not {"Shape", "Size"} & {layer.kind for layer in program.run_net.layers}
    for layer in program.run_net.layers:  # every shape input a run layer reads is a constant or a host copy
        for p in SHAPE_INPUTS.get(layer.kind, ()):
            name = layer.inputs[p] if p < len(layer.inputs) else ""
            assert not name or name in engine.network.constants or name.endswith(HOST_SUFFIX), (layer, name)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (4, 32), (2, 8)])
def test_outputs_equal_onnx_runtime_and_a_static_engine(model, engine, shape):
    x = np.random.default_rng(sum(shape)).standard_normal((*shape, HEADS * DIM)).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ctx = engine.create_context()
    first, again = ctx.run({"x": x})["y"], ctx.run({"x": x})["y"]  # the second reads the memoized shape values
    static = kiln.build(str(model), kiln.BuildConfig.with_shapes({"x": (*shape, HEADS * DIM)}))
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(again, first)
    np.testing.assert_allclose(static.run({"x": x})["y"], again, rtol=1e-5, atol=1e-6)


def test_a_seen_signature_reads_no_tensor_but_its_host_copies(engine):
    ctx = engine.create_context()
    x = torch.randn(3, 9, HEADS * DIM)
    ctx.run({"x": x})
    entry = engine.shape_program.lookup(input_signature({"x": x}))
    assert entry is not None and any(n.endswith(HOST_SUFFIX) for n in entry.values)
    calls, saved = [], list(engine.kernels)
    for k in engine.shape_program.steps:  # the shape layers must not run again
        kernel = engine.kernels[k]
        engine.kernels[k] = lambda args, kernel=kernel, k=k, **kw: calls.append(k) or kernel(args, **kw)
    try:
        with HostReads() as spy:
            ctx.run({"x": x})
    finally:
        engine.kernels[:] = saved
    allowed = {v.untyped_storage().data_ptr() for v in list(engine.network.constants.values())
               + [v for n, v in entry.values.items() if n.endswith(HOST_SUFFIX)]}
    assert not calls
    assert spy.read and all(r.untyped_storage().data_ptr() in allowed for r in spy.read), spy.read


def test_a_new_signature_is_memoized_once(engine):
    program, ctx = engine.shape_program, engine.create_context()
    x = torch.randn(2, 11, HEADS * DIM)
    assert program.lookup(input_signature({"x": x})) is None
    ctx.run({"x": x})
    first = program.lookup(input_signature({"x": x}))
    ctx.run({"x": x})
    assert program.lookup(input_signature({"x": x})) is first


def test_kept_intermediates_still_come_back(engine):
    name = next(o for layer in engine.network.layers if layer.kind == "Shape" for o in layer.outputs)
    out = engine.create_context().run({"x": np.zeros((2, 3, HEADS * DIM), np.float32)}, keep={name})
    assert list(out[name]) == [2, 3, HEADS * DIM]


def test_bound_outputs_are_written_in_place(engine):
    ctx = engine.create_context()
    x = torch.randn(2, 4, HEADS * DIM)
    buf = torch.empty(2, 4, HEADS * DIM)
    out = ctx.run({"x": x}, outputs={"y": buf})
    assert out["y"] is buf
    torch.testing.assert_close(buf, ctx.run({"x": x})["y"])
    with pytest.raises(InputError, match="bind a tensor of that dtype and shape"):
        ctx.run({"x": x}, outputs={"y": torch.empty(1, 4, HEADS * DIM)})
    with pytest.raises(InputError, match="not an output of this engine"):
        ctx.run({"x": x}, outputs={"z": buf})


def test_static_engines_have_no_shape_program(model):
    engine = kiln.build(str(model), kiln.BuildConfig.with_shapes({"x": (2, 4, HEADS * DIM)}))
    assert not engine.shape_program


def test_max_cuda_graphs_is_checked(engine):
    with pytest.raises(InputError, match="max_cuda_graphs"):
        engine.create_context(max_cuda_graphs=-1)


@pytest.mark.gpu
def test_dynamic_engine_replays_a_cuda_graph_per_signature(model):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    engine = kiln.build(str(model), kiln.BuildConfig(fp16=True, profiles=({"x": PROFILE},)))
    ctx = engine.create_context(max_cuda_graphs=2)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for shape in [(1, 3), (4, 32), (2, 8), (1, 3)]:
        x = torch.randn(*shape, HEADS * DIM, device="cuda")
        want = sess.run(None, {"x": x.cpu().numpy()})[0]
        for _ in range(2):
            torch.testing.assert_close(ctx.run({"x": x})["y"].float().cpu(), torch.from_numpy(want),
                                       rtol=2e-2, atol=2e-2)
    assert ctx.eager_reasons == {}
    assert len(ctx.graphs.runs) == 2 and ctx.graphs.captures == 4  # (1, 3) was evicted, then captured again
    stream = torch.cuda.Stream()
    x = torch.randn(2, 8, HEADS * DIM, device="cuda")
    buf = torch.empty_like(ctx.run({"x": x})["y"])
    with torch.cuda.stream(stream):
        ctx.run({"x": x}, stream=stream, outputs={"y": buf})
    stream.synchronize()
    torch.testing.assert_close(buf, ctx.run({"x": x})["y"])


@pytest.mark.gpu
def test_gpu_captures_leave_other_threads_running(model):
    """A capture in one thread must not fail another thread's run that synchronizes (numpy out: its download
    waits for the stream). The capture's warm-up once set the process-wide sync-debug mode, and the server's other
    instances failed with "called a synchronizing CUDA operation"."""
    import threading

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    engine = kiln.build(str(model), kiln.BuildConfig(fp16=True, profiles=({"x": PROFILE},)))
    capturer, syncer = engine.create_context(max_cuda_graphs=64), engine.create_context()
    x = np.random.default_rng(0).normal(size=(2, 8, HEADS * DIM)).astype(np.float32)
    want = syncer.run({"x": x})["y"]
    errors, stop = [], threading.Event()

    def sync_loop():
        while not stop.is_set():
            try:
                np.testing.assert_allclose(syncer.run({"x": x})["y"], want, rtol=1e-3, atol=1e-3)
            except Exception as e:  # noqa: BLE001 — any failure is the finding
                errors.append(repr(e))
                return

    thread = threading.Thread(target=sync_loop)
    thread.start()
    try:
        for b in range(1, 5):
            for s in range(3, 33, 5):
                x_new = torch.randn(b, s, HEADS * DIM, device="cuda")
                for _ in range(2):  # a new shape runs eagerly first; its second run captures
                    capturer.run({"x": x_new})
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert capturer.graphs.captures >= 20 and capturer.eager_reasons == {}
