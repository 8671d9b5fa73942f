"""The KV-cache blocks behind the serving engine (week 19): who owns which block, and which blocks hold a prefix
that a new request can reuse.

    hs = block_hashes(token_ids, block_size=16)     # one chained sha256 per full block
    pool = PrefixCache(num_blocks=64)               # reference-counted blocks with a prefix cache over them
    manager = BlockManager(64, 16, enable_prefix_caching=True)   # hands a request's blocks out and back

- `chain_hash` / `block_hashes`: a content hash per full block, chained over the previous block's hash, so a hit
  on block i means blocks 0..i all match.
- `PrefixCache`: the pool (`lib.batching.paged.BlockAllocator`'s `allocate`, `fork`, `free`, `ref_count`) plus
  `register` / `lookup` by hash; a freed cached block stays cached until evicted, least recently freed first.
- `BlockManager`: the engine's view of the pool per request: growing a request's block table (copy-on-write of a
  shared block), releasing it, finding and registering its cached prefix.

Separate from `lib/batching/engine.py` because this is bookkeeping over plain ints, with no model and no scheduling:
it can be read (and tested) on its own, and `lib.batching.engine` builds on it (`LLMEngine(block_pool=...,
block_hashes=...)` swaps these parts for the notebook's). Import these names from here.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from lib.batching.paged import OutOfBlocksError, blocks_needed


# --- hashing full blocks -------------------------------------------------------------------------------------

def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The hash of one full block: sha256 over the previous block's hash and this block's token ids.

    A content hash, the same in every process and run (Python's `hash()` is neither for strings, and its
    64 bits invite collisions that an attacker can aim for: vLLM moved to sha256 for that reason)."""
    digest = hashlib.sha256(repr((parent, [int(t) for t in tokens])).encode()).digest()
    return int.from_bytes(digest[:16], "little")


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """One hash per *full* block of `token_ids`, each chained over the previous block's hash:
    h_i = chain_hash(h_{i-1}, tokens of block i). Two sequences share h_i only if they share every token up
    to the end of block i, so a hit on h_i means blocks 0..i can all be reused."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out = []
    h = parent
    for i in range(len(token_ids) // block_size):
        h = chain_hash(h, token_ids[i * block_size:(i + 1) * block_size])
        out.append(h)
    return out


# --- blocks: allocation, sharing and the prefix cache ---------------------------------------------

class PrefixCache:
    """A pool of `num_blocks` reference-counted blocks with a prefix cache over them.

    `allocate`, `fork`, `free` as `lib.batching.paged.BlockAllocator`; `ref_count(block)` its owners. A full block can be
    `register`ed under its hash (with its tokens); `lookup(hash, tokens)` finds it again while it stays
    cached — also after its last owner has freed it: a freed cached block stays *free but cached*, and a
    hit takes it back (`fork`). `allocate()` prefers a block that caches nothing; when only free cached
    blocks are left it evicts the least recently freed one (LRU), forgetting its hash.
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._uncached = list(range(num_blocks - 1, -1, -1))  # free blocks that cache nothing (a stack)
        self._lru: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recently freed first
        self._block_of: dict[int, int] = {}  # hash -> block
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> (hash, tokens)

    @property
    def num_free(self) -> int:
        """Blocks no request owns (cached or not): what `allocate` can hand out."""
        return len(self._uncached) + len(self._lru)

    def _check(self, block: int, what: str) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"cannot {what} block {block!r}: blocks are ints in 0..{self.num_blocks - 1}")

    def ref_count(self, block: int) -> int:
        self._check(block, "read")
        return self.ref_counts[block]

    def allocate(self) -> int:
        if self._uncached:
            block = self._uncached.pop()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)  # evict the least recently freed cached block
            del self._block_of[self._key_of.pop(block)[0]]
        else:
            raise OutOfBlocksError(f"out of KV blocks: all {self.num_blocks} blocks are in use")
        self.ref_counts[block] = 1
        return block

    def fork(self, block: int) -> int:
        """One more owner; a free cached block (a prefix-cache hit) is taken back from the free ones."""
        self._check(block, "fork")
        if self.ref_counts[block] == 0:
            if block not in self._lru:
                raise ValueError(f"cannot fork block {block}: it is free and caches nothing")
            del self._lru[block]
        self.ref_counts[block] += 1
        return block

    def free(self, block: int) -> None:
        self._check(block, "free")
        if self.ref_counts[block] == 0:
            raise ValueError(f"cannot free block {block}: it is not allocated (double free?)")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if block in self._key_of:
                self._lru[block] = None  # the most recently freed: evicted last
            else:
                self._uncached.append(block)

    def register(self, block: int, block_hash: int, tokens: Sequence[int]) -> None:
        """Cache an allocated full `block` under `block_hash`; nothing if the hash or the block is cached already."""
        self._check(block, "register")
        if self.ref_counts[block] == 0:
            raise ValueError(f"cannot register block {block}: it is not allocated")
        if block_hash not in self._block_of and block not in self._key_of:
            self._block_of[block_hash] = block
            self._key_of[block] = (block_hash, tuple(int(t) for t in tokens))

    def lookup(self, block_hash: int, tokens: Sequence[int]) -> int | None:
        """The cached block of `block_hash` if it holds exactly `tokens` (a hash collision is a miss), else None.
        Changes nothing: `fork` the block to use it."""
        block = self._block_of.get(block_hash)
        if block is None or self._key_of[block][1] != tuple(int(t) for t in tokens):
            return None
        return block


class BlockManager:
    """Gives requests blocks from a pool (`PrefixCache`, or the class given as `pool`: `allocate`, `fork`, `free`,
    `ref_count`, `num_free`, and `register`, `lookup` for prefix caching) and, with prefix caching, registers
    their full blocks (hashed by `hashes`, `block_hashes`'s signature) and looks up the longest cached prefix of a
    new request.

    A request (`req`) is a `lib.batching.request.Request`; of it this class reads and writes `blocks` (its block table),
    `block_hashes`, `num_computed`, and reads `tokens`, `num_tokens`, `request_id` and `lora`."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False, pool=PrefixCache,
                 hashes=None):
        self.pool = pool(num_blocks)
        self.block_hashes = block_hashes if hashes is None else hashes  # (token_ids, block_size) -> a hash per full block
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.registered: dict[int, int] = {}  # block -> hash, for the blocks this manager had the pool cache
        self.num_evictions = 0

    @property
    def num_available(self) -> int:
        return self.pool.num_free

    @property
    def num_in_use(self) -> int:
        """Blocks some request holds (free cached blocks excluded)."""
        return self.num_blocks - self.pool.num_free

    def _allocate(self) -> int:
        block = self.pool.allocate()
        if self.registered.pop(block, None) is not None:  # a cached block handed out again: evicted
            self.num_evictions += 1
        return block

    def _shared_write_block(self, req) -> int | None:
        """Index in `req.blocks` of the block its next token is written to, if another owner shares it."""
        j = req.num_computed // self.block_size
        if j < len(req.blocks) and self.pool.ref_count(req.blocks[j]) > 1:
            return j
        return None

    def _need(self, req, num_tokens: int) -> int:
        new = blocks_needed(num_tokens, self.block_size) - len(req.blocks)
        return max(new, 0) + (self._shared_write_block(req) is not None)

    def can_grow(self, req, num_tokens: int) -> bool:
        return self._need(req, num_tokens) <= self.num_available

    def grow(self, req, num_tokens: int) -> list[tuple[int, int]]:
        """Give `req` blocks for `num_tokens` tokens; returns the (source, destination) blocks to copy.

        Copy-on-write: a block that another owner shares is replaced by a private copy before `req`
        writes into it. Raises OutOfBlocksError when there are not enough blocks."""
        need = self._need(req, num_tokens)
        if need > self.num_available:
            raise OutOfBlocksError(f"request {req.request_id!r} needs {need} more blocks; {self.num_available} of "
                                   f"{self.num_blocks} are free")
        copies = []
        j = self._shared_write_block(req)
        if j is not None:
            src, dst = req.blocks[j], self._allocate()
            self.pool.free(src)  # one owner fewer; the others keep it
            req.blocks[j] = dst
            copies.append((src, dst))
        while len(req.blocks) < blocks_needed(num_tokens, self.block_size):
            req.blocks.append(self._allocate())
        return copies

    def release(self, req) -> None:
        """Free every block of `req` (shared ones stay with their other owners, cached ones stay cached)."""
        for block in reversed(req.blocks):  # the tail first: later blocks are the least likely to be hit again
            self.pool.free(block)
        req.blocks, req.block_hashes, req.num_computed = [], [], 0

    def _hashes(self, req, tokens: Sequence[int]) -> list[int]:
        """The hashes of `tokens`' full blocks for `req`: with a LoRA adapter (`req.lora`, lib.modeling.lora) each is salted with
        the adapter's, since the keys and values it computes are not the base model's (nor another adapter's)."""
        hashes = self.block_hashes(tokens, self.block_size)
        salt = getattr(getattr(req, "lora", None), "salt", None)
        return hashes if salt is None else [chain_hash(salt, [h]) for h in hashes]

    def _hits(self, req) -> list[tuple[int, int]]:
        """(hash, block) of `req`'s longest cached prefix of full blocks, at least one token left to compute."""
        if not self.enable_prefix_caching or req.blocks:
            return []
        bs = self.block_size
        usable = (req.num_tokens - 1) // bs
        tokens = req.tokens
        hits = []
        for i, h in enumerate(self._hashes(req, tokens[:usable * bs])):
            block = self.pool.lookup(h, tokens[i * bs:(i + 1) * bs])
            if block is None:
                break
            hits.append((h, block))
        return hits

    def peek(self, req) -> tuple[int, int]:
        """What `lookup(req)` would find, changing nothing: (tokens covered, hit blocks that are free: sharing
        those takes them out of the free pool, sharing one that another request holds does not)."""
        hits = self._hits(req)
        return len(hits) * self.block_size, sum(self.pool.ref_count(block) == 0 for _, block in hits)

    def lookup(self, req) -> int:
        """Share the cached blocks of `req`'s longest cached prefix; return how many tokens that covers.

        At least one token is always left to compute (its logits give the next token)."""
        for h, block in self._hits(req):
            self.pool.fork(block)
            req.blocks.append(block)
            req.block_hashes.append(h)
        return len(req.blocks) * self.block_size

    def writable(self, req) -> int:
        """Blocks of `req` it can write into (a shared block it is about to write is copied first: not counted)."""
        return len(req.blocks) - (self._shared_write_block(req) is not None)

    def freeable(self, req) -> int:
        """Blocks that become free if `req` is released (those no other request holds)."""
        return sum(self.pool.ref_count(b) == 1 for b in req.blocks)

    def register(self, req) -> None:
        """Have the pool cache `req`'s newly completed full blocks."""
        if not self.enable_prefix_caching:
            return
        full = req.num_computed // self.block_size
        if len(req.block_hashes) >= full:
            return
        bs = self.block_size
        tokens = req.tokens
        for i, h in enumerate(self._hashes(req, tokens[:full * bs])[len(req.block_hashes):], len(req.block_hashes)):
            block_tokens = tokens[i * bs:(i + 1) * bs]
            req.block_hashes.append(h)
            block = req.blocks[i]
            if block not in self.registered and self.pool.lookup(h, block_tokens) is None:
                self.pool.register(block, h, block_tokens)
                self.registered[block] = h
