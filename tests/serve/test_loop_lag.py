"""/metrics reports how late each server process's event loop runs (kiln_event_loop_lag_seconds): the measure of a
saturated process that the concurrency-64 runs of issue 24 need."""

from __future__ import annotations

import asyncio
import time

from kiln.serve.metrics import Metrics


def _sample(text: str, name: str, process: str) -> float:
    key = f'{name}{{process="{process}"}}'
    return next(float(line.split(" ")[1]) for line in text.splitlines() if line.startswith(key))


def test_a_blocked_loop_shows_as_lag():
    metrics = Metrics()

    async def main():
        watch = asyncio.create_task(metrics.watch_loop("engine", interval_s=0.01))
        await asyncio.sleep(0.05)  # idle: a few samples of (almost) no lag
        time.sleep(0.06)  # a request's work holding the loop
        await asyncio.sleep(0.03)
        watch.cancel()

    asyncio.run(main())
    text = metrics.render().decode()
    count = _sample(text, "kiln_event_loop_lag_seconds_count", "engine")
    assert count >= 3
    assert 0.04 <= _sample(text, "kiln_event_loop_lag_seconds_sum", "engine") < 0.5
    within_5ms = next(float(line.split(" ")[1]) for line in text.splitlines()
                      if line.startswith('kiln_event_loop_lag_seconds_bucket{le="0.005",process="engine"}'))
    assert within_5ms <= count - 1  # the blocked sample lies above 5 ms
