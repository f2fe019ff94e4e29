"""The per-request path's cheap hand-offs (issue 24): the batcher's waits and engine threads, read-only request views
copied once, metrics children looked up once."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from kiln.serve import DynamicBatcher
from kiln.serve.batcher import _LoopState, _Threads
from kiln.serve.grpc_server import decode_inputs
from kiln.serve.http import parse_infer_request
from kiln.serve.metrics import Metrics


class _Engine:
    """y = 2 x; records whether each input it got was writable."""

    def __init__(self):
        self.writable: list[bool] = []

    def create_context(self, **options):
        return self

    def run(self, feeds):
        self.writable += [v.flags.writeable for v in feeds.values()]
        return {"y": feeds["x"] * 2}


def test_threads_answer_with_the_result_or_the_error():
    threads = _Threads(2, "test-threads")

    def fail():
        raise ValueError("no")

    async def main():
        loop = asyncio.get_running_loop()
        assert await threads.run(loop, pow, 2, 10) == 1024
        with pytest.raises(ValueError, match="no"):
            await threads.run(loop, fail)
        cancelled = threads.run(loop, time.sleep, 0.05)
        cancelled.cancel()  # its answer, when it comes, is dropped without an InvalidStateError
        await asyncio.sleep(0.1)

    try:
        asyncio.run(main())
    finally:
        threads.shutdown()


def test_a_wait_ends_on_wake_or_on_time():
    async def main():
        state = _LoopState(asyncio.get_running_loop())
        start = time.perf_counter()
        assert await state.sleep(0.003) is True
        assert time.perf_counter() - start >= 0.002
        waiting = asyncio.ensure_future(state.sleep(10))
        await asyncio.sleep(0)
        state.wake()
        assert await waiting is False and not state.waiters

    asyncio.run(main())


def test_a_short_queue_delay_waits_once_instead_of_spinning(monkeypatch):
    """Below the loop's timer resolution a wait fired at once and the batcher waited again, ~20 times a batch."""
    waits = []
    sleep = _LoopState.sleep

    async def counted(self, timeout_s=None):
        waits.append(timeout_s)
        return await sleep(self, timeout_s)

    monkeypatch.setattr(_LoopState, "sleep", counted)
    batcher = DynamicBatcher(_Engine(), max_batch_size=8, max_queue_delay_s=0.0005, name="delay")

    async def main():
        for _ in range(5):
            out = await batcher.submit({"x": np.ones((1, 4), np.float32)}, 1)
            np.testing.assert_array_equal(out["y"], np.full((1, 4), 2, np.float32))
        await batcher.close()

    asyncio.run(main())
    assert len([w for w in waits if w is not None]) <= 5


def test_request_bytes_are_viewed_and_the_engine_gets_its_own_copy():
    """gRPC raw contents and HTTP binary data become read-only views (no copy per input); a batch of one request
    copies them before the engine, a merged batch's concatenation already does."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.raw_input_contents.append(x.tobytes())
    grpc_x = decode_inputs(request)["x"]
    header = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2,4],"parameters":{"binary_data_size":32}}]}'
    http_x = parse_infer_request(header + x.tobytes(), len(header)).inputs["x"]
    for got in (grpc_x, http_x):
        np.testing.assert_array_equal(got, x)
        assert not got.flags.writeable
    engine = _Engine()
    batcher = DynamicBatcher(engine, max_batch_size=8, name="views")

    async def main():
        alone = await batcher.submit({"x": grpc_x}, 2)
        merged = await asyncio.gather(batcher.submit({"x": http_x}, 2), batcher.submit({"x": grpc_x}, 2))
        await batcher.close()
        return alone, merged

    alone, merged = asyncio.run(main())
    for out in (alone, *merged):
        np.testing.assert_array_equal(out["y"], x * 2)
    assert engine.writable and all(engine.writable)


def test_metrics_children_are_looked_up_once():
    metrics = Metrics()
    for _ in range(3):
        metrics.request("m", "1", "success")
        metrics.stages("m", 0.01, 0.001, 0.001)
        metrics.batch("m", 2, 0.005, [0.001, 0.002])
    text = metrics.render().decode()
    assert 'kiln_inference_requests_total{model="m",status="success",version="1"} 3.0' in text
    assert 'kiln_inference_queue_seconds_count{model="m"} 6.0' in text
    assert len(metrics._children) == 7
