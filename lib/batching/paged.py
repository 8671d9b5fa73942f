"""PagedAttention: the KV cache in fixed-size blocks, as an operating system pages memory (week 19).

A preallocated cache reserves `max_len` slots per request, whatever the request uses. A paged cache
keeps one pool of `num_blocks` blocks of `block_size` slots per layer and gives each sequence blocks
only as it fills them; the sequence's *block table* lists its blocks in order, so logical position p
lives in physical slot

    slot(p) = block_table[p // block_size] * block_size + p % block_size

and only a sequence's last block can hold empty slots. Blocks are reference-counted
(`BlockAllocator.fork`), so two sequences can share one (copy-on-write, prefix caching).

    alloc = BlockAllocator(num_blocks)        # allocate / free / fork / num_free
    slot_mapping(table, start, n, block_size) # where n new tokens' K and V go
    paged_attention(q, k_pool, v_pool, block_tables, context_lens)   # one decode query per sequence
    cache = PagedKVCache(config, num_blocks, block_size)             # what lib.modeling.llama runs on
    cache.prepare(tables, starts, num_tokens); logits = model(ids[None], cache=cache)

The serving engine that uses all of this is `lib.batching.engine`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

# --- counting blocks ---------------------------------------------------------------------------------


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` slots: ceil(num_tokens / block_size)."""
    if block_size < 1 or num_tokens < 0:
        raise ValueError(f"need block_size >= 1 and num_tokens >= 0; got block_size={block_size}, "
                         f"num_tokens={num_tokens}")
    return -(-num_tokens // block_size)


def slots_wasted(lengths: Sequence[int], block_size: int) -> int:
    """Empty slots in the last blocks of sequences of these lengths (the only waste a paged cache has)."""
    return sum(blocks_needed(n, block_size) * block_size - n for n in lengths)


def preallocated_waste(lengths: Sequence[int], max_len: int) -> int:
    """Slots reserved but never used when every sequence gets `max_len` slots up front."""
    if any(n > max_len for n in lengths):
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a {max_len}-slot preallocation")
    return sum(max_len - n for n in lengths)


# --- the block allocator -----------------------------------------------------------------------------

class OutOfBlocksError(RuntimeError):
    """`BlockAllocator.allocate()` found no free block."""


class BlockAllocator:
    """A pool of `num_blocks` physical blocks with reference counts.

    `allocate()` hands out a free block with one owner; `fork(block)` adds an owner (a second sequence
    sharing it); `free(block)` removes one owner and returns the block to the pool when none is left;
    `ref_count(block)` is its number of owners (0: free).
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: allocate() pops block 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block: int) -> int:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"cannot read block {block!r}: blocks are ints in 0..{self.num_blocks - 1}")
        return self.ref_counts[block]

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocksError(f"out of KV blocks: all {self.num_blocks} blocks are in use "
                                   f"({self.num_used} in use, 0 free). Free a sequence, preempt one, or "
                                   f"give the pool more blocks.")
        block = self._free.pop()
        self.ref_counts[block] = 1
        return block

    def _check(self, block: int, what: str) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"cannot {what} block {block!r}: blocks are ints in 0..{self.num_blocks - 1}")
        if self.ref_counts[block] == 0:
            raise ValueError(f"cannot {what} block {block}: it is not allocated (double free, or a block "
                             f"that was never allocated)")

    def fork(self, block: int) -> int:
        """One more owner of an allocated block; returns the block."""
        self._check(block, "fork")
        self.ref_counts[block] += 1
        return block

    def free(self, block: int) -> None:
        """One owner fewer; the block returns to the pool when its last owner frees it."""
        self._check(block, "free")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free.append(block)


# --- block tables and slot mapping ------------------------------------------------------------------

def slot_mapping(block_table: Sequence[int], start: int, num_tokens: int, block_size: int,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Physical slots (int64 `[num_tokens]`) of logical positions `start .. start + num_tokens - 1`."""
    end = start + num_tokens
    if start < 0 or num_tokens < 0:
        raise ValueError(f"need start >= 0 and num_tokens >= 0; got {start}, {num_tokens}")
    if blocks_needed(end, block_size) > len(block_table):
        raise ValueError(f"positions up to {end - 1} need {blocks_needed(end, block_size)} blocks of "
                         f"{block_size}; the block table has {len(block_table)}")
    pos = torch.arange(start, end, device=device)  # [num_tokens]
    table = torch.as_tensor(list(block_table), dtype=torch.int64, device=device)
    return table[pos // block_size] * block_size + pos % block_size


def block_table_tensor(tables: Sequence[Sequence[int]], device: torch.device | str | None = None) -> torch.Tensor:
    """Block tables of several sequences as int64 `[B, max_blocks]`, padded with 0 (ignored past each end)."""
    width = max((len(t) for t in tables), default=0)
    out = torch.zeros(len(tables), max(width, 1), dtype=torch.int64, device=device)
    for i, t in enumerate(tables):
        if len(t):
            out[i, :len(t)] = torch.as_tensor(list(t), dtype=torch.int64, device=device)
    return out


# --- paged attention ---------------------------------------------------------------------------------

def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, chunk_tokens: int = 32) -> torch.Tensor:
    """Attention of one decode query per sequence over its keys and values, read from the block pool.

    q `[B, n_heads, head_dim]`; k_pool, v_pool `[num_blocks, n_kv_heads, block_size, head_dim]`;
    block_tables int64 `[B, max_blocks]` (entries past a sequence's last block are ignored);
    context_lens int64 `[B]` (each >= 1). Returns `[B, n_heads, head_dim]`.

    The blocks are read a few at a time (about `chunk_tokens` keys) with an online softmax, as the CUDA
    kernel does: no contiguous copy of any sequence's whole K/V is made.
    """
    if q.dim() != 3 or k_pool.dim() != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(f"expected q [B, H, d] and k_pool, v_pool [num_blocks, Hkv, block_size, d]; got q "
                         f"{tuple(q.shape)}, k_pool {tuple(k_pool.shape)}, v_pool {tuple(v_pool.shape)}")
    b, h, d = q.shape
    num_blocks, hkv, bs, _ = k_pool.shape
    if k_pool.shape[3] != d or h % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not fit the pool {tuple(k_pool.shape)}: head_dim must match "
                         f"and n_heads must be a multiple of n_kv_heads")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or tuple(context_lens.shape) != (b,):
        raise ValueError(f"block_tables must be [B={b}, max_blocks] and context_lens [B={b}]; got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    lens = context_lens.to(torch.int64)
    if b and (int(lens.min()) < 1 or int(lens.max()) > block_tables.shape[1] * bs):
        raise ValueError(f"context_lens must be in 1..{block_tables.shape[1] * bs} (max_blocks x block_size); "
                         f"got {lens.tolist()}")
    group = h // hkv
    n_used = blocks_needed(int(lens.max()), bs) if b else 0
    per_chunk = max(1, chunk_tokens // bs)
    qg = q.reshape(b, hkv, group, d).float() / math.sqrt(d)  # [B, Hkv, group, d]
    m = torch.full((b, hkv, group), float("-inf"), device=q.device)  # running max
    l = torch.zeros(b, hkv, group, device=q.device)  # running sum of exp
    acc = torch.zeros(b, hkv, group, d, device=q.device)  # running sum of exp * V
    for j0 in range(0, n_used, per_chunk):
        j1 = min(j0 + per_chunk, n_used)
        pos = torch.arange(j0 * bs, j1 * bs, device=q.device)  # [c * bs] logical positions of this chunk
        valid = pos[None, :] < lens[:, None]  # [B, c * bs]
        ids = block_tables[:, j0:j1]
        ids = torch.where(valid[:, ::bs], ids, torch.zeros_like(ids))  # blocks past the end: read block 0, masked
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, (j1 - j0) * bs, d)  # [B, Hkv, c*bs, d]
        vb = v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, (j1 - j0) * bs, d)
        s = (qg @ kb.float().transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))  # [B, Hkv, group]
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe[..., None])  # [B, Hkv, group, c*bs]
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vb.float()
        m = m_new
    return (acc / l[..., None]).reshape(b, h, d).to(q.dtype)


# --- the paged cache the model runs on ---------------------------------------------------------------

class PagedKVCache:
    """Per layer, a K and a V pool `[num_blocks, n_kv_heads, block_size, head_dim]`, shared by all sequences.

    Before each forward, `prepare(block_tables, starts, num_tokens)` describes the step: sequence i
    contributes `num_tokens[i]` new tokens at positions `starts[i] ..`, and the model gets their ids
    flattened as `[1, sum(num_tokens)]`. Each layer then writes the new keys and values into their
    slots and attends: sequences with one new token (decode) together through `paged_attention`,
    longer ones (prefill, or a prefill chunk) with the model's attention over their gathered blocks.

    `slot_mapping` and `paged_attention` replace this module's (same signatures, without `device` and
    `chunk_tokens`): the engine runs on the notebook's own when it is given them.
    """

    def __init__(self, config, num_blocks: int, block_size: int = 16, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, slot_mapping=None, paged_attention=None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1; got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks, config.n_kv_heads, block_size, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.device = self.k[0].device
        self.positions: torch.Tensor | None = None
        self.logits_rows: torch.Tensor | None = None  # set by the engine: the rows whose logits the model returns
        # Keys read per online-softmax step in decode. On a CPU each step costs Python time that a GPU kernel
        # does not pay, so the engine reads more at once than paged_attention's default.
        self.chunk_tokens = 256
        self.slot_mapping_fn, self.paged_attention_fn = slot_mapping, paged_attention  # None: this module's

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's keys and values in every layer (copy-on-write)."""
        for pool in self.k + self.v:
            pool[dst] = pool[src]

    def swap_out(self, blocks: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of `blocks`' keys and values, per layer, in host memory (a preempted sequence's, to swap back in)."""
        ids = torch.as_tensor(list(blocks), dtype=torch.int64, device=self.device)
        return [(k[ids].to("cpu", copy=True), v[ids].to("cpu", copy=True)) for k, v in zip(self.k, self.v)]

    def swap_in(self, blocks: Sequence[int], saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write `swap_out`'s copies into the first blocks of `blocks` (the sequence's new block table)."""
        ids = torch.as_tensor(list(blocks)[:saved[0][0].shape[0]], dtype=torch.int64, device=self.device)
        for (k, v), (ks, vs) in zip(zip(self.k, self.v), saved):
            k[ids] = ks.to(self.device)
            v[ids] = vs.to(self.device)

    def prepare(self, block_tables: Sequence[Sequence[int]], starts: Sequence[int],
                num_tokens: Sequence[int]) -> None:
        """Describe the next forward: sequence i adds `num_tokens[i]` tokens at positions `starts[i]` onwards."""
        if not (len(block_tables) == len(starts) == len(num_tokens)) or not len(starts):
            raise ValueError("prepare needs one block table, start and token count per sequence (at least one)")
        dev, bs = self.device, self.block_size
        self.positions = torch.cat([torch.arange(s, s + n, device=dev) for s, n in zip(starts, num_tokens)])
        if self.slot_mapping_fn is None:
            self.slots = torch.cat([slot_mapping(t, s, n, bs, dev) for t, s, n in zip(block_tables, starts, num_tokens)])
        else:  # the notebook's: [n] slots per sequence, on any device, in any integer dtype
            slots = []
            for t, s, n in zip(block_tables, starts, num_tokens):
                got = torch.as_tensor(self.slot_mapping_fn(list(t), s, n, bs)).to(dev, torch.int64)
                if tuple(got.shape) != (n,) or (n and not 0 <= int(got.min()) <= int(got.max()) < self.num_blocks * bs):
                    raise ValueError(f"slot_mapping({list(t)}, {s}, {n}, {bs}) returned {got.tolist()}: expected {n} "
                                     f"slots in 0..{self.num_blocks * bs - 1} (the pool has {self.num_blocks} blocks)")
                slots.append(got)
            self.slots = torch.cat(slots)
        offsets = [0]
        for n in num_tokens:
            offsets.append(offsets[-1] + n)
        decode = [i for i, n in enumerate(num_tokens) if n == 1]
        self.decode_rows = torch.tensor([offsets[i] for i in decode], dtype=torch.int64, device=dev)
        self.decode_tables = block_table_tensor([block_tables[i] for i in decode], dev)
        self.decode_lens = torch.tensor([starts[i] + 1 for i in decode], dtype=torch.int64, device=dev)
        self.prefills = [(offsets[i], n, starts[i] + n,
                          torch.as_tensor(list(block_tables[i][:blocks_needed(starts[i] + n, bs)]), dtype=torch.int64,
                                          device=dev))
                         for i, n in enumerate(num_tokens) if n > 1]

    def __len__(self) -> int:
        return len(self.k)

    def __getitem__(self, i: int) -> "PagedLayer":
        return PagedLayer(self, i)


class PagedLayer:
    """One layer's view of a `PagedKVCache`; `lib.modeling.llama.Attention` calls its `attend`."""

    def __init__(self, cache: PagedKVCache, layer: int):
        self.cache, self.layer = cache, layer

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_fn) -> torch.Tensor:
        """q `[1, H, N, d]`, k, v `[1, Hkv, N, d]` for the step's N flattened tokens -> out `[1, H, N, d]`."""
        c = self.cache
        if c.positions is None or q.shape[0] != 1 or q.shape[2] != c.slots.shape[0]:
            raise ValueError(f"a paged forward takes input_ids [1, N] with N = the tokens given to "
                             f"cache.prepare(...) ({None if c.positions is None else c.slots.shape[0]}); "
                             f"got q {tuple(q.shape)}")
        kp, vp, bs = c.k[self.layer], c.v[self.layer], c.block_size
        blocks, offs = c.slots // bs, c.slots % bs
        kp[blocks, :, offs] = k[0].transpose(0, 1)  # [N, Hkv, d] into their slots
        vp[blocks, :, offs] = v[0].transpose(0, 1)
        out = torch.empty_like(q)  # [1, H, N, d]
        if c.decode_rows.numel():
            qd = q[0, :, c.decode_rows].transpose(0, 1)  # [B, H, d]
            if c.paged_attention_fn is None:
                od = paged_attention(qd, kp, vp, c.decode_tables, c.decode_lens, chunk_tokens=c.chunk_tokens)
            else:
                od = c.paged_attention_fn(qd, kp, vp, c.decode_tables, c.decode_lens)
                if not isinstance(od, torch.Tensor) or od.shape != qd.shape:
                    raise ValueError(f"paged_attention returned {tuple(getattr(od, 'shape', ())) or type(od).__name__} "
                                     f"for queries {tuple(qd.shape)}: expected [B, n_heads, head_dim], like q")
            out[0, :, c.decode_rows] = od.transpose(0, 1)  # [B, H, d] -> [H, B, d]
        hkv, d = kp.shape[1], kp.shape[3]
        for row, n, ctx, table in c.prefills:
            kc = kp[table].transpose(0, 1).reshape(hkv, -1, d)[None, :, :ctx]  # [1, Hkv, ctx, d]
            vc = vp[table].transpose(0, 1).reshape(hkv, -1, d)[None, :, :ctx]
            out[:, :, row:row + n] = attention_fn(q[:, :, row:row + n], kc, vc, causal=True)
        return out
