"""Accuracy tools: error metrics, comparison against ONNX Runtime, and the search for layers to keep in fp32."""
