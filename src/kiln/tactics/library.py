"""Importing this module registers every tactic module."""

from kiln.tactics import (  # noqa: F401  (imported for their registrations)
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
    triton_gemm,
    triton_int8,
    triton_int8_conv,
    triton_int8_s2d,
    triton_int8_tma,
    triton_norm,
    triton_pointwise,
    triton_pool,
    triton_quantize,
    views,
)
