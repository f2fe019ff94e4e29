"""QuantConv's tactics, in registration order (which breaks ties between equal priorities: registry.candidates sorts
stably). The GEMM tactics of tactics/quant_gemm.py run a conv lowered to one GEMM: they are listed here by reference
(one Tactic object serves both kinds; quant_gemm registers it), at the places they have always held in this order.

| tactic | priority | launcher |
|---|---|---|
| triton_{int8,fp8}_gemm | 20 | quant_gemm.py |
| triton_{int8,fp8}_gemm_tma | 19 | quant_gemm.py |
| triton_int8_conv_tma, triton_fp8_conv_tma | 19 | the TMA implicit-GEMM conv, Hopper (tactics/triton_int8_tma.py) |
| torch_int_mm, torch_scaled_mm | 10 | quant_gemm.py |
| triton_int8_conv, triton_fp8_conv | 15 | the Triton implicit-GEMM conv (tactics/triton_int8_conv.py) |
| triton_int8_gemm_wgmma | 18 | quant_gemm.py |
| triton_int8_conv_wgmma | 18 | the Gluon implicit-GEMM conv, Hopper (tactics/triton_int8_wgmma.py) |
| triton_int8_conv_halo | 18 | the Gluon halo-box conv, Hopper (tactics/triton_int8_wgmma.py) |
| triton_int8_conv_s2d, triton_fp8_conv_s2d | 14 | space-to-depth + the Triton conv (tactics/triton_int8_s2d.py) |
| triton_int8_conv_s2d_halo | 18 | space-to-depth + the halo-box conv, Hopper (tactics/triton_int8_s2d.py) |
"""

from __future__ import annotations

from dataclasses import replace

from kiln.tactics import quant_gemm, triton_int8_conv, triton_int8_s2d, triton_int8_tma, triton_int8_wgmma
from kiln.tactics.int8_common import qtype_variants, tma_conv_reason, tma_device_reason
from kiln.tactics.registry import Tactic, register_table

KINDS = ("QuantConv",)

CONV_TMA = qtype_variants("conv_tma", KINDS, triton_int8_tma.compile_conv, triton_int8_tma.conv_configs, priority=19,
                          layer_reason=tma_conv_reason, device_reason=tma_device_reason, arch_specific=True)
# ResNet-50 int8 on H100 / H200 (batch 1-256): no layer taken by these where their Hopper successor ran
CONV_TMA = (replace(CONV_TMA[0], superseded_by=("triton_int8_conv_wgmma",)), *CONV_TMA[1:])
TRITON_CONV = qtype_variants("conv", KINDS, triton_int8_conv.compile_conv, triton_int8_conv.conv_configs, priority=15,
                             layer_reason=triton_int8_conv.conv_only)
# ResNet-50: ahead of the Gluon convs on ≤ 6 layers at batch 128-256 (by ≤ 4.5 % on an H200, ≤ 11.5 % on an H100:
# ~0.5 % of the engine), on ≤ 1 at 64: not worth its compiles in every build; opt level 4 tries it
TRITON_CONV = (replace(TRITON_CONV[0], superseded_by=("triton_int8_conv_wgmma",)), *TRITON_CONV[1:])
CONV_WGMMA = Tactic("triton_int8_conv_wgmma", KINDS, triton_int8_wgmma.compile_conv, triton_int8_wgmma.supports_conv,
                    triton_int8_wgmma.conv_configs, priority=18, arch_specific=True, writes_out=True)
CONV_HALO = Tactic("triton_int8_conv_halo", KINDS, triton_int8_wgmma.compile_halo, triton_int8_wgmma.supports_halo,
                   triton_int8_wgmma.halo_configs, priority=18, arch_specific=True, writes_out=True)
CONV_S2D = qtype_variants("conv_s2d", KINDS, triton_int8_s2d.compile_conv, triton_int8_s2d.conv_configs, priority=14,
                          layer_reason=triton_int8_s2d.s2d_reason)
CONV_S2D = (replace(CONV_S2D[0], superseded_by=("triton_int8_conv_s2d_halo",)), *CONV_S2D[1:])
CONV_S2D_HALO = Tactic("triton_int8_conv_s2d_halo", KINDS, triton_int8_s2d.compile_halo, triton_int8_s2d.supports_halo,
                       triton_int8_s2d.halo_configs, priority=18, arch_specific=True, writes_out=True)

TABLE = register_table("QuantConv", (
    *quant_gemm.TRITON_GEMM,
    *quant_gemm.TRITON_GEMM_TMA,
    *CONV_TMA,
    quant_gemm.TORCH_INT_MM,
    quant_gemm.TORCH_SCALED_MM,
    *TRITON_CONV,
    quant_gemm.GEMM_WGMMA,
    CONV_WGMMA,
    CONV_HALO,
    *CONV_S2D,
    CONV_S2D_HALO,
))
