"""Attention and its kernels (weeks 16-17).

- `lib.attn.masks`      the causal mask and the sliding-window mask (week 16)
- `lib.attn.attention`  GQA attention and the SDPA backend; naive and tiled (FlashAttention) attention, forward and
  backward; flash decoding (weeks 16-17)
- `lib.attn.triton_attention`  Triton kernels: a row softmax, a tiled matmul, FlashAttention-2's forward; the
  interpreter without a GPU (week 17)
- `lib.attn.io_model`   counting slow-memory traffic of standard and tiled attention (week 17)
"""
