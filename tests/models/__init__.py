"""Architectures of the reference models, written in plain torch (torchvision cannot be installed beside CPU torch)."""
