"""The same model, faster: what a serving engine does to a decoder before it serves it (issue: the lab's engine).

    from lib.modeling.fast import FastLlama
    fast = FastLlama(model)                        # shares no code path with lib.modeling.llama, only the weights
    fast.kernel_reason                             # which kernel it chose for this CPU, and why (item 9)
    ids = generate(fast, input_ids, 64)            # same tokens as generate(model, ...), faster
    fast_bf16 = FastLlama(model, dtype=torch.bfloat16)   # prefill on the CPU's matrix units (AMX), approximate

`lib.modeling.llama.LlamaModel` is written to be read; this module is written to be fast, using only choices a reader
can follow — each one is a line below, and `benchmarks/decode.py --profile` shows what each step costs:

1. **Fewer, larger matmuls.** Q, K and V are one matmul (their weights concatenated at load), and so are the
   MLP's gate and up projections: 4 weight reads per layer instead of 7, with the same bytes read.
2. **No per-step setup.** RoPE's cos/sin are computed once for all positions and sliced; a one-token decode
   step needs no causal mask at all (a single query may see every cached key).
3. **GQA without copies**: each KV group's query heads are folded into the query axis, so K and V are read
   once per KV head (as `lib.attn.attention.gqa_attention` does); prefill uses PyTorch's fused SDPA.
4. **`torch.inference_mode`** (no autograd bookkeeping) and the preallocated `lib.modeling.kv_cache.KVCache`, written
   in place.
5. Optional **bf16 weights and activations** (`dtype=torch.bfloat16`): on a CPU with AMX, prefill matmuls run
   on the matrix units; logits are then only approximately equal (the benchmark reports the error).
6. Optional **`torch.compile`** of the per-layer step (`compile=True`); its compile time is reported by the
   benchmark, and it is off by default because on 2 cores it costs a student more than it saves.
7. **Weights in the matmul library's own layout** (`kernel="packed"`, or `packed=True`; item 9 chooses). `F.linear` on a
   plain `[out, in]` weight with 2–8 rows of input costs about as much as that many one-row calls here (MKL
   runs a matrix-vector product per row: measured 25 ms for 2 rows against 11.5 ms for 1 on SmolLM2's
   output layer), so the weights would be read from memory once per row. Reordering each weight once at load
   into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the same step `torch.compile`'s
   CPU weight freezing takes) reads them once for every small batch: 1 row ≈ 2 rows ≈ 4 rows. That is what
   makes verifying draft tokens (week 18) and decoding a batch (week 19) cost nearly one step, as the
   roofline says it should. `benchmarks/decode.py --matmul` measures both layouts side by side.
   On an AMD EPYC (AVX-512) the packed kernels decoded SmolLM2 at 2.1x plain `F.linear`; on an Intel Xeon with
   AMX, plain was 1.23x faster — which is why the kernel is chosen by measuring (item 9).
8. **CUDA graphs for decode** (on a GPU; `graphs=None` turns them on where the model is on CUDA). A 135M model's
   decode step is ~300 small kernels; launched one by one from Python, a GPU spends its time waiting for the CPU
   (the issue measured 83 tok/s for this module on an H100, 2 % of its bandwidth roofline). A CUDA graph records
   the step's kernels once and replays them with one launch. A graph replays fixed addresses and shapes, so the
   replayed step is written for that: the new token and its position are read from small device buffers, the
   new K and V are written at that position with `index_copy_` (no Python-side slicing by length), and the
   query attends over a fixed window of the cache (the length rounded up to `GRAPH_BUCKET` positions) with the
   positions after it masked to -inf (softmax gives them exactly 0). One graph per (cache, window): the cache's
   buffers are recycled between caches of the same shape (`new_cache`), so `generate` captures once, not every
   call. Prefill and multi-token verify steps run eagerly, as before. Greedy tokens are identical to
   `lib.modeling.llama`'s (tests/test_fast.py runs the replayed step's code on the CPU, uncaptured, against it).
   Measured on an NVIDIA H200 (batch 1, 64 new tokens, the machine busy with tests): 311 tok/s replayed, 45 for
   the same code launched from Python, 34 for transformers' `generate`; a first capture costs ~0.5 s. That was 6 %
   of the bandwidth roofline with ~40 small kernels per layer, so the replayed step (`window_step`) is now written
   in 14: RMSNorm fused, RoPE for Q and K as one [d, d] matmul, the scores' scale and mask inside their matmul,
   each residual add inside the matmul before it (not yet timed on a GPU). `lib.batching.fast_paged` replays the engine's
   decode steps the same way over the paged cache.

9. **A one-token step in one C++ call, and the kernel chosen by measuring** (`kernel="cpp"`). Items 1–7 still
   leave a decode step as ~400 small tensor operations with Python between them; at SmolLM2's size on 2 cores
   they cost as much as the matmuls. `lib/gguf/csrc/qmatmul.cpp` (week 20's GGUF kernel) has a whole decode step —
   norms, RoPE, the cache write, attention, SiLU, residuals — in one call, and plain float32 weights are one more
   "type" for its loops (`F32`: nothing to decode, so a matmul is a stream of loads and multiply-adds, each weight
   row read once for up to 8 rows of x). So with kernel "cpp" a step on `lib.modeling.kv_cache`'s cache of up to
   `step_max_rows` rows (batch x new tokens: a one-token decode step, or a verify step of K + 1 tokens, the causal
   mask applied inside the new ones) is one call (`_cpp_step`), the final norm and LM head one more; a larger
   step (a prefill) runs the Python step with torch's matmul. That flattens week 18's verify curve: on the lab's
   EPYC a 2-token step costs 1.18 one-token steps, a 4-token one 1.25 (the Python step: 1.62 and 1.72). Same
   arithmetic in float32, sums in another order: greedy tokens identical to `lib.modeling.llama`'s (tests/test_fast.py).
   Which of "cpp", "packed" and "plain" is fastest depends on the CPU, so with `kernel=None` (the default)
   `FastLlama` times a whole step of the model in each — one token, then 4 (a verify) after a 32-token cache —
   once per machine (`lib.modeling.fast_kernels.choose_kernel`), keeps the fastest, and remembers it in `data/cache/fast_kernels.json`
   (keyed by CPU model, torch version, thread count, the kernels that run here and the model's shapes);
   `INFERENCE_LAB_FAST_KERNEL=cpp|packed|plain|measure` overrides (measure: time again). Unmeasured — models under
   64 MB of weights (the tests' tiny ones: they sit in the CPU's cache, where timing says nothing about decode),
   or a machine whose other work keeps the cores busy (timed under load, a kernel's threads wait on the others:
   a loaded run once measured packed 9x slower than plain on a machine where it is 2x faster) — the first of
   "cpp", "packed", "plain" that runs here is used. `benchmarks/decode.py` prints the choice and why, and times
   the kernels not chosen beside it.
10. **Weights on 2 MB pages** (`lib.bench.roofline.on_huge_pages`, for the "cpp" and "plain" kernels on a CPU). Decode
   streams 538 MB per token; on 4 KB pages that is a TLB miss every 4 KB, and on a virtual machine each miss walks
   two page tables. The weights are copied once into one buffer the kernel is asked to back with 2 MB pages
   (`madvise`), where Linux allows it; the bandwidth probe that sets the roofline reads from such pages too.

`lib.modeling.fast_kernels.pack_linears(model)` gives the readable `lib.modeling.llama` item 7 alone, in place: its `nn.Linear`s multiply with packed
weights, and the model's code (and a student's attention or cache plugged into it) is unchanged.

The call contract is the model's: `fast(input_ids [B, T], cache=None) -> logits [B, T, vocab]` float32, with
`config`, `device` and `new_cache()`, so `lib.modeling.generate.generate` and every week's code accept it unchanged.

Here: `FastLlama` (items 1-6, 10 and the steps items 8 and 9 run) and `step_timer`, which times its steps. The
kernels and how one is chosen (items 7 and 9) are `lib.modeling.fast_kernels`'s; the CUDA graphs (item 8), `lib.modeling.fast_graphs`'s.
"""
from __future__ import annotations

import ctypes
import math
import weakref

import torch
import torch.nn.functional as F

from lib.gguf import qmatmul as Q
from lib.modeling.fast_graphs import GraphedDecode
from lib.modeling.fast_kernels import KERNELS, choose_kernel, cpp_linear, kernels_for, pack_weight, packed_linear
from lib.modeling.kv_cache import KVCache, LayerKVCache
from lib.attn.masks import causal_mask
from lib.bench.roofline import best_time, on_huge_pages
from lib.modeling.llama import apply_rope

_MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")  # a layer's weights a matmul reads


def step_timer(model, dtype, repeats: int = 5, make=None):
    """timer(kernel, rows): seconds of one whole FastLlama step in that kernel over `rows` new tokens after a
    32-token cache, best of `repeats` (a decode step at 1 row; a verify step at 4). `make(name)` builds the
    engine to time (default: `FastLlama(model, kernel=name)`)."""
    built = {}
    ids = torch.randint(0, model.config.vocab_size, (1, 36), generator=torch.Generator().manual_seed(0))
    make = make or (lambda name: FastLlama(model, dtype=dtype, kernel=name, graphs=False))

    def timer(name, rows):
        if name not in built:
            built.clear()  # one copy of the weights at a time
            built[name] = make(name)
        fast = built[name]
        cache = fast.new_cache(1, 36)
        with torch.inference_mode():
            fast(ids[:, :32], cache)

            def step():
                cache.truncate(32)
                fast(ids[:, 32:32 + rows], cache)

            return best_time(step, repeats)

    return timer



class FastLlama:
    """A fused, inference-only view of a `lib.modeling.llama.LlamaModel` (the weights are copied once, concatenated)."""

    # rows (batch x new tokens) up to which a multi-token step on a KVCache is one C++ call, where the kernel is
    # "cpp": up to the C++ loops' crossing with oneDNN (lib.gguf.qmatmul.F32_MAX_ROWS); above, the Python step with
    # oneDNN. One-token steps take the C++ call at any batch.
    step_max_rows = Q.F32_MAX_ROWS

    def __init__(self, model, dtype: torch.dtype | None = None, compile: bool = False, packed: bool | None = None,
                 graphs: bool | None = None, kernel: str | None = None):
        cfg = model.config
        self.config = cfg
        self.dtype = dtype if dtype is not None else model.embed.weight.dtype
        dev = model.embed.weight.device
        if packed is not None:  # the older switch: packed=True is kernel="packed", packed=False kernel="plain"
            if kernel is not None and kernel != ("packed" if packed else "plain"):
                raise ValueError(f"packed={packed} and kernel={kernel!r} disagree; pass one of them")
            kernel = "packed" if packed else "plain"
        if kernel is not None and kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)} (or None: chosen by measuring); "
                             f"got {kernel!r}")
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        cast = lambda w: w.detach().to(device=dev, dtype=self.dtype).contiguous()  # noqa: E731
        self.embed = cast(model.embed.weight)  # [vocab, d_model], looked up by row: stays plain
        self.lm_head = cast(model.embed.weight if model.lm_head is None else model.lm_head.weight)
        self.layers = []
        for blk in model.layers:
            a, m = blk.attn, blk.mlp
            self.layers.append(dict(
                attn_norm=cast(blk.attn_norm.weight), mlp_norm=cast(blk.mlp_norm.weight),
                wqkv=cast(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),  # [(H+2Hkv)d, D]
                wo=cast(a.o_proj.weight),
                w_gate_up=cast(torch.cat([m.gate_proj.weight, m.up_proj.weight])),  # [2 d_ff, D]
                w_down=cast(m.down_proj.weight),
            ))
        weights = [lw[k] for lw in self.layers for k in _MATRICES] + [self.lm_head]
        avail = [] if compile else kernels_for(weights)
        if kernel is None:  # which kernel decodes fastest on this CPU, with the model's own weights (item 9)
            if compile:  # inductor cannot lower the packed op (torch 2.13): compiled code packs on its own
                kernel, self.kernel_reason = "plain", "plain: torch.compile packs on its own"
            elif avail == ["plain"]:
                kernel, self.kernel_reason = "plain", f"plain: {self.dtype} on {dev}"
            else:
                kernel, self.kernel_reason = choose_kernel(weights, timer=step_timer(model, self.dtype))
        elif kernel != "plain" and kernel not in avail:
            if compile:
                raise ValueError(f"kernel={kernel!r} cannot be combined with compile=True (torch.compile cannot "
                                 f"lower it); leave the kernel unset")
            if kernel == "packed":
                raise ValueError(f"packed=True needs float32 weights on a CPU with oneDNN; got {self.dtype} on {dev} "
                                 f"(pass packed=False or leave it unset to choose automatically)")
            raise ValueError(f"kernel='cpp' needs float32 weights on the CPU, every matmul's input width a multiple "
                             f"of {Q.F32_BLOCK}, and lib/gguf/csrc/qmatmul.cpp built; here {', '.join(avail) or 'plain'}"
                             f" can run (leave the kernel unset to choose automatically)")
        else:
            self.kernel_reason = f"{kernel}: asked for"
        self.kernel = kernel
        self.packed = kernel == "packed"
        if kernel != "packed" and dev.type == "cpu":  # item 10: the weights decode streams, on 2 MB pages
            where = [(lw, k) for lw in self.layers for k in _MATRICES]
            moved = on_huge_pages([lw[k] for lw, k in where] + [self.lm_head])
            for (lw, k), w in zip(where, moved):
                lw[k] = w
            self.lm_head = moved[-1]
        if self.packed:  # the weights a matmul reads, in oneDNN's layout
            self.lm_head = pack_weight(self.lm_head)
            for lw in self.layers:
                lw.update({k: pack_weight(lw[k]) for k in _MATRICES})
        self.norm = cast(model.norm.weight)
        self.eps = cfg.norm_eps
        # RoPE for every position, once: [max_seq_len, head_dim] (4 MB for SmolLM2).
        pos = torch.arange(cfg.max_seq_len, device=dev, dtype=torch.float32)
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, self.head_dim, 2, device=dev,
                                                         dtype=torch.float32) / self.head_dim)
        emb = torch.cat([pos[:, None] * inv_freq] * 2, dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.linear = {"cpp": cpp_linear, "packed": packed_linear, "plain": F.linear}[kernel]
        self._layer = torch.compile(self._layer_step, dynamic=True) if compile else self._layer_step
        self._positions = torch.arange(cfg.max_seq_len, device=dev)  # the replayed step's mask reads it (item 8)
        half = self.head_dim // 2
        self._rope_eye = torch.eye(self.head_dim, device=dev)  # rotate_half as a matrix: x @ turn = cat(-x2, x1)
        self._rope_turn = torch.zeros(self.head_dim, self.head_dim, device=dev)
        self._rope_turn[torch.arange(half, 2 * half, device=dev), torch.arange(half, device=dev)] = -1.0
        self._rope_turn[torch.arange(half, device=dev), torch.arange(half, 2 * half, device=dev)] = 1.0
        on_cuda = dev.type == "cuda"
        if graphs and not on_cuda:
            raise ValueError(f"graphs=True needs the model on a CUDA device; it is on {dev} (leave graphs unset: "
                             f"CUDA graphs are used wherever the model is on CUDA)")
        if graphs and compile:
            raise ValueError("graphs=True cannot be combined with compile=True; use one or the other")
        use = on_cuda and not compile if graphs is None else bool(graphs)
        self.graphs = GraphedDecode(self, capture=True) if use else None
        self._step = self._decode_step_args() if kernel == "cpp" else None  # item 9's one-call decode step
        self._kv_ptrs = (None, None)  # (weak reference to the cache, its buffers' pointer arrays)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        if self.graphs is not None:  # buffers the decode graphs were captured on, recycled (item 8)
            return self.graphs.new_cache(batch, max_len)
        return KVCache.for_model(self.config, batch, max_len, dtype=self.dtype, device=self.device)

    def _rms(self, x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def _attend(self, q, k, v, start: int):
        """q [B, H, T, d]; k, v [B, Hkv, S, d] (S = start + T). Bottom-right causal, GQA folded."""
        b, h, t, d = q.shape
        hkv, s = k.shape[1], k.shape[2]
        g = h // hkv
        if t == 1:  # one query sees every key: no mask; fold the group into the query axis (no K/V copy)
            qg = q.reshape(b, hkv, g, d)
            scores = (qg @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))  # [B, Hkv, g, S]
            out = torch.softmax(scores, dim=-1).to(v.dtype) @ v  # [B, Hkv, g, d]
            return out.reshape(b, h, 1, d)
        if start == 0:  # prefill: top-left causal == bottom-right causal
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t, s, device=q.device),
                                              enable_gqa=True)

    def _layer_step(self, x, lw, cos, sin, layer_cache, start: int):
        b, t, _ = x.shape
        h, hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.linear(self._rms(x, lw["attn_norm"]), lw["wqkv"])  # [B, T, (H + 2Hkv) d]
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        q = apply_rope(q.view(b, t, h, d).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(b, t, hkv, d).transpose(1, 2), cos, sin)
        v = v.view(b, t, hkv, d).transpose(1, 2)
        if layer_cache is not None:
            k, v = layer_cache.append(k, v)
        attn = self._attend(q, k, v, start)
        x = x + self.linear(attn.transpose(1, 2).reshape(b, t, h * d), lw["wo"])
        gate, up = self.linear(self._rms(x, lw["mlp_norm"]), lw["w_gate_up"]).chunk(2, dim=-1)
        return x + self.linear(F.silu(gate) * up, lw["w_down"])

    def __call__(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return self.forward_hidden(input_ids, cache)[0]

    def forward_hidden(self, input_ids: torch.Tensor, cache: KVCache | None = None):
        """`(logits [B, T, vocab] float32, hidden [B, T, d_model])`: the logits and the final-normed hidden state
        the LM head reads (what an EAGLE-style draft head, `lib.spec_decode.draft_head`, is fed)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        start = cache.length if cache is not None else 0
        if start + t > self.config.max_seq_len:
            raise ValueError(f"sequence of {start + t} positions is longer than the model's "
                             f"max_seq_len={self.config.max_seq_len}")
        with torch.inference_mode():
            if t == 1 and self.graphs is not None and self.graphs.owns(cache):
                return self.graphs.step(input_ids, cache)
            if self._step is not None and (t == 1 or b * t <= self.step_max_rows) and type(cache) is KVCache:
                out = self._cpp_step(input_ids, cache)
                if out is not None:
                    return out
            cos, sin = self.cos[start:start + t], self.sin[start:start + t]
            x = self.embed[input_ids.to(self.device)]  # [B, T, D]
            for i, lw in enumerate(self.layers):
                x = self._layer(x, lw, cos, sin, cache[i] if cache is not None else None, start)
            h = self._rms(x, self.norm)  # [B, T, D]
            return self.linear(h, self.lm_head).float(), h  # [B, T, vocab], [B, T, D]


    # --- item 9: a one-token step in one C++ call ----------------------------------------------------------

    def _step_parts(self, lw: dict, key: str) -> list[tuple[str, torch.Tensor]]:
        """How the C++ decode step reads one of a layer's weights: [(type, tensor)], parts stacked along the
        output. Here the float32 weight itself; lib.quantization.quant_linear.GGUFFastLlama gives its GGUF blocks."""
        return [("F32", lw[key])]

    def _decode_step_args(self):
        """The C++ decode step's arguments (lib/gguf/csrc/qmatmul.cpp `decode_steps`), or None where it cannot run
        (no kernel, not float32 on the CPU, or a weight of more than 3 parts)."""
        lib = Q.kernel() if self.device.type == "cpu" and self.dtype == torch.float32 else None
        parts = [{k: self._step_parts(lw, k) for k in _MATRICES} for lw in self.layers]
        if lib is None or any(len(p) > 3 for layer in parts for p in layer.values()):
            return None
        cfg = self.config
        layers = (Q.DecodeLayer * len(self.layers))()
        for dst, lw, layer in zip(layers, self.layers, parts):
            dst.attn_norm, dst.mlp_norm = lw["attn_norm"].data_ptr(), lw["mlp_norm"].data_ptr()
            for k, p in layer.items():
                setattr(dst, k, Q.qweight(p))
        d_ff = sum(b.shape[0] for _, b in parts[0]["w_gate_up"]) // 2
        dims = Q.DecodeDims(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, d_ff, 0, cfg.norm_eps)
        return lib, layers, dims

    def _cpp_step(self, input_ids: torch.Tensor, cache: KVCache):
        """T new tokens per row (a decode step, T = 1; a verify step of week 18, T = K + 1) on lib.modeling.kv_cache's
        preallocated cache, every layer in one C++ call (the same computation as `_layer_step`, causal mask
        included, without Python between the operations), then the final norm and the LM head:
        (logits [B, T, vocab], hidden [B, T, D]). None where the cache is not one the call can write (another
        layout or dtype, a length it cannot take): the caller's Python step then runs, and raises the clear
        error where there is one."""
        b, t = input_ids.shape
        pos = cache.length
        if b != cache[0].k.shape[0] or pos + t > min(cache.max_len, self.config.max_seq_len) or any(
                layer.length != pos for layer in cache.layers):
            return None
        kv = self._cache_pointers(cache)
        if kv is None:
            return None
        lib, layers, _ = self._step
        x = self.embed[input_ids.reshape(-1).to(self.device)]  # [B·T, D], a new tensor: written in place
        rc = lib.decode_steps(ctypes.addressof(layers), len(self.layers), kv[2], x.data_ptr(), b, t, pos,
                              self.cos[pos].data_ptr(), self.sin[pos].data_ptr(), kv[0], kv[1],
                              torch.get_num_threads())  # cos, sin: rows pos .. pos + T - 1, contiguous
        if rc != 0:
            raise RuntimeError("lib.gguf.qmatmul decode_steps failed (unsupported type or shape)")
        for layer in cache.layers:
            layer.length = pos + t
        h = self._rms(x, self.norm).view(b, t, -1)  # [B, T, D]
        return self.linear(h, self.lm_head).float(), h

    def _cache_pointers(self, cache):
        """Pointers to every layer's K and V buffers and to the step's dimensions for this cache (kept while the
        same cache is used), or None when a layer is not a float32, contiguous `LayerKVCache` on the CPU."""
        ref, ptrs = self._kv_ptrs
        if ref is not None and ref() is cache and ptrs[3] is cache[0].k and ptrs[4] is cache[-1].v:
            return ptrs
        n = len(self.layers)
        want = (cache[0].k.shape[0], self.n_kv_heads, cache.max_len, self.head_dim)
        if len(cache) != n or any(type(lay) is not LayerKVCache or any(
                t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or t.shape != want
                for t in (lay.k, lay.v)) for lay in cache.layers):
            return None
        ks = (ctypes.c_void_p * n)(*[lay.k.data_ptr() for lay in cache.layers])
        vs = (ctypes.c_void_p * n)(*[lay.v.data_ptr() for lay in cache.layers])
        dims = Q.DecodeDims.from_buffer_copy(self._step[2])  # this cache's length of buffer
        dims.max_len = cache.max_len
        ptrs = (ctypes.addressof(ks), ctypes.addressof(vs), ctypes.addressof(dims), cache[0].k, cache[-1].v, ks, vs,
                dims)
        self._kv_ptrs = (weakref.ref(cache), ptrs)
        return ptrs

    def window_step(self, tok: torch.Tensor, pos: torch.Tensor, ks, vs, width: int):
        """One decode step as a CUDA graph replays it (item 8): `tok` [B, 1] ids and `pos` [1] (the position they
        take), both on the device; `ks`, `vs` each layer's K and V buffers [B, Hkv, max_len, d], written at `pos`;
        attention over the first `width` positions. Returns (logits [B, 1, vocab] float32, hidden [B, 1, D]).

        A replayed step costs what its kernels cost to run, so this one is written in few of them, each a line:
        RMSNorm fused (`F.rms_norm`); RoPE for Q and K together as one small matmul (RoPE at one position is a
        linear map of each head, `rope_matrix`); the scores' scale and the mask of the positions not written yet
        inside the scores' matmul (`baddbmm` over an additive 0/-inf row); each residual add inside the matmul
        before it (`addmm_`, accumulating into the residual stream). 14 kernels a layer where `_layer_step` runs
        ~40."""
        b = tok.shape[0]
        h, hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        g, qk_width = h // hkv, (h + hkv) * d
        x = self.embed[tok.reshape(-1)]  # [B, D], a new tensor: the residual stream, accumulated in place
        rope = self.rope_matrix(pos)[0]  # [d, d]: rope(head) = head @ rope, for Q and K alike
        hidden_pos = torch.where(self._positions[:width] > pos, float("-inf"), 0.0).to(self.dtype)
        mask = hidden_pos.expand(b * hkv, g, width)  # exp(-inf) = 0: the positions not written yet add nothing
        for lw, k_buf, v_buf in zip(self.layers, ks, vs):
            qkv = self.linear(self.rms_norm(x, lw["attn_norm"]), lw["wqkv"])  # [B, (H + 2Hkv) d]
            qk = (qkv[:, :qk_width].reshape(b, h + hkv, d).to(rope.dtype) @ rope).to(self.dtype)  # rotated
            k_buf.index_copy_(2, pos, qk[:, h:].unsqueeze(2))
            v_buf.index_copy_(2, pos, qkv[:, qk_width:].reshape(b, hkv, 1, d))
            k_win = k_buf[:, :, :width].reshape(b * hkv, width, d)  # views: the buffers are [B, Hkv, max_len, d]
            v_win = v_buf[:, :, :width].reshape(b * hkv, width, d)
            q = qk[:, :h].reshape(b * hkv, g, d)  # each KV head's g query heads as rows (GQA without copies)
            scores = torch.baddbmm(mask, q, k_win.transpose(1, 2), alpha=1.0 / math.sqrt(d))  # [B Hkv, g, W]
            attn = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype) @ v_win  # [B Hkv, g, d]
            x = self.add_linear(x, attn.reshape(b, h * d), lw["wo"])
            gate, up = self.linear(self.rms_norm(x, lw["mlp_norm"]), lw["w_gate_up"]).chunk(2, dim=-1)
            x = self.add_linear(x, F.silu(gate) * up, lw["w_down"])
        h_out = self.rms_norm(x, self.norm)
        return self.linear(h_out, self.lm_head).float().unsqueeze(1), h_out.unsqueeze(1)

    def rms_norm(self, x, w):
        """RMSNorm in one kernel where torch has a fused one (CUDA); the same arithmetic as `_rms`."""
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def add_linear(self, x, a, w):
        """x + a @ w.T, accumulated into x (one matmul whose output starts at x: cuBLAS's beta = 1)."""
        if self.linear is not F.linear:  # oneDNN-packed weights (opaque to addmm), or a subclass's own product
            return x.add_(self.linear(a, w))
        return x.addmm_(a, w.t())

    def rope_matrix(self, pos: torch.Tensor) -> torch.Tensor:
        """RoPE at each position of `pos` [P] as a [d, d] matrix M with rope(x) = x @ M: x*cos + rotate_half(x)*sin,
        where rotate_half(x) = x @ T for a fixed signed permutation T (-x2, x1), so M = I*cos + T*sin (a row of cos
        and sin broadcast down the columns). Each output element is one product plus one (the other terms are exact
        zeros), so it matches `apply_rope` to rounding."""
        cos, sin = self.cos.index_select(0, pos)[:, None], self.sin.index_select(0, pos)[:, None]  # [P, 1, d]
        return self._rope_eye * cos + self._rope_turn * sin  # [P, d, d]: one matrix per position in `pos`

