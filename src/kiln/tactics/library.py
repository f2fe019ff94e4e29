"""Importing this module registers every tactic module.

The order is the registration order, which breaks ties between tactics of one priority (registry.candidates sorts
stably): the Triton GEMM families before the torch ones, as the import chains of the tactic modules used to leave
them. Keep it when adding a module, or say in the change which choices it moves.

The quantized kinds register from one module each (quant_gemm, quant_conv, quant_conv_pair, quant_conv_chain), a
table in that kind's order; their launchers (triton_int8*.py, torch_int8.py, torch_scaled_mm.py) register nothing.
tests/tactics/test_quant_tactic_table.py holds every kind's order."""

from kiln.tactics import (  # noqa: F401  (imported for their registrations)  # isort: skip
    triton_gemm,
    triton_gemm_tma,
    triton_gemv,
    quant_gemm,
    quant_conv,
    quant_conv_pair,
    quant_conv_chain,
    torch_attention,
    cublaslt_algo,
    torch_conv,
    torch_fused,
    torch_gemm,
    torch_norm,
    torch_patch_conv,
    torch_pool,
    triton_attention,
    triton_conv,
    triton_conv_s2d,
    triton_cuda_core_conv,
    triton_gather,
    triton_tma_conv1x1,
    triton_norm,
    triton_pointwise,
    triton_pointwise_chain,
    triton_pool,
    triton_quantize,
    views,
)
