"""Reference implementations of the resize layer kinds."""

from __future__ import annotations

import torch

from kiln.kinds.registry import kind
