"""What week 19's checks run the student's code through, and judge it against: plain-data models of the rules.

- `judge_plan` (the invariants one step's plan must keep: among them the preemptions' order and amount,
  `preemptions_needed`) and `simulate` (a whole workload served step by step with the student's `schedule`, every
  plan judged, no model), on random `workload`s, `shared_step`s and `amount_step`s;
- `paged_case` (paged attention's inputs, the long case included), `exponentials` and `sdpa_ops` (what an
  observation's ops say about a softmax), `hash_bits` (a block hash's width);
- `CacheModel` (what a PrefixCache must do, as sets and lists) and `cache_trial` (random operations on the
  student's PrefixCache against it);
- `contiguous_reference` (what paged attention must equal), `context_model` (a tiny model whose next token
  depends on the context), `engine_workload` and `step_workload` (engine configurations and queues), and
  `lib_parts` (which of an engine's parts are lib's own).

Separate from grader/checks/week19.py, which holds `WEEK` and one `check_<name>` per exercise (what each must
do, and the routes it refuses): these are the check's machinery, long and rule-by-rule, and read apart from it.
Nothing here calls the student's code except through the function or class it is given.
"""
from __future__ import annotations

import copy
import math
import random

import torch

from grader.checks import seed_note
from lib.batching import paged as ref
from lib.attn.attention import gqa_attention


def expect_error(fn, kind, what: str) -> Exception:
    try:
        fn()
    except NotImplementedError:
        raise
    except kind as e:
        return e
    except Exception as e:  # noqa: BLE001  (the wrong kind is judged below)
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}; expected a {kind.__name__}") from None
    raise AssertionError(f"{what} did not raise; expected a {kind.__name__}")


def contiguous_reference(q, k_pool, v_pool, tables, lens):
    """What contiguous attention gives, one sequence at a time (the check's reference, outside the observation)."""
    _, hkv, bs, d = k_pool.shape
    flat_k = k_pool.permute(0, 2, 1, 3).reshape(-1, hkv, d)  # [slots, Hkv, d]
    flat_v = v_pool.permute(0, 2, 1, 3).reshape(-1, hkv, d)
    outs = []
    for i, n in enumerate(lens):
        slots = ref.slot_mapping(tables[i], 0, n, bs)
        k = flat_k[slots].transpose(0, 1)[None]  # [1, Hkv, n, d]
        v = flat_v[slots].transpose(0, 1)[None]
        outs.append(gqa_attention(q[i][None, :, None], k, v)[0, :, 0])
    return torch.stack(outs)  # [B, H, d]


LONG_CASE = 4  # paged attention's case with one long sequence: a whole row of one KV head's keys is more than it may hold


def paged_case(g: torch.Generator, case: int, d: int, long_keys: tuple[int, int] = (4500, 5000)) -> dict:
    """Paged attention's case `case` (0-4) with head size `d`: the arguments (q, k_pool, v_pool, block_tables,
    context_lens), each sequence's blocks (`tables`), `lens`, block size `bs`, heads `h`, KV heads `hkv`, batch `b`.
    Every run: a GQA group of 2 (case 0), MHA (1), groups of 3 to 6 (2), any (3), and the long case (4): B = 2, one
    sequence of `long_keys` (4500-5000) keys, GQA groups of 64 query heads (1 or 2 KV heads). Table entries past each end name the 3 blocks no sequence holds (to be
    ignored, or read and masked: either way no sequence's block is read for them)."""
    heads = [(4, 2), (4, 4), (6, 1), (6, 3), (8, 2), (8, 4), (9, 3)]
    options = {0: [(4, 2), (6, 3), (8, 4)], 1: [(4, 4)], 2: [(6, 1), (8, 2), (9, 3)], 3: heads,
               LONG_CASE: [(64, 1), (128, 2)]}[case]  # long: groups of 64, whose row of scores outweighs a row of keys
    h, hkv = options[int(torch.randint(0, len(options), (1,), generator=g))]
    if case == LONG_CASE:
        bs, b = [16, 32][int(torch.randint(0, 2, (1,), generator=g))], 2
        lens = torch.tensor([int(torch.randint(long_keys[0], long_keys[1] + 1, (1,), generator=g)), int(torch.randint(1, 300, (1,), generator=g))])
    else:
        bs = [1, 7, 16, int(torch.randint(2, 33, (1,), generator=g))][case]
        b = int(torch.randint(3, 7, (1,), generator=g))
        lens = torch.randint(1, 1200, (b,), generator=g)
        lens[0] = int(torch.randint(1500, 2001, (1,), generator=g))  # one long sequence
        lens[1] = 1
        lens[2] = bs * int(torch.randint(1, 40, (1,), generator=g))  # one fills its last block exactly
    lens = lens[torch.randperm(b, generator=g)].tolist()
    need = [ref.blocks_needed(n, bs) for n in lens]
    nb = sum(need) + 3
    k_pool = torch.randn(nb, hkv, bs, d, generator=g)
    v_pool = torch.randn(nb, hkv, bs, d, generator=g)
    perm = torch.randperm(nb, generator=g).tolist()
    tables, at = [], 0
    for k in need:
        tables.append(perm[at:at + k])
        at += k
    spare = torch.tensor(perm[at:])
    block_tables = spare[torch.randint(0, len(spare), (b, max(need) + 2), generator=g)]
    for i, t in enumerate(tables):
        block_tables[i, :len(t)] = torch.tensor(t)
    q = torch.randn(b, h, d, generator=g)
    return dict(args=(q, k_pool, v_pool, block_tables, torch.tensor(lens)), tables=tables, lens=lens, bs=bs, h=h,
                hkv=hkv, b=b)


def paged_one_score(c: dict, value: float, g: torch.Generator) -> tuple:
    """`paged_case`'s arguments with one key per sequence and KV head, at a random position it holds, whose score
    against its group's first query head is `value` (past 709, exp overflows even float64 without a max)."""
    q, k_pool, v_pool, block_tables, lens = c["args"]
    k_pool, (bs, d, group) = k_pool.clone(), (c["bs"], q.shape[-1], c["h"] // c["hkv"])
    for i, (table, n) in enumerate(zip(c["tables"], c["lens"])):
        for j in range(c["hkv"]):
            at = int(torch.randint(0, n, (1,), generator=g))
            x = q[i, j * group].double()
            k_pool[table[at // bs], j, at % bs] = (x * (value * d ** 0.5 / float(x @ x))).to(k_pool.dtype)
    return q, k_pool, v_pool, block_tables, lens


# Ops that compute an exponential (exact names: a prefix "aten.exp" also matches aten.expand), and the ops SDPA runs
# as: its fused kernels, or its math path on 3-d inputs, whose softmax is aten._safe_softmax (torch.softmax is
# aten._softmax).
_EXPONENTIALS = {"aten.exp", "aten.exp_", "aten.exp2", "aten.exp2_", "aten.special_exp2", "aten.pow", "aten._softmax",
                 "aten.softmax", "aten.logsumexp", "aten.sigmoid"}


def exponentials(obs) -> list[str]:
    """The ops of an observation that compute an exponential."""
    return sorted(op for op in obs.ops if op in _EXPONENTIALS)


def sdpa_ops(obs) -> list[str]:
    """The ops of an observation that are scaled_dot_product_attention's."""
    return sorted(op for op in obs.ops if op.startswith(("aten._scaled_dot_product", "aten.scaled_dot_product"))
                  or op == "aten._safe_softmax")


def blocks_to_grow(view: dict, n: int, block_size: int) -> int:
    return max(0, ref.blocks_needed(view["computed"] + n, block_size) - view["blocks"])


def preemptions_needed(running: list[dict], free: int, bs: int, budget: int) -> int:
    """How many running requests a step must preempt: serving the running ones oldest first, each its tokens left
    (cut to the budget left), the newest still running is preempted while the request served needs more blocks than
    are free — the request itself last (then nobody after it runs)."""
    alive, victims, i = list(running), 0, 0
    while i < len(alive) and budget > 0:
        req = alive[i]
        n = min(req["tokens"] - req["computed"], budget)
        need = blocks_to_grow(req, n, bs)
        while need > free:
            victim = alive.pop()
            victims += 1
            free += victim["freeable"]
            if victim is req:
                return victims
        free, budget, i = free - need, budget - n, i + 1
    return victims


def judge_plan(plan, running: list[dict], waiting: list[dict], free: int, bs: int, budget: int, max_seqs: int,
                chunked: bool, where: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The invariants one step's plan must keep; returns (preempted ids, [(id, n)])."""
    assert isinstance(plan, dict) and set(plan) >= {"preempt", "run"}, (
        f"{where}: schedule returned {plan!r}; expected a dict {{'preempt': [id, ...], 'run': [[id, n], ...]}}")
    assert all(type(plan[k]) in (list, tuple) for k in ("preempt", "run")), (
        f"{where}: schedule returned {plan!r}; 'preempt' and 'run' must be lists (plain data, not generators or "
        f"other lazy objects)")
    try:
        preempt = [int(i) for i in plan["preempt"]]
        run = [(int(i), int(n)) for i, n in plan["run"]]
    except (TypeError, ValueError):
        raise AssertionError(f"{where}: schedule returned {plan!r}; 'preempt' must be a list of request ids and "
                             f"'run' a list of [id, num_tokens] pairs") from None
    views = {r["id"]: r for r in running + waiting}
    run_ids = [i for i, _ in run]
    assert len(set(run_ids)) == len(run_ids), f"{where}: the plan runs a request twice: {run}"
    unknown = [i for i in run_ids + preempt if i not in views]
    assert not unknown, f"{where}: the plan names request ids {unknown} that are neither running nor waiting"
    for i, n in run:
        left = views[i]["tokens"] - views[i]["computed"]
        assert 1 <= n <= left, f"{where}: the plan runs {n} tokens of request {i}, which has {left} left to compute"
    total = sum(n for _, n in run)
    assert total <= budget, (f"{where}: the plan runs {total} tokens; the token budget is {budget} "
                             f"(max_num_batched_tokens): cut the prefills to what is left of it")
    # preemption: the newest running requests, newest first, and only requests that are running
    running_ids = [r["id"] for r in running]
    assert all(i in running_ids for i in preempt), f"{where}: the plan preempts {preempt}, not all of them running"
    newest = running_ids[::-1][:len(preempt)]
    assert preempt == newest, (
        f"{where}: the plan preempts {preempt}; running (oldest first) is {running_ids}: preempt the most recently "
        f"admitted request first ({newest}), so the oldest requests keep their blocks and finish")
    assert not set(preempt) & set(run_ids), f"{where}: the plan both preempts and runs {set(preempt) & set(run_ids)}"
    admitted_now = [i for i in run_ids if i not in running_ids]
    assert not (preempt and admitted_now), (
        f"{where}: the plan preempts {preempt} and admits {admitted_now} from the waiting queue in the same step: a "
        f"preempted request goes back to the queue's front and must resume before later arrivals, so a step that "
        f"is short of blocks admits nobody")
    # blocks: never more than are free (plus what the preempted requests give back)
    need = sum(blocks_to_grow(views[i], n, bs) for i, n in run)
    have = free + sum(views[i]["freeable"] for i in preempt)
    held = sum(views[i]["blocks"] for i in preempt)
    assert need <= have, (f"{where}: the plan needs {need} new blocks; {free} are free"
                          f"{f' and the preempted give back {have - free}' if preempt else ''}: a request that needs a "
                          f"block when none is free must preempt (the newest running request) or wait"
                          f"{f'; a preempted request gives back its freeable blocks ({have - free}), not all it holds ({held}): blocks it shares with others (prefix caching) stay' if held > have - free else ''}")
    # the amount: one request at a time, newest first, only while the blocks do not suffice
    needed = preemptions_needed(running, free, bs, budget)
    assert len(preempt) <= needed, (
        f"{where}: the plan preempts {preempt}; preempting {running_ids[::-1][:needed]} already frees the blocks the "
        f"running requests it serves need (new blocks {need}, free {free}): preempt the newest running request only "
        f"while the request being served does not fit, one at a time, and give the others their tokens")
    assert len(preempt) >= needed, (
        f"{where}: the plan preempts {preempt or 'nobody'}; serving the running requests {running_ids} oldest first "
        f"(each its tokens left, cut to the budget) needs {needed} preemption(s), newest first: "
        f"{running_ids[::-1][:needed]} — a request that does not fit is not skipped: the newest running request is "
        f"preempted while it does not fit, and it is preempted itself when it is the newest left")
    # running requests first, oldest first; waiting ones first come first served
    kept = [i for i in running_ids if i not in preempt]
    ran = [i for i in run_ids if i in kept]
    assert ran == kept[:len(ran)], (f"{where}: of the running requests {kept} (oldest first) the plan runs {ran}: "
                                    f"serve the running requests oldest first, skipping none")
    if len(ran) < len(kept):  # (preempting frees what the others need: red team 11b's scheduler skipped them then)
        assert total == budget, (
            f"{where}: running requests {kept[len(ran):]} got no tokens although the plan leaves "
            f"{budget - total} of the budget unused{f' (after preempting {preempt}, the others fit)' if preempt else ''}")
    spent, amounts = 0, dict(run)  # each running request, oldest first, takes all it can use of the budget left
    for i in ran:  # (red team 13b's #6: a fair share of a running prefill's budget went to later arrivals)
        left = views[i]["tokens"] - views[i]["computed"]
        assert amounts[i] == min(left, budget - spent), (
            f"{where}: running request {i} gets {amounts[i]} tokens with {left} left to compute and {budget - spent} of "
            f"the budget left at its turn (running requests oldest first): a running request takes as much of the "
            f"budget left as it can use before the next one, and before any waiting request is admitted")
        spent += amounts[i]
    waiting_ids = [r["id"] for r in waiting]
    admitted = [i for i in run_ids if i in waiting_ids]
    assert admitted == waiting_ids[:len(admitted)], (
        f"{where}: the plan admits {admitted} from the waiting queue {waiting_ids}: admit first come first served "
        f"(the queue's front first; a preempted request is at the front and resumes before later arrivals)")
    seqs = sum(views[i]["seqs"] for i in kept) + sum(views[i]["seqs"] for i in admitted)
    assert seqs <= max_seqs, f"{where}: the plan runs {seqs} sequences; max_num_seqs is {max_seqs}"
    for i, n in run:
        left = views[i]["tokens"] - views[i]["computed"]
        if n < left:
            assert chunked, (f"{where}: the plan runs {n} of the {left} tokens request {i} has left, with chunked "
                             f"prefill off: a prompt runs whole or waits")
            assert total == budget, (f"{where}: the plan cuts request {i} to {n} of its {left} tokens while "
                                     f"{budget - total} of the budget is unused: a chunk is cut by the budget only")
    if not preempt and waiting_ids[len(admitted):] and seqs < max_seqs and total < budget:
        nxt = views[waiting_ids[len(admitted)]]
        left = nxt["tokens"] - nxt["computed"]
        n = min(left, budget - total)
        fits = nxt["seqs"] + seqs <= max_seqs and blocks_to_grow(nxt, n, bs) <= free - need and (chunked or n == left)
        assert not fits, (f"{where}: waiting request {nxt['id']} could run {n} tokens (slots, {budget - total} of the "
                          f"budget and {free - need} free blocks are left) but the plan leaves it waiting"
                          f"{'; with chunked prefill on, admit a chunk of a prompt longer than the budget left' if n < left else ''}")
    return preempt, run


def workload(rng: random.Random, crowded: bool = False) -> dict:
    """A random workload; `crowded`: everyone arrives at once, decodes long, in a pool that makes several running
    requests preempt one another."""
    if crowded:
        bs, k = rng.choice([1, 2]), rng.randint(5, 8)
        prompts = [rng.randint(2, 10) for _ in range(k)]
        new = [rng.randint(8, 20) for _ in range(k)]
        longest = max(ref.blocks_needed(p + m - 1, bs) for p, m in zip(prompts, new))
        return dict(bs=bs, prompts=prompts, new=new, arrivals=[0] * k, num_blocks=longest + rng.randint(0, 3),
                    max_seqs=rng.randint(4, 6), budget=rng.randint(16, 32), chunked=True,
                    seqs=_seqs(rng, k))
    bs = rng.choice([1, 2, 4, 8])
    k = rng.randint(3, 9)
    prompts = [rng.randint(1, 30) for _ in range(k)]
    new = [rng.randint(1, 10) for _ in range(k)]
    longest = max(ref.blocks_needed(p + m - 1, bs) for p, m in zip(prompts, new))
    chunked = rng.random() < 0.75
    max_seqs = rng.randint(1, 5)
    budget = rng.randint(max(max_seqs, 4), 24) if chunked else max(p + m - 1 for p, m in zip(prompts, new)) + rng.randint(0, 8)
    seqs = _seqs(rng, k)
    max_seqs = max(max_seqs, max(seqs))
    return dict(bs=bs, prompts=prompts, new=new, arrivals=sorted(rng.randint(0, 12) for _ in range(k)),
                num_blocks=longest + rng.randint(0, 2 * longest), max_seqs=max_seqs, budget=max(budget, max_seqs),
                chunked=chunked, seqs=seqs)


def shared_step(rng: random.Random) -> dict:
    """One step's state in which some running requests share blocks (a prefix cache's hits): preempting one frees
    only its `freeable` blocks, which may be fewer than it holds — what the simulator, one request per prefix,
    never produces. Running requests decode or prefill; the pool has 0-2 free blocks."""
    bs = rng.choice([1, 2, 4])
    k = rng.randint(2, 5)
    running = []
    for i in range(k):
        computed = rng.randint(1, 12)
        tokens = computed + (1 if rng.random() < 0.7 else rng.randint(2, 8))
        blocks = ref.blocks_needed(computed, bs)
        running.append(dict(id=i, computed=computed, tokens=tokens, blocks=blocks, freeable=rng.randint(0, blocks),
                            seqs=1))
    waiting = [dict(id=k + j, computed=0, tokens=rng.randint(1, 10), blocks=0, freeable=0, seqs=1)
               for j in range(rng.randint(0, 2))]
    return dict(running=running, waiting=waiting, free=rng.randint(0, 2), bs=bs, budget=rng.randint(k, 24),
                max_seqs=k + 2)


def _seqs(rng: random.Random, k: int) -> list[int]:
    """Slots each request takes: n for a parallel-sampling request (n > 1 in about one request in four)."""
    return [rng.choice([1, 1, 1, 2, 3]) for _ in range(k)]


def simulate(schedule, w: dict, label: str, call=None) -> int:
    """Serve workload `w` with `schedule`, judging every plan; returns the steps taken. Plain data, no model:
    a request whose cache holds all its tokens produces one more, until it has its max_new_tokens. `call(schedule,
    *args)` makes each step's call (the check observes some of them)."""
    reqs = [dict(id=i, computed=0, tokens=p, blocks=0, out=0) for i, p in enumerate(w["prompts"])]

    def view(r):
        return dict(id=r["id"], computed=r["computed"], tokens=r["tokens"], blocks=r["blocks"], freeable=r["blocks"],
                    seqs=w["seqs"][r["id"]])

    waiting, running, free, step = [], [], w["num_blocks"], 0
    arrived = 0
    limit = 20 * sum(p + m for p, m in zip(w["prompts"], w["new"])) + 20
    while arrived < len(reqs) or waiting or running:
        while arrived < len(reqs) and w["arrivals"][arrived] <= step:
            waiting.append(reqs[arrived])
            arrived += 1
        if not (waiting or running):
            step += 1
            continue
        where = f"{label}, step {step}"

        rv, wv = [view(r) for r in running], [view(r) for r in waiting[:w["max_seqs"]]]
        # the call gets its own copies: what it does to them (written back into the lists it was given, as the
        # isolated path does with a list argument) never reaches the views the plan is judged against (red team 10, p1)
        plan = (call or _plain_call)(schedule, copy.deepcopy(rv), copy.deepcopy(wv), free, w["bs"], w["budget"],
                                     w["max_seqs"], w["chunked"])
        preempt, run = judge_plan(plan, rv, wv, free, w["bs"], w["budget"], w["max_seqs"], w["chunked"], where)
        assert run, (f"{where}: the plan runs nothing although {len(running)} request(s) run and {len(waiting)} wait; "
                     f"the engine would stall")
        for i in preempt:  # back to the queue's front (the oldest preempted first), blocks freed, to be recomputed
            r = reqs[i]
            running.remove(r)
            free += r["blocks"]
            r["computed"] = r["blocks"] = 0
            waiting.insert(0, r)
        for i, n in run:
            r = reqs[i]
            if r in waiting:
                waiting.remove(r)
                running.append(r)
            grow = blocks_to_grow(view(r), n, w["bs"])
            free -= grow
            r["blocks"] += grow
            r["computed"] += n
            if r["computed"] == r["tokens"]:
                r["out"] += 1
                if r["out"] == w["new"][i]:
                    running.remove(r)
                    free += r["blocks"]
                else:
                    r["tokens"] += 1
        step += 1
        assert step <= limit, (f"{label}: not finished after {limit} steps ({[r['id'] for r in running]} running, "
                               f"{[r['id'] for r in waiting]} waiting): a request is starved {seed_note()}")
    assert free == w["num_blocks"], f"{label}: blocks leaked: {free} of {w['num_blocks']} free at the end"
    return step


def _plain_call(fn, *args, accept=None):
    return fn(*args)


def hash_bits(h) -> int:
    """How many bits a hash value carries: an int's magnitude, a bytes' or a hex string's length."""
    if isinstance(h, bool):
        return 1
    if isinstance(h, int):
        return abs(h).bit_length()
    if isinstance(h, (bytes, bytearray)):
        return 8 * len(h)
    if isinstance(h, str):
        return 4 * len(h) if all(c in "0123456789abcdefABCDEF" for c in h) else 8 * len(h)
    if isinstance(h, tuple):
        return sum(hash_bits(x) for x in h)
    return 64  # another hashable: its width is not ours to read


class CacheModel:
    """What a PrefixCache must do, as sets and lists: free blocks that cache nothing (any order), free cached
    blocks (least recently freed first), owners per block, hash -> (block, tokens)."""

    def __init__(self, n: int):
        self.uncached, self.lru, self.owners, self.cached = set(range(n)), [], {}, {}

    def key_of(self, block):
        return next((h for h, (b, _) in self.cached.items() if b == block), None)


def cache_trial(PrefixCache, rng: random.Random, n: int, steps: int, trial: int, call=None) -> int:
    """Random operations on a PrefixCache(n) against `CacheModel`; returns the lookup hits. `call(fn, *args)` makes
    each call into the student's code (the check observes some of them)."""
    do = call or _plain_call
    cache, model, log, hits = do(PrefixCache, n), CacheModel(n), [], 0
    hashes = [rng.getrandbits(62) for _ in range(6)]  # few hashes: registering one twice and colliding happen

    def where():
        return f"PrefixCache({n}), trial {trial}, after {log[-8:]} {seed_note()}"

    for _ in range(steps):
        touched = None  # the block whose owners this operation changed
        op = rng.choice(["allocate", "allocate", "free", "free", "fork", "register", "register", "lookup", "lookup",
                         "reuse"])
        if op == "allocate":
            if not model.uncached and not model.lru:
                e = expect_error(cache.allocate, Exception, f"{where()}: allocate() with every block owned (a block "
                                  f"in use is never evicted)")
                assert type(e).__name__ == "OutOfBlocksError", f"allocate() on a full pool raised {type(e).__name__}"
                continue
            block = do(cache.allocate, accept=sorted(model.uncached))  # any of them (set.pop's choice, say)
            log.append(f"allocate() -> {block}")
            if model.uncached:
                assert block in model.uncached, (
                    f"{where()}: allocate() returned {block}; a free block that caches nothing ({sorted(model.uncached)}) "
                    f"must go first: evict a cached block only when no other is free"
                    + (f" (block {block} is owned)" if block in model.owners else ""))
                model.uncached.discard(block)
            else:
                want = model.lru[0]
                assert block == want, (
                    f"{where()}: allocate() returned {block}; with no uncached block free it must evict the least "
                    f"recently freed cached block, {want} (free cached blocks, oldest first: {model.lru})"
                    + (f"; block {block} is in use by {model.owners[block]} owner(s)" if block in model.owners else ""))
                model.lru.pop(0)
                del model.cached[model.key_of(block)]
            model.owners[block] = 1
            touched = block
        elif op == "free" and model.owners:
            block = rng.choice(sorted(model.owners))
            do(cache.free, block)
            log.append(f"free({block})")
            touched = block
            model.owners[block] -= 1
            if not model.owners[block]:
                del model.owners[block]
                (model.lru.append if model.key_of(block) is not None else model.uncached.add)(block)
        elif op == "fork" and model.owners:
            block = rng.choice(sorted(model.owners))
            do(cache.fork, block)
            log.append(f"fork({block})")
            touched = block
            model.owners[block] += 1
        elif op == "register" and model.owners:
            block, h = rng.choice(sorted(model.owners)), rng.choice(hashes)
            tokens = [rng.randrange(4) for _ in range(3)]
            do(cache.register, block, h, tokens)
            log.append(f"register({block}, {h:#x}, {tokens})")
            if h not in model.cached and model.key_of(block) is None:
                model.cached[h] = (block, tuple(tokens))
        elif op in ("lookup", "reuse"):
            if op == "reuse" and model.lru:  # a cached block sitting among the free ones: a hit takes it back
                block = rng.choice(model.lru)
                h = model.key_of(block)
                tokens = list(model.cached[h][1])
            else:
                h = rng.choice(hashes)
                tokens = list(model.cached[h][1]) if h in model.cached and rng.random() < 0.6 else \
                    [rng.randrange(4) for _ in range(3)]
            got = do(cache.lookup, h, tokens)
            log.append(f"lookup({h:#x}, {tokens}) -> {got}")
            want = model.cached[h][0] if h in model.cached and model.cached[h][1] == tuple(tokens) else None
            assert got == want, (
                f"{where()}: lookup returned {got}; expected {want}" +
                (" (the hash is cached but for other tokens: a collision is a miss)" if want is None and h in model.cached
                 else " (the block was registered and has not been evicted, even if no request owns it now)"
                 if want is not None else " (nothing is cached under this hash)"))
            if got is not None:
                hits += 1
                if op == "reuse" or rng.random() < 0.5:
                    do(cache.fork, got)
                    log.append(f"fork({got})")
                    touched = got
                    if got in model.lru:
                        model.lru.remove(got)
                    model.owners[got] = model.owners.get(got, 0) + 1
        if touched is not None:  # the block this operation changed: its owners (the engine's copy-on-write reads them)
            got = do(cache.ref_count, touched)
            assert got == model.owners.get(touched, 0), (
                f"{where()}: ref_count({touched}) = {got}; expected {model.owners.get(touched, 0)} (its owners: "
                f"allocate gives 1, fork and a hit add 1, free takes 1; a free block, cached or not, has 0)")
        want_free = len(model.uncached) + len(model.lru)
        assert cache.num_free == want_free, (
            f"{where()}: num_free = {cache.num_free}; expected {want_free} (free blocks, cached or not: a hit on a "
            f"free cached block takes it back)")
    return hits


def lru_order(PrefixCache, rng: random.Random, low: int, high: int) -> None:
    """LRU order, spelled out, in a pool of `low` to `high` blocks (log-uniform; called with 3-8, 13-64 and 65-1024
    every run, past bounds hidden on the free cached blocks or the pool: FINDINGS6 #13-15): every block cached (token
    ids up to 2^17: lookups differing in bit 8-15 or 16 of one token miss), freed in a random order, one reused."""
    n = min(max(int(math.exp(rng.uniform(math.log(low), math.log(high + 1)))), low), high)
    cache = PrefixCache(n)
    blocks = [cache.allocate() for _ in range(n)]
    keys = [(rng.getrandbits(62), [rng.randrange(1 << 17) for _ in range(4)]) for _ in blocks]
    for block, (h, tokens) in zip(blocks, keys):
        cache.register(block, h, tokens)
    order = rng.sample(blocks, n)
    for block in order:
        cache.free(block)
    reused = order[rng.randrange(n)]
    h, tokens = keys[blocks.index(reused)]
    for bit in (rng.randrange(8, 16), 16):
        near = list(tokens)
        near[rng.randrange(len(near))] ^= 1 << bit
        assert (got := cache.lookup(h, near)) is None, (f"PrefixCache({n}): block {reused} cached for tokens {tokens}; lookup of its hash "
                             f"with tokens {near} (one token differs in bit {bit}) returned {got}: compare the "
                             f"tokens themselves, whole (a collision is a miss) {seed_note()}")
    assert cache.lookup(h, tokens) == reused, (f"PrefixCache({n}): block {reused}, registered and then freed, is "
                                               f"not found by lookup: a free cached block stays cached until evicted")
    cache.fork(reused)
    assert cache.num_free == n - 1, f"after fork({reused}) of a free cached block num_free = {cache.num_free}; expected {n - 1}"
    want = [b for b in order if b != reused]
    got = [cache.allocate() for _ in want]
    assert got == want, (f"PrefixCache({n}): every block cached and freed in the order {_short(order)}, block "
                         f"{reused} taken back by a hit; allocate() then evicted {_short(got)}; expected the least "
                         f"recently freed first: {_short(want)} {seed_note()}")


def _short(blocks: list) -> str:
    return str(blocks) if len(blocks) <= 40 else f"{blocks[:20]} ... {blocks[-20:]} ({len(blocks)} blocks)"


def lib_parts(parts: dict) -> list[str]:
    """How each part that is lib's own (or lib's code under another name) says so: through the isolation the
    child answers; in the notebook's process the code is fingerprinted here."""
    from grader.fingerprint import lib_name
    from grader.isolation import ChildProxy

    found = []
    for name, part in parts.items():
        proxy = getattr(part, "_remote", part)
        if isinstance(proxy, ChildProxy):
            found += proxy._session.reference_use([name]).values()
            continue
        members = [part] + (list(vars(part).values()) + list(part.__mro__[1:]) if isinstance(part, type) else [])
        for member in members:
            code = getattr(getattr(getattr(member, "__func__", member), "__wrapped__", member), "__code__", None)
            module = str(getattr(member, "__module__", "") or "")
            same = "lib" if module.startswith("lib.") else (lib_name(code) if code is not None else None)
            if same is not None:
                found.append(f"`{name}` is lib's own ({same if same != 'lib' else module})")
                break
    return found


def context_model(seed: int):
    """A tiny model whose next token depends on the context. `tiny_model`'s attention is too weak for that (its
    greedy tokens follow the last token alone: K/V written to the wrong slots would go unseen), so its attention
    projections are scaled up 8x: a prompt whose first 8 of 12 tokens change then changes the output (20 of 20
    random prompts, seed 3)."""
    from lib.modeling.llama import tiny_model

    model = tiny_model(seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj", "o_proj"):
                p.mul_(8.0)
    return model


def engine_workload(rng: random.Random, vocab: int, prefix_caching: bool) -> dict:
    """Prompts, new tokens and an engine configuration tight enough to preempt, with a budget small enough to
    chunk (and, for prefix caching, prompts that share a system prompt of whole blocks, some repeated)."""
    bs = rng.choice([2, 4])
    k = rng.randint(5, 7)
    if prefix_caching:
        system = [rng.randrange(vocab) for _ in range(bs * rng.randint(2, 3))]
        prompts = [system + [rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for _ in range(k)]
        prompts[rng.randrange(1, k)] = list(prompts[0])  # the same prompt twice: its whole prefix is cached
    else:
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(3, 20))] for _ in range(k)]
    new = rng.randint(4, 8)
    longest = max(ref.blocks_needed(len(p) + new - 1, bs) for p in prompts)
    max_seqs = rng.randint(3, 4)
    return dict(prompts=prompts, new=new, kwargs=dict(
        num_blocks=longest + rng.randint(1, 3), block_size=bs, max_num_seqs=max_seqs,
        max_num_batched_tokens=rng.randint(max(max_seqs, 6), 12), enable_chunked_prefill=True,
        enable_prefix_caching=prefix_caching))


def step_workload(rng: random.Random, unchunked: bool = False) -> dict:
    """Requests queued at once, slots and a budget (chunked prefill on or off), blocks to spare. `unchunked`: chunked
    prefill off, and two prompts that cannot both be admitted in one step (a waiting prompt longer than the budget
    left, every run: the case a simulation's `if not chunked and prompt > left` must meet)."""
    k = rng.randint(2, 8) if unchunked else rng.randint(1, 8)
    prompts = [rng.randint(30, 40) if unchunked else rng.randint(1, 40) for _ in range(k)]
    new = [rng.randint(1, 8) for _ in range(k)]
    seqs = rng.randint(2, 4) if unchunked else rng.randint(1, 4)
    chunked = not unchunked and rng.random() < 0.7
    budget = (rng.randint(max(seqs, 4), 24) if chunked
              else max(p + n - 1 for p, n in zip(prompts, new)) + rng.randint(0, 8))  # a recompute fits (engine rule)
    return dict(prompt_lens=prompts, new_tokens=new, max_num_seqs=seqs, token_budget=budget, chunked_prefill=chunked)
