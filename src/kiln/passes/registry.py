"""The ordered list of passes a default build runs (each pass lives in its own module), and `Step`: one entry of a
build's full pass list (quant/pipeline.py), gated on the build target."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from kiln.passes.attention_keep_mask import attention_keep_mask
from kiln.passes.collapse_views import collapse_views
from kiln.passes.eliminate_common import eliminate_common
from kiln.passes.eliminate_dead import eliminate_dead
from kiln.passes.eliminate_identity import eliminate_identity
from kiln.passes.fold_batchnorm import fold_batchnorm
from kiln.passes.fold_constants import fold_constants
from kiln.passes.fold_shape_arithmetic import fold_shape_arithmetic
from kiln.passes.fuse_attention import fuse_attention
from kiln.passes.fuse_conv_epilogue import fuse_conv_epilogue
from kiln.passes.fuse_embedding import fuse_embedding
from kiln.passes.fuse_gemm_epilogue import fuse_gemm_epilogue
from kiln.passes.fuse_layernorm import fuse_layernorm
from kiln.passes.fuse_pointwise_chain import fuse_pointwise_chain
from kiln.passes.fuse_sibling_gemms import fuse_sibling_gemms
from kiln.passes.gather_as_reshape import gather_as_reshape
from kiln.passes.gemm_rows import gemm_rows
from kiln.passes.narrow_attention_mask import narrow_attention_mask
from kiln.passes.manager import BuildTarget, Pass
from kiln.passes.sink_transpose import sink_transpose

# Folding first (BatchNorm must be folded into its Conv before the conv epilogue is fused); the
# decomposed-LayerNorm (then the embedding lookups summed into one) and attention patterns before the epilogue
# fusions that would take their pieces (attention's mask then narrowed to the shape it broadcasts from); pointwise
# chains last, so they only get what no other fusion wanted, and after the layers those fusions left dead
# (attention's run-time scale arithmetic) are gone. Sibling GEMMs (attention's Q/K/V projections) merge once their
# epilogues are fused; repeated layers (the attention mask each encoder layer recomputes) go last, so no fusion
# finds a value shared that it needs alone.
DEFAULT: list = [eliminate_identity, fold_shape_arithmetic, fold_constants, gather_as_reshape, fold_batchnorm,
                 fuse_layernorm, fuse_embedding, fuse_attention, narrow_attention_mask, fuse_conv_epilogue,
                 fuse_gemm_epilogue, fuse_sibling_gemms, eliminate_dead, fuse_pointwise_chain, eliminate_common]


class Stage(enum.Enum):
    """When in a build a pass runs: on the float network, or after the precision stage has assigned dtypes and
    made quantized layers (the passes that rewrite those)."""

    OPTIMIZE = "optimize"
    PRECISION = "precision"


def _always(target: BuildTarget) -> bool:
    return True


@dataclass(frozen=True)
class Step:
    """One entry of a build's ordered pass list: the pass, the stage that runs it, and the condition on the build
    target under which it runs, as a predicate and in words (`kiln inspect` prints them)."""

    run: Pass
    stage: Stage = Stage.OPTIMIZE
    when: Callable[[BuildTarget], bool] = _always
    condition: str = "always"

    @property
    def name(self) -> str:
        return self.run.__name__


STEPS: list[Step] = [Step(p) for p in DEFAULT]

# Layout, last of all (after the precision stage, so its quantization sees the graph as exported, and an fp16
# attention mask's constant is -inf): attention reads the padding mask itself, GEMMs keep their rows in memory order,
# then the layout layers between two kernels become one view where each step alone copies.
LAYOUT_STEPS: list[Step] = [Step(p, Stage.PRECISION) for p in (attention_keep_mask, sink_transpose, gemm_rows,
                                                                collapse_views, eliminate_dead)]


def select(steps: list[Step], target: BuildTarget, stage: Stage) -> list[Pass]:
    """The passes of `steps` that `stage` runs for `target`, in order."""
    return [s.run for s in steps if s.stage is stage and s.when(target)]
