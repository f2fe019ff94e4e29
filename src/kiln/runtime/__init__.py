"""Running engines: execution contexts, input checking, memory planning."""

from kiln.runtime.context import ExecutionContext

__all__ = ["ExecutionContext"]
