"""Fuse trees of elementwise layers into one PointwiseChain layer whose `program` a code generator
compiles into one kernel (format: kinds/fused.py).

    a = Mul(x, 2.0); b = Add(a, y); z = Tanh(b)   ⇒   z = PointwiseChain(x, 2.0, y)
        {program: [["Mul", [0, 1], []], ["Add", [3, 2], []], ["Tanh", [4], []]]}

Members: unary math, activations, binary arithmetic, comparisons and logic, Clip, Cast and Where
on plain numeric types. Every member's output and every non-constant input has the root's shape
(only constants broadcast); every member but the root has its one reader inside the tree and is
not a network output. At least two layers, and a float output (integer trees are shape
arithmetic, which belongs on the host). Runs after the other fusions so it does not take
their epilogues.
"""

from __future__ import annotations

from kiln.ir import DType, Layer, Network
from kiln.passes.fuse_common import fuse, same_shape
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer

ELEMENTWISE = {
    "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Tanh", "Erf", "Floor", "Ceil",
    "Round", "Sign", "Not", "IsNaN", "IsInf",
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus", "Softsign",
    "Gelu", "Mish", "Swish", "ThresholdedRelu", "PRelu",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
    "Clip", "Cast", "Where",
}
_PLAIN = {DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT64, DType.INT8, DType.UINT8, DType.INT16,
          DType.INT32, DType.INT64, DType.BOOL}


def _eligible(net: Network, layer: Layer, shape_of: str) -> bool:
    """An elementwise layer on plain types whose output and runtime inputs all have `shape_of`'s shape."""
    if layer.kind not in ELEMENTWISE or len(layer.outputs) != 1 or not layer.outputs[0]:
        return False
    names = [i for i in layer.inputs if i] + layer.outputs
    if any(net.tensors[n].dtype not in _PLAIN or net.tensors[n].kind != "tensor" for n in names):
        return False
    return all(same_shape(net, shape_of, n) for n in layer.outputs + [i for i in layer.inputs
                                                                       if i and i not in net.constants])


def _tree(net: Network, root: Layer, producers, consumers, used: set[int]) -> list[Layer]:
    """The root and every eligible producer that only feeds the tree, in network order."""
    members, todo = [root], [root]
    while todo:
        for i in todo.pop().inputs:
            p = producers.get(i)
            if (p is not None and id(p) not in used and single_consumer(net, i, consumers) is not None
                    and _eligible(net, p, root.outputs[0])):
                members.append(p)
                todo.append(p)
    order = {id(l): k for k, l in enumerate(net.layers)}
    return sorted(members, key=lambda l: order[id(l)])


def _program(layers: list[Layer]) -> tuple[list[str], list]:
    """(external inputs, program) of a tree of layers in network order (format: kinds/fused.py)."""
    inputs = list(dict.fromkeys(i for l in layers for i in l.inputs if i and i not in {l2.outputs[0] for l2 in layers}))
    value = {name: k for k, name in enumerate(inputs)}
    program = []
    for layer in layers:
        refs = [value[i] if i else None for i in layer.inputs]
        program.append([layer.kind, refs, [x for kv in layer.attrs.items() for x in kv]])
        value[layer.outputs[0]] = len(inputs) + len(program) - 1
    return inputs, program


def fuse_pointwise_chain(net: Network, ctx: PassContext) -> bool:
    changed = False
    producers, consumers = net.producers(), net.consumers()
    used: set[int] = set()
    for root in reversed(list(net.layers)):
        if id(root) in used or not _eligible(net, root, root.outputs[0] if root.outputs else ""):
            continue
        out = root.outputs[0]
        if not net.tensors[out].dtype.is_float:
            continue
        layers = _tree(net, root, producers, consumers, used)
        if len(layers) < 2:
            continue
        used |= {id(l) for l in layers}
        inputs, program = _program(layers)
        if fuse(net, layers, "PointwiseChain", inputs, [out], {"program": program}):
            ctx.record("fuse_pointwise_chain.layers", len(layers) - 1)
            changed = True
    return changed
