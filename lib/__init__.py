"""Inference Lab's reference implementation: one module per technique.

- `lib.model`     a Llama-family decoder (SmolLM2 from its GGUF file, or tiny random configs)
- `lib.generate`  the generation loop and sampling (greedy, temperature, top-k, top-p)
- `lib.masks`    the causal mask and the sliding-window mask (week 16)
- `lib.kv_cache`  the KV cache, the sliding-window cache, `kv_cache_bytes` (week 16); `truncate` (week 18)
- `lib.gqa`       pooling KV heads into fewer groups: MHA -> GQA -> MQA (week 16)
- `lib.roofline`  FLOPs, bytes and the roofline; this machine's FLOP/s and bandwidth (week 16, benchmarks)
- `lib.attention` GQA attention and the SDPA backend; naive and tiled (FlashAttention) attention (weeks 16-17)
- `lib.io_model`  counting slow-memory traffic of standard and tiled attention (week 17)
- `lib.fast`      the same model fused for speed (QKV and gate/up matmuls, oneDNN-packed weights, no per-step setup), for serving and benchmarks; `pack_linears(model)` gives the readable model the packed weights alone
- `lib.paged`     the block allocator, slot mapping, paged attention and the paged KV cache (week 19)
- `lib.blocks`    the engine's blocks: chained block hashes, the prefix cache (`PrefixCache`), `BlockManager` (week 19)
- `lib.engine`    a serving engine: continuous batching, preemption, chunked prefill, prefix caching (week 19)
- `lib.engine_load` a load test of the engine in-process: arrivals, TTFT, TBT, throughput, KV utilization (week 19)
- `lib.speculative` speculative decoding: `verify`, `speculative_generate` with KV-cache rollback, drafts (incl. FR-Spec `fr_spec_draft`, distilled `load_distilled_draft`), acceptance theory (week 18)
- `lib.qformats`  GGUF block formats byte for byte (Q8_0 ... Q6_K): quantize, dequantize, the K-quants' scale search (week 20)
- `lib.quant`     whole models: per-tensor type plans, imatrix, RTN, writing a GGUF, llama.cpp; re-exports `lib.qformats` (week 20)
- `lib.gptq`      GPTQ: Hessian-based column-by-column error compensation; calibration inputs (week 20)
- `lib.awq`       AWQ: activation-aware channel scales and their grid search; salient channels (week 20)
- `lib.smoothquant` W8A8 with activation outliers migrated into the weights (week 20)
- `lib.quant_linear` int8 / int4 weight-only linears on torch's CPU kernels; `GGUFLinear` / `gguf_linears` / `GGUFFastLlama`: the model on the GGUF file's own blocks (week 20)
- `lib.qmatmul`  matmuls straight from GGUF blocks (Q4_1, Q8_0, Q4_K, ...): a C++ kernel built on first use, a PyTorch fallback, the readable block dot product (week 20)
- `lib.serving`   the serving loop's core without the network: `ServingLoop` (admit, cancel, one step, route), `TextStream` (streaming detokenizer with stop strings) (week 21)
- `lib.server`    an OpenAI-compatible HTTP server on the engine (Starlette + uvicorn; `python -m lib.server`, `make serve`) (week 21)
- `lib.loadtest`  a load test through the official `openai` client: Poisson arrivals, TTFT/TPOT p50/p95, KV use (week 21, `benchmarks/load.py`)
- `lib.text`      the committed Gutenberg text and perplexity
- `lib.fetch`     the set-up step that places the model where `lib` finds it (`python -m lib.fetch`)
- `lib.paths`     where data lives, the model file's size and sha256, and `check_smollm2` that holds the file to them
"""
