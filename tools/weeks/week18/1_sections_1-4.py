# %% [markdown]
# # Week 18 — Speculative decoding: draft, verify, reject, and prove it exact
#
# Decoding one token costs one pass over all the weights, and on this CPU (like on a GPU) that pass is limited
# by memory traffic, not arithmetic: scoring **several** tokens in one pass costs less than scoring them one by one.
# How much less depends on the machine and on the matmul kernels, and it is not a smooth curve: section 1 measures it
# for `lib.modeling.llama` on your machine, and section 10 for the faster `FastLlama`, whose curve is another.
# **Speculative decoding** exploits that: a cheap **draft** guesses the next K tokens, the **target** scores all
# of them in one forward, and we keep the longest prefix the target agrees with, plus one token of the
# target's own. Done right, the output is **exactly** what the target alone would produce — token for token
# when greedy, in distribution when sampling. This week you build it on SmolLM2, prove both kinds of exactness,
# measure acceptance against theory, and find out honestly when it is faster on this CPU and why.
#
# **Notation** (everywhere in this notebook and in `lib/spec_decode/speculative.py`): **p is the target** distribution,
# **q is the draft**. Seed quiz 002 Q5 uses the same letters; the TV-distance paper in the resources (seed 004)
# calls the draft p and the target q — read it with the letters swapped.
#
# **You will write** the decoder's parts, mostly from their properties rather than from a recipe: greedy speculative
# decoding with cache rollback (*design*), the acceptance rule of speculative sampling (*derive*) and the sampling
# loop around it (*design*), the expected number of rejections (*derive*), the prompt-lookup draft (*practice*), the
# best K (*derive*), the target calls a run makes (*predict*, then measured with a draft you train), a batched
# decoder whose rows accept different numbers of tokens (*design*), and the acceptance rule of a draft tree's node,
# whose children were drawn without replacement (*derive*). Each recipe, rule or formula is printed **after**
# its check, for you to compare with yours. Check them with `pytest weeks/18`; the written answers of section 12 are
# graded by hand.
#
# `FULL = True` below runs the longer measurements (more repeats, positions and training); the default keeps the
# whole notebook within the lab's budget of 3 min on two quiet cores.

# %% tags=["setup"]
import math

import torch

from lib.modeling.kv_cache import KVCache
from grader.checks.week18 import (check_speculative_generate, check_verify, check_speculative_sample,
                                  check_expected_rejections, check_lookup_draft, check_best_k,
                                  check_expected_target_calls, check_batched_speculative_generate,
                                  check_tree_accept)

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from grader.checks import week18 as checks
from lib.bench import roofline
from lib.spec_decode import drafts as lib_drafts  # the drafts (lib.spec_decode.speculative's theory is imported after section 6's check)
from lib.modeling.generate import generate as lib_generate
from lib.spec_decode.speculative import EDIT_REQUEST, QUOTE_TEXT, SpecStats, chat_ids
from lib.spec_decode.speculative import speculative_generate as lib_speculative_generate  # the lab's loop, for measurements
from lib.modeling.llama import shared_smollm2
from lib.modeling.text import load_text
from lib.bench.timing import Conditions, Timed, impossible_verify_curve, interleaved, report, warning

FULL = False  # True: more repeats, positions and tokens (several minutes)
# The lab's own run of this notebook (tests/test_nbgrader_pipeline.py) sets INFERENCE_LAB_QUICK_DEMOS=1: every
# measurement at a smaller size, to show that each cell runs; its figures then say little. Leave it unset.
QUICK = not FULL and os.environ.get("INFERENCE_LAB_QUICK_DEMOS") == "1"
torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32; do not modify it
cfg = model.config
dev = model.device  # every tensor a demo makes goes here: the notebook runs unchanged on a GPU
print(f"{torch.get_num_threads()} CPU threads, device {dev}")


def sync():
    roofline.sync(dev)  # wait for queued GPU work before reading a clock (CUDA runs asynchronously; a CPU needs nothing)

# %% [markdown]
# ## 1. Why it can work: the verify-cost curve
#
# Speculation trades draft work for fewer target calls. It only pays if the target scoring K + 1 tokens costs
# much less than K + 1 separate steps. Measure it: fill a cache with 128 tokens of *Hamlet*, then time one forward
# of m new tokens after it (rolling the cache back to 128 each time with `KVCache.truncate`, the rollback this
# week relies on), relative to m = 1. (Every timer in this notebook calls `sync()` at both ends: on a GPU, work is
# queued and runs later, and a clock read without waiting for it measures the launch.)

# %%
text_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[:, :4096].to(model.device)  # [1, 4096]
CONTEXT = 128
sizes = list(range(1, 17)) if FULL else [1, 2, 3, 4, 5, 8, 9, 16]  # K + 1 for K = 1, 2, 4, 8 included
repeats = 9 if FULL else 2 if QUICK else 5
cache = model.new_cache(max_len=CONTEXT + max(sizes))

def forward_time(m):
    # seconds of one forward of m new tokens after the CONTEXT cached ones
    cache.truncate(CONTEXT)  # drop the positions of the previous try
    sync(); t0 = time.perf_counter()
    model(text_ids[:, CONTEXT:CONTEXT + m], cache=cache)
    sync()
    return time.perf_counter() - t0

conditions = Conditions.now()  # the load around the measurement: a busy machine makes curves that are noise
with torch.no_grad():
    model(text_ids[:, :CONTEXT], cache=cache)
    forward_time(1)  # warm-up
    ratios = {m: [] for m in sizes}
    step_time = {}
    for m in tqdm(sizes, desc="verify cost"):
        for _ in range(repeats):  # one step and one m-token forward side by side: their ratio survives a busy machine
            t1 = forward_time(1)
            ratios[m].append(forward_time(m) / t1)
            step_time[1] = min(step_time.get(1, math.inf), t1)
verify_cost = {m: float(torch.tensor(ratios[m]).median()) for m in sizes}  # in units of one decode step
conditions.done()
print(f"one decode step after {CONTEXT} tokens: {1e3 * step_time[1]:.1f} ms; {conditions.line()}")
for m in sizes:
    lo, hi = min(ratios[m]), max(ratios[m])
    print(f"m = {m:2d} new tokens: {verify_cost[m]:.2f} steps  ({verify_cost[m] / m:.2f} per token; "
          f"{repeats} repeats {lo:.2f}–{hi:.2f})")
disturbed = impossible_verify_curve(verify_cost) or warning(
    [Timed(f"m = {m}", ratios[m]) for m in sizes], conditions)
if disturbed:
    print(disturbed)
plt.figure(figsize=(6, 3.5))
plt.plot(sizes, [verify_cost[m] for m in sizes], "o-", label="measured")
plt.plot(sizes, sizes, "--", color="gray", label="m separate steps")
plt.axhline(1, color="gray", lw=0.5)
plt.xlabel("tokens scored in one forward (K + 1)"); plt.ylabel("time / one decode step")
plt.title("The verify-cost curve (SmolLM2, fp32, this CPU)" + ("\nMEASUREMENT DISTURBED: rerun when quieter" if disturbed else ""))
plt.legend(); plt.show()

# %% [markdown]
# Scoring m tokens costs much less than m steps — the weights are read once either way — but not always "barely
# more than one", and the curve need not be smooth: the matmul library picks its kernel by the number of rows, and on
# some machines 2–3 rows take a slower kernel than 4 (on others, not). Your figures are above, with the load they were
# measured under, and the cell below prints what each extra token adds. A round that verifies K + 1 tokens has to win
# back `verify_cost[K + 1]` steps. On a datacenter GPU the curve stays near 1 up to tens of tokens; section 6 shows
# what that changes.
# Keep `verify_cost`: the speedup model uses it.

# %%
for m in sizes[1:]:
    print(f"{m:2d} tokens in one forward: {verify_cost[m]:.2f} steps, {verify_cost[m] - 1:+.2f} over one token "
          f"({(verify_cost[m] - 1) / (m - 1):.2f} per extra token)")

# %% [markdown]
# ## 2. Greedy speculation and rollback
#
# A **round** of greedy speculation: the draft guesses K tokens, the target checks them, and the output grows by as
# many tokens as the target's own greedy decoding would have written — never a token it would not have written. The
# target checks all K guesses in **one** forward: that is the only reason this can be faster. Both models keep a KV
# cache, and a guess the target rejects leaves positions in both caches that the next round must not see.
#
# **Exercise 1 (design).** Write `speculative_generate(target, draft, input_ids, max_new_tokens, k=4)` (greedy). Both
# models are called as `model(ids [1, t], cache=c)` → logits `[1, t, vocab]`, with `c = model.new_cache(batch=1,
# max_len=...)`, `c.length` and `c.truncate(n)` (keep the first n positions). What it must do, not how — the check
# holds each of these:
#
# * it returns `[1, T + max_new_tokens]` ids, exactly `max_new_tokens` new ones, **identical to greedy decoding with
#   the target alone**, whatever the draft;
# * each target call writes as many tokens as exactness allows: the check counts target calls (`target(...)` or
#   `target.forward(...)`) and allows one more than a loop that does — token by token does not pass;
# * after the prefill a target call is fed at most K + 1 tokens and a draft call at most 2, and at the start of each
#   round each cache holds only tokens of the output;
# * every tensor you make is on `input_ids.device` (the check runs your loop once with torch's default device set
#   to `meta`, as a CPU tensor would meet a model on CUDA).
#
# Work out for yourself: which of the target's K + 1 rows of logits says whether guess i is right; what the round
# writes when the target disagrees at guess i, and when it agrees with all K; how far back each cache goes; how many
# tokens the last rounds may guess. Use your own loop (no `lib.spec_decode.speculative`, no `lib.modeling.generate`). The check runs
# Markov-chain and tiny-Llama targets with drafts from perfect to hopeless, and SmolLM2 for 64 tokens with K ∈ {2, 8}
# (its draft is prompt lookup: section 5). The round, step by step, is printed after the check.

# %% nbgrader={"grade": false, "grade_id": "speculative_generate", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int = 4) -> torch.Tensor:
    """Greedy speculative decoding: [1, T + max_new_tokens] ids, identical to greedy decoding with `target`."""
    ### BEGIN SOLUTION
    out = input_ids[0].tolist()
    t0 = len(out)
    device = input_ids.device
    max_len = t0 + max_new_tokens + k + 1
    t_cache, d_cache = target.new_cache(batch=1, max_len=max_len), draft.new_cache(batch=1, max_len=max_len)
    while len(out) - t0 < max_new_tokens:
        kk = min(k, max_new_tokens - (len(out) - t0) - 1)  # the round adds kk + 1 tokens at most
        drafted = []
        for _ in range(kk):
            unseen = (out + drafted)[d_cache.length:]  # 1 token, or 2 after a round that kept all K
            logits = draft(torch.tensor([unseen], device=device), cache=d_cache)  # [1, t, vocab]
            drafted.append(int(logits[0, -1].argmax()))
        unseen = (out + drafted)[t_cache.length:]  # the last token kept, then the kk draft tokens
        best = target(torch.tensor([unseen], device=device), cache=t_cache)[0, -(kk + 1):].argmax(-1).tolist()
        n = 0
        while n < kk and drafted[n] == best[n]:
            n += 1
        out += drafted[:n] + [best[n]]
        t_cache.truncate(min(t_cache.length, len(out) - 1))  # roll back: keep the positions of kept tokens
        d_cache.truncate(min(d_cache.length, len(out) - 1))
    return torch.tensor([out], dtype=input_ids.dtype, device=device)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_speculative_generate", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_speculative_generate(speculative_generate)

# %% [markdown]
# **The round, now that your check passes.** With the sequence so far `out` (its last token not yet in either cache):
#
# 1. the draft proposes K tokens greedily, one forward each, on its own KV cache;
# 2. the target scores `out`'s last token and the K guesses **in one forward** on its cache: K + 1 rows of logits;
#    row 0 is its prediction after `out`'s last token, row i (i ≥ 1) after guess i − 1 — so guess i is right when it
#    equals the argmax of row i;
# 3. keep guesses while they equal the target's argmax (n of them), then append the target's argmax at the first
#    disagreement — or, if all K agree, its argmax after the last one (the **bonus** token): every round writes
#    n + 1 tokens with one target call;
# 4. **roll back**: both caches now hold positions of rejected guesses. Truncate each to the tokens kept
#    (`cache.truncate(len(out) - 1)`); the next round feeds each model whatever it has not seen yet (one token, or
#    two for the draft after a round that kept all K).
#
# Near the end the round guesses fewer tokens (`min(K, max_new_tokens - written - 1)`), so that exactly
# `max_new_tokens` come out. Every token written is the target's argmax given the tokens before it, so the output is
# **identical** to greedy decoding with the target alone, whatever the draft — a bad draft only costs time.
# (Identical *as arithmetic*: a forward over K + 1 tokens is not bitwise the K + 1 one-token steps; the cell after
# the demo measures the difference and when it can flip a token.)

# %% [markdown]
# On SmolLM2, with two drafts (section 5 compares more): **prompt lookup** (no model: guess that an n-gram of
# the text so far repeats) and an **int8 copy** of the target. A counting wrapper shows how many target calls
# each run made; the output is the same either way.

# %%
class Counting:
    """Counts a model's forwards (either way they are called) and passes everything else through."""
    def __init__(self, m):
        self.m, self.calls = m, 0
    def __call__(self, *a, **kw):
        self.calls += 1
        return self.m(*a, **kw)
    forward = __call__
    def __getattr__(self, name):
        return getattr(self.m, name)

prompt_ids = tok(checks.SMOLLM2_PROMPT, return_tensors="pt").input_ids.to(model.device)
N_NEW = 64
greedy_ids = checks.smollm2_case()[2]  # the greedy 64 tokens, already computed by the check (same as lib_generate)
drafts = {"prompt lookup": lib_drafts.PromptLookupDraft(cfg.vocab_size, device=model.device),  # drafts on the model's device
          "int8 copy": lib_drafts.quantized_draft(model)}
for name, d in drafts.items():
    for k in ([2, 4] if FULL else [4]):
        counted = Counting(model)
        ids = speculative_generate(counted, d, prompt_ids, N_NEW, k=k)
        print(f"{name:22s} K={k}: identical to target greedy: {torch.equal(ids, greedy_ids)}; "
              f"{counted.calls} target calls for {N_NEW} tokens")
print(repr(tok.decode(greedy_ids[0, prompt_ids.shape[1]:])))

# %% [markdown]
# **"Identical token for token" — when it holds.** Greedy speculation writes the argmax of rows of a K + 1-token
# forward; plain decoding writes the argmax of one-token steps. In exact arithmetic they are the same numbers; in
# fp32 they are summed in another order (other matrix shapes, other kernels), so they differ in the last bits.
# Measured below on SmolLM2: the largest difference between the logits of one 9-token forward and of 9 one-token
# steps, and the smallest gap between the top two logits along the greedy continuation. The outputs are identical
# as long as every top-2 gap exceeds that difference; a near-tie can flip (seed 002's "exact match: 100 %" holds
# only under that condition — not on every input, and less so in fp16, whose rounding unit is 2¹³ times fp32's: 10 stored mantissa bits against 23).

# %%
with torch.no_grad():
    t0 = prompt_ids.shape[1]
    seq = greedy_ids[:, :t0 + 8]  # the prompt and 8 greedy tokens
    c1 = model.new_cache(max_len=seq.shape[1]); c9 = model.new_cache(max_len=seq.shape[1])
    model(seq[:, :t0 - 1], cache=c1); model(seq[:, :t0 - 1], cache=c9)
    block = model(seq[:, t0 - 1:], cache=c9)[0]  # [9, vocab]: one forward, as a verify round
    steps = torch.cat([model(seq[:, i:i + 1], cache=c1)[0] for i in range(t0 - 1, seq.shape[1])])  # 9 steps
    full = model(greedy_ids)[0, t0 - 1:-1]  # [64, vocab]: the logits behind each greedy token
top2 = full.topk(2, -1).values
gaps = top2[:, 0] - top2[:, 1]
err = (block - steps).abs().max().item()
print(f"max |9-token forward - 9 one-token steps| = {err:.2e} (fp32 logits)")
print(f"smallest top-2 logit gap over the {gaps.numel()} greedy tokens: {gaps.min().item():.3e} "
      f"({'identity holds here' if gaps.min().item() > err else 'a near-tie: identity could break here'}); "
      f"gaps below 1e-3: {int((gaps < 1e-3).sum())}")

# %% [markdown]
# Check: `pytest weeks/18 -k ex01`

# %% [markdown]
# ## 3. Speculative sampling: `verify`
#
# Sampling is where most write-ups stop at "accept if it looks likely". Work the rule out instead. At one position
# the draft drew its guess x from q (its distribution there); the target's distribution there is p. A rule accepts x
# with some probability a(x), and on a rejection emits a replacement drawn from some distribution r. We want:
#
# * **exactness**: the token emitted has exactly the law p, **whatever q is**;
# * **as many acceptances as exactness allows**: a(x) as large as it can be (each rejection ends the round).
#
# **Derive a(x) and r.** A start: P(emit y) = q(y)·a(y) + P(reject)·r(y), and both terms are ≥ 0. How large can
# q(y)·a(y) be without overshooting p(y)? With a at that largest value, what is left for the second term to supply,
# and so what must r be (it must be a distribution)? Check your answer on the cases q = p, q with mass where p has
# none, and p with mass where q has none. For a round of K guesses, test them in order; the round ends at the first
# rejection, with its replacement; if all K are accepted, the next token comes from p_K, the target's distribution
# after the last guess (the bonus token).
#
# **Exercise 2 (derive).** Write `verify(target_probs [K+1, V], draft_probs [K, V], draft_tokens [K], generator=None)
# -> (n_accepted, next_token)` (two ints) with your rule. Draw every random number from `generator`, on the inputs'
# device (`torch.rand((), generator=generator, device=target_probs.device)`, `torch.multinomial(..., generator=
# generator)`); leave the arguments unchanged (the caller still needs p and q).
#
# The check knows the **exact law** of the output of the rule you are asked for, and tests yours against it: per run
# (seed printed) it draws p, q and draft tokens at K = 3 with every position uncertain, plus edge cases (p = q,
# disjoint supports, q zero where p has mass, a sure guess first), a longer round (K = 6) and the model's whole
# vocabulary (49,152 tokens, its next tokens tested in groups by rank), calls your `verify` 42,000 + 5 × 4,000 + 1,000
# times, and tests every acceptance probability and every next-token probability. A correct `verify` fails less than once in a million runs; a rule that is exact but accepts less often
# than it could fails, and so does one whose acceptance probability is off by 2 points at any position (with
# probability above 0.999).
# The rule, the law and the test are printed after the check.

# %% nbgrader={"grade": false, "grade_id": "verify", "locked": false, "schema_version": 3, "solution": true, "task": false}
def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling: test draft tokens 0..K-1 in order with your rule; returns (n_accepted, next_token):
    the replacement at the first rejection, or the bonus token after K acceptances."""
    ### BEGIN SOLUTION
    k = draft_tokens.shape[0]
    for i in range(k):
        x = int(draft_tokens[i])
        p_x, q_x = float(target_probs[i, x]), float(draft_probs[i, x])
        u = float(torch.rand((), generator=generator, device=target_probs.device))  # on the inputs' device
        if u * q_x < p_x:  # u < p/q without dividing; p = 0 is never accepted
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp(min=0)  # [V]: the mass q under-covers (a new tensor)
        if residual.sum() <= 0:  # p == q: a rejection had probability 0
            residual = target_probs[i]
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator))
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_verify", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_verify(verify)

# %% [markdown]
# **The rule, now that your check passes** (Leviathan et al. 2023, Chen et al. 2023): accept draft token x_i with
# probability **min(1, p_i(x_i) / q_i(x_i))**; at the first rejection, sample the replacement from the **residual**
# normalize(max(p_i − q_i, 0)); if all K are accepted, sample a bonus token from p_K.
#
# Why it is exact, and why no larger acceptance is: P(emit x) = q(x)·a(x) + P(reject)·r(x), and the first term may
# not exceed p(x), so a(x) ≤ p(x)/q(x) — the largest allowed is min(1, p(x)/q(x)), and then the first term is
# min(p(x), q(x)). The second must supply the rest, p(x) − min(p(x), q(x)) = max(p(x) − q(x), 0): that is the
# residual's shape, the mass of p that q under-covers, and it works out exactly when P(reject) equals the residual's
# normaliser Σ_y max(p(y) − q(y), 0) (section 4 has you work out P(reject) and see that it does). Sample the
# replacement from p instead and tokens that q over-proposes come out too often; accept with min(1, q/p) (the letters
# swapped) and tokens the target never writes (p = 0) slip through.
#
# The law the check tests against, for fixed inputs, with a_i = min(1, p_i(x_i)/q_i(x_i)) and r_i =
# normalize(max(p_i − q_i, 0)): P(n = j, next = y) = a_0 ··· a_(j−1) · (1 − a_j) · r_j(y) for j < K, and
# a_0 ··· a_(K−1) · p_K(y) for j = K. Its main case draws every ratio p_i(x_i)/q_i(x_i) strictly between 0 and 1
# (K = 3, so the third draft token and the bonus after it are tested); the long round makes three sure acceptances,
# then three uncertain ones.

# %% [markdown]
# The milestone, in a picture: the check's main case, drawn with seed 0, against 12,000 runs (`FULL`: the check's
# 42,000) of your `verify` and of the classic bug (after a rejection, sample from p instead of the residual). Each dot is a cell
# (n_accepted, next_token); the check's verdict and the power of its test are printed below. The bound
# comes from Chernoff's inequality: for X ~ Binomial(m, a), P[m·KL(X/m ‖ a) > L] ≤ 2e^(−L); with L = ln(2T / 10⁻⁶)
# for the T tests of the check, a union bound keeps a correct `verify` under 10⁻⁶.

# %%
def wrong_residual(tp, dp, tokens, generator=None):
    """verify with the classic bug: after a rejection, sample from p instead of (p - q)+."""
    n, nxt = verify(tp, dp, tokens, generator=generator)
    if n == tokens.shape[0]:  # all accepted: the bonus token from p_K is right
        return n, nxt
    return n, int(torch.multinomial(tp[n], 1, generator=generator))  # wrong: should be (p_n - q_n)+

cases = checks.law_cases(torch.Generator().manual_seed(0))
n_tests = sum(len(checks.law_tests(c)) for c in cases)
level = checks.law_level(n_tests)
main = dataclasses.replace(cases[0], trials=42_000 if FULL else 12_000)  # the check runs 42,000
law = main.law()  # [K+1, V]: P(n_accepted = j, next = y)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
for ax, (name, fn) in zip(axes, [("your verify", verify), ("residual sampled from p", wrong_residual)]):
    counts = checks.law_counts(fn, main, 0)
    bad = checks.law_failures(main, counts, level)
    ax.bar(range(law.numel()), law.flatten(), color="lightgray", label="exact law")
    ax.plot(range(law.numel()), (counts / counts.sum()).flatten(), "o", color="C3" if bad else "C0", label="observed")
    ax.set_title(f"{name}: {'REJECTED' if bad else 'passes'}", fontsize=9)
    ax.set_xticks(range(law.numel()), [f"{j},{y}" for j in range(law.shape[0]) for y in range(law.shape[1])], fontsize=6)
    print(f"{name}: {len(bad)} failed tests" + (f", e.g. {bad[0]}" if bad else ""))
axes[0].legend(fontsize=8); axes[0].set_xlabel("(n_accepted, next_token)"); plt.show()
lo, hi = checks.MAIN_RATIOS
print(f"{n_tests} binomial tests, each at m·KL > {level:.2f}; power against an acceptance probability 2 points off, "
      f"from the 29,500 runs that reach the third draft token at least: "
      + ", ".join(f"a = {a}: {min(checks.law_power(29_500, a, d, level) for d in (0.02, -0.02)):.5f}" for a in (lo, hi)))

# %% [markdown]
# **Exercise 3 (design).** Around your `verify`, write the sampling loop: `speculative_sample(target, draft,
# input_ids, max_new_tokens, k=4, temperature=1.0, generator=None)`. What it must do — decide yourself what your
# exercise-1 loop must change for it:
#
# * **every new token has the target's law at temperature T**, p = softmax(target logits / T) — each position of a
#   round, the token after a rejection, the bonus token — whatever the draft;
# * the guesses are the draft's own samples at temperature T, with what your `verify` needs to judge them;
# * `generator` decides every draw: generators in equal states give equal ids, in different states other ids;
# * the work rules of exercise 1 hold (the same counted models: at most K + 1 tokens a target call, caches holding
#   only tokens of the output at the start of a round) and tensors are made on `input_ids.device`.
#
# The check runs it with counted models, then 1,020 times on models whose law is set per position, at K = 4, 8, 1 and
# 2 and T = 1, 0.5 and 2 (one case over the model's whole vocabulary, 49,152 tokens), and tests the law of every new
# token against the target's; then from generators in equal
# and different states, and last with torch's default device set to `meta`. The changes, listed, follow the check.

# %% nbgrader={"grade": false, "grade_id": "speculative_sample", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def speculative_sample(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int = 4,
                       temperature: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Speculative sampling: [1, T + max_new_tokens] ids whose new tokens have the target's law at `temperature`
    (> 0), drafted from the draft's and kept by your `verify`; both caches rolled back after each round."""
    ### BEGIN SOLUTION
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (greedy is speculative_generate); got {temperature}")
    out = input_ids[0].tolist()
    t0 = len(out)
    device = input_ids.device
    max_len = t0 + max_new_tokens + k + 1
    t_cache, d_cache = target.new_cache(batch=1, max_len=max_len), draft.new_cache(batch=1, max_len=max_len)
    while len(out) - t0 < max_new_tokens:
        kk = min(k, max_new_tokens - (len(out) - t0) - 1)  # the round adds kk + 1 tokens at most
        drafted, q_rows = [], []
        for _ in range(kk):
            unseen = (out + drafted)[d_cache.length:]  # 1 token, or 2 after a round that kept all K
            logits = draft(torch.tensor([unseen], device=device), cache=d_cache)[0, -1]  # [vocab]
            q = torch.softmax(logits.float() / temperature, -1)  # the draft's law at this temperature
            q_rows.append(q)
            drafted.append(int(torch.multinomial(q, 1, generator=generator)))
        unseen = (out + drafted)[t_cache.length:]  # the last token kept, then the kk draft tokens
        logits = target(torch.tensor([unseen], device=device), cache=t_cache)[0, -(kk + 1):]  # [kk + 1, vocab]
        p = torch.softmax(logits.float() / temperature, -1)  # [kk + 1, vocab]
        q = torch.stack(q_rows) if q_rows else p.new_zeros(0, p.shape[-1])  # [kk, vocab]
        n, nxt = verify(p, q, torch.tensor(drafted, dtype=torch.int64, device=device), generator=generator)
        out += drafted[:n] + [nxt]
        t_cache.truncate(min(t_cache.length, len(out) - 1))  # roll back: keep the positions of kept tokens
        d_cache.truncate(min(d_cache.length, len(out) - 1))
    return torch.tensor([out], dtype=input_ids.dtype, device=device)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_speculative_sample", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_speculative_sample(speculative_sample)

# %% [markdown]
# **The changes, now that your check passes.** Exercise 1's loop with three changes: the draft *samples* each guess
# from q = softmax(draft logits / T) and keeps each q row; the target's K + 1 rows become p = softmax(target logits /
# T); and `verify(p, q, guesses, generator)` decides how many guesses are kept and which token follows. Both caches
# roll back as before. What fails the check every run: a guess that is q's argmax passed off as a sample of q (verify
# then judges it against the wrong q), one uniform reused for a round's guesses, the temperature applied to one model
# only, a loop exact for two tokens and wrong after them.

# %% [markdown]
# Your loop on SmolLM2 at T = 1, with the int8 draft (with `FULL`, prompt lookup too: its point-mass q is rarely
# accepted at T = 1); the law of what comes out is the target's either way.

# %%
g = torch.Generator(device=model.device).manual_seed(0)  # the generator lives on the tensors' device
for name, d in (drafts.items() if FULL else [("int8 copy", drafts["int8 copy"])]):
    t_count, d_count = Counting(model), Counting(d)
    ids = speculative_sample(t_count, d_count, prompt_ids, 32, k=4, temperature=1.0, generator=g)
    print(f"{name:22s} T=1, K=4: {32 - t_count.calls} of {d_count.calls} drafted tokens kept, "
          f"{32 / t_count.calls:.2f} tokens per target call")
print(repr(tok.decode(ids[0, prompt_ids.shape[1]:])))

# %% [markdown]
# Check: `pytest weeks/18 -k ex02` and `-k ex03`

# %% [markdown]
# ## 4. Acceptance: theory and measurement
#
# Section 3 gave the rule for one position: draft token x ~ q is accepted with probability min(1, p(x)/q(x)).
# How many rejections should a run expect? Derive it yourself from that rule — average the acceptance
# probability over x ~ q, and add over positions — and write it as a function. (Seed 004's theorem states the
# result with its letters swapped; work it out before you look.) Its optimality needs care: no scheme that
# verifies **token by token** — each position accepted or rejected given the prefix — rejects less, but schemes
# that verify a **block** jointly accept strictly more in expectation (block verification, Sun et al. 2024): "no
# unbiased rejection scheme does better", as it is often quoted, is false.
#
# **Exercise 4 (derive).** Write `expected_rejections(p [n, V], q [n, V]) -> 0-dim tensor`: the expected number of rejected
# draft tokens when at each of the n positions a token is drawn from q_i and tested against p_i. Return it in the
# inputs' dtype and device; raise a `ValueError` for mismatched shapes; do not write into p or q.

# %% nbgrader={"grade": false, "grade_id": "expected_rejections", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expected_rejections(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """E[number of rejections] over n positions, each testing one token x ~ q_i against p_i."""
    ### BEGIN SOLUTION
    if p.shape != q.shape or p.dim() != 2:
        raise ValueError(f"p and q must both be [n, V]; got {tuple(p.shape)} and {tuple(q.shape)}")
    # one position: P(accept) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)); a rejection is the rest
    return (1 - torch.minimum(p, q).sum(-1)).sum()
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_expected_rejections", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_expected_rejections(expected_rejections)

# %% [markdown]
# **The derivation, now that your check passes.** At one position, P(accept) = Σ_x q(x)·min(1, p(x)/q(x)) =
# Σ_x min(p(x), q(x)) — call it **α** —, and 1 − α = Σ_x max(p(x) − q(x), 0) = TV(p, q), the total variation
# distance: exactly the residual's normaliser of section 3, which is why the replacement makes the output exact. Over
# n positions the expectation adds: E[rejections] = Σ_i (1 − Σ_x min(p_i(x), q_i(x))) = Σ_i TV(p_i, q_i) (seed 004's
# theorem, with its letters swapped).

# %% [markdown]
# **Measurement.** Read a stretch of *Hamlet* once with the target and once with the int8 draft (teacher forcing:
# both see the real text), predict the rejections with your `expected_rejections`, then *run* the acceptance test —
# draw x from q, call your `verify` with K = 1 — at every position, several times, and count.

# %%
N_POS = 2048 if FULL else 128 if QUICK else 512
DRAWS = 4
with torch.no_grad():
    p_all = torch.softmax(model(text_ids[:, :N_POS])[0], -1)  # [N_POS, vocab]
    int8 = drafts["int8 copy"]
    q_all = torch.softmax(int8(text_ids[:, :N_POS])[0], -1)
predicted = DRAWS * expected_rejections(p_all[:-1], q_all[:-1]).item()  # row i + 1 only serves as a bonus row
g = torch.Generator(device=model.device).manual_seed(1)  # on the tensors' device
rejected = tested = 0
for i in tqdm(range(N_POS - 1), desc="acceptance tests"):
    for _ in range(DRAWS):
        x = torch.multinomial(q_all[i], 1, generator=g)  # [1]
        n, _ = verify(p_all[i:i + 2], q_all[i:i + 1], x, generator=g)
        rejected += 1 - n
        tested += 1
alpha_measured = 1 - rejected / tested
print(f"{tested} acceptance tests: {rejected} rejections; your expected_rejections predicts {predicted:.0f} "
      f"(difference {(rejected - predicted) / math.sqrt(predicted):+.1f} standard deviations at most)")
print(f"α at T = 1 (int8 draft, Hamlet): measured {alpha_measured:.4f}, predicted {1 - predicted / tested:.4f}")

# %% [markdown]
# α is not one number: it changes from position to position (the histogram below), and a run of easy positions
# keeps more tokens than the mean α suggests. Keep `alpha_pos`: section 6 uses it.

# %%
alpha_pos = torch.minimum(p_all, q_all).sum(-1)  # [N_POS]: α at each position (your derivation, per position)
plt.figure(figsize=(6, 3))
plt.hist(alpha_pos.cpu().numpy(), bins=40)
plt.xlabel("α at one position (int8 draft, T = 1)"); plt.ylabel("positions")
plt.title("Per-position α"); plt.show()

# %% [markdown]
# Check: `pytest weeks/18 -k ex04`
