"""Export helpers: a torch module to an ONNX file with either exporter, readable by ONNX Runtime 1.31."""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch


def export(model: torch.nn.Module, args: tuple, path: Path, *, dynamo: bool, input_names, output_names,
           dynamic_axes=None, opset: int = 18) -> Path:
    model.eval()
    fastpath = torch.backends.mha.get_fastpath_enabled()
    # nn.MultiheadAttention's fused eval fast path has no ONNX export; torchvision models export the plain path
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if dynamo:
                prog = torch.onnx.export(model, args, dynamo=True, input_names=input_names,
                                         output_names=output_names, opset_version=opset, verbose=False)
                prog.save(str(path))
            else:
                torch.onnx.export(model, args, str(path), dynamo=False, input_names=input_names,
                                  output_names=output_names, dynamic_axes=dynamic_axes, opset_version=opset)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    m = onnx.load(str(path), load_external_data=False)
    if m.ir_version > 10:  # ONNX Runtime 1.31 reads IR <= 13; keep files portable
        m.ir_version = 10
    onnx.save(m, str(path))
    return path
