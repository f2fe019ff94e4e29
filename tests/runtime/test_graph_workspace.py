"""A captured engine owns its cuBLAS workspace: replays stay right after others free torch's workspaces
(torch.compile's reduce-overhead clears them before recording; a BERT-base graph then faulted on freed memory)."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.runtime import cuda_graph


def test_clearing_workspaces_is_harmless_without_cuda():
    cuda_graph.clear_blas_workspaces()  # a CPU build has no workspaces to drop: nothing happens


@pytest.mark.gpu
def test_gpu_graph_replays_right_after_workspaces_are_freed(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    # long reductions onto few outputs: the shapes where cuBLAS splits K and uses its workspace
    net = torch.nn.Sequential(torch.nn.Linear(8192, 64), torch.nn.Linear(64, 8192), torch.nn.Linear(8192, 32)).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(net, (torch.randn(2, 8192),), str(path), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=18)
    engine = kiln.build(str(path), kiln.BuildConfig(fp16=True, profiles=({"x": ((1, 8192), (16, 8192), (64, 8192))},)))
    ctx = engine.create_context()
    xs = [torch.randn(b, 8192, device="cuda") for b in (4, 16, 64)]
    firsts = [ctx.run({"x": x})["y"].clone() for x in xs]
    for x, first in zip(xs, firsts):
        torch.testing.assert_close(ctx.run({"x": x})["y"], first)  # captured at the second run
    assert len(ctx.graphs.runs) == 3
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    junk = torch.full((torch.cuda.mem_get_info()[0] // 2 // 4,), float("nan"), device="cuda")  # in the freed memory
    for x, first in zip(xs, firsts):
        torch.testing.assert_close(ctx.run({"x": x})["y"], first)
    torch.cuda.synchronize()
    del junk
