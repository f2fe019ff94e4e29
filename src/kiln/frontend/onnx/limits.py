"""Caps that keep untrusted models from exhausting memory or recursion."""

from __future__ import annotations

from dataclasses import dataclass

PROTOBUF_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class ModelLimits:
    """Budgets checked while loading and importing a model."""

    max_file_bytes: int = 64 * 2**30          # whole model file plus external data
    max_rank: int = 64                        # dims of any declared tensor
    max_nodes: int = 1_000_000
    max_graph_depth: int = 16                 # nesting of subgraphs
    max_tensor_bytes: int = 2**40             # a declared static tensor above this is a typo or an attack
    fold_budget_bytes: int = 64 * 2**20       # constant folding never creates a tensor larger than this
    max_shape_values: int = 2**20             # 1-D elements ONNX data propagation may hold (~140 bytes each)
