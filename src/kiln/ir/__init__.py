"""kiln's network IR: typed tensors, layers with provenance, and the network that holds them."""

from kiln.ir.dtype import DType
from kiln.ir.layer import Layer
from kiln.ir.network import Network
from kiln.ir.tensor import Tensor

__all__ = ["DType", "Layer", "Network", "Tensor"]
