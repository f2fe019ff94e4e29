"""Importing this module registers every tactic module."""

from kiln.tactics import (  # noqa: F401  (imported for their registrations)
    torch_attention,
    torch_conv,
    torch_fused,
    torch_gemm,
    torch_norm,
    torch_pool,
    triton_attention,
    triton_gemm,
    triton_norm,
    triton_pointwise,
    views,
)
