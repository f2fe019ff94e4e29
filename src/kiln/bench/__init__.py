"""Latency measurement: warm-up, timed iterations (CUDA events on a GPU, perf_counter on the CPU), statistics."""

from kiln.util.timing import DEFAULT_DURATION_S, DEFAULT_ITERATIONS, LatencyStats, measure

__all__ = ["DEFAULT_DURATION_S", "DEFAULT_ITERATIONS", "LatencyStats", "measure"]
