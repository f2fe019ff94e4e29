"""Inputs that layer references read on the host (shapes, axes, pads, sizes, k): kept on the CPU.

A reference that calls `.tolist()` on a device tensor synchronizes with the GPU, which costs a round
trip per layer and makes the engine impossible to capture in a CUDA graph. When such an input is a
build-time constant, the engine hands the reference the constant's CPU copy instead.
"""

from __future__ import annotations

from kiln.tactics.registry import Kernel

_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

HOST_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "Pad": (1, 2, 3), "TopK": (1,), "Trilu": (1,), "CenterCropPad": (1, 2),
    "Resize": (1, 2, 3), "Upsample": (1,), "CumSum": (1,), "CumProd": (1,), "OneHot": (1,),
    **{k: (1,) for k in _REDUCE},
}


def with_host_constants(kernel: Kernel, host: dict[int, object]) -> Kernel:
    """`kernel` with the inputs at the given positions replaced by their host copies."""
    def run(inputs):
        args = list(inputs)
        for i, value in host.items():
            args[i] = value
        return kernel(args)

    return run
