"""Reference implementations of the sampling layer kinds."""

from __future__ import annotations

import torch

from kiln.kinds.registry import kind
