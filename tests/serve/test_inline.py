"""A lone request runs on the event loop (DynamicBatcher.inline_s) only when its shape ran fast before and nothing
else is queued or running; everything else takes an engine thread (issue 24, concurrency 1)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from kiln.serve import DynamicBatcher


class _Engine:
    """y = 2 x, sleeping `delay_s`; records the thread of every call."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s, self.threads = delay_s, []

    def create_context(self, **options):
        return self

    def run(self, feeds):
        self.threads.append(threading.current_thread())
        time.sleep(self.delay_s)
        return {"y": feeds["x"] * 2}


def _x(rows: int = 1, width: int = 3) -> dict:
    return {"x": np.arange(rows * width, dtype=np.float32).reshape(rows, width)}


def _serve(batcher: DynamicBatcher, work) -> None:
    async def main():
        try:
            await work()
        finally:
            await batcher.close()

    asyncio.run(main())


def test_a_lone_request_runs_on_the_loop_once_its_shape_ran_fast():
    engine = _Engine()
    batcher = DynamicBatcher(engine, max_batch_size=8, inline_s=0.05)

    async def work():
        for _ in range(3):
            out = await batcher.submit(_x(), 1)
            np.testing.assert_array_equal(out["y"], _x()["x"] * 2)
        await batcher.submit(_x(width=5), 1)  # a new shape: a thread first

    _serve(batcher, work)
    loop_thread = threading.main_thread()
    assert engine.threads[0] is not loop_thread  # the shape's first run
    assert engine.threads[1:3] == [loop_thread, loop_thread]
    assert engine.threads[3] is not loop_thread


def test_off_slow_or_busy_keeps_the_engine_on_its_threads():
    loop_thread = threading.main_thread()
    for inline_s, delay_s in ((0.0, 0.0), (0.001, 0.01)):  # off; a shape slower than the limit
        engine = _Engine(delay_s)
        batcher = DynamicBatcher(engine, max_batch_size=8, inline_s=inline_s)

        async def work():
            for _ in range(3):
                await batcher.submit(_x(), 1)

        _serve(batcher, work)
        assert loop_thread not in engine.threads, (inline_s, delay_s)


def test_a_request_arriving_while_a_batch_runs_on_a_thread_is_not_inlined():
    engine = _Engine(0.03)
    batcher = DynamicBatcher(engine, max_batch_size=1, instance_count=2, inline_s=1.0)

    async def work():
        await batcher.submit(_x(), 1)  # known shape now
        engine.threads.clear()
        a = asyncio.ensure_future(batcher.submit(_x(), 1))
        b = asyncio.ensure_future(batcher.submit(_x(), 1))  # queued with a: a goes to a thread, b then sees it run
        await asyncio.gather(a, b)

    _serve(batcher, work)
    assert threading.main_thread() not in engine.threads


def test_requests_arriving_faster_than_a_lone_run_keep_it_off_the_loop():
    from kiln.serve.batcher import _LoopState

    async def main():
        batcher = DynamicBatcher(_Engine(), max_batch_size=8, inline_s=0.01)
        state, lone = _LoopState(asyncio.get_running_loop()), ("key", None, 1)
        batcher._lone_ns[lone] = 1_000_000  # the shape's lone run took 1 ms
        batcher._gap_ns = 2_000_000  # a request every 2 ms: none would wait on the loop
        assert batcher._inline(state, lone)
        batcher._gap_ns = 500_000  # every 0.5 ms: two would arrive during the run
        assert not batcher._inline(state, lone)
        batcher._gap_ns, batcher.inline_s = 2e7, 0.0005  # slow arrivals, but the run is over the limit
        assert not batcher._inline(state, lone)
        await batcher.close()

    asyncio.run(main())
