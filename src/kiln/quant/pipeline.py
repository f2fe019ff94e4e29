"""The ordered pass list of a build: the float graph passes (passes/registry.py), then the precision passes, which
rewrite the layers the precision stage makes, each gated on the build target (passes/manager.py's BuildTarget,
filled by the builder from the config and device), never on which modules happen to be imported.

They live here, not in passes/, because they only rewrite quantized layers (QuantConv, AddLayerNorm's quantized
output) and run after the precision stage of this package; they use the pass signature, PassContext and the
registry's Step like every other pass.
"""

from __future__ import annotations

from kiln.passes.manager import BuildTarget, Pass
from kiln.passes.registry import LAYOUT_STEPS, STEPS, Stage, Step, select
from kiln.quant.fold_quantize import fold_quantize
from kiln.quant.fuse_conv_chain import fuse_conv_chain
from kiln.quant.fuse_conv_pair import fuse_conv_pair


def _quantized(target: BuildTarget) -> bool:
    return target.quantized


def _int8_conv_kernels(target: BuildTarget) -> bool:
    return target.quantized and target.int8_conv_kernels


QUANTIZED = "--int8 or --fp8"
INT8_CONV_KERNELS = "--int8 or --fp8, on a device that runs the Gluon int8 1x1 conv kernels (Hopper)"

# Pairs before chains: a chain's first conv may be a pair (ResNet's layer-1 projection block).
PRECISION_STEPS: list[Step] = [
    Step(fold_quantize, Stage.PRECISION, _quantized, QUANTIZED),
    Step(fuse_conv_pair, Stage.PRECISION, _int8_conv_kernels, INT8_CONV_KERNELS),
    Step(fuse_conv_chain, Stage.PRECISION, _int8_conv_kernels, INT8_CONV_KERNELS),
]

PIPELINE: list[Step] = STEPS + PRECISION_STEPS + LAYOUT_STEPS


def build_passes(target: BuildTarget, stage: Stage) -> list[Pass]:
    """The passes `stage` of a build for `target` runs, in order."""
    return select(PIPELINE, target, stage)
