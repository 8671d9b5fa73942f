"""GGUF's quantized blocks: the formats byte for byte, and the matmuls that read them (week 20).

- `lib.gguf.qformats`  GGUF block formats (Q8_0 ... Q6_K): quantize, dequantize, the K-quants' scale search
- `lib.gguf.qmatmul`   matmuls straight from GGUF blocks: the C++ kernel of `csrc/qmatmul.cpp` (built on first use;
  also the fast model's float32 decode step), a PyTorch fallback, the readable block dot product
"""
