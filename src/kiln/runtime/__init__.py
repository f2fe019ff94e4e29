"""Running engines: the Engine (weights and compiled kernels on a device), execution contexts, input checking,
memory planning."""

from kiln.runtime.context import ExecutionContext
from kiln.runtime.engine import Engine

__all__ = ["Engine", "ExecutionContext"]
