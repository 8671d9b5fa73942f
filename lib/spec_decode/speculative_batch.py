"""Batched speculative decoding (week 18, section 8): the ragged batch, where each row accepts a different number
of tokens per round.

A batch of B sequences shares each target forward (the weights are read once for all of them), but after a
verification row b has kept n_b + 1 tokens and row b' another number: their caches now hold different lengths, the
next round's rows start at different positions, and a row that has written all its tokens drops out while the
others go on. Two things make that work:

- **one cache per row, rolled back per row**: `RaggedKVCache` keeps, per layer, K and V buffers
  `[rows, n_kv_heads, max_len, head_dim]` and one length per row; `truncate(row, n)` rolls one row back (nothing is
  copied: the next append overwrites the dropped positions) and leaves the others as they are;
- **the next round packed or padded**: `RaggedTarget(model)` runs any set of rows, each with its own new tokens
  (`target({row: [tokens], ...}, cache=cache)`), in one forward of the model. `layout="packed"` (the default)
  concatenates the rows' tokens into one `[1, N]` forward, N = the tokens the rows need, each token at its own
  row's next position and attending only to its own row's cache (the model's `cache.positions` / `attend` hooks,
  as lib.batching.paged uses them). `layout="padded"` runs the rectangle a `[B, T]` batch would: every row of the cache,
  finished or not, fed T = the longest row's count of tokens, the pads computed and thrown away (their positions
  lie past the row's length, overwritten later). `stats` counts what each layout computed and what the rows
  needed, so the notebook can say how much of a padded forward was waste.

The scheduler (which rows go in a round, what each is fed, how far each rolls back) is the exercise
(`batched_speculative_generate` in the notebook); this module is the machinery it runs on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class _RaggedLayer:
    """One layer's K and V buffers for every row; the model's attention calls `attend` with the packed tokens."""

    def __init__(self, cache: "RaggedKVCache", rows: int, n_kv_heads: int, max_len: int, head_dim: int, dtype, device):
        self.cache = cache
        self.k = torch.zeros(rows, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_fn) -> torch.Tensor:
        """q `[1, H, N, d]`, k and v `[1, Hkv, N, d]`: the forward's N tokens, row after row as `cache.plan` says.
        Each row's tokens are written after its `length` positions and attend (causally, bottom-right aligned) to
        its own cache only."""
        out = torch.empty_like(q)
        lengths = self.cache._lengths
        for row, start, count in self.cache.plan:
            held = lengths[row]
            self.k[row, :, held:held + count] = k[0, :, start:start + count]
            self.v[row, :, held:held + count] = v[0, :, start:start + count]
            out[:, :, start:start + count] = attention_fn(q[:, :, start:start + count], self.k[row:row + 1, :, :held + count],
                                                          self.v[row:row + 1, :, :held + count], causal=True)
        return out


class RaggedKVCache:
    """One KV cache per row of a batch, all run in one forward; row b holds `lengths[b]` positions.

    `truncate(row, n)` keeps the first n positions of that row only (speculative decoding's rollback, per row).
    Made by `RaggedTarget.new_cache(rows, max_len)`."""

    def __init__(self, config, rows: int, max_len: int, dtype=torch.float32, device=None):
        if rows < 1 or max_len < 1:
            raise ValueError(f"need rows >= 1 and max_len >= 1; got {rows}, {max_len}")
        self.rows, self.max_len = rows, max_len
        self._lengths = [0] * rows
        self.layers = [_RaggedLayer(self, rows, config.n_kv_heads, max_len, config.head_dim, dtype, device)
                       for _ in range(config.n_layers)]
        self.plan: list[tuple[int, int, int]] = []  # (row, first index in the packed forward, tokens) while it runs
        self.positions: torch.Tensor | None = None  # the model reads each token's position here (lib.modeling.llama)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Positions each row holds."""
        return tuple(self._lengths)

    def truncate(self, row: int, n: int) -> None:
        """Roll row `row` back to its first `n` positions; the other rows keep theirs."""
        if not isinstance(row, int) or not 0 <= row < self.rows:
            raise ValueError(f"truncate(row, n): row must be an int in 0..{self.rows - 1}; got {row!r}")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self._lengths[row]:
            raise ValueError(f"truncate({row}, {n!r}): row {row} holds {self._lengths[row]} positions; keep between 0 "
                             f"and {self._lengths[row]} of them")
        self._lengths[row] = n

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> _RaggedLayer:
        return self.layers[i]


@dataclass
class RaggedStats:
    """What a `RaggedTarget` computed: forwards, token positions run through the model, and of those the tokens the
    rows needed (the rest were pads)."""
    forwards: int = 0
    computed: int = 0
    needed: int = 0
    row_rounds: int = 0  # rows fed, summed over forwards

    @property
    def pad_fraction(self) -> float:
        return 1 - self.needed / self.computed if self.computed else 0.0


class RaggedTarget:
    """A model (lib.modeling.llama.LlamaModel) that runs several rows, each with its own new tokens, in one forward.

        target = RaggedTarget(model)                      # layout="packed" (or "padded")
        cache = target.new_cache(rows=4, max_len=256)
        logits = target({0: [5, 6, 7], 2: [9]}, cache=cache)   # {0: [3, vocab], 2: [1, vocab]}; rows 1, 3 not run
        cache.truncate(0, 6)                              # roll row 0 back; row 2 keeps its 1 position

    Each row's tokens go after the positions its cache holds; its logits are the model's on that row alone (up to
    the last bits of fp32: one forward over several rows sums in another order than a forward over one)."""

    def __init__(self, model, layout: str = "packed"):
        if layout not in ("packed", "padded"):
            raise ValueError(f"layout must be 'packed' or 'padded'; got {layout!r}")
        self.model, self.layout = model, layout
        self.config, self.device = model.config, model.device
        self.stats = RaggedStats()

    def new_cache(self, rows: int, max_len: int) -> RaggedKVCache:
        return RaggedKVCache(self.config, rows, max_len, dtype=self.model.embed.weight.dtype, device=self.device)

    @torch.no_grad()
    def __call__(self, feeds: dict, cache: RaggedKVCache) -> dict:
        """`feeds`: {row: [token ids]} (at least one token each) -> {row: logits [tokens, vocab]}, in one forward."""
        if not isinstance(cache, RaggedKVCache):
            raise ValueError("pass the cache made by this target's new_cache(rows, max_len)")
        if not feeds:
            raise ValueError("feeds is empty: give at least one row its new tokens")
        feeds = {int(r): [int(t) for t in toks] for r, toks in feeds.items()}
        for row, toks in feeds.items():
            if not 0 <= row < cache.rows or not toks:
                raise ValueError(f"row {row}: rows are 0..{cache.rows - 1} and each is fed at least one token")
            if cache.lengths[row] + len(toks) > cache.max_len:
                raise ValueError(f"row {row} holds {cache.lengths[row]} positions and was fed {len(toks)}: more than "
                                 f"the cache's max_len {cache.max_len}")
        run = dict(feeds)
        if self.layout == "padded":  # the rectangle: every row of the cache, each fed the longest row's count
            width = max(len(t) for t in feeds.values())
            run = {}
            for row in range(cache.rows):
                toks = feeds.get(row, [])
                pads = min(width, cache.max_len - cache.lengths[row]) - len(toks)  # never past a row's buffer
                if toks or pads > 0:
                    run[row] = toks + [toks[-1] if toks else 0] * max(pads, 0)
        plan, ids, positions, start = [], [], [], 0
        for row, toks in run.items():
            plan.append((row, start, len(toks)))
            ids += toks
            positions.append(torch.arange(cache.lengths[row], cache.lengths[row] + len(toks), device=self.device))
            start += len(toks)
        cache.plan, cache.positions = plan, torch.cat(positions)
        try:
            logits = self.model(torch.tensor([ids], device=self.device), cache=cache)[0]  # [N, vocab]
        finally:
            cache.plan, cache.positions = [], None
        for row, toks in feeds.items():  # only the fed tokens are kept; a pad's position lies past the row's length
            cache._lengths[row] += len(toks)
        self.stats.forwards += 1
        self.stats.computed += len(ids)
        self.stats.needed += sum(len(t) for t in feeds.values())
        self.stats.row_rounds += len(feeds)
        return {row: logits[s:s + len(feeds[row])] for row, s, _ in plan if row in feeds}
