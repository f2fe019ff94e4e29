"""QuantGemm's tactics, in registration order (which breaks ties between equal priorities: registry.candidates sorts
stably). Each also runs QuantConv, a conv lowered to one GEMM (int8_lowering.gemm_form: a 1x1 conv's rows are a view
of NHWC input, others go through im2col), so tactics/quant_conv.py lists these same objects in its own table.

| tactic | priority | launcher |
|---|---|---|
| triton_int8_gemm, triton_fp8_gemm | 20 | the Triton quantized GEMM (tactics/triton_int8.py) |
| triton_int8_gemm_tma, triton_fp8_gemm_tma | 19 | its TMA-fed form, Hopper (tactics/triton_int8_tma.py) |
| torch_int_mm | 10 | torch._int_mm, cuBLASLt int8 (tactics/torch_int8.py) |
| torch_scaled_mm | 10 | torch._scaled_mm, cuBLASLt fp8 (tactics/torch_scaled_mm.py) |
| triton_int8_gemm_wgmma | 18 | the Gluon GEMM keeping one wgmma in flight, Hopper (tactics/triton_int8_wgmma.py) |
"""

from __future__ import annotations

from dataclasses import replace

from kiln.tactics import torch_int8, torch_scaled_mm, triton_int8, triton_int8_tma, triton_int8_wgmma
from kiln.tactics.int8_common import qtype_variants, tma_device_reason
from kiln.tactics.registry import Tactic, register_table

KINDS = ("QuantGemm", "QuantConv")  # every QuantGemm tactic runs a conv lowered to one GEMM too

TRITON_GEMM = qtype_variants("gemm", KINDS, triton_int8.compile_gemm, triton_int8.gemm_configs, priority=20)
# ResNet-50 int8 (H200, batch 64-256): behind the Gluon kernels on every conv they took, a fifth of the cold build's
# candidates; it keeps the classifier (N = 1000, which they refuse) and the batch-1 1x1 convs (triton_int8.outpaced)
TRITON_GEMM = (replace(TRITON_GEMM[0], superseded_by=("triton_int8_gemm_wgmma", "triton_int8_conv_wgmma",
                                                      "triton_int8_conv_halo"), superseded_when=triton_int8.outpaced),
               *TRITON_GEMM[1:])
TRITON_GEMM_TMA = qtype_variants("gemm_tma", KINDS, triton_int8_tma.compile_gemm, triton_int8_tma.gemm_configs,
                                 priority=19, device_reason=tma_device_reason, arch_specific=True)
TORCH_INT_MM = Tactic("torch_int_mm", KINDS, torch_int8.compile_int_mm, torch_int8.supports_int_mm, priority=10,
                      fresh=True, superseded_by=("triton_int8_gemm_wgmma",))
TORCH_SCALED_MM = Tactic("torch_scaled_mm", KINDS, torch_scaled_mm.compile_scaled_mm,
                         torch_scaled_mm.supports_scaled_mm, priority=10, arch_specific=True, fresh=True)
GEMM_WGMMA = Tactic("triton_int8_gemm_wgmma", KINDS, triton_int8_wgmma.compile_gemm, triton_int8_wgmma.supports_gemm,
                    triton_int8_wgmma.gemm_configs, priority=18, arch_specific=True, writes_out=True)

TABLE = register_table("QuantGemm", (
    *TRITON_GEMM,
    *TRITON_GEMM_TMA,
    TORCH_INT_MM,
    TORCH_SCALED_MM,
    GEMM_WGMMA,
))
