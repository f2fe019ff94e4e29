"""The ordered list of passes a default build runs (each pass lives in its own module)."""

from __future__ import annotations

DEFAULT: list = []
