"""The ONNX ops TensorRT 10.15's ONNX parser marks as supported (onnx-tensorrt docs/operators.md, "Y" rows).

kiln's acceptance bar: every one of these imports and runs on the CPU, its node tests passing.
ImageScaler, ParametricSoftplus and ScaledTanh were experimental ops removed from ONNX before opset 10;
they are listed apart because no current ONNX model (or checker) accepts them.
"""

TENSORRT_10_15 = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization
BlackmanWindow Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh
CumSum DeformConv DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten
Floor Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater
GreaterOrEqual GridSample GroupNormalization GRU HammingWindow HannWindow HardSigmoid HardSwish Hardmax
Identity If InstanceNormalization IsInf IsNaN LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax
Loop LRN LSTM LpNormalization LpPool MatMul Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg
NonMaxSuppression NonZero Not OneHot Or Pad Pow PRelu QuantizeLinear RandomNormal RandomNormalLike
RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax
ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RMSNormalization
RNN RoiAlign RotaryEmbedding Round STFT Scan Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign
Sin Sinh Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh TensorScatter
ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor
""".split())

REMOVED_FROM_ONNX = frozenset({"ImageScaler", "ParametricSoftplus", "ScaledTanh"})
