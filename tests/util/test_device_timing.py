"""The autotuner's device timing: one spin covers the host's enqueueing of every timed run."""

from __future__ import annotations

import pytest
import torch

from kiln.util import timing


def test_the_spin_covers_every_run_within_its_bounds():
    per_ms = 2_000_000.0  # cycles a millisecond, about an H100's
    assert timing.cover_cycles(20, 0.03, per_ms) == int((2 * 20 * 0.03 + 0.2) * per_ms)  # 1.4 ms for 20 Triton launches
    assert timing.cover_cycles(1, 0.001, per_ms) == timing.LAUNCH_COVER_CYCLES  # never below the one-run spin
    assert timing.cover_cycles(50, 10.0, per_ms) == int(timing.MAX_COVER_MS * per_ms)  # nor above the cap
    assert timing.cover_cycles(20, 0.03, None) == timing.LAUNCH_COVER_CYCLES  # no clock rate known: the old spin


@pytest.mark.gpu
def test_gpu_device_time_is_the_kernels_not_the_hosts():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    per_ms = timing.sleep_cycles_per_ms()
    x = torch.ones(1, device="cuda")

    def spin_50us(_):  # a 50 µs kernel behind 1 ms of host work each time
        torch.cuda._sleep(int(per_ms * 0.05))
        deadline = timing.time.perf_counter() + 1e-3
        while timing.time.perf_counter() < deadline:
            pass

    assert 35 < timing.device_time_us(spin_50us, None, 10) < 80

    def syncs(_):  # waits for the GPU: the spin cannot cover it, each run gets its own
        torch.cuda._sleep(int(per_ms * 0.05))
        return (x + 1).item()

    assert 35 < timing.device_time_us(syncs, None, 5) < 200


@pytest.mark.gpu
def test_gpu_a_candidate_far_over_the_cutoff_is_not_timed_in_full():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    per_ms = timing.sleep_cycles_per_ms()
    calls = []

    def spin_500us(_):
        calls.append(1)
        torch.cuda._sleep(int(per_ms * 0.5))

    assert timing.device_time_us(spin_500us, None, 20, cutoff_us=100.0) > 400
    assert len(calls) == 3  # the warm-up runs only
    calls.clear()
    assert 400 < timing.device_time_us(spin_500us, None, 20, cutoff_us=2000.0) < 700
    assert len(calls) == 23
