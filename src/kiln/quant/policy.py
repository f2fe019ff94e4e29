"""Which layer kinds may compute in fp16/bf16, and which of their tensors follow the layer's precision.

- ALLOWED kinds run in the reduced type under --fp16/--bf16 (their references accumulate or take
  statistics in fp32 internally where range demands it).
- DENIED kinds never do, not even on request: fp32-only semantics, or an output type that an
  attribute fixes (a cast, a random generator, quantization, a control-flow body).
- Any other kind runs reduced only when --layer-precision asks for it by name.
- A PointwiseChain is judged by the kinds of its steps: reduced only if all are allowed, denied if any is.
- READS_ANY kinds read a float input in whatever type it has (a shape query, a cast: exact either
  way), so they never need a cast in front.
"""

from __future__ import annotations

FUSED = {"FusedConv", "FusedGemm", "FusedAttention", "AddLayerNorm", "EmbedLayerNorm", "PointwiseChain"}
LINEAR = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Attention"}  # Attention: ONNX Attention-23
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Erf",
               "Tanh", "Sigmoid", "Max", "Min", "Sum", "Mean", "Clip", "Where", "Floor", "Ceil", "Round", "Sign"}
ACTIVATIONS = {"Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "HardSigmoid", "HardSwish",
               "Softplus", "Softsign", "Mish", "Swish", "ThresholdedRelu", "SwiGLU"}
POOLING = {"AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool"}
NORMALIZATION = {"Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "InstanceNormalization",
                 "BatchNormalization", "RMSNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"}
DATA_MOVEMENT = {"Concat", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Tile", "Slice",
                 "Gather", "GatherElements", "GatherND", "Split", "Pad", "Identity", "Trilu", "Resize",
                 "DepthToSpace", "SpaceToDepth"}

ALLOWED = FUSED | LINEAR | ELEMENTWISE | ACTIVATIONS | POOLING | NORMALIZATION | DATA_MOVEMENT

DENIED = {
    "Cast", "BitCast", "Range", "ConstantOfShape", "EyeLike",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial",
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "Adam", "Adagrad", "Momentum",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "ConvInteger", "MatMulInteger",
    "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix", "DFT", "STFT",
    "TreeEnsemble", "LabelEncoder", "Binarizer", "ArrayFeatureExtractor", "TfIdfVectorizer",
    "NonMaxSuppression", "If", "Loop", "Scan", "SequenceMap",
}

READS_ANY = {"Shape", "Size", "Cast"}

# Float inputs/outputs that keep their own type whatever the layer's precision (index → not data).
# Resize's roi and scales are coordinates; LayerNormalization's Mean/InvStdDev have the stash type.
DATA_INPUTS = {"Resize": (0,)}
DATA_OUTPUTS = {"LayerNormalization": (0,)}


def _kinds(layer) -> set[str]:
    """The kinds a layer computes: its own, or a PointwiseChain's steps'."""
    return {step[0] for step in layer.attrs["program"]} if layer.kind == "PointwiseChain" else {layer.kind}


def allowed(layer) -> bool:
    return _kinds(layer) <= ALLOWED


def denied(layer) -> bool:
    return bool(_kinds(layer) & DENIED)


def is_data_input(kind: str, index: int) -> bool:
    return index in DATA_INPUTS.get(kind, (index,))


def is_data_output(kind: str, index: int) -> bool:
    return index in DATA_OUTPUTS.get(kind, (index,))
