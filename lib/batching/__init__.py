"""The serving engine: continuous batching over a paged KV cache (week 19).

- `lib.batching.paged`         the block allocator, slot mapping, paged attention and the paged KV cache
- `lib.batching.blocks`        chained block hashes, the prefix cache (`PrefixCache`), `BlockManager`
- `lib.batching.request`       the engine's record of a request (`Request`), its step outputs and its errors
- `lib.batching.model_runner`  the engine's forward: one flat batch over the paged cache, multi-LoRA rows
- `lib.batching.fast_paged`    the engine's decode-only steps as CUDA graphs over the paged KV cache
- `lib.batching.engine`        `LLMEngine`: scheduling, preemption, chunked prefill, prefix caching
- `lib.batching.engine_load`   a load test of the engine in-process: arrivals, TTFT, TBT, throughput, KV utilization
"""
