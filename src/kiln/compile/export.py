"""A torch module to an ONNX ModelProto (torch.onnx.export, the torch.export-based exporter first)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import onnx
import torch

from kiln.errors import ModelError


def _first_lines(e: BaseException, n: int = 6) -> str:
    lines = [line for line in str(e).splitlines() if line.strip() and "\x1b" not in line]
    text = " ".join(lines[:n])
    return f"{type(e).__name__}: {text[:800]}"


@contextlib.contextmanager
def _quiet():
    """The exporters warn and log a lot (missing torchvision ops, tracer warnings); none of it is for kiln's users."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "torch._dynamo",
                                              "torch.fx.experimental.symbolic_shapes", "onnxscript")]
    levels = [lg.level for lg in loggers]
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # nn.MultiheadAttention's fused fast path has no ONNX export
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def to_onnx(module: torch.nn.Module, args: tuple, input_names: list[str], output_names: list[str] | None,
            dynamic: dict[int, dict[int, tuple[int, int]]] | None = None, what: str = "the module") -> onnx.ModelProto:
    """`module(*args)` (flat tensors in, a tuple of tensors out) as an ONNX model whose inputs and outputs carry the
    given names. `dynamic`: {argument index: {dim: (min, max)}}. The torch.export-based exporter runs first, the
    TorchScript one only if it fails; a ModelError says why when neither can export the module."""
    dynamic = dynamic or {}
    errors = []
    with _quiet():
        try:
            shapes = None
            if dynamic:
                shapes = (tuple({d: torch.export.Dim.DYNAMIC(min=lo, max=hi) for d, (lo, hi) in dynamic[i].items()}
                                if i in dynamic else None for i in range(len(args))),)
            prog = torch.onnx.export(module, args, dynamo=True, input_names=input_names, output_names=output_names,
                                     dynamic_shapes=shapes, verbose=False)
            if prog is None:
                raise RuntimeError("torch.onnx.export returned no program")
            return prog.model_proto
        except Exception as e:  # the exporter raises many kinds of errors; each is reported below
            errors.append(f"torch.export-based exporter: {_first_lines(e.__cause__ or e)}")
        try:  # a trace that reads tensor values into Python would be silently specialized: refuse that instead
            warnings.simplefilter("error", torch.jit.TracerWarning)
            buf = io.BytesIO()
            axes = {input_names[i]: {d: f"{input_names[i]}_{d}" for d in dims} for i, dims in dynamic.items()}
            torch.onnx.export(module, args, buf, dynamo=False, input_names=input_names, output_names=output_names,
                              dynamic_axes=axes or None, opset_version=18)
            return onnx.load_from_string(buf.getvalue())
        except Exception as e:
            errors.append(f"TorchScript exporter: {_first_lines(e)}")
    raise ModelError(f"kiln.compile could not export {what} to ONNX; " + " | ".join(errors)
                     + ". Make the forward exportable by torch.export (no data-dependent Python control flow, "
                       "tensor or nested tuple/list/dict arguments and results), or export it yourself and use "
                       "kiln.build.")
