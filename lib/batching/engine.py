"""A small serving engine: continuous batching over a paged KV cache (week 19).

    engine = LLMEngine(model, num_blocks=64, block_size=16, max_num_seqs=8)
    outs = engine.generate([prompt_a, prompt_b, ...], max_new_tokens=32)   # new ids per request, input order

    rid = engine.add_request(prompt_ids, max_new_tokens=32)   # the step-level API (notebook, load test)
    while engine.has_unfinished():
        for event in engine.step():                           # one forward; the tokens it produced
            ...
    engine.finished_outputs()                                 # {request_id: new ids}

Every step `schedule` — a function of plain data (the queues, the free blocks, the token budget) returning
the plan, which `LLMEngine(..., scheduler=...)` can replace — picks what to run (vLLM v1's shape,
nano-vllm's size):

1. the *running* requests first, oldest first: a decode needs one token, a request still prefilling
   needs the rest of its prompt (cut to the step's token budget: **chunked prefill**). A request that
   needs a block when none is free **preempts** the most recently admitted request: its blocks are
   freed and it goes back to the front of the queue, to be recomputed (prompt + what it generated so
   far) when there is room again, or (`preemption_mode="swap"`) its blocks are copied to host memory and
   back. Its output is unchanged: greedy decoding is a function of the tokens.
2. then, if nobody was preempted, *waiting* requests, first come first served, while there are slots
   (`max_num_seqs`; `n` parallel samples take `n`), budget (`max_num_batched_tokens`) and free blocks.

The blocks come from a `PrefixCache` (in `lib.batching.blocks`, with the `BlockManager` that hands them to requests;
`block_pool=` replaces it): reference-counted blocks and, with prefix caching, a request's leading full blocks that an earlier request computed, found by a sha256 chained
over the token ids (the tokens compared on a hit) and shared instead of recomputed; a freed cached block
stays cached until evicted, least recently freed first.

A step is schedule → run → postprocess. The run (`lib.batching.model_runner.ModelRunner`) puts all scheduled tokens of all
requests through the model in **one forward** (`[1, N]`, flattened), the decodes' attention through
`lib.batching.paged.paged_attention` (or the one given as `paged_attention=`), the LM head only on each sequence's last
token; postprocess samples, applies the stop conditions and frees; `lib.batching.step_stats.StepStats` records the step (`trace`,
`step_stats`). Greedy output of every request is what `lib.modeling.generate.generate` gives on it alone.

Also here: parallel sampling with copy-on-write (`add_request(..., n=4, temperature=0.8)`, `sample`): the
samples share the prompt's blocks and copy a shared block only when they write into it; static batching
for comparison (`policy="static"`); the step-count model of batching (`simulate_steps`). A load test with
arrival times (`run_load`: TTFT, TBT, throughput, KV utilization) is in `lib.batching.engine_load`; import each name
from the module that defines it.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Sequence

import torch

from lib.batching.blocks import BlockManager, PrefixCache
from lib.batching.model_runner import ModelRunner
from lib.batching.paged import PagedKVCache, blocks_needed
from lib.batching.request import AdmissionError, Request, StepOutput, UnknownRequestError
from lib.batching.step_stats import StepStats
from lib.bench.roofline import sync
from lib.modeling.sampling import SamplingParams


def simulate_steps(lengths: Sequence[int], slots: int, policy: str = "continuous") -> int:
    """Decode steps to serve requests that generate `lengths[i]` tokens each, in order, on `slots` slots.

    The step-count model of batching: one step gives every running request one token. "static" runs
    batches of `slots` requests until the longest of the batch is done; "continuous" refills a slot the
    step after its request finishes. Prefill is left out (one more step per request, or per batch)."""
    if slots < 1 or any(n < 1 for n in lengths):
        raise ValueError(f"need slots >= 1 and every length >= 1; got slots={slots}, lengths={list(lengths)[:8]}")
    if policy == "static":
        return sum(max(lengths[i:i + slots]) for i in range(0, len(lengths), slots))
    if policy != "continuous":
        raise ValueError(f"policy must be 'continuous' or 'static', got {policy!r}")
    queue, running, steps = deque(lengths), [], 0
    while queue or running:
        while queue and len(running) < slots:
            running.append(queue.popleft())
        running = [n - 1 for n in running if n > 1]
        steps += 1
    return steps


# --- the scheduler ------------------------------------------------------------------------------------

def schedule(running: list[dict], waiting: list[dict], free_blocks: int, block_size: int, token_budget: int,
             max_num_seqs: int, chunked_prefill: bool = True) -> dict:
    """One step's plan, from plain data: who runs how many tokens, who is preempted.

    Each request is a dict of ints: `id`; `computed` (tokens whose K and V are in the cache, or found in the
    prefix cache for a waiting one); `tokens` (prompt + output so far: it needs `tokens - computed` more);
    `blocks` (blocks it holds that it can write into); `freeable` (blocks that come free if it is
    preempted); `seqs` (slots it takes: n for a parallel-sampling request whose samples are not forked yet).
    `running` is in admission order (oldest first), `waiting` in queue order (preempted ones in front).
    To compute n more tokens a request needs `max(0, blocks_needed(computed + n, block_size) - blocks)` more.

    Returns `{"preempt": [id, ...], "run": [[id, n], ...]}`: the running requests first (oldest first; a
    prefill is cut to the budget left: chunked prefill), preempting the newest running request while the
    blocks do not suffice; then, if nobody was preempted, waiting requests first come first served while
    slots, budget and blocks last (with `chunked_prefill` off, a prompt is admitted only whole).
    """
    budget, free = token_budget, free_blocks
    alive = list(running)
    preempt, run = [], []
    i = 0
    while i < len(alive) and budget > 0:
        req = alive[i]
        n = min(req["tokens"] - req["computed"], budget)
        need = max(0, blocks_needed(req["computed"] + n, block_size) - req["blocks"])
        while need > free:
            victim = alive.pop()  # the most recently admitted
            preempt.append(victim["id"])
            free += victim["freeable"]
            if victim is req:
                break
        if req is not (alive[i] if i < len(alive) else None):
            break
        run.append([req["id"], n])
        free -= need
        budget -= n
        i += 1
    if preempt:
        return {"preempt": preempt, "run": run}
    seqs = sum(r["seqs"] for r in alive)
    for req in waiting:
        remaining = req["tokens"] - req["computed"]
        n = min(remaining, budget)
        if seqs + req["seqs"] > max_num_seqs or budget <= 0 or (n < remaining and not chunked_prefill):
            break
        need = max(0, blocks_needed(req["computed"] + n, block_size) - req["blocks"])
        if need > free:
            break
        run.append([req["id"], n])
        free -= need
        budget -= n
        seqs += req["seqs"]
    return {"preempt": preempt, "run": run}


# --- the engine --------------------------------------------------------------------------------------

class LLMEngine:
    """Continuous batching of greedy requests on `model` (a `lib.modeling.llama.LlamaModel`) over a paged KV cache.

    `num_blocks` blocks of `block_size` slots per layer; at most `max_num_seqs` requests run at once and
    at most `max_num_batched_tokens` tokens go through one forward. `policy="static"` admits a new batch
    only when the whole previous one has finished, and a finished request keeps decoding (its tokens
    thrown away) until then, as a padded row of a static batch does: static batching, for comparison.
    `long_prefill_token_threshold` (vLLM's name; 0, the default, is off) caps the tokens one prompt gets per step,
    so a long prompt's prefill leaves budget for the others: a short request sent during it starts at the next
    step instead of after the whole prefill.
    The parts can be replaced by the notebook's own (same signatures): `scheduler`, the function that plans each
    step (`schedule`); `block_pool`, the class of the block pool (`PrefixCache`, or without prefix caching any
    pool with `BlockAllocator`'s `allocate`, `fork`, `free`, `ref_count`, `num_free`); `block_hashes`, the
    chained hash of a sequence's full blocks; `slot_mapping` and `paged_attention` (`lib.batching.paged`'s, without their
    `device` and `chunk_tokens` arguments; None: lib's). A preempted
    request is recomputed (`preemption_mode="recompute"`) or its blocks are copied to host memory and back
    (`"swap"`).
    `graphs` (None: wherever the model is on CUDA and attention and slot mapping are lib's) replays the steps in
    which every sequence decodes one token as CUDA graphs (`lib.batching.fast_paged`); prefill steps run as before.
    """

    def __init__(self, model, num_blocks: int, block_size: int = 16, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 256, enable_chunked_prefill: bool = True,
                 enable_prefix_caching: bool = False, policy: str = "continuous",
                 eos_token_id: int | None = None, clock=time.perf_counter, scheduler=schedule,
                 block_pool=PrefixCache, preemption_mode: str = "recompute", block_hashes=None, slot_mapping=None,
                 paged_attention=None, long_prefill_token_threshold: int = 0, graphs: bool | None = None):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(f"need max_num_seqs >= 1 and max_num_batched_tokens >= 1; got {max_num_seqs}, "
                             f"{max_num_batched_tokens}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({max_num_seqs}): every running request decodes one token per step")
        if long_prefill_token_threshold < 0 or (long_prefill_token_threshold and not enable_chunked_prefill):
            raise ValueError(f"long_prefill_token_threshold must be >= 0 (0: off) and needs chunked prefill; got "
                             f"{long_prefill_token_threshold} with enable_chunked_prefill={enable_chunked_prefill}")
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {preemption_mode!r}")
        if policy not in ("continuous", "static"):
            raise ValueError(f"policy must be 'continuous' or 'static', got {policy!r}")
        self.model = model
        self.config = model.config
        self.block_size = block_size
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.enable_chunked_prefill, self.policy, self.eos_token_id = enable_chunked_prefill, policy, eos_token_id
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching, pool=block_pool, hashes=block_hashes)
        self.cache = PagedKVCache(self.config, num_blocks, block_size, dtype=model.embed.weight.dtype,
                                  device=model.device, slot_mapping=slot_mapping, paged_attention=paged_attention)
        self.runner = ModelRunner(model, self.cache, graphs, own_parts=slot_mapping is None and paged_attention is None)
        self.clock = clock
        self.scheduler = scheduler
        self._serials = itertools.count()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[object, Request] = {}
        self._finished: dict[object, list[int]] = {}
        self._ids = itertools.count()
        self.stats = StepStats()  # the observer of every step; its two records, read as the engine's own:
        self.trace, self.step_stats = self.stats.trace, self.stats.step_stats
        self.num_preemptions = 0
        self.num_cow_copies = 0
        self.preemption_mode = preemption_mode
        self.recomputed_tokens = 0  # recompute: tokens computed again after a preemption
        self.swap_bytes, self.swap_seconds = 0, 0.0  # swap: bytes copied out and back in, and the time it took
        self.prompt_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        return self.blocks.num_blocks

    # -- the request API ----------------------------------------------------------------------------

    def admissible(self, prompt: Sequence[int], max_new_tokens: int, n: int = 1, temperature: float = 0.0) -> list[int]:
        """The prompt as a list of ints, if the engine can ever run this request; else an `AdmissionError` saying
        why and naming the field at fault. The one admission rule: `add_request` applies it, and so does the
        server (`lib.serve.server`) before it answers a client, so the two never disagree."""
        if n < 1 or temperature < 0:
            raise AdmissionError(f"need n >= 1 and temperature >= 0; got n={n}, temperature={temperature}", "n")
        if n > self.max_num_seqs:
            raise AdmissionError(f"n={n} samples run at once, but the engine runs at most max_num_seqs="
                                 f"{self.max_num_seqs} sequences", "n")
        prompt = [int(t) for t in (prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)]
        if not prompt:
            raise AdmissionError("a request needs a prompt of at least one token", "prompt")
        if max_new_tokens < 1:
            raise AdmissionError(f"max_new_tokens must be >= 1, got {max_new_tokens}", "max_tokens")
        bad = [t for t in prompt if not 0 <= t < self.config.vocab_size]
        if bad:
            raise AdmissionError(f"prompt token ids outside 0..{self.config.vocab_size - 1}: {bad[:5]}", "prompt")
        total = len(prompt) + max_new_tokens
        if total > self.config.max_seq_len:
            raise AdmissionError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) = {total} exceeds the "
                                 f"model's max_seq_len {self.config.max_seq_len}", "max_tokens",
                                 "context_length_exceeded")
        # The last token's K and V are never written. (With n samples, more than one sample's worth helps,
        # but one is enough: samples that do not fit are preempted and run later.)
        need = blocks_needed(total - 1, self.block_size)
        if need > self.num_blocks:
            raise AdmissionError(f"request can never fit: prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) "
                                 f"- 1 = {total - 1} tokens need {need} KV blocks of {self.block_size}, and the whole "
                                 f"pool has {self.num_blocks}. Give the engine more blocks or ask for fewer tokens.",
                                 "max_tokens", "context_length_exceeded")
        if not self.enable_chunked_prefill and total - 1 > self.max_num_batched_tokens:
            # A preempted request is recomputed (prompt + output so far) in one step: without chunking, that
            # must fit the token budget, or it could never be admitted again (vLLM asks the same of the
            # model's maximum length).
            raise AdmissionError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) - 1 = {total - 1} tokens "
                                 f"exceed max_num_batched_tokens ({self.max_num_batched_tokens}) and chunked prefill "
                                 f"is off: if preempted, the request could never be recomputed in one step",
                                 "max_tokens", "context_length_exceeded")
        return prompt

    def add_request(self, prompt: Sequence[int], max_new_tokens: int, request_id=None,
                    arrival: float | None = None, n: int = 1, temperature: float | None = None,
                    seed: int | None = None, params: SamplingParams | None = None):
        """Queue a request; returns its id. Raises ValueError at once for a request that can never run.

        `params` (`lib.modeling.sampling.SamplingParams`) carries everything the request's sampling needs: when given,
        *its* temperature and seed are the request's (`temperature` and `seed`, if given, must agree); without it,
        `temperature` (default 0: greedy) and `seed` (default 0) make plain params. Temperature > 0 samples
        (sample k draws from a generator seeded with `seed + k`, as `lib.modeling.generate.generate(..., temperature,
        generator=torch.Generator().manual_seed(seed + k))` does). `n` > 1 is parallel sampling: the prompt is
        computed once, then `n - 1` more samples, ids `(request_id, 1) … (request_id, n - 1)`, share its blocks
        (copy-on-write), each with params of its own (`for_another_sequence`). `params.lora`: the request's LoRA
        adapter (`lib.modeling.lora`), on its rows only. With `params.logprobs` set, each chosen token's `(token, logprob,
        [(alternative, logprob), ...])` is appended to `params.logprob_entries`: results come back through the
        object the submitter holds (one params object per request).

        `params.sibling_of = parent_id` makes the request a sibling of a *waiting* request with the same prompt: it
        takes no place in the queue, and when the parent's prompt is computed it forks off it like one of `n` (its
        own id, seed and params; the prompt computed once): how the server's `n` and `best_of` samples share a prompt
        while its `ServingLoop` sees `n` ordinary requests. Where the parent has started (or is gone), it queues alone.
        """
        if params is None:
            params = SamplingParams(temperature=temperature or 0.0, seed=seed or 0)
        elif temperature not in (None, params.temperature) or seed not in (None, params.seed):
            raise ValueError(f"temperature={temperature} and seed={seed} disagree with params (temperature="
                             f"{params.temperature}, seed={params.seed}), whose temperature and seed are the request's")
        prompt = self.admissible(prompt, max_new_tokens, n, params.temperature)
        bad = [t for t in [*params.logit_bias, *params.stop_token_ids, params.eos_token_id]
               if t is not None and not 0 <= int(t) < self.config.vocab_size]
        if bad:
            raise AdmissionError(f"token ids {bad[:5]} are outside the vocabulary (0 to {self.config.vocab_size - 1})",
                                 "params")
        if params.lora is not None:  # multi-LoRA: the adapter must fit the model (ValueError naming the mismatch)
            params.lora.check(self.config, self.model.device, self.model.embed.weight.dtype)
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self.requests:
                request_id = next(self._ids)
        elif request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = Request(request_id, prompt, max_new_tokens, arrival=self.clock() if arrival is None else arrival,
                      n=n, serial=next(self._serials), params=params)
        self.requests[request_id] = req
        parent = self.requests.get(params.sibling_of) if params.sibling_of is not None else None
        if (parent is not None and parent in self.waiting and not parent.num_preemptions and n == 1
                and parent.prompt == req.prompt and parent.lora is req.lora and parent.n + 1 <= self.max_num_seqs):
            parent.siblings.append(req)  # forks off the parent's prompt when it is computed (`_fork_samples`)
            parent.n += 1
            req.sibling_of = parent
        else:
            self.waiting.append(req)
        return request_id

    def _get(self, request_id) -> Request:
        try:
            return self.requests[request_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request id {request_id!r}: known ids are "
                           f"{list(self.requests)[:10]}{' …' if len(self.requests) > 10 else ''}") from None

    def output(self, request_id) -> list[int]:
        """The tokens request `request_id` has produced so far."""
        return list(self._get(request_id).output)

    def request(self, request_id) -> Request:
        """The request's record (timestamps, preemptions, blocks)."""
        return self._get(request_id)

    def abort(self, request_id) -> None:
        """Drop a request, finished or not, and free its blocks."""
        req = self._get(request_id)
        if req.sibling_of is not None:  # a sibling still waiting for its parent's prompt
            req.sibling_of.siblings.remove(req)
            req.sibling_of.n -= 1
            req.sibling_of = None
        at = 0  # where the siblings waiting for this request's prompt queue on their own: in its place, or first
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            at = self.waiting.index(req)
            self.waiting.remove(req)
        for k, child in enumerate(req.siblings):
            child.sibling_of = None
            self.waiting.insert(at + k, child)
        req.n -= len(req.siblings)
        req.siblings = []
        self.blocks.release(req)
        del self.requests[request_id]
        self._finished.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finished_outputs(self) -> dict:
        """`{request_id: new token ids}` for the requests finished since the last call (then forgotten)."""
        out, self._finished = self._finished, {}
        for rid in out:
            self.requests.pop(rid, None)
        return out

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy new tokens of every prompt, in input order."""
        ids = []
        try:
            for p in prompts:
                ids.append(self.add_request(p, max_new_tokens))
        except ValueError:
            for i in ids:  # all or nothing: a bad prompt leaves no request of this call queued
                self.abort(i)
            raise
        return self._run_to_end(ids)

    def _run_to_end(self, ids: list) -> list[list[int]]:
        """Step until the requests `ids` have finished; their outputs, in order (then forgotten)."""
        while any(i not in self.requests or not self.requests[i].finished for i in ids):
            self.step()
        outs = [list(self.requests[i].output) for i in ids]
        for i in ids:
            self._finished.pop(i, None)
            self.requests.pop(i, None)
        return outs

    # -- scheduling ---------------------------------------------------------------------------------

    def _copy(self, copies: list[tuple[int, int]]) -> None:
        for src, dst in copies:
            self.cache.copy_block(src, dst)
            self.num_cow_copies += 1

    def _sample(self, req: Request, logits: torch.Tensor) -> int:
        params = req.params
        if params.temperature != 0.0 and req.generator is None:
            req.generator = torch.Generator(device=logits.device).manual_seed(params.seed)
        token = params.choose(logits, req.prompt, req.output, req.generator)
        if params.logprobs is not None:  # of the model's own distribution (before penalties and filters), as vLLM's
            lp = torch.log_softmax(logits.float(), -1)
            top = torch.topk(lp, params.logprobs) if params.logprobs else None
            alternatives = [] if top is None else list(zip(top.indices.tolist(), top.values.tolist()))
            params.logprob_entries.append((token, float(lp[token]), alternatives))
        return token

    def _fork_samples(self, parent: Request) -> list[Request]:
        """Parallel sampling: n - 1 more samples of `parent`'s prompt, sharing every block it has (its own
        `n` and the siblings that joined it, `add_request`)."""
        children = [Request((parent.request_id, k), parent.prompt, parent.max_new_tokens, arrival=parent.arrival,
                            params=parent.params.for_another_sequence(seed=parent.params.seed + k, sibling_of=None),
                            serial=next(self._serials))
                    for k in range(1, parent.n - len(parent.siblings))]
        for child in children:
            self.requests[child.request_id] = child
        children += parent.siblings
        for child in children:
            child.num_computed, child.block_hashes = parent.num_computed, list(parent.block_hashes)
            child.blocks = [self.blocks.pool.fork(b) for b in parent.blocks]
            child.sibling_of = None
            self.running.append(child)
        parent.siblings = []
        parent.n = 1
        return children

    def sample(self, prompt: Sequence[int], max_new_tokens: int, n: int, temperature: float,
               seed: int = 0) -> list[list[int]]:
        """`n` samples of one prompt (parallel sampling, the prompt's blocks shared); sample k is seeded `seed + k`."""
        rid = self.add_request(prompt, max_new_tokens, n=n, temperature=temperature, seed=seed)
        return self._run_to_end([rid] + [(rid, k) for k in range(1, n)])

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        computed = req.num_computed
        if self.preemption_mode == "swap" and not req.finished and computed:
            self._swap(req, out=True)
        self.blocks.release(req)  # recompute later (prompt + output so far), or swap back in
        if req.swapped is not None:
            req.num_computed = computed
        if req.finished:  # a padded row of a static batch: nothing to recompute
            req.padding = []
            return
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _swap(self, req: Request, out: bool) -> None:
        """Copy `req`'s computed blocks to host memory (`out`) or back into its new blocks; timed and counted."""
        sync(self.model.device)  # both ends: a GPU's copies run asynchronously
        start = time.perf_counter()
        if out:
            req.swapped = self.cache.swap_out(req.blocks[:blocks_needed(req.num_computed, self.block_size)])
        else:
            self.cache.swap_in(req.blocks, req.swapped)
        sync(self.model.device)
        self.swap_seconds += time.perf_counter() - start
        self.swap_bytes += sum(k.numel() * k.element_size() * 2 for k, _ in req.swapped)
        if not out:
            req.swapped = None

    def _view(self, req: Request, waiting: bool) -> dict:
        """The request as the scheduler sees it (plain ints). With `long_prefill_token_threshold`, a prefill is
        shown at most that many tokens from its end, so no step gives one prompt more than the threshold."""
        if waiting and req.swapped is not None:  # its computed tokens come back from host memory
            view = dict(id=req.serial, computed=req.num_computed, tokens=req.num_tokens, blocks=0, freeable=0,
                        seqs=req.n)
        elif waiting:
            computed, free_hits = self.blocks.peek(req)  # a waiting request holds no block
            view = dict(id=req.serial, computed=computed, tokens=req.num_tokens, blocks=computed // self.block_size
                        - free_hits, freeable=0, seqs=req.n)
        else:
            view = dict(id=req.serial, computed=req.num_computed, tokens=req.num_tokens,
                        blocks=self.blocks.writable(req), freeable=self.blocks.freeable(req), seqs=req.n)
        if self.long_prefill_token_threshold:
            view["tokens"] = min(view["tokens"], view["computed"] + self.long_prefill_token_threshold)
        return view

    def _schedule(self) -> list[tuple[Request, int]]:
        """Ask `self.scheduler` for this step's plan, check it, and carry it out (preempt, admit, give blocks)."""
        admit = not (self.policy == "static" and self.running)  # static: a new batch only when the last is done
        waiting = list(itertools.islice(self.waiting, self.max_num_seqs)) if admit else []
        plan = self.scheduler([self._view(r, False) for r in self.running], [self._view(r, True) for r in waiting],
                              self.blocks.num_available, self.block_size, self.max_num_batched_tokens,
                              self.max_num_seqs, self.enable_chunked_prefill)
        try:
            preempt = [int(i) for i in plan["preempt"]]
            run = [(int(i), int(n)) for i, n in plan["run"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"the scheduler returned {plan!r}; expected {{'preempt': [id, ...], "
                             f"'run': [[id, num_tokens], ...]}}") from None
        by_id = {r.serial: r for r in self.running}
        for i in preempt:
            if i not in by_id or by_id[i] not in self.running:
                raise ValueError(f"the scheduler's plan preempts request {i}, which is not running")
            self._preempt(by_id.pop(i))
        queued = {r.serial: r for r in waiting}
        if len({i for i, _ in run}) < len(run) or sum(n for _, n in run) > self.max_num_batched_tokens:
            raise ValueError(f"the scheduler's plan {run} runs a request twice or exceeds the token budget "
                             f"({self.max_num_batched_tokens})")
        scheduled: list[tuple[Request, int]] = []
        for i, n in run:
            req = by_id.get(i)
            if req is None and i in queued:
                req = queued[i]
                if req.swapped is None:
                    req.num_computed = req.num_cached_prompt = self.blocks.lookup(req)
                    if req.num_preemptions:  # recompute: everything the prefix cache does not hold, again
                        self.recomputed_tokens += req.num_tokens - req.num_computed
                if not 1 <= n <= req.num_tokens - req.num_computed or not self.blocks.can_grow(req, req.num_computed + n):
                    self.blocks.release(req)  # the prefix cache changed since the plan (an eviction): admit later
                    req.num_cached_prompt = 0
                    break
                self.waiting.remove(req)
                if req.num_preemptions == 0:
                    self.prompt_tokens += len(req.prompt)
                    self.prefix_hit_tokens += req.num_cached_prompt
                self.running.append(req)
            elif req is None:
                raise ValueError(f"the scheduler's plan runs request {i}, which is neither running nor waiting")
            if not 1 <= n <= req.num_tokens - req.num_computed:
                raise ValueError(f"the scheduler's plan runs {n} tokens of request {i}, which has "
                                 f"{req.num_tokens - req.num_computed} to compute")
            if not self.blocks.can_grow(req, req.num_computed + n):
                raise RuntimeError(f"the scheduler's plan gives request {i} {n} tokens, which need more blocks than "
                                   f"the {self.blocks.num_available} available: it allocated more blocks than are free")
            self._copy(self.blocks.grow(req, req.num_computed + n))
            if req.swapped is not None:
                self._swap(req, out=False)
            scheduled.append((req, n))
        if sum(r.n for r in self.running) > self.max_num_seqs:
            raise RuntimeError(f"the scheduler's plan runs {sum(r.n for r in self.running)} sequences; "
                               f"max_num_seqs is {self.max_num_seqs}")
        return scheduled

    # -- one step -----------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[StepOutput]:
        """Schedule → run → postprocess: one forward over every scheduled token (`ModelRunner`), then sampling and
        stop conditions; returns the tokens produced. The step's record goes to the observer (`StepStats`)."""
        scheduled = self._schedule()
        if not scheduled:
            if self.running or self.waiting:
                raise RuntimeError("the scheduler could schedule nothing although requests are pending "
                                   f"({len(self.running)} running, {len(self.waiting)} waiting, "
                                   f"{self.blocks.num_available} blocks available)")
            return []
        logits = self.runner.run(scheduled)  # [rows, vocab], made by the time it returns
        now = self.clock()
        events = self._postprocess(scheduled, logits, now)
        self.stats.on_step(self, scheduled, now)
        return events

    def _postprocess(self, scheduled: list[tuple[Request, int]], logits: torch.Tensor, now: float) -> list[StepOutput]:
        """The scheduled tokens are computed; every request that reached its last token samples the next one from
        its row of `logits`, and may finish. Static batching releases a batch once all of it is done."""
        events = []
        for req, row in self._advance(scheduled):
            event = self._emit(req, self._sample(req, logits[row]), now)
            if event is not None:
                events.append(event)
        if self.policy == "static" and all(r.finished for r in self.running):  # the whole batch is done
            for req in self.running:
                self.blocks.release(req)
                req.padding = []
            self.running = []
        return events

    def _advance(self, scheduled: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """Count the scheduled tokens as computed (their full blocks registered for prefix caching) and fork the
        other samples of an n > 1 request whose prompt is done; returns (request, its row of the logits) for each
        request that samples now (the runner's rows: one per request whose tokens reached its last)."""
        rows, row = [], 0
        for req, n in scheduled:
            req.num_computed += n
            self.blocks.register(req)
            if req.num_computed < req.num_tokens:  # a prefill chunk: nothing to sample yet
                continue
            rows.append((req, row))
            if req.n > 1:  # the prompt is done: fork the other samples; each samples its own first token
                rows += [(child, row) for child in self._fork_samples(req)]
            row += 1
        return rows

    def _emit(self, req: Request, token: int, now: float) -> StepOutput | None:
        """`token`, sampled for `req`: its next output token (None: a padded row's, thrown away). The request
        finishes at `max_new_tokens` or the EOS token, and leaves the batch with its blocks (static batching: later)."""
        if req.finished:  # a padded row of a static batch
            req.padding.append(token)
            if req.num_tokens >= self.config.max_seq_len:  # the model cannot take it further
                self._preempt(req)
            return None
        req.output.append(token)
        req.token_times.append(now)
        if req.first_token_time is None:
            req.first_token_time = now
        done = len(req.output) >= req.max_new_tokens or token == self.eos_token_id
        if done:
            req.finished = True
            self._finished[req.request_id] = list(req.output)
            if self.policy != "static":
                self.running.remove(req)
                self.blocks.release(req)
        return StepOutput(req.request_id, token, done)
