"""The engine's decode steps as CUDA graphs: `lib.modeling.fast` item 8 over week 19's paged KV cache.

    graphs = PagedDecodeGraphs(FastLlama(model), engine.cache)      # LLMEngine does this itself on CUDA
    logits = graphs.decode(ids, starts, tables)                      # [B, vocab] float32, or None: run eagerly

A step of the engine in which every scheduled sequence decodes one token (no prefill chunk among them) is the
step a GPU repeats most, and at a few sequences it is bound by kernel launches as batch-1 decode is
(`lib.modeling.fast`'s docstring). So, as vLLM does, that step is captured once per shape and replayed:

- **Shapes are bucketed.** A graph replays fixed shapes, so the batch is padded up to a bucket
  (`BATCH_BUCKETS`; a padded row repeats row 0: it writes the same key and value to the same slot, and its
  logits are dropped) and the block tables to a multiple of `BLOCKS_BUCKET` blocks (padded with block 0, its
  positions masked). A batch larger than the last bucket runs eagerly.
- **What changes between steps lives in device buffers**: the token ids, the positions and the block tables are
  copied into the graph's own tensors before each replay; the K/V pools are the engine's own, written in place.
- **The step itself** is `FastLlama.window_step`'s arithmetic, per row: each row's RoPE matrix at its own
  position (`FastLlama.rope_matrix`), its new key and value written at slot `table[pos // bs], pos % bs`,
  its blocks gathered (`pool[tables]`) and attended with the positions after its own masked to -inf.

Greedy tokens are those of `lib.modeling.llama` (tests/test_fast_paged.py runs the same code uncaptured on the CPU, and on
a GPU captured, through the engine, against `lib.modeling.generate`). Graphs share one memory pool (they replay one at a
time), and `captures` / `replays` count them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
BLOCKS_BUCKET = 16  # block tables are padded to a multiple of this many blocks (256 positions at block size 16)


def paged_decode_step(fast, k_pools, v_pools, ids, pos, tables, block_size: int):
    """One token for each of B sequences: `ids`, `pos` [B] (int64, on the model's device), `tables` [B, nb] their
    block tables; keys and values written into and read from the pools `[num_blocks, Hkv, bs, d]` (one per
    layer). Returns logits [B, vocab] float32."""
    f = fast
    b, nb = tables.shape
    h, hkv, d = f.n_heads, f.n_kv_heads, f.head_dim
    g, qk_width, width = h // hkv, (h + hkv) * d, nb * block_size
    x = f.embed[ids]  # [B, D]: a new tensor, the residual stream accumulated in place
    rope = f.rope_matrix(pos)  # [B, d, d]: each row's RoPE at its own position
    block = tables.gather(1, (pos // block_size).unsqueeze(1)).squeeze(1)  # [B]: where each new key goes
    offset = pos % block_size
    later = torch.arange(width, device=pos.device).unsqueeze(0) > pos.unsqueeze(1)  # [B, W]: not written yet
    mask = torch.where(later, float("-inf"), 0.0).to(f.dtype)
    mask = mask[:, None, None, :].expand(b, hkv, g, width).reshape(b * hkv, g, width)
    for lw, k_pool, v_pool in zip(f.layers, k_pools, v_pools):
        qkv = f.linear(f.rms_norm(x, lw["attn_norm"]), lw["wqkv"])  # [B, (H + 2Hkv) d]
        qk = torch.bmm(qkv[:, :qk_width].reshape(b, h + hkv, d).to(rope.dtype), rope).to(f.dtype)
        k_pool[block, :, offset] = qk[:, h:]  # [B, Hkv, d] at (block, :, offset)
        v_pool[block, :, offset] = qkv[:, qk_width:].reshape(b, hkv, d)
        k_seq = k_pool[tables].permute(0, 2, 1, 3, 4).reshape(b * hkv, width, d)  # each row's blocks, in order
        v_seq = v_pool[tables].permute(0, 2, 1, 3, 4).reshape(b * hkv, width, d)
        q = qk[:, :h].reshape(b * hkv, g, d)
        scores = torch.baddbmm(mask, q, k_seq.transpose(1, 2), alpha=1.0 / math.sqrt(d))  # [B Hkv, g, W]
        attn = torch.softmax(scores, dim=-1, dtype=torch.float32).to(f.dtype) @ v_seq  # [B Hkv, g, d]
        x = f.add_linear(x, attn.reshape(b, h * d), lw["wo"])
        gate, up = f.linear(f.rms_norm(x, lw["mlp_norm"]), lw["w_gate_up"]).chunk(2, dim=-1)
        x = f.add_linear(x, F.silu(gate) * up, lw["w_down"])
    return f.linear(f.rms_norm(x, f.norm), f.lm_head).float()


class PagedDecodeGraphs:
    """The engine's decode-only steps, replayed (this module's docstring). `capture=False` runs the same code
    eagerly with the same padding: how the CPU tests check it."""

    def __init__(self, fast, cache, capture: bool = True):
        self.fast, self.cache, self.capture = fast, cache, capture
        self.block_size = cache.block_size
        self.max_blocks = -(-fast.config.max_seq_len // self.block_size)
        self.graphs: dict = {}  # (batch bucket, blocks bucket) -> (graph or None, ids, pos, tables, logits)
        self.pool = None  # the graphs' shared memory pool
        self.captures = self.replays = 0

    def decode(self, ids, starts, tables):
        """Logits [B, vocab] of B sequences' next tokens: `ids` their last tokens, `starts` those tokens'
        positions, `tables` their block tables (lists). None where the batch is larger than the last bucket."""
        n = len(ids)
        bucket = next((s for s in BATCH_BUCKETS if s >= n), None)
        if bucket is None or n == 0:
            return None
        blocks = max(len(t) for t in tables)
        width = min(self.max_blocks, -(-blocks // BLOCKS_BUCKET) * BLOCKS_BUCKET)
        pad = bucket - n
        rows = [list(t) + [0] * (width - len(t)) for t in tables]
        host_ids = torch.tensor(list(ids) + [ids[0]] * pad, dtype=torch.int64)
        host_pos = torch.tensor(list(starts) + [starts[0]] * pad, dtype=torch.int64)
        host_tables = torch.tensor(rows + [rows[0]] * pad, dtype=torch.int64)
        entry = self.graphs.get((bucket, width))
        if entry is None:
            entry = self._capture(host_ids, host_pos, host_tables)
            self.graphs[(bucket, width)] = entry
        graph, d_ids, d_pos, d_tables, logits = entry
        d_ids.copy_(host_ids, non_blocking=True)
        d_pos.copy_(host_pos, non_blocking=True)
        d_tables.copy_(host_tables, non_blocking=True)
        if graph is None:
            logits = self._step(d_ids, d_pos, d_tables)
        else:
            graph.replay()
            self.replays += 1
        return logits[:n].clone()  # the graph's output is overwritten by its next replay

    def _step(self, ids, pos, tables):
        return paged_decode_step(self.fast, self.cache.k, self.cache.v, ids, pos, tables, self.block_size)

    def _capture(self, host_ids, host_pos, host_tables):
        dev = self.fast.device
        d_ids, d_pos, d_tables = (t.to(dev) for t in (host_ids, host_pos, host_tables))
        if not self.capture:
            return (None, d_ids, d_pos, d_tables, None)
        side = torch.cuda.Stream(device=dev)  # warm-up off the main stream, as torch.cuda.graphs asks
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # writes these rows' keys and values: the same ones the replay writes again
            self._step(d_ids, d_pos, d_tables)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):  # other threads may use CUDA
            logits = self._step(d_ids, d_pos, d_tables)
        self.pool = graph.pool()
        self.captures += 1
        return (graph, d_ids, d_pos, d_tables, logits)
