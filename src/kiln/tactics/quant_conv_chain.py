"""QuantConvChain's tactics (an int8 1x1 conv, or conv pair, and the 1x1 conv reading its output,
quant/fuse_conv_chain.py), in registration order (which breaks ties between equal priorities). Both launchers are in
tactics/triton_int8_chain.py; the split one takes the pair's tiles (triton_int8_pair.split_configs).

| tactic | priority | launcher |
|---|---|---|
| triton_int8_conv_chain | 15 | Triton implicit-GEMM convs, any GPU |
| triton_int8_conv_chain_wgmma | 18 | the Gluon chain kernel, Hopper |
"""

from __future__ import annotations

from kiln.tactics import triton_int8_chain as chain, triton_int8_pair as pair
from kiln.tactics.registry import Tactic, register_table

KINDS = ("QuantConvChain",)

TABLE = register_table("QuantConvChain", (
    Tactic("triton_int8_conv_chain", KINDS, chain.compile_split, chain.supports_chain, pair.split_configs, priority=15,
           writes_out=True, superseded_by=("triton_int8_conv_chain_wgmma",)),
    Tactic("triton_int8_conv_chain_wgmma", KINDS, chain.compile_wgmma, chain.supports_wgmma, chain.wgmma_configs,
           priority=18, arch_specific=True, writes_out=True),
))
