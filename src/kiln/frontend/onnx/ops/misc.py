"""ONNX importers for ops of no other family: ImageDecoder (rejected: no image decoder is installed)."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register


@register("ImageDecoder", since=20)
def image_decoder(node: OnnxNode, ctx: ImportContext) -> None:
    """kiln ships no image codecs (ImageDecoder needs a JPEG/PNG/... library such as Pillow)."""
    raise UnsupportedOpError(f"{node.where()}: ImageDecoder needs an image decoding library (Pillow), "
                             "which kiln does not depend on; decode images before the model and feed the "
                             "pixels as a uint8 tensor")
