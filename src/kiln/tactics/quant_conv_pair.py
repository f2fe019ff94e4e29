"""QuantConvPair's tactics (two 1x1 int8 convs summed under one epilogue, quant/fuse_conv_pair.py), in registration
order (which breaks ties between equal priorities). Both launchers are in tactics/triton_int8_pair.py.

| tactic | priority | launcher |
|---|---|---|
| triton_int8_conv_pair | 15 | two Triton implicit-GEMM convs, any GPU |
| triton_int8_conv_pair_wgmma | 18 | the Gluon pair kernel, Hopper |
"""

from __future__ import annotations

from kiln.tactics import triton_int8_pair as pair
from kiln.tactics.registry import Tactic, register_table

KINDS = ("QuantConvPair",)

TABLE = register_table("QuantConvPair", (
    Tactic("triton_int8_conv_pair", KINDS, pair.compile_split, pair.supports_pair, pair.split_configs, priority=15,
           writes_out=True, superseded_by=("triton_int8_conv_pair_wgmma",)),  # ResNet-50 b64-256: ≤ 2 % ahead once
    Tactic("triton_int8_conv_pair_wgmma", KINDS, pair.compile_wgmma, pair.supports_wgmma, pair.wgmma_configs,
           priority=18, arch_specific=True, writes_out=True),
))
