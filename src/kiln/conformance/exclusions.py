"""The one list of backend tests kiln does not run, each with the reason why.

A pattern is a regular expression over the harness's test names (e.g. `test_abs_cpu`).
Never exclude a test of an op kiln supports without naming the feature that is missing.
"""

from __future__ import annotations

_DEVICE = r"_(cpu|cuda)$"

EXCLUDED: dict[str, str] = {
    r"^test_flexattention(?!\w*_expanded)\w*" + _DEVICE:
        "FlexAttention (ai.onnx.preview) is not supported as one op (its score/probability modifiers are "
        "subgraphs the installed onnx has no schema for); its _expanded function form runs and passes",
    r"^test_image_decoder_\w+" + _DEVICE:
        "ImageDecoder is not supported: decoding JPEG/PNG/WebP/TIFF needs an image codec library kiln does "
        "not depend on; decode images before the model",
    r"^test_gradient_of_add(_and_mul)?" + _DEVICE:
        "Gradient (ai.onnx.preview.training) is a training-only op; kiln builds inference engines",
    r"^test_bernoulli(_double|_seed)?(_expanded)?" + _DEVICE:
        "Bernoulli is supported, but the expected values are draws from numpy's global RandomState; "
        "kiln draws from torch's generator (same distribution, other values; see tests/test_sampling.py)",
    r"^test_dft_inverse(_opset19)?" + _DEVICE:
        "DFT inverse is supported; the expected data holds float32 rounding noise (1.9e-7) where the exact "
        "result is 0 and kiln returns 0, outside the test's atol of 1e-7 (ONNX Runtime fails it too)",
    r"^test_attention_4d_causal_fp16_expanded" + _DEVICE:
        "fp16 rounding: kiln's fp16 MatMul accumulates in fp32 and rounds once; the expected data differs "
        "by one fp16 ulp (4.9e-4) in 2 of 192 values (ONNX Runtime misses by the same amount)",
    r"^test_attention_4d(_causal)?_fp16_cuda$":
        "fp16 rounding on CUDA: the fused attention kernels keep QK^T and the softmax in fp32 and round once; "
        "the expected data differs by one fp16 ulp (4.9e-4) in 1-2 of 192 values, just over the test's rtol "
        "of 1e-3 (measured on an H100, 2026-11-23)",
    r"^test_loop16_seq_none" + _DEVICE:
        "harness limitation: onnx's assert_similar_outputs calls len() on a 0-d array inside the output "
        "sequence and raises TypeError before comparing values",
}
