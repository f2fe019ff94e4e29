"""--int8 with fp16 float layers (the GPU's int8 builds, as TensorRT's --int8 --fp16): quantized layers write
fp16 and QuantizeLinear reads fp16, instead of fp32 tensors with casts around them.

    QuantGemm ─▶ y: f32 ─▶ Cast ─▶ y': f16 ─▶ LayerNorm@f16    ⇒   QuantGemm{out_dtype=f16} ─▶ y: f16 ─▶ LayerNorm@f16
    a: f16 ─▶ Cast ─▶ a': f32 ─▶ QuantizeLinear                  ⇒   a: f16 ─▶ QuantizeLinear{precision=f32}
    QuantConv ─▶ r: f32 ─▶ QuantizeLinear, QuantConv(residual)   ⇒   QuantConv{out_dtype=f16} ─▶ r: f16 ─▶ ...

The second is exact (f16 → f32 is exact, the division stays fp32, the residual is read as fp32). The first and
third round the float output to fp16 once, as the cast did (first) or as an fp16 tensor of a mixed build would.
(A residual stays float only where its producer writes float, quant/int8.py: a reader in float, Q/DQ models.)
Network outputs and tensors with any other reader keep their type.
"""

from __future__ import annotations

from kiln.ir import DType, Network
from kiln.kinds.verify import verify_network
from kiln.passes import PassContext
from kiln.passes.eliminate_dead import eliminate_dead
from kiln.quant.casts import remove_redundant_casts

F32, F16 = DType.FLOAT32, DType.FLOAT16
QUANTIZED = ("QuantConv", "QuantGemm")
RESIDUAL = 4  # QuantConv's residual input


def _reads_any_float(layer, k: int) -> bool:
    """`layer` reads its k-th input as fp32 whatever float type it has, exactly."""
    return (layer.kind == "QuantizeLinear" and k == 0) or (layer.kind == "QuantConv" and k == RESIDUAL)


def int8_fp16_io(net: Network) -> list[str]:
    """The rewrites of the module docstring, in place; notes for the build summary."""
    consumers, outputs = net.consumers(), set(net.outputs)
    written = 0
    for layer in net.layers:
        y = layer.outputs[0] if layer.outputs else None
        if layer.kind not in QUANTIZED or layer.attrs.get("out_scale") is not None or y in outputs \
                or net.tensors[y].dtype is not F32 or not consumers.get(y):
            continue
        readers = consumers[y]
        if all((r.kind == "Cast" and r.attrs.get("to") is F16)
               or all(_reads_any_float(r, k) for k, n in enumerate(r.inputs) if n == y) for r in readers):
            layer.attrs["out_dtype"] = F16
            net.tensors[y].dtype = F16
            written += 1
    producers, read_direct = net.producers(), 0
    for layer in net.layers:
        for k, n in enumerate(layer.inputs):
            cast = producers.get(n) if n else None
            if cast is None or cast.kind != "Cast" or not _reads_any_float(layer, k) or net.tensors[n].dtype is not F32:
                continue
            src = cast.inputs[0]
            if net.tensors[src].dtype is F16:
                layer.inputs[k] = src
                read_direct += 1
                if layer.kind == "QuantizeLinear":
                    layer.attrs["precision"] = F32
    for layer in net.layers:  # a QuantizeLinear reading fp16 divides in fp32, as it did behind the cast
        if layer.kind == "QuantizeLinear" and net.tensors[layer.inputs[0]].dtype is F16 and layer.attrs.get(
                "precision") is None:
            layer.attrs["precision"] = F32
    bypassed = remove_redundant_casts(net)
    eliminate_dead(net, PassContext())
    verify_network(net)
    return [f"int8 with fp16: {written} quantized layers write fp16, {read_direct} fp16 tensors read by "
            f"QuantizeLinear / residuals without a cast, {bypassed} casts bypassed"]
