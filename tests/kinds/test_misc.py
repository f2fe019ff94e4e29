"""Ops of no other family: ImageDecoder's clear rejection."""

import numpy as np
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, make_model


def test_image_decoder_names_missing_dependency():
    model = make_model("ImageDecoder", {"data": np.zeros(16, np.uint8)}, {"pixel_format": "RGB"}, opset=20)
    with pytest.raises(UnsupportedOpError, match="ImageDecoder needs an image decoding library"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))
