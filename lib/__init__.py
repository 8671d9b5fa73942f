"""Inference Lab's reference implementation: one module per technique.

- `lib.model`     a Llama-family decoder (SmolLM2 from its GGUF file, or tiny random configs)
- `lib.kv_cache`  the causal mask and the KV cache (week 16)
- `lib.attention` attention with grouped KV heads; naive and tiled (FlashAttention) attention (weeks 16–17)
- `lib.generate`  the generation loop and sampling
- `lib.fetch`     the set-up step that places the model where `lib` finds it
"""
