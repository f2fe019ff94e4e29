"""Engines and their plan files."""

from kiln.engine.engine import Engine

__all__ = ["Engine"]
