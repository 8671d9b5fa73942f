"""The model and its caches: a Llama-family decoder, generation, sampling, and the same model fused for speed.

- `lib.modeling.llama`     a Llama-family decoder (SmolLM2 from its GGUF file, or tiny random configs)
- `lib.modeling.kv_cache`  the KV cache, the sliding-window cache, `kv_cache_bytes` (week 16); `truncate` (week 18)
- `lib.modeling.gqa`       pooling KV heads into fewer groups: MHA -> GQA -> MQA (week 16)
- `lib.modeling.sampling`  the one sampler of generate, the engine and the server (`SamplingParams`)
- `lib.modeling.generate`  the generation loop (greedy, temperature, top-k, top-p, or any `SamplingParams`)
- `lib.modeling.text`      the committed Gutenberg text and perplexity
- `lib.modeling.lora`      LoRA adapters, and many of them in one batch (week 21)
- `lib.modeling.fetch`     the set-up step that places the model where lib finds it (`python -m lib.modeling.fetch`)
- `lib.modeling.fast`      the same model fused for speed (QKV and gate/up matmuls, packed weights, no per-step
  setup), for serving and benchmarks
- `lib.modeling.fast_kernels`  how `fast` multiplies (plain, oneDNN-packed, the C++ step), chosen by timing once per
  machine; `pack_linears(model)`
- `lib.modeling.fast_graphs`   `fast`'s one-token decode as CUDA graphs over recycled cache buffers
"""
