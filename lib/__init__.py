"""Inference Lab's reference implementation, in packages by concern, one module per technique.

Layers, lowest first: `bench` → `attn`, `gguf` → `modeling` → `spec_decode` → `quantization`, `batching` → `serve`;
a package imports only from itself and the layers below it, never from one beside or above it
(tests/test_layers.py holds it). Each package's docstring lists its modules.

- `lib.bench`         where data lives, torch's threads, the roofline, timing under load, benchmark records
- `lib.attn`          the masks, GQA / naive / tiled (FlashAttention) attention, Triton kernels, HBM traffic (weeks 16-17)
- `lib.gguf`          GGUF's block formats byte for byte, and matmuls on the blocks with a C++ kernel (`csrc/`) (week 20)
- `lib.modeling`      the Llama model, its KV caches, GQA pooling, sampling, generation, perplexity, LoRA, the fetch
  step, and the same model fused for speed (`fast`, `fast_kernels`, `fast_graphs`) (week 16 onwards)
- `lib.spec_decode`   speculative decoding: verification, drafts, a draft head, the ragged batch (week 18)
- `lib.quantization`  quantizing a model: type plans and imatrix, GPTQ, AWQ, SmoothQuant, quantized linears (week 20)
- `lib.batching`      the engine: continuous batching over a paged KV cache, the prefix cache, the model runner, CUDA
  graphs over the paged cache, the in-process load test (week 19)
- `lib.serve`         the OpenAI-compatible server: API schema, serving loop, engine thread, metrics, guided decoding,
  the HTTP load test, a queueing model (week 21)
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
# host's core count (lib/bench/threads.py); a notebook kernel says what was chosen, once.
import sys as _sys

from lib.bench import threads as _threads

THREADS = _threads.apply()
if "ipykernel" in _sys.modules:
    print(_threads.describe(THREADS))
