"""Importing this module registers every tactic module."""

from kiln.tactics import torch_attention, torch_conv, torch_gemm, torch_norm  # noqa: F401
