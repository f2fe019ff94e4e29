"""Importing this module registers every tactic module."""

from kiln.tactics import torch_attention, torch_conv, torch_gemm, torch_norm, triton_attention, triton_gemm, triton_norm, triton_pointwise  # noqa: F401,E501
