"""Reference implementations of the spectral layer kinds."""

from __future__ import annotations

import torch

from kiln.kinds.registry import kind
