"""Generated Triton and Gluon kernels, one module per kernel family, each named for what it computes:

- float: gemm (GEMM, fused epilogue), conv (implicit-GEMM conv), attention (flash attention), layernorm (and residual
  add + LayerNorm), softmax, pointwise (activations), pool (max pooling, also int8 / fp8);
- quantized (int8, most also fp8 e4m3; kinds/quantized.py's epilogue): quantize (QuantizeLinear), int8_gemm (Triton),
  int8_gemm_tma (Triton, TMA-fed, Hopper), int8_gemm_wgmma (Gluon GEMM and implicit-GEMM conv, Hopper),
  int8_conv (Triton implicit-GEMM conv), int8_conv_tma (TMA-fed conv, Hopper), int8_conv_halo (Gluon halo-box conv,
  Hopper), int8_conv_pair (Gluon QuantConvPair), int8_gemm_chain (Gluon QuantConvChain), space_to_depth (the stem
  conv's input regrouping);
- shared: common (interpreter detection, dot precision, device limits, activations), out_buffer (outputs written
  into the activation arena).

Each kernel module holds its `@triton.jit` / `@gluon.jit` kernels, a launcher that takes torch tensors, and the
tile-config space the tactics offer the autotuner. Under TRITON_INTERPRET=1 the Triton ones run \
on CPU tensors (tests); the Gluon
ones need a Hopper GPU.
"""
