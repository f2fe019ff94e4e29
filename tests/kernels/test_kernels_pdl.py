"""Programmatic dependent launch (kernels/common.pdl_args, pdl_start): on for Hopper unless KILN_PDL=0, off under
the interpreter and off CUDA; every fp16 kernel takes it, so a chain of kiln kernels is never broken by one that
launches plainly; on a GPU a captured chain gives the same bits either way."""

import ast
import importlib
import inspect
import os
import textwrap

import pytest
import torch

from kiln.kernels import common

MODULES = ["attention", "conv", "depthwise_conv", "direct_conv", "gather", "gemm", "gemm_tma", "layernorm",
           "pointwise", "pool", "softmax", "space_to_depth"]


def test_pdl_args_follow_the_device_and_the_switch(monkeypatch):
    assert common.pdl_args(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setattr(common, "_pdl_device", lambda index: True)
    assert common.pdl_args(torch.device("cuda", 0)) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv("KILN_PDL", "0")
    assert common.pdl_args(torch.device("cuda", 0)) == {"PDL": False}
    monkeypatch.setattr(common, "_pdl_device", lambda index: False)  # before Hopper
    monkeypatch.delenv("KILN_PDL")
    assert common.pdl_args(torch.device("cuda", 0)) == {"PDL": False}


@pytest.mark.parametrize("name", MODULES)
def test_every_kernel_takes_pdl_and_waits_first(name):
    """Each launched kernel has the PDL constexpr and calls pdl_start before anything else."""
    module = importlib.import_module(f"kiln.kernels.{name}")
    kernels = [v for k, v in vars(module).items() if k.endswith("_kernel") and hasattr(v, "arg_names")]
    assert kernels
    for kernel in kernels:
        assert "PDL" in kernel.arg_names, f"{name}.{kernel.fn.__name__} has no PDL constexpr"
        body = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn))).body[0].body
        first = ast.unparse(body[1] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                            else body[0])
        assert first == "pdl_start(PDL)", f"{name}.{kernel.fn.__name__} starts with {first!r}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible on this machine")
def test_a_captured_chain_gives_the_same_bits_with_and_without_pdl(monkeypatch):
    from kiln.kernels import conv, pointwise, pool

    torch.manual_seed(0)
    x = torch.randn(2, 64, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w1 = conv.pack_weight(torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16) * 0.05)
    w2 = conv.pack_weight(torch.randn(128, 64, 1, 1, device="cuda", dtype=torch.float16) * 0.1)
    scratch = common.SplitScratch()

    def chain():
        y = conv.conv2d(x, w1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), activation="relu")
        y = pool.max_pool2d(y, (3, 3), (2, 2), (1, 1), (1, 1), (14, 14))
        y = conv.conv2d(y, w2, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), scratch=scratch,
                        config={"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3,
                                "SPLIT_K": 2})
        return pointwise.apply(y, "sigmoid")

    outs = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("KILN_PDL", pdl)
        chain()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        outs[pdl] = out.clone()
    assert os.environ["KILN_PDL"] == "0"
    assert torch.equal(outs["1"], outs["0"])
    torch.testing.assert_close(outs["1"].float(), chain().float(), atol=0, rtol=0)
