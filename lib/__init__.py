"""Inference Lab's reference implementation: one module per technique.

- `lib.model`     a Llama-family decoder (SmolLM2 from its GGUF file, or tiny random configs)
- `lib.generate`  the generation loop (greedy, temperature, top-k, top-p, or any `lib.sampling.SamplingParams`)
- `lib.sampling`  the one sampler of generate, the engine and the server: top-p/k, min-p, penalties, logit bias, min_tokens
- `lib.guided`    JSON mode: a byte-level JSON automaton lifted to a mask over the vocabulary, cached by state (week 21)
- `lib.guided_schema` guided decoding to a JSON Schema (`response_format` json_schema): the same masks, a machine that knows the schema (week 21)
- `lib.masks`    the causal mask and the sliding-window mask (week 16)
- `lib.kv_cache`  the KV cache, the sliding-window cache, `kv_cache_bytes` (week 16); `truncate` (week 18)
- `lib.gqa`       pooling KV heads into fewer groups: MHA -> GQA -> MQA (week 16)
- `lib.roofline`  FLOPs, bytes and the roofline; this machine's FLOP/s and bandwidth (week 16, benchmarks)
- `lib.attention` GQA attention and the SDPA backend; naive and tiled (FlashAttention) attention (weeks 16-17)
- `lib.io_model`  counting slow-memory traffic of standard and tiled attention (week 17)
- `lib.triton_attention` Triton kernels: a row softmax, a tiled matmul, FlashAttention-2's forward; the interpreter without a GPU (week 17)
- `lib.fast`      the same model fused for speed (QKV and gate/up matmuls, oneDNN-packed weights, no per-step setup), for serving and benchmarks, CUDA graphs for decode on a GPU; the kernels' choice and the CUDA graphs are `lib.fast_kernels` and `lib.fast_graphs`
- `lib.fast_kernels` how `lib.fast` multiplies (plain, oneDNN-packed, the C++ step) and which, chosen by timing once per machine; `pack_linears(model)` gives the readable model the packed weights alone
- `lib.fast_graphs` `lib.fast`'s one-token decode as CUDA graphs over recycled cache buffers (`GraphedDecode`)
- `lib.fast_paged` the engine's decode-only steps as CUDA graphs over the paged KV cache (`LLMEngine` uses them on a GPU)
- `lib.paged`     the block allocator, slot mapping, paged attention and the paged KV cache (week 19)
- `lib.blocks`    the engine's blocks: chained block hashes, the prefix cache (`PrefixCache`), `BlockManager` (week 19)
- `lib.engine`    a serving engine: continuous batching, preemption, chunked prefill, prefix caching (week 19)
- `lib.model_runner` the engine's forward: one flat batch over the paged cache, multi-LoRA rows, decode steps as CUDA graphs (week 19)
- `lib.request`   the engine's record of a request (`Request`), its step outputs and its errors (week 19)
- `lib.engine_load` a load test of the engine in-process: arrivals, TTFT, TBT, throughput, KV utilization (week 19)
- `lib.drafts`    the drafts of speculative decoding: prompt lookup, early exit, int8, FR-Spec `fr_spec_draft`, distilled `load_distilled_draft` (week 18)
- `lib.speculative` speculative decoding: `verify`, `speculative_generate` with KV-cache rollback, acceptance theory (week 18)
- `lib.qformats`  GGUF block formats byte for byte (Q8_0 ... Q6_K): quantize, dequantize, the K-quants' scale search (week 20)
- `lib.quant`     whole models: per-tensor type plans, imatrix, RTN, writing a GGUF, llama.cpp (week 20)
- `lib.gptq`      GPTQ: Hessian-based column-by-column error compensation; calibration inputs (week 20)
- `lib.awq`       AWQ: activation-aware channel scales and their grid search; salient channels (week 20)
- `lib.smoothquant` W8A8 with activation outliers migrated into the weights (week 20)
- `lib.quant_linear` int8 / int4 weight-only linears on torch's CPU kernels; `GGUFLinear` / `gguf_linears` / `GGUFFastLlama`: the model on the GGUF file's own blocks (week 20)
- `lib.qmatmul`  matmuls straight from GGUF blocks (Q4_1, Q8_0, Q4_K, ...): a C++ kernel built on first use, a PyTorch fallback, the readable block dot product (week 20)
- `lib.serving`   the serving loop's core without the network: `ServingLoop` (admit, cancel, one step, route), `TextStream` (streaming detokenizer with stop strings) (week 21)
- `lib.server`    an OpenAI-compatible HTTP server on the engine (Starlette + uvicorn; `python -m lib.server`, `make serve`) (week 21)
- `lib.engine_thread` the server's engine thread: `EngineLoop` runs a `ServingLoop` over the engine, `Submission` (week 21)
- `lib.openai_api` the request side of OpenAI's API, checked: allowed fields, prompts, answer options, sampling fields (week 21)
- `lib.server_metrics` /metrics: the lab's names and vLLM's, histograms (week 21)
- `lib.loadtest`  a load test through the official `openai` client: Poisson arrivals, TTFT/TPOT p50/p95, KV use (week 21, `benchmarks/load.py`)
- `lib.text`      the committed Gutenberg text and perplexity
- `lib.fetch`     the set-up step that places the model where `lib` finds it (`python -m lib.fetch`)
- `lib.threads`   torch's threads sized to this process's share of the CPU (cgroup quota, affinity, load), applied on import
- `lib.paths`     where data lives, the model file's size and sha256, and `check_smollm2` that holds the file to them
"""
import os as _os

# Week 17's Triton kernels: without a CUDA device they run in Triton's interpreter, and Triton reads
# TRITON_INTERPRET when it is first imported (its own library's kernels are decorated then) — and torch imports
# it as a side effect (torch.utils.flop_counter, for one). So it is set here, when lib is first imported, unless
# it is set already. On a CPU, Triton has no compiled backend; torch.compile's CPU code does not use Triton.
if "TRITON_INTERPRET" not in _os.environ:
    import torch as _torch

    if not _torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"

# torch's threads follow this process's share of the CPU (its cgroup's quota, its affinity mask, the load), not the
# host's core count (lib/threads.py); a notebook kernel says what was chosen, once.
import sys as _sys

from lib import threads as _threads

THREADS = _threads.apply()
if "ipykernel" in _sys.modules:
    print(_threads.describe(THREADS))
