"""On a CUDA engine the batcher uploads numpy feeds itself, so a batch shape met before replays its graph at once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from test_http import _affine_onnx

import kiln
from kiln.serve.batcher import DynamicBatcher


def _affine_engine(tmp_path, max_rows: int):
    """The affine model (y = 2x + 1) built on the GPU for batches of 1..max_rows rows."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    profile = {"x": ((1, 4), (max_rows // 2, 4), (max_rows, 4))}
    return kiln.build(str(_affine_onnx(tmp_path / "affine.onnx")), kiln.BuildConfig(device="cuda", profiles=(profile,)))


@pytest.mark.gpu
def test_gpu_batches_take_the_replay_fast_path_and_answer_exactly(tmp_path):
    engine = _affine_engine(tmp_path, 8)
    batcher = DynamicBatcher(engine, max_batch_size=8, max_queue_delay_s=0.0, name="affine")
    xs = [np.full((1, 4), i, np.float32) for i in range(6)]

    async def main():
        outs = [await batcher.submit({"x": x}, 1) for x in xs]
        await batcher.close()
        return outs

    for x, out in zip(xs, asyncio.run(main())):
        assert isinstance(out["y"], np.ndarray)
        np.testing.assert_allclose(out["y"], x * 2 + 1, rtol=1e-3)
    ctx = batcher._contexts.get()
    assert ctx._seen  # the device feeds of a batch shape met before are known to the context


@pytest.mark.gpu
def test_gpu_merged_batches_are_assembled_in_a_pinned_block_and_split_exactly(tmp_path):
    engine = _affine_engine(tmp_path, 16)
    batcher = DynamicBatcher(engine, max_batch_size=16, max_queue_delay_s=0.05, name="affine")
    records = []
    batcher.on_batch = records.append
    rounds = [[np.full((1 + i % 3, 4), 10 * r + i, np.float32) for i in range(5)] for r in range(3)]

    async def main():
        outs = [await asyncio.gather(*(batcher.submit({"x": x}, len(x)) for x in xs)) for xs in rounds]
        await batcher.close()
        return outs

    for xs, outs in zip(rounds, asyncio.run(main())):  # each round reuses the block the round before wrote
        for x, out in zip(xs, outs):
            np.testing.assert_allclose(out["y"], x * 2 + 1, rtol=1e-3)
    assert max(r.requests for r in records) > 1
    (staging,) = batcher._staging.values()
    assert torch.from_numpy(staging.block).is_pinned()
