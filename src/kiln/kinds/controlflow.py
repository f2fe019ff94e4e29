"""Reference implementations of the controlflow layer kinds."""

from __future__ import annotations

import torch

from kiln.kinds.registry import kind
