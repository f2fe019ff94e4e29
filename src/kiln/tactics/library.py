"""Importing this module registers every tactic module.

The order is the registration order, which breaks ties between tactics of one priority (registry.candidates sorts
stably): the Triton GEMM families before the torch ones, as the import chains of the tactic modules used to leave
them. Keep it when adding a module, or say in the change which choices it moves."""

from kiln.tactics import (  # noqa: F401  (imported for their registrations)  # isort: skip
    triton_gemm,
    triton_int8,
    triton_int8_tma,
    triton_int8_pair,
    triton_int8_chain,
    torch_attention,
    torch_conv,
    torch_fused,
    torch_gemm,
    torch_int8,
    torch_norm,
    torch_pool,
    torch_scaled_mm,
    triton_attention,
    triton_conv,
    triton_int8_conv,
    triton_int8_wgmma,
    triton_int8_s2d,
    triton_norm,
    triton_pointwise,
    triton_pool,
    triton_quantize,
    views,
)
