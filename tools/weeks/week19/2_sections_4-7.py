# %% [markdown]
# ## 4. Block tables and paged attention
#
# A sequence's **block table** lists its physical blocks in logical order: its first `block_size` tokens
# live in block `table[0]`, the next ones in `table[1]`, and so on. The pool numbers its slots block by block
# (block `b` holds slots `b·block_size … b·block_size + block_size − 1`). The engine writes each new token's
# key and value to its slot (the **slot mapping**) and reads a sequence's keys through its table.
#
# **Exercise 5 (derive).** Work out, from the table and `block_size`, the slot that holds logical position
# `p` of a sequence; then write `slot_mapping(block_table, start, num_tokens, block_size)`: the slots (int64
# tensor `[num_tokens]`) of positions `start … start + num_tokens − 1`. (The derivation is spelled out after
# the check.)

# %% nbgrader={"grade": false, "grade_id": "slot_mapping", "locked": false, "schema_version": 3, "solution": true, "task": false}
def slot_mapping(block_table: list[int], start: int, num_tokens: int, block_size: int) -> torch.Tensor:
    """Physical slots of logical positions start .. start + num_tokens - 1."""
    ### BEGIN SOLUTION
    pos = torch.arange(start, start + num_tokens)  # [num_tokens]
    table = torch.tensor(block_table, dtype=torch.int64)
    return table[pos // block_size] * block_size + pos % block_size
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_slot_mapping", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_slot_mapping(slot_mapping)

# %% [markdown]
# *The derivation.* Position `p` is in the table's entry `p // block_size` (whole blocks before it) at offset
# `p % block_size` inside that block, so its slot is `table[p // block_size] · block_size + p % block_size` —
# vLLM's `slot_mapping` is exactly this, computed for every new token of a step.

# %% [markdown]
# Now the attention. At a decode step every running sequence has **one** query and its own number of
# keys, scattered over the pool. `paged_attention(q, k_pool, v_pool, block_tables, context_lens)` takes
#
# * `q [B, n_heads, head_dim]` (one query per sequence),
# * `k_pool, v_pool [num_blocks, n_kv_heads, block_size, head_dim]` (one layer's pool),
# * `block_tables` int64 `[B, max_blocks]` (a row may end with entries that mean nothing: ignore them),
# * `context_lens` int64 `[B]` (how many keys each sequence has, its new token's included),
#
# and returns `[B, n_heads, head_dim]`, equal to ordinary attention over each sequence's keys (query head
# `h` reads KV head `h // (n_heads // n_kv_heads)`, as in week 16). `q` and the pools may be bf16 or fp16 (a
# server's cache usually is): the result has `q`'s dtype and is as accurate as an fp32 computation rounded once at
# the end — upcast each block you read (`.float()`), keep the scores, the running statistics and the output in fp32,
# and return `.to(q.dtype)`.
#
# **Exercise 6 (design).** Write it **without** copying each sequence's keys into a contiguous `[B, max_len]`
# tensor: that copy is exactly the memory paging saves, and the vLLM kernel never makes it. Read a block
# (or a few) of every sequence at a time — `k_pool[block_tables[:, j]]` is `[B, n_kv_heads, block_size,
# head_dim]` — mask the positions at or past `context_lens`, and combine the blocks with the **online
# softmax** of week 17 (running max `m`, running sum `l`, running output). The check compares against
# contiguous attention (≤ 1e-5) on ragged lengths, random block sizes, head sizes and batches (GQA and MHA
# every run), and in bf16 and fp16 with 12,000–16,000 keys (within the dtype's rounding); it watches the peak memory (less than half a contiguous copy of the longest sequence's K and V,
# and with one sequence of ~5,000 keys and groups of 64 query heads less than half of one KV head's keys or of its
# group's scores: no whole row per head, no scores kept for a second pass), the
# longest reduction (no softmax over a whole row), how often each block of K is read (once per KV head: the
# query heads of a GQA group share it, so read it once for all of them — not once per query head, not a first
# pass for the max and a second for the exponentials, not twice by chunks of positions that split a block) and
# your inputs (unchanged); no SDPA, no `lib`, no numpy, and every
# tensor you make on the inputs' device (`device=q.device`: the check also runs it on `meta` tensors).

# %% nbgrader={"grade": false, "grade_id": "paged_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor) -> torch.Tensor:
    """One decode query per sequence, attending over its keys and values read from the block pool."""
    ### BEGIN SOLUTION
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    group = h // hkv
    dev = q.device  # every tensor made here lives where the inputs do (a GPU's, in a server)
    per_step = max(1, 32 // bs)  # blocks read at once: about 32 keys
    qg = q.reshape(b, hkv, group, d).float() / math.sqrt(d)  # [B, Hkv, group, d]
    m = torch.full((b, hkv, group), float("-inf"), device=dev)
    l = torch.zeros(b, hkv, group, device=dev)
    acc = torch.zeros(b, hkv, group, d, device=dev)
    for j0 in range(0, block_tables.shape[1], per_step):  # columns past a sequence's end are masked out
        j1 = min(j0 + per_step, block_tables.shape[1])
        pos = torch.arange(j0 * bs, j1 * bs, device=dev)  # logical positions of these blocks
        valid = pos[None, :] < context_lens[:, None]  # [B, c * bs]
        ids = torch.where(valid[:, ::bs], block_tables[:, j0:j1], 0)  # past the end: any block, masked
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()  # [B, Hkv, c * bs, d]
        vb = v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
        s = (qg @ kb.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # a sequence with nothing valid yet
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vb
        m = m_new
    return (acc / l[..., None]).reshape(b, h, d).to(q.dtype)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_paged_attention", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_paged_attention(paged_attention)

# %% [markdown]
# **Milestone.** On SmolLM2's shapes (9 query heads, 3 KV heads of 64), ragged lengths and shuffled
# blocks: your `paged_attention` against contiguous attention.

# %%
g = torch.Generator().manual_seed(1)
for bs in (1, 16):
    lens = [1, 37, 300, 129, 16]
    need = [blocks_needed(n, bs) for n in lens]
    # drawn on the CPU (the seeded generator lives there), then put where a server's pool lives: the model's device
    k_pool = torch.randn(sum(need) + 4, cfg.n_kv_heads, bs, cfg.head_dim, generator=g).to(dev)
    v_pool = torch.randn_like(k_pool)
    perm = torch.randperm(k_pool.shape[0], generator=g).tolist()
    tables = [perm[sum(need[:i]):sum(need[:i + 1])] for i in range(len(lens))]
    q = torch.randn(len(lens), cfg.n_heads, cfg.head_dim, generator=g).to(dev)
    out = paged_attention(q, k_pool, v_pool, ref.block_table_tensor(tables, dev), torch.tensor(lens, device=dev))
    err = 0.0
    for i, n in enumerate(lens):
        slots = slot_mapping(tables[i], 0, n, bs).to(dev)
        k = k_pool.permute(0, 2, 1, 3).reshape(-1, cfg.n_kv_heads, cfg.head_dim)[slots].transpose(0, 1)[None]
        v = v_pool.permute(0, 2, 1, 3).reshape(-1, cfg.n_kv_heads, cfg.head_dim)[slots].transpose(0, 1)[None]
        err = max(err, (gqa_attention(q[i][None, :, None], k, v)[0, :, 0] - out[i]).abs().max().item())
    print(f"block size {bs:2d}: lengths {lens}, max |paged - contiguous| = {err:.1e}")

# %% [markdown]
# **What reading in place costs.** The vLLM paper measured its paged kernel against the contiguous kernel of
# FasterTransformer; seed 001 quotes the cost as "20-26% higher attention kernel latency (block table lookup,
# non-contiguous memory access)". Measure yours on this machine: your `paged_attention`
# against attention over the same keys and values stored contiguously per sequence (`gqa_attention`: the same
# matmuls and softmax, one call for the whole batch), a decode batch of 8 sequences of SmolLM2's shapes (one
# layer), blocks of 16 scattered over the pool, at several context lengths. The two take turns, round by round,
# so that whatever else the machine does falls on both (`lib.bench.timing`); read the best of the repeats, their
# spread and the load.

# %%
CONTEXTS = [256, 1024, 4096, 8192] if FULL else [256, 1024, 4096]
B_DECODE, BS = 8, 16
g = torch.Generator().manual_seed(4)
conditions = Conditions.now()
latency = {}
for T in CONTEXTS:
    n_blocks = B_DECODE * T // BS
    k_pool = torch.randn(n_blocks, cfg.n_kv_heads, BS, cfg.head_dim, generator=g).to(dev)
    v_pool = torch.randn_like(k_pool)
    tables = torch.randperm(n_blocks, generator=g).reshape(B_DECODE, T // BS).to(dev)  # scattered blocks
    lens = torch.full((B_DECODE,), T, device=dev)
    q = torch.randn(B_DECODE, cfg.n_heads, cfg.head_dim, generator=g).to(dev)
    # the same keys and values, each sequence's stored contiguously: [B, n_kv_heads, T, head_dim]
    k, v = (pool[tables].permute(0, 2, 1, 3, 4).reshape(B_DECODE, cfg.n_kv_heads, T, cfg.head_dim).contiguous()
            for pool in (k_pool, v_pool))
    latency[T] = interleaved({"contiguous": lambda q=q, k=k, v=v: gqa_attention(q[:, :, None], k, v),
                              "paged (yours)": lambda q=q, kp=k_pool, vp=v_pool, t=tables, n=lens:
                              paged_attention(q, kp, vp, t, n)}, repeats=7 if FULL else 5, device=dev)
conditions.done()
print(f"decode attention, batch {B_DECODE}, {cfg.n_heads} query heads / {cfg.n_kv_heads} KV heads of {cfg.head_dim}, "
      f"blocks of {BS}; best of the repeats (ms), worst / best in brackets")
print(f"{'context':>8} {'contiguous':>15} {'paged (yours)':>15} {'paged cost':>11}")
for T, t in latency.items():
    c, p = t["contiguous"], t["paged (yours)"]
    print(f"{T:>8} {c.best * 1e3:9.3f} ({c.spread:.2f}) {p.best * 1e3:9.3f} ({p.spread:.2f}) {p.best / c.best - 1:+11.0%}")
print(conditions.line())
alerts = [not_monotone(CONTEXTS, [latency[T][name].best for T in CONTEXTS], f"{name} attention's time")
          for name in ("contiguous", "paged (yours)")]  # more keys cannot take less time
alerts.append(warning([x for t in latency.values() for x in t.values()], conditions))
print("\n".join(a for a in alerts if a))

# %% [markdown]
# Compare the last column with the seed's "20-26%". That figure is for a fused CUDA kernel, where a block-table
# lookup is a few instructions inside one kernel that reads every block once. Your function issues a handful of
# torch operations for each chunk of blocks, and on a CPU each operation has a fixed cost (the interpreter, the
# dispatcher, a small matmul that uses the cores badly) on top of its arithmetic. How much of that a chunk
# amortizes is what the column shows: a kernel that reads the table inside a fused loop (vLLM's, or FlashInfer's)
# pays for the indirection only, which is how the paper's figure can be that small.

# %% [markdown]
# Check: `pytest weeks/19 -k "ex05 or ex06"`

# %% [markdown]
# ## 5. The engine
#
# `lib/batching/engine.py` puts the pieces together. It is not short (the first code cell printed its length); the part
# to read is `LLMEngine.step`, schedule → run → postprocess: `_schedule` carries out the scheduler's plan,
# `ModelRunner.run` (`lib/batching/model_runner.py`) runs the forward, `_postprocess` samples and finishes. Each **step**:
#
# 1. the scheduler picks the running requests (one token each for a decode, a chunk of the prompt for a
#    prefill), then admits waiting ones while there are free slots, token budget and blocks;
# 2. the allocator gives each one the blocks its new tokens need;
# 3. all scheduled tokens of all requests go through the model in **one forward**, flattened to
#    `[1, N]`: the linear layers see every token at once, and each layer writes its new keys and values
#    to their slots (`lib.batching.paged.PagedKVCache`) and attends — decodes together through `paged_attention`,
#    prefills over their own blocks;
# 4. each request whose tokens are all computed gets its next token (greedy); finished ones free their blocks.
#
# **Milestone.** Requests batched together give exactly the tokens `generate` gives each one alone.

# %%
prompts = PROMPTS[:8] if FULL else PROMPTS[:3]
NEW = 32 if FULL else 8
alone = [lib_generate(model, torch.tensor([p]), NEW)[0, len(p):].tolist() for p in tqdm(prompts, desc="alone")]
engine = LLMEngine(model, num_blocks=64, block_size=16, max_num_seqs=8)
batched = engine.generate(prompts, NEW)
print("identical to generate on each alone:", batched == alone)
print("requests per forward:", [len(s) for s in engine.trace])
print(repr(tok.decode(prompts[0])), "->", repr(tok.decode(batched[0])))
assert batched == alone

# %% [markdown]
# **Throughput against batch size.** A decode step of a small batch is bound by memory bandwidth: it
# reads every weight once whatever the batch (week 16, section 6). So a step with 8 requests should cost
# little more than a step with 1, and tokens per second should grow almost linearly with the batch — until
# the matmuls become compute-bound. Measured (decode steps only, after the prefill; the batch sizes take turns,
# round by round, and the best round counts). The roofline uses the best streaming bandwidth measured on this
# class of machine (`lib.bench.records.best_bandwidth`: the committed records, this machine's earlier runs and this
# run), never one run's reading alone: a shared machine's probe moves from minute to minute.

# %%
BATCHES = [1, 2, 4, 8, 16, 32] if FULL else [1, 4, 8, 16]
STEPS, REPEATS = (16, 3) if FULL else (4, 2)


def decoding_engine(batch):
    """An engine whose `batch` requests are past their prefill, with tokens left for every timed round."""
    eng = LLMEngine(model, num_blocks=8 * batch, block_size=16, max_num_seqs=batch, max_num_batched_tokens=1024)
    for p in PROMPTS[:batch]:
        eng.add_request(p, STEPS * REPEATS + 2)
    eng.step()  # the prefill of every request
    return eng


engines = {b: decoding_engine(b) for b in tqdm(BATCHES, desc="prefill")}
conditions = Conditions.now()
timed = interleaved({f"batch {b}": lambda e=engines[b]: [e.step() for _ in range(STEPS)] for b in BATCHES},
                    repeats=REPEATS, warmup=0, device=dev)
bandwidth = rl.measure_bandwidth(128, repeats=3, device=dev)  # a streaming read of 128 MiB on the model's device
conditions.done()
rates = {b: (b * STEPS / timed[f"batch {b}"].best, timed[f"batch {b}"].best / STEPS) for b in BATCHES}  # tok/s, s/step
weight_bytes = rl.weight_bytes_per_token(model)  # every matmul weight once, the tied embedding as the LM head
roof_bandwidth, roof_from = records.best_bandwidth(measured_now=bandwidth)
roofline = weight_bytes / roof_bandwidth  # s per step to read every weight once
print(f"this machine ({records.machine()['class']}): roofline {weight_bytes / 1e6:.0f} MB of weights at "
      f"{roof_bandwidth / 1e9:.1f} GB/s = {roofline * 1e3:.1f} ms per step, any batch")
print(f"  the bandwidth: {roof_from}; the probe read {bandwidth / 1e9:.1f} GB/s now")
print(f"{'batch':>6} {'ms/step':>8} {'spread':>7} {'x roofline':>10} {'tok/s':>7} {'vs batch 1':>10} {'of linear':>9}")
for b, (rate, step) in rates.items():
    print(f"{b:>6} {step * 1e3:8.1f} {timed[f'batch {b}'].spread:6.2f}x {step / roofline:9.1f}x {rate:7.1f} "
          f"{rate / rates[1][0]:9.1f}x {rate / rates[1][0] / b:9.0%}")
print(conditions.line())
alerts = [not_monotone(BATCHES, [rates[b][1] for b in BATCHES], "the decode step's time"),  # more rows cannot cost less
          warning(timed, conditions)]
if min(step for _, step in rates.values()) < roofline:
    alerts.append("measurement problem: a step faster than reading the weights once — the bandwidth is understated")
print("\\n".join(a for a in alerts if a))
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].plot(BATCHES, [rates[b][0] for b in BATCHES], "o-", label="measured")
ax[0].plot(BATCHES, [rates[1][0] * b for b in BATCHES], "--", color="gray", label="linear in batch")
ax[0].set_xlabel("batch (requests decoding together)"); ax[0].set_ylabel("decode tokens / s"); ax[0].legend()
ax[1].plot(BATCHES, [rates[b][1] * 1e3 for b in BATCHES], "o-")
ax[1].set_xlabel("batch"); ax[1].set_ylabel("ms per decode step"); ax[1].set_ylim(bottom=0)
plt.tight_layout(); plt.show()

# %% [markdown]
# Read the last two columns. Throughput grows with the batch — that is the reason servers batch — but
# **not** in proportion. The bandwidth argument above assumed a step costs about the time to read the weights;
# the `x roofline` column says how far from that the steps are. Several times the roofline at batch 1 means the
# step is bound by **overhead** — Python, one kernel call per layer and operation, the paged-attention loop, the
# LM head — more than by memory bandwidth, and that overhead grows with the batch. Your machine's figures are the
# table above: read its ratios, not the absolute times, and rerun the cell if it warns (a busy machine changes the
# ratios too).
#
# The same decode steps, recorded with `python benchmarks/serving.py --decode-only` on the lab's machines:
# {{ serving_records() }}

# %% [markdown]
# ## 6. Copy-on-write: parallel sampling
#
# Asking for `n` samples of one prompt (`n=4` in an API call) computes the prompt **once**. The samples
# then share its blocks: the allocator's reference counts say each block has `n` owners. The full blocks
# are never written again, so they stay shared to the end. The prompt's last, partly filled block is
# written by every sample's next token — so each sample but the last owner gets a private **copy** of
# that one block the first time it writes (copy-on-write), and from then on fills blocks of its own.
#
# `LLMEngine.sample(prompt, max_new_tokens, n, temperature, seed)` does this; below, its peak block use
# against the same 4 samples run as 4 separate requests.

# %%
long_prompt = tok(" ".join(lines[300:330])).input_ids[:100]  # a 100-token prompt: 6 full blocks + 4 tokens
N_SAMPLES, NEW6, TEMP = 4, (32 if FULL else 6), 0.8
shared = LLMEngine(model, num_blocks=64, block_size=16)
samples = shared.sample(long_prompt, NEW6, n=N_SAMPLES, temperature=TEMP, seed=0)
separate = LLMEngine(model, num_blocks=64, block_size=16)
for k in range(N_SAMPLES):
    separate.add_request(long_prompt, NEW6, temperature=TEMP, seed=k)  # sample k of `sample` is seeded 0 + k
while separate.has_unfinished():
    separate.step()
apart = separate.finished_outputs()
print("each shared sample equals its separate run:", [samples[k] == apart[k] for k in range(N_SAMPLES)])
block_bytes = 16 * kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1, bytes_per_element=4)
for name, eng in [("shared (copy-on-write)", shared), ("4 separate requests", separate)]:
    peak = max(s["blocks_in_use"] for s in eng.step_stats)
    print(f"{name:>24}: peak {peak:3d} blocks = {peak * block_bytes / 1e6:5.1f} MB; "
          f"prompt computed {sum(s['num_prefill_tokens'] for s in eng.step_stats)} tokens; "
          f"{eng.num_cow_copies} blocks copied on write")
for k in range(N_SAMPLES):
    print(f"sample {k}:", repr(tok.decode(samples[k])))

# %% [markdown]
# Sharing saves the prompt's full blocks `n − 1` times over, and its prefill `n − 1` times; the copies cost
# one block per extra sample. The longer the prompt against the answers, the bigger the saving: on chat
# workloads, whose answers are long against their prompts, it is much smaller than here (the vLLM paper,
# §6.3, measures it for parallel sampling and for beam search, which shares more and saves more).

# %% [markdown]
# ## 7. Prefix caching
#
# A chatbot sends the same long system prompt in front of every user message (the seed's Q10: a
# 2000-token system prompt shared by all users). Its keys and values are the same every time, so a server
# can keep the blocks and reuse them: **prefix caching**. The engine needs to find, for a new request, the
# longest run of leading *full* blocks that some earlier request already computed. It keys each full
# block by a hash, and looks the hashes up. A hit shares the block (one more reference); a cached block that no
# running request holds is kept until the pool runs short, then the least recently used one is evicted.
#
# **Exercise 7 (design).** `block_hashes(token_ids, block_size)`: one hash per full block, designed so
# that a hit is safe to share. Two requests must get the same hash for block `i` exactly when their first
# `(i + 1)·block_size` tokens agree — not just block `i`'s own tokens; the same block of tokens at another
# depth must hash differently; the order of the tokens matters; and a cache of a million blocks must not
# collide (keep at least 64 bits). What must the hash of block `i` be computed from? The check tests these
# properties, not particular values; one design is given after it.

# %% nbgrader={"grade": false, "grade_id": "block_hashes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """One hash per FULL block of token_ids, with the properties above."""
    ### BEGIN SOLUTION
    hashes, h = [], None
    for i in range(len(token_ids) // block_size):
        h = hash((h, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        hashes.append(h)
    return hashes
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_block_hashes", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_block_hashes(block_hashes)

# %% [markdown]
# *One design, now that your check passes.* Chain it: `h_i = hash((h_{i−1}, tuple(tokens of block i)))` with `h_{−1} = None`. Block `i`'s
# hash then covers every earlier token through `h_{i−1}`, a tuple keeps the order, and Python's `hash` of a
# tuple gives 64 bits, deterministic within one process — enough for one engine (processes that must agree on
# hashes use a stable one, such as SHA-256 of the tokens' bytes). The collision that remains possible is why
# `lookup` compares the tokens too.

# %% [markdown]
# The engine keeps the cache inside its block pool: a block whose last owner frees it can stay cached, so that a
# later request with the same prefix takes it back instead of recomputing it.
#
# **Exercise 8 (design).** `PrefixCache(num_blocks)`: a block pool with your `BlockAllocator`'s interface
# (`allocate`, `fork`, `free`, `ref_count`, `num_free`) and two more methods: `register(block, block_hash,
# tokens)` caches an owned full block under its hash, keeping its tokens (nothing if that hash or that block is
# cached already); `lookup(block_hash, tokens)` returns a cached block or `None`, and changes nothing (the engine
# `fork`s a block it uses). The structures are yours; what it must keep true:
#
# * **A hit is safe.** `lookup` returns a block only if it is cached under that hash with exactly these tokens:
#   two different blocks can share a hash, and serving another prompt's keys and values would be a silent wrong
#   answer.
# * **What is owned stays.** A block somebody owns is never handed out by `allocate`, and never forgotten by the
#   cache.
# * **A freed block stays cached as long as the pool can afford it.** When its last owner frees it, it counts as
#   free (`num_free`), `lookup` still finds it, and `fork` takes it back (a hit: one owner, no longer free).
#   `allocate` hands out a free block that caches nothing while there is one; only when every free block caches
#   something does it evict one — the one freed longest ago (least recently used) — and forget its hash.
# * **What cannot be done changes nothing and says why**, as in exercise 4: `allocate` with no free block raises
#   `OutOfBlocksError`; `free` of a block nobody owns, `fork` of a free block that caches nothing, or a number that
#   is not a block of the pool raise `ValueError`.
#
# The check replays random operations against a model of the cache (which block is evicted, every
# lookup's answer, a collision, `num_free` after every step), then runs `LLMEngine(...,
# enable_prefix_caching=True, block_pool=PrefixCache)` on prompts sharing a prefix through a pool small
# enough to evict, against `generate` on each prompt alone.

# %% nbgrader={"grade": false, "grade_id": "PrefixCache", "locked": false, "schema_version": 3, "solution": true, "task": false}
class PrefixCache:
    def __init__(self, num_blocks: int):
        ### BEGIN SOLUTION
        from collections import OrderedDict

        self.size = num_blocks
        self.owners = [0] * num_blocks
        self.plain = list(range(num_blocks - 1, -1, -1))  # free blocks caching nothing (a stack)
        self.stale = OrderedDict()  # free cached blocks, least recently freed first
        self.by_hash = {}  # hash -> block
        self.entry = {}  # block -> (hash, tokens)
        ### END SOLUTION

    @property
    def num_free(self) -> int:
        ### BEGIN SOLUTION
        return len(self.plain) + len(self.stale)
        ### END SOLUTION

    def ref_count(self, block: int) -> int:
        ### BEGIN SOLUTION
        return self.owners[block]
        ### END SOLUTION

    def allocate(self) -> int:
        ### BEGIN SOLUTION
        if self.plain:
            block = self.plain.pop()
        elif self.stale:
            block = next(iter(self.stale))  # the least recently freed
            del self.stale[block]
            block_hash, _ = self.entry.pop(block)
            del self.by_hash[block_hash]
        else:
            raise OutOfBlocksError(f"all {self.size} blocks are in use")
        self.owners[block] = 1
        return block
        ### END SOLUTION

    def fork(self, block: int) -> int:
        ### BEGIN SOLUTION
        if not 0 <= block < self.size:
            raise ValueError(f"no block {block}")
        if self.owners[block] == 0:
            if block not in self.stale:
                raise ValueError(f"block {block} is free and caches nothing")
            del self.stale[block]  # a hit: the cached block is in use again
        self.owners[block] += 1
        return block
        ### END SOLUTION

    def free(self, block: int) -> None:
        ### BEGIN SOLUTION
        if not 0 <= block < self.size or self.owners[block] == 0:
            raise ValueError(f"block {block} is not allocated")
        self.owners[block] -= 1
        if self.owners[block] == 0:
            if block in self.entry:
                self.stale[block] = None  # free, still cached, evicted last
            else:
                self.plain.append(block)
        ### END SOLUTION

    def register(self, block: int, block_hash: int, tokens: list[int]) -> None:
        ### BEGIN SOLUTION
        if not 0 <= block < self.size or self.owners[block] == 0:
            raise ValueError(f"block {block} is not allocated")
        if block_hash in self.by_hash or block in self.entry:
            return
        self.by_hash[block_hash] = block
        self.entry[block] = (block_hash, tuple(tokens))
        ### END SOLUTION

    def lookup(self, block_hash: int, tokens: list[int]) -> int | None:
        ### BEGIN SOLUTION
        block = self.by_hash.get(block_hash)
        if block is not None and self.entry[block][1] == tuple(tokens):
            return block
        return None  # not cached, or a collision
        ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_PrefixCache", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_PrefixCache(PrefixCache)

# %% [markdown]
# *One design, now that your check passes.* Reference counts as in exercise 4; a stack of the free blocks that
# cache nothing; the free blocks that cache something in the order they were freed (an `OrderedDict`: the first
# is the one to evict, and a hit removes its block from it); and two maps, hash → block and block → (hash,
# tokens). `free` of a block's last owner puts it on the stack or, if it caches something, at the end of the
# ordered free blocks; `allocate` pops the stack first. vLLM's pool gets the same order from one free queue in
# which freed cached blocks go to the back.

# %% [markdown]
# The engine with and without prefix caching on 8 requests that share a system prompt (128 tokens here,
# 512 with `FULL`), each with its own question, all arriving at once:

# %%
SYSTEM = tok(" ".join(lines[400:520])).input_ids[:512 if FULL else 128]
chat = [SYSTEM + p for p in PROMPTS[10:18]]


def serve(prompts, new, **kwargs):
    eng = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=4, block_pool=PrefixCache, **kwargs)
    result = run_load(eng, prompts, [new] * len(prompts), [0.0] * len(prompts))
    return eng, result


caching = {"no prefix cache": False, "prefix cache": True}
runs = {name: [] for name in caching}  # each repeat's (engine, result), the two taking turns
conditions = Conditions.now()
timed = interleaved({name: lambda name=name: runs[name].append(serve(chat, 4, enable_prefix_caching=caching[name]))
                     for name in caching}, repeats=3 if FULL else 2, warmup=0, device=dev)
conditions.done()
print(f"{len(chat)} requests, {len(SYSTEM)}-token shared system prompt + {sum(map(len, PROMPTS[10:18])) // 8} "
      f"tokens each; TTFT p50: the best repeat, the worst in brackets")
ttft = {name: [percentile(r["ttft"], 50) for _, r in done] for name, done in runs.items()}
for name, done in runs.items():
    eng = done[0][0]
    computed = sum(s["num_prefill_tokens"] for s in eng.step_stats)
    hit = eng.prefix_hit_tokens / eng.prompt_tokens
    print(f"{name:>16}: prefill tokens computed {computed:5d}, hit rate {hit:5.1%}, "
          f"TTFT p50 {min(ttft[name]):5.2f} s ({max(ttft[name]):.2f})")
print(report(timed, conditions, unit="s for all requests", scale=1))
print(f"TTFT gain (p50, best repeats): {min(ttft['no prefix cache']) / min(ttft['prefix cache']):.2f}x")

# %% [markdown]
# The first batch of requests is admitted together, before anything is cached, so they all compute the
# system prompt; every later request computes only its own question. **Eviction under pressure:** with
# a pool too small to keep the system prompt cached while unrelated requests run, its blocks are evicted
# (oldest first) and the next round has to recompute it.

# %%
small = LLMEngine(model, num_blocks=16, block_size=16, max_num_seqs=2, enable_prefix_caching=True,
                  block_pool=PrefixCache)
small.generate(chat[:2], 1)
hits_before = small.prefix_hit_tokens
unrelated = [tok(" ".join(lines[600 + 10 * i:610 + 10 * i])).input_ids[:120] for i in range(2)]
small.generate(unrelated, 1)  # needs more blocks than are free: evicts cached blocks, LRU first
small.generate(chat[2:4], 1)
print(f"evictions: {small.blocks.num_evictions}; system-prompt tokens reused: round 1 {hits_before}, "
      f"round 2 {small.prefix_hit_tokens - hits_before} (of {2 * len(SYSTEM) // 16 * 16} possible)")

# %% [markdown]
# Check: `pytest weeks/19 -k "ex07 or ex08"`
