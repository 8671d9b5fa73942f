"""The engine's model runner (week 19): one forward over every token a step scheduled, on the paged KV cache.

    runner = ModelRunner(model, cache)          # LLMEngine makes one over its PagedKVCache
    logits = runner.run([(req, n), ...])        # [rows, vocab]: one row per request whose last token ran

`LLMEngine.step` is schedule → run → postprocess; this is the *run*. It owns the forward and nothing else: which
tokens (`LLMEngine._schedule`) and what becomes of the logits (sampling, stop conditions, `LLMEngine._postprocess`)
are the engine's.

- **One flat batch.** The scheduled tokens of all requests are flattened into `[1, N]` ids; each request brings
  its block table, the position of its first scheduled token (`starts`) and its number of tokens (`counts`), which
  `PagedKVCache.prepare` turns into slots and attention spans. The LM head runs only on `logits_rows`: the last
  token of each request whose scheduled tokens reach its end (a prefill chunk that does not has no next token).
- **Multi-LoRA.** Requests with an adapter (`params.lora`) form row groups (`lib.modeling.lora.row_groups`); each group's
  low-rank product is added to its rows only, inside the one forward (`lib.modeling.lora.applied`).
- **CUDA graphs.** A step in which every request decodes one token, with no adapter, is replayed from a graph
  (`lib.batching.fast_paged.PagedDecodeGraphs`, in `graphs`) where the model is on CUDA and attention and slot mapping are
  lib's; a batch beyond the last bucket, and every other step, runs eagerly.

`run` waits for the device (`lib.bench.roofline.sync`) before it returns: the engine reads its clock next, and a
token's time is when its logits exist, not when the GPU was asked for them.
"""
from __future__ import annotations

import torch

from lib.modeling import lora
from lib.bench.roofline import sync


class ModelRunner:
    """The paged forward of `model` over `cache` (a `lib.batching.paged.PagedKVCache`). `graphs`: None (decode steps as CUDA
    graphs wherever they can run), True (required: a ValueError where they cannot) or False (never)."""

    def __init__(self, model, cache, graphs: bool | None = None, own_parts: bool = True):
        self.model, self.cache = model, cache
        self.graphs = self._decode_graphs(graphs, own_parts)

    def _decode_graphs(self, graphs, own_parts: bool):
        """`lib.batching.fast_paged.PagedDecodeGraphs` over the cache, or None. `own_parts`: slot mapping and paged attention
        are lib's (a graph replays lib's arithmetic, not the notebook's)."""
        on_cuda = self.cache.device.type == "cuda"
        if graphs and not (on_cuda and own_parts):
            raise ValueError("graphs=True needs the model on a CUDA device and lib's own slot_mapping and "
                             f"paged_attention (model on {self.cache.device}; leave graphs unset to choose)")
        if not (on_cuda and own_parts if graphs is None else graphs):
            return None
        from lib.modeling.fast import FastLlama
        from lib.batching.fast_paged import PagedDecodeGraphs

        return PagedDecodeGraphs(FastLlama(self.model, graphs=False), self.cache)

    def run(self, scheduled) -> torch.Tensor:
        """Logits `[rows, vocab]` for `scheduled`, a list of (request, number of its tokens to compute now), in
        order: one row per request whose tokens reach its last (`num_computed + n == num_tokens`)."""
        ids, tables, starts, counts, last = [], [], [], [], []
        for req, n in scheduled:
            ids.extend(req.tokens[req.num_computed:req.num_computed + n])
            tables.append(req.blocks)
            starts.append(req.num_computed)
            counts.append(n)
            if req.num_computed + n == req.num_tokens:  # its last token: the logits its next token comes from
                last.append(len(ids) - 1)
        logits = None
        adapters = lora.row_groups([(req.lora, n) for req, n in scheduled], self.model.device)  # multi-LoRA groups
        if self.graphs is not None and not adapters and len(last) == len(ids) == len(scheduled):  # all decode 1 token
            logits = self.graphs.decode(ids, starts, tables)  # replayed (None: a batch beyond the last bucket)
        if logits is None:
            logits = self._eager(ids, tables, starts, counts, last, adapters)
        sync(self.model.device)  # the tokens' times are when the GPU has made their logits, not when it was asked
        return logits

    def _eager(self, ids, tables, starts, counts, last, adapters) -> torch.Tensor:
        self.cache.prepare(tables, starts, counts)
        self.cache.logits_rows = torch.tensor(last, dtype=torch.int64, device=self.model.device)
        input_ids = torch.tensor([ids], dtype=torch.int64, device=self.model.device)  # [1, N]
        with lora.applied(self.model, adapters):  # each adapter group adds its low-rank product to its rows
            logits = self.model(input_ids, cache=self.cache)[0]  # [len(last), vocab]: the LM head on those rows
        self.cache.positions = self.cache.logits_rows = None
        return logits
