"""Generated Triton kernels, one module per kernel family (GEMM, LayerNorm, Softmax, attention, pointwise).

Each module holds the `@triton.jit` kernel, a launcher that takes torch tensors, and the tile-config
space the tactics offer the autotuner. Under TRITON_INTERPRET=1 they run on CPU tensors (tests).
"""
