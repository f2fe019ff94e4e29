"""cuDNN's algorithm search runs only while kiln tunes or warms an engine, never on the run path."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from kiln.builder import autotune
from kiln.tactics.common import cudnn_search, tf32


def _benchmark_in_tf32_scope() -> bool:
    with tf32(False):
        return torch.backends.cudnn.benchmark


def test_search_is_on_only_inside_its_scope():
    before = torch.backends.cudnn.benchmark
    assert _benchmark_in_tf32_scope() is False
    with cudnn_search():
        assert _benchmark_in_tf32_scope() is True
        seen = []
        worker = threading.Thread(target=lambda: seen.append(_benchmark_in_tf32_scope()))
        worker.start()
        worker.join()
        assert seen == [False]  # a serving thread never inherits the tuner's scope
    assert _benchmark_in_tf32_scope() is False
    assert torch.backends.cudnn.benchmark == before


class _Stop(Exception):
    pass


def test_tuning_runs_inside_the_search_scope(monkeypatch):
    seen = []

    def tuner(*args, **kwargs):
        seen.append(_benchmark_in_tf32_scope())
        raise _Stop

    monkeypatch.setattr(autotune, "Autotuner", tuner)
    with pytest.raises(_Stop):
        autotune.tune_profiles(SimpleNamespace(layers=[]), {}, SimpleNamespace(backend="cuda"), 1, False, None,
                               lambda *a: None)
    assert seen == [True]
    assert _benchmark_in_tf32_scope() is False


@pytest.mark.gpu
def test_gpu_runs_never_search_but_tuning_and_warm_up_do(tmp_path, monkeypatch):
    """On a GPU: tuning and the warm-up's probe shapes ask cuDNN to search; every call on the run path, at a shape
    never seen before included, does not (so a first call there stays cheap); a cuDNN conv engine warms every batch."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import kiln
    from models.export import export

    net = torch.nn.Sequential(*(m for _ in range(3) for m in (torch.nn.Conv2d(64, 64, 3, padding=1),
                                                               torch.nn.ReLU()))).eval()
    path = export(net, (torch.randn(2, 64, 56, 56),), tmp_path / "convs.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    seen = []
    flags = torch.backends.cudnn.flags

    def recording(*args, **kwargs):
        if "benchmark" in kwargs:  # kiln's tf32() scope names it; torch's own uses of flags() may not
            seen.append(kwargs["benchmark"])
        return flags(*args, **kwargs)

    monkeypatch.setattr(torch.backends.cudnn, "flags", recording)
    engine = kiln.build(path, kiln.BuildConfig(fp16=True, profiles=({"x": ((1, 64, 56, 56), (4, 64, 56, 56),
                                                                           (8, 64, 56, 56))},)))
    if not seen:
        pytest.skip("no cuDNN or cuBLAS tactic won a layer of this net on this GPU: nothing to observe")
    assert any(seen), "tuning and the warm-up's probe shapes search"
    if {"cudnn_conv", "cudnn_fused_conv"} & set(engine.tactic_summary()):  # cuDNN plans per shape: all 8 warmed
        assert engine.build_info["warm_up_shapes"] == 8
    seen.clear()
    ctx = engine.create_context()
    for batch in (4, 3, 7):  # the opt shape, then two shapes no one ran before
        ctx.run({"x": torch.randn(batch, 64, 56, 56, device="cuda")})
    assert seen and set(seen) == {False}, seen
