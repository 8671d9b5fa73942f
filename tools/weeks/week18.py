"""Builds solutions/18/week18_speculative.ipynb (run: python tools/weeks/week18.py)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.nbbuild import Notebook  # noqa: E402
from tools.results import recorded_md  # noqa: E402

EPYC = "amd-epyc-avx512"
FAST_DECODE = "decode b1 n64: lib.modeling.generate (lib.modeling.fast, C++ step)"  # FastLlama's one-call C++ step, SmolLM2 fp32
PACKED_DECODE = "decode b1 n64: lib.modeling.generate (lib.modeling.fast, packed)"
MODEL_DECODE = "decode b1 n64: lib.modeling.generate (lib.modeling.llama)"

nb = Notebook()

nb.md(r"""
# Week 18 — Speculative decoding: draft, verify, reject, and prove it exact

Decoding one token costs one pass over all the weights, and on this CPU (like on a GPU) that pass is limited
by memory traffic, not arithmetic: scoring **several** tokens in one pass costs less than scoring them one by one.
How much less depends on the machine and on the matmul kernels, and it is not a smooth curve: section 1 measures it
for `lib.modeling.llama` on your machine, and section 10 for the faster `FastLlama`, whose curve is another.
**Speculative decoding** exploits that: a cheap **draft** guesses the next K tokens, the **target** scores all
of them in one forward, and we keep the longest prefix the target agrees with, plus one token of the
target's own. Done right, the output is **exactly** what the target alone would produce — token for token
when greedy, in distribution when sampling. This week you build it on SmolLM2, prove both kinds of exactness,
measure acceptance against theory, and find out honestly when it is faster on this CPU and why.

**Notation** (everywhere in this notebook and in `lib/spec_decode/speculative.py`): **p is the target** distribution,
**q is the draft**. Seed quiz 002 Q5 uses the same letters; the TV-distance paper in the resources (seed 004)
calls the draft p and the target q — read it with the letters swapped.

**You will write** the decoder's parts, mostly from their properties rather than from a recipe: greedy speculative
decoding with cache rollback (*design*), the acceptance rule of speculative sampling (*derive*) and the sampling
loop around it (*design*), the expected number of rejections (*derive*), the prompt-lookup draft (*practice*), the
best K (*derive*), the target calls a run makes (*predict*, then measured with a draft you train), and a batched
decoder whose rows accept different numbers of tokens (*design*). Each recipe, rule or formula is printed **after**
its check, for you to compare with yours. Check them with `pytest weeks/18`; the written answers of section 11 are
graded by hand.

`FULL = True` below runs the longer measurements (more repeats, positions and training); the default keeps the
whole notebook within the lab's budget of 3 min on two quiet cores.
""")

nb.setup("""
import math

import torch

from lib.modeling.kv_cache import KVCache
from grader.checks.week18 import (check_speculative_generate, check_verify, check_speculative_sample,
                                  check_expected_rejections, check_lookup_draft, check_best_k,
                                  check_expected_target_calls, check_batched_speculative_generate)
""")

nb.code("""
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
torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32; do not modify it
cfg = model.config
dev = model.device  # every tensor a demo makes goes here: the notebook runs unchanged on a GPU
print(f"{torch.get_num_threads()} CPU threads, device {dev}")


def sync():
    roofline.sync(dev)  # wait for queued GPU work before reading a clock (CUDA runs asynchronously; a CPU needs nothing)
""")

# --- 1 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 1. Why it can work: the verify-cost curve

Speculation trades draft work for fewer target calls. It only pays if the target scoring K + 1 tokens costs
much less than K + 1 separate steps. Measure it: fill a cache with 128 tokens of *Hamlet*, then time one forward
of m new tokens after it (rolling the cache back to 128 each time with `KVCache.truncate`, the rollback this
week relies on), relative to m = 1. (Every timer in this notebook calls `sync()` at both ends: on a GPU, work is
queued and runs later, and a clock read without waiting for it measures the launch.)
""")

nb.code("""
text_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[:, :4096].to(model.device)  # [1, 4096]
CONTEXT = 128
sizes = list(range(1, 17)) if FULL else [1, 2, 3, 4, 5, 8, 9, 16]  # K + 1 for K = 1, 2, 4, 8 included
repeats = 9 if FULL else 5
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
plt.title("The verify-cost curve (SmolLM2, fp32, this CPU)" + ("\\nMEASUREMENT DISTURBED: rerun when quieter" if disturbed else ""))
plt.legend(); plt.show()
""")

nb.md(r"""
Scoring m tokens costs much less than m steps — the weights are read once either way — but not always "barely
more than one", and the curve need not be smooth: the matmul library picks its kernel by the number of rows, and on
some machines 2–3 rows take a slower kernel than 4 (on others, not). Your figures are above, with the load they were
measured under, and the cell below prints what each extra token adds. A round that verifies K + 1 tokens has to win
back `verify_cost[K + 1]` steps. On a datacenter GPU the curve stays near 1 up to tens of tokens; section 6 shows
what that changes.
Keep `verify_cost`: the speedup model uses it.
""")

nb.code("""
for m in sizes[1:]:
    print(f"{m:2d} tokens in one forward: {verify_cost[m]:.2f} steps, {verify_cost[m] - 1:+.2f} over one token "
          f"({(verify_cost[m] - 1) / (m - 1):.2f} per extra token)")
""")

# --- 2 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 2. Greedy speculation and rollback

A **round** of greedy speculation: the draft guesses K tokens, the target checks them, and the output grows by as
many tokens as the target's own greedy decoding would have written — never a token it would not have written. The
target checks all K guesses in **one** forward: that is the only reason this can be faster. Both models keep a KV
cache, and a guess the target rejects leaves positions in both caches that the next round must not see.

**Exercise 1 (design).** Write `speculative_generate(target, draft, input_ids, max_new_tokens, k=4)` (greedy). Both
models are called as `model(ids [1, t], cache=c)` → logits `[1, t, vocab]`, with `c = model.new_cache(batch=1,
max_len=...)`, `c.length` and `c.truncate(n)` (keep the first n positions). What it must do, not how — the check
holds each of these:

* it returns `[1, T + max_new_tokens]` ids, exactly `max_new_tokens` new ones, **identical to greedy decoding with
  the target alone**, whatever the draft;
* each target call writes as many tokens as exactness allows: the check counts target calls (`target(...)` or
  `target.forward(...)`) and allows one more than a loop that does — token by token does not pass;
* after the prefill a target call is fed at most K + 1 tokens and a draft call at most 2, and at the start of each
  round each cache holds only tokens of the output;
* every tensor you make is on `input_ids.device` (the check runs your loop once with torch's default device set
  to `meta`, as a CPU tensor would meet a model on CUDA).

Work out for yourself: which of the target's K + 1 rows of logits says whether guess i is right; what the round
writes when the target disagrees at guess i, and when it agrees with all K; how far back each cache goes; how many
tokens the last rounds may guess. Use your own loop (no `lib.spec_decode.speculative`, no `lib.modeling.generate`). The check runs
Markov-chain and tiny-Llama targets with drafts from perfect to hopeless, and SmolLM2 for 64 tokens with K ∈ {2, 8}
(its draft is prompt lookup: section 5). The round, step by step, is printed after the check.
""")

nb.exercise("speculative_generate", '''
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
''')

nb.test("test_speculative_generate", "check_speculative_generate(speculative_generate)", points=3)

nb.md(r"""
**The round, now that your check passes.** With the sequence so far `out` (its last token not yet in either cache):

1. the draft proposes K tokens greedily, one forward each, on its own KV cache;
2. the target scores `out`'s last token and the K guesses **in one forward** on its cache: K + 1 rows of logits;
   row 0 is its prediction after `out`'s last token, row i (i ≥ 1) after guess i − 1 — so guess i is right when it
   equals the argmax of row i;
3. keep guesses while they equal the target's argmax (n of them), then append the target's argmax at the first
   disagreement — or, if all K agree, its argmax after the last one (the **bonus** token): every round writes
   n + 1 tokens with one target call;
4. **roll back**: both caches now hold positions of rejected guesses. Truncate each to the tokens kept
   (`cache.truncate(len(out) - 1)`); the next round feeds each model whatever it has not seen yet (one token, or
   two for the draft after a round that kept all K).

Near the end the round guesses fewer tokens (`min(K, max_new_tokens - written - 1)`), so that exactly
`max_new_tokens` come out. Every token written is the target's argmax given the tokens before it, so the output is
**identical** to greedy decoding with the target alone, whatever the draft — a bad draft only costs time.
(Identical *as arithmetic*: a forward over K + 1 tokens is not bitwise the K + 1 one-token steps; the cell after
the demo measures the difference and when it can flip a token.)
""")

nb.md(r"""
On SmolLM2, with two drafts (section 5 compares more): **prompt lookup** (no model: guess that an n-gram of
the text so far repeats) and an **int8 copy** of the target. A counting wrapper shows how many target calls
each run made; the output is the same either way.
""")

nb.code("""
class Counting:
    \"\"\"Counts a model's forwards (either way they are called) and passes everything else through.\"\"\"
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
""")

nb.md(r"""
**"Identical token for token" — when it holds.** Greedy speculation writes the argmax of rows of a K + 1-token
forward; plain decoding writes the argmax of one-token steps. In exact arithmetic they are the same numbers; in
fp32 they are summed in another order (other matrix shapes, other kernels), so they differ in the last bits.
Measured below on SmolLM2: the largest difference between the logits of one 9-token forward and of 9 one-token
steps, and the smallest gap between the top two logits along the greedy continuation. The outputs are identical
as long as every top-2 gap exceeds that difference; a near-tie can flip (seed 002's "exact match: 100 %" holds
only under that condition — not on every input, and less so in fp16, whose rounding unit is 2¹³ times fp32's: 10 stored mantissa bits against 23).
""")

nb.code("""
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
""")

nb.md("Check: `pytest weeks/18 -k ex01`")

# --- 3 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 3. Speculative sampling: `verify`

Sampling is where most write-ups stop at "accept if it looks likely". Work the rule out instead. At one position
the draft drew its guess x from q (its distribution there); the target's distribution there is p. A rule accepts x
with some probability a(x), and on a rejection emits a replacement drawn from some distribution r. We want:

* **exactness**: the token emitted has exactly the law p, **whatever q is**;
* **as many acceptances as exactness allows**: a(x) as large as it can be (each rejection ends the round).

**Derive a(x) and r.** A start: P(emit y) = q(y)·a(y) + P(reject)·r(y), and both terms are ≥ 0. How large can
q(y)·a(y) be without overshooting p(y)? With a at that largest value, what is left for the second term to supply,
and so what must r be (it must be a distribution)? Check your answer on the cases q = p, q with mass where p has
none, and p with mass where q has none. For a round of K guesses, test them in order; the round ends at the first
rejection, with its replacement; if all K are accepted, the next token comes from p_K, the target's distribution
after the last guess (the bonus token).

**Exercise 2 (derive).** Write `verify(target_probs [K+1, V], draft_probs [K, V], draft_tokens [K], generator=None)
-> (n_accepted, next_token)` (two ints) with your rule. Draw every random number from `generator`, on the inputs'
device (`torch.rand((), generator=generator, device=target_probs.device)`, `torch.multinomial(..., generator=
generator)`); leave the arguments unchanged (the caller still needs p and q).

The check knows the **exact law** of the output of the rule you are asked for, and tests yours against it: per run
(seed printed) it draws p, q and draft tokens at K = 3 with every position uncertain, plus edge cases (p = q,
disjoint supports, q zero where p has mass, a sure guess first) and a longer round (K = 6), calls your `verify`
42,000 + 5 × 4,000 times, and tests every acceptance probability and every next-token probability. A correct
`verify` fails less than once in a million runs; a rule that is exact but accepts less often than it could fails,
and so does one whose acceptance probability is off by 2 points at any position (with probability above 0.999).
The rule, the law and the test are printed after the check.
""")

nb.exercise("verify", '''
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
''')

nb.test("test_verify", "check_verify(verify)", points=3)

nb.md(r"""
**The rule, now that your check passes** (Leviathan et al. 2023, Chen et al. 2023): accept draft token x_i with
probability **min(1, p_i(x_i) / q_i(x_i))**; at the first rejection, sample the replacement from the **residual**
normalize(max(p_i − q_i, 0)); if all K are accepted, sample a bonus token from p_K.

Why it is exact, and why no larger acceptance is: P(emit x) = q(x)·a(x) + P(reject)·r(x), and the first term may
not exceed p(x), so a(x) ≤ p(x)/q(x) — the largest allowed is min(1, p(x)/q(x)), and then the first term is
min(p(x), q(x)). The second must supply the rest, p(x) − min(p(x), q(x)) = max(p(x) − q(x), 0): that is the
residual's shape, the mass of p that q under-covers, and it works out exactly when P(reject) equals the residual's
normaliser Σ_y max(p(y) − q(y), 0) (section 4 has you work out P(reject) and see that it does). Sample the
replacement from p instead and tokens that q over-proposes come out too often; accept with min(1, q/p) (the letters
swapped) and tokens the target never writes (p = 0) slip through.

The law the check tests against, for fixed inputs, with a_i = min(1, p_i(x_i)/q_i(x_i)) and r_i =
normalize(max(p_i − q_i, 0)): P(n = j, next = y) = a_0 ··· a_(j−1) · (1 − a_j) · r_j(y) for j < K, and
a_0 ··· a_(K−1) · p_K(y) for j = K. Its main case draws every ratio p_i(x_i)/q_i(x_i) strictly between 0 and 1
(K = 3, so the third draft token and the bonus after it are tested); the long round makes three sure acceptances,
then three uncertain ones.
""")

nb.md(r"""
The milestone, in a picture: the check's main case, drawn with seed 0, against 12,000 runs (`FULL`: the check's
42,000) of your `verify` and of the classic bug (after a rejection, sample from p instead of the residual). Each dot is a cell
(n_accepted, next_token); the check's verdict and the power of its test are printed below. The bound
comes from Chernoff's inequality: for X ~ Binomial(m, a), P[m·KL(X/m ‖ a) > L] ≤ 2e^(−L); with L = ln(2T / 10⁻⁶)
for the T tests of the check, a union bound keeps a correct `verify` under 10⁻⁶.
""")

nb.code("""
def wrong_residual(tp, dp, tokens, generator=None):
    \"\"\"verify with the classic bug: after a rejection, sample from p instead of (p - q)+.\"\"\"
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
""")

nb.md(r"""
**Exercise 3 (design).** Around your `verify`, write the sampling loop: `speculative_sample(target, draft,
input_ids, max_new_tokens, k=4, temperature=1.0, generator=None)`. What it must do — decide yourself what your
exercise-1 loop must change for it:

* **every new token has the target's law at temperature T**, p = softmax(target logits / T) — each position of a
  round, the token after a rejection, the bonus token — whatever the draft;
* the guesses are the draft's own samples at temperature T, with what your `verify` needs to judge them;
* `generator` decides every draw: generators in equal states give equal ids, in different states other ids;
* the work rules of exercise 1 hold (the same counted models: at most K + 1 tokens a target call, caches holding
  only tokens of the output at the start of a round) and tensors are made on `input_ids.device`.

The check runs it with counted models, then 760 times on models whose law is set per position, at K = 4, 8, 1 and
2 and T = 1, 0.5 and 2, and tests the law of every new token against the target's; then from generators in equal
and different states, and last with torch's default device set to `meta`. The changes, listed, follow the check.
""")

nb.exercise("speculative_sample", '''
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
''')

nb.test("test_speculative_sample", "check_speculative_sample(speculative_sample)", points=2)

nb.md(r"""
**The changes, now that your check passes.** Exercise 1's loop with three changes: the draft *samples* each guess
from q = softmax(draft logits / T) and keeps each q row; the target's K + 1 rows become p = softmax(target logits /
T); and `verify(p, q, guesses, generator)` decides how many guesses are kept and which token follows. Both caches
roll back as before. What fails the check every run: a guess that is q's argmax passed off as a sample of q (verify
then judges it against the wrong q), one uniform reused for a round's guesses, the temperature applied to one model
only, a loop exact for two tokens and wrong after them.
""")

nb.md(r"""
Your loop on SmolLM2 at T = 1, with the int8 draft (with `FULL`, prompt lookup too: its point-mass q is rarely
accepted at T = 1); the law of what comes out is the target's either way.
""")

nb.code("""
g = torch.Generator(device=model.device).manual_seed(0)  # the generator lives on the tensors' device
for name, d in (drafts.items() if FULL else [("int8 copy", drafts["int8 copy"])]):
    t_count, d_count = Counting(model), Counting(d)
    ids = speculative_sample(t_count, d_count, prompt_ids, 32, k=4, temperature=1.0, generator=g)
    print(f"{name:22s} T=1, K=4: {32 - t_count.calls} of {d_count.calls} drafted tokens kept, "
          f"{32 / t_count.calls:.2f} tokens per target call")
print(repr(tok.decode(ids[0, prompt_ids.shape[1]:])))
""")

nb.md("Check: `pytest weeks/18 -k ex02` and `-k ex03`")

# --- 4 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 4. Acceptance: theory and measurement

Section 3 gave the rule for one position: draft token x ~ q is accepted with probability min(1, p(x)/q(x)).
How many rejections should a run expect? Derive it yourself from that rule — average the acceptance
probability over x ~ q, and add over positions — and write it as a function. (Seed 004's theorem states the
result with its letters swapped; work it out before you look.) Its optimality needs care: no scheme that
verifies **token by token** — each position accepted or rejected given the prefix — rejects less, but schemes
that verify a **block** jointly accept strictly more in expectation (block verification, Sun et al. 2024): "no
unbiased rejection scheme does better", as it is often quoted, is false.

**Exercise 4 (derive).** Write `expected_rejections(p [n, V], q [n, V]) -> 0-dim tensor`: the expected number of rejected
draft tokens when at each of the n positions a token is drawn from q_i and tested against p_i. Return it in the
inputs' dtype and device; raise a `ValueError` for mismatched shapes; do not write into p or q.
""")

nb.exercise("expected_rejections", '''
def expected_rejections(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """E[number of rejections] over n positions, each testing one token x ~ q_i against p_i."""
    ### BEGIN SOLUTION
    if p.shape != q.shape or p.dim() != 2:
        raise ValueError(f"p and q must both be [n, V]; got {tuple(p.shape)} and {tuple(q.shape)}")
    # one position: P(accept) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)); a rejection is the rest
    return (1 - torch.minimum(p, q).sum(-1)).sum()
    ### END SOLUTION
''')
nb.test("test_expected_rejections", "check_expected_rejections(expected_rejections)", points=2)

nb.md(r"""
**The derivation, now that your check passes.** At one position, P(accept) = Σ_x q(x)·min(1, p(x)/q(x)) =
Σ_x min(p(x), q(x)) — call it **α** —, and 1 − α = Σ_x max(p(x) − q(x), 0) = TV(p, q), the total variation
distance: exactly the residual's normaliser of section 3, which is why the replacement makes the output exact. Over
n positions the expectation adds: E[rejections] = Σ_i (1 − Σ_x min(p_i(x), q_i(x))) = Σ_i TV(p_i, q_i) (seed 004's
theorem, with its letters swapped).
""")

nb.md(r"""
**Measurement.** Read a stretch of *Hamlet* once with the target and once with the int8 draft (teacher forcing:
both see the real text), predict the rejections with your `expected_rejections`, then *run* the acceptance test —
draw x from q, call your `verify` with K = 1 — at every position, several times, and count.
""")

nb.code("""
N_POS = 2048 if FULL else 512
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
""")

nb.md(r"""
α is not one number: it changes from position to position (the histogram below), and a run of easy positions
keeps more tokens than the mean α suggests. Keep `alpha_pos`: section 6 uses it.
""")

nb.code("""
alpha_pos = torch.minimum(p_all, q_all).sum(-1)  # [N_POS]: α at each position (your derivation, per position)
plt.figure(figsize=(6, 3))
plt.hist(alpha_pos.cpu().numpy(), bins=40)
plt.xlabel("α at one position (int8 draft, T = 1)"); plt.ylabel("positions")
plt.title("Per-position α"); plt.show()
""")

nb.md("Check: `pytest weeks/18 -k ex04`")


# --- 5 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 5. Drafts compared on SmolLM2

Four kinds of draft, all with a model's call shape (`lib/spec_decode/drafts.py`):

* **random 2-layer** model with SmolLM2's vocabulary: the α ≈ 0 baseline (the seed says "≈ 1/vocab"; it is
  Σ min(p, q), which two broad distributions make a few percent);
* **early exit**: the target's first L layers + its final norm + LM head — free to build, shares every weight,
  but the intermediate layers were never trained to predict tokens;
* **int8 copy** of the target: every linear layer (and the LM head) with int8 per-output-channel weights —
  the same model up to rounding, so α is high; its cost c is what decides;
* **prompt lookup**: no model; guess that the text repeats an n-gram seen before (drafts only where one
  matches, `min_draft_prob=0.5`).

For each: α at T = 0 (argmax agreement) and T = 1 on *Hamlet* (teacher forcing: both models read the real text; T =
1 with your `expected_rejections`), the draft's cost c (one draft step / one target step, after a 128-token cache),
and the measured wall-clock speedup of greedy speculation on a chat prompt (tokens identical to the target's,
checked). What the model of section 6 predicts from α, c and the verify curve comes after its check.
""")

nb.code("""
def vc(m):
    \"\"\"The verify curve of section 1 at m tokens (interpolated between measured sizes).\"\"\"
    xs = sorted(verify_cost)
    if m in verify_cost:
        return verify_cost[m]
    hi = min((x for x in xs if x > m), default=xs[-1]); lo = max(x for x in xs if x < m)
    return verify_cost[lo] + (verify_cost[hi] - verify_cost[lo]) * (m - lo) / (hi - lo)

curve = {m: vc(m) for m in range(1, 17)}

def draft_cost(d):
    \"\"\"One draft step after a 128-token context, in target steps (median of side-by-side ratios).\"\"\"
    c = d.new_cache(batch=1, max_len=CONTEXT + 1)
    out = []
    with torch.no_grad():
        d(text_ids[:, :CONTEXT], cache=c)
        for _ in range(repeats):
            c.truncate(CONTEXT)
            sync(); t0 = time.perf_counter()
            d(text_ids[:, CONTEXT:CONTEXT + 1], cache=c)
            sync()
            out.append((time.perf_counter() - t0) / forward_time(1))
    return float(torch.tensor(out).median())

chat_prompt = chat_ids(tok, "What are three tips for staying healthy?", model.device)  # the chat template, [1, t]
candidates = {
    "random 2-layer": (lib_drafts.random_draft(cfg, device=model.device), 0.0),
    "early exit 4": (lib_drafts.early_exit_draft(model, 4), 0.0),
    "early exit 20": (lib_drafts.early_exit_draft(model, 20), 0.0),
    "int8 copy": (drafts["int8 copy"], 0.0),
    "prompt lookup": (lib_drafts.PromptLookupDraft(cfg.vocab_size, device=model.device), 0.5),
}
N_ALPHA = 1024 if FULL else 256
N_SPEED = 64 if FULL else 32
K_MEASURE = [1, 2, 4, 8] if FULL else [2, 4]
MEASURE = set(candidates) if FULL else {"int8 copy", "prompt lookup"}  # wall-clock runs (the others: FULL)
with torch.no_grad():
    p_logits = model(text_ids[:, :N_ALPHA])[0]  # [N_ALPHA, vocab], read once for every draft
base_ids, base_t = None, math.inf
for _ in range(2):
    sync(); t0 = time.perf_counter(); base_ids = lib_generate(model, chat_prompt, N_SPEED); sync()
    base_t = min(base_t, time.perf_counter() - t0)
table = {}
for name, (d, min_prob) in tqdm(candidates.items(), desc="drafts"):
    with torch.no_grad():
        q_logits = d(text_ids[:, :N_ALPHA], cache=d.new_cache(batch=1, max_len=N_ALPHA))[0]  # [N_ALPHA, vocab]
    a0 = (p_logits.argmax(-1) == q_logits.argmax(-1)).float().mean().item()  # T = 0: argmax agreement
    a1 = 1 - expected_rejections(torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)).item() / N_ALPHA  # T = 1
    c = draft_cost(d)
    measured = {}
    for k in (K_MEASURE if name in MEASURE else []):
        st = SpecStats()
        sync(); t0 = time.perf_counter()
        ids = lib_speculative_generate(model, d, chat_prompt, N_SPEED, k=k, stats=st, min_draft_prob=min_prob)
        sync()
        measured[k] = (base_t / (time.perf_counter() - t0), torch.equal(ids, base_ids), st.tokens_per_call)
    table[name] = dict(a0=a0, a1=a1, c=c, measured=measured)
print(f"target greedy on the chat prompt: {N_SPEED / base_t:.1f} tok/s")
print(f"{'draft':15s} {'α T=0':>6s} {'α T=1':>6s} {'c':>6s} " + " ".join(f"{'meas K=' + str(k):>9s}" for k in K_MEASURE)
      + "  identical")
for name, r in table.items():
    cells = " ".join(f"{r['measured'][k][0] if k in r['measured'] else float('nan'):9.2f}" for k in K_MEASURE)
    print(f"{name:15s} {r['a0']:6.2f} {r['a1']:6.2f} {r['c']:6.2f} {cells}  {all(m[1] for m in r['measured'].values())}")
n_params = sum(p.numel() for name, p in model.named_parameters() if "norm" not in name)  # the tied head counted once
head_share = cfg.vocab_size * cfg.d_model / n_params
print(f"the LM head: {cfg.vocab_size} x {cfg.d_model} = {cfg.vocab_size * cfg.d_model / 1e6:.1f} M of the target's "
      f"{n_params / 1e6:.1f} M weights ({head_share:.2f} of its bytes)")
""")

nb.md(r"""
What the table says (your numbers are above; α is the same in every run, c moves with the machine's load):

* a draft that shares the **LM head** pays for it at every draft step: its weights are the share of the target's
  printed above. If a step's time were its bytes, no such draft could cost less than that share of a target step;
  a measured c can come out lower (compare early exit 4), because a target step's time is not only its bytes —
  this CPU's eager step also spends time outside the matmuls, in norms, RoPE, attention and Python, and a 4-layer
  draft does less of that. Early exit also pays for its L layers;
* the **int8 copy** is the same model up to rounding, so its α is high — the seed's "70–80 % acceptance" comes
  easily to a draft that *is* the target; section 7 asks what a small trained draft reaches — but on this CPU its c
  is far from small: eager PyTorch spends much of a step outside the matmuls, which int8 does not shrink, and the
  loop adds its own overhead per draft call;
* **prompt lookup** costs nothing, and pays exactly where the output repeats the input (quoting, summarizing,
  code editing); `benchmarks/speculative.py` measures it on chat, editing and quoting prompts, and the cells
  after the table try an edit here.

A small draft *distilled* from SmolLM2 is the classic fifth option: section 7 has you train one.
""")

nb.md(r"""
**Where prompt lookup pays: an answer that repeats the prompt.** Ask the model to fix the spelling of a paragraph
(`EDIT_REQUEST`, an invented paragraph with two typos — asked to repeat a *famous* text, this small model
paraphrases it from memory instead, and there is little to look up). Most of the answer is the paragraph again,
so the n-gram guesses are right for long runs, and a long K is cheap where the verify curve of section 1 is low.
""")

nb.code("""
edit_ids = chat_ids(tok, EDIT_REQUEST, model.device)
N_EDIT = 48
edit_ref = lib_generate(model, edit_ids, N_EDIT)
print(repr(tok.decode(edit_ref[0, edit_ids.shape[1]:])))
lookup = lib_drafts.PromptLookupDraft(cfg.vocab_size, device=model.device)
edit_out, edit_stats = {}, {}


def edit_lookup(k):
    def run():
        edit_stats[k] = SpecStats()
        edit_out[k] = lib_speculative_generate(model, lookup, edit_ids, N_EDIT, k=k, stats=edit_stats[k],
                                               min_draft_prob=0.5)
    return run


conditions = Conditions.now()  # greedy and lookup at K = 2 and 8, interleaved: a disturbance falls on all three
edit_timings = interleaved({"greedy": lambda: lib_generate(model, edit_ids, N_EDIT),
                            **{f"lookup K={k}": edit_lookup(k) for k in (2, 8)}}, repeats=2, warmup=0, device=dev)
conditions.done()
edit_t = edit_timings["greedy"].best
for k, st in edit_stats.items():
    print(f"K={k}: {edit_t / edit_timings[f'lookup K={k}'].best:.2f}x the target's greedy ({N_EDIT / edit_t:.1f} tok/s), "
          f"identical={torch.equal(edit_out[k], edit_ref)}, acceptance {st.acceptance_rate:.2f}, tokens per target "
          f"call {st.tokens_per_call:.2f}")
print(report(edit_timings, conditions, unit="s", scale=1.0))
""")

nb.md(r"""
**Exercise 5 (practice): your prompt-lookup draft.** The rule is given here; turning it into a search with its
edge cases (the longest n-gram, its latest occurrence, nothing when none matches) is the exercise. Prompt lookup
guesses that the text repeats itself: take the longest n-gram that ends the text (n from `max_ngram` down to `min_ngram`) and also occurs earlier, take its **latest**
earlier occurrence, and propose the (up to) k tokens that followed it there. No n-gram of at least `min_ngram`
tokens seen before: propose nothing — which is adaptive K: the round verifies only what the draft is sure of.
Write `lookup_draft(tokens: list[int], k, max_ngram=3, min_ngram=1) -> list[int]` (a `ValueError` for k < 0 or
unless 1 ≤ min_ngram ≤ max_ngram).
""")

nb.exercise("lookup_draft", '''
def lookup_draft(tokens: list, k: int, max_ngram: int = 3, min_ngram: int = 1) -> list:
    """Up to k tokens that followed the latest earlier occurrence of the longest n-gram ending `tokens`."""
    ### BEGIN SOLUTION
    if k < 0 or not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need k >= 0 and 1 <= min_ngram <= max_ngram; got k={k}, min_ngram={min_ngram}, "
                         f"max_ngram={max_ngram}")
    n_tok = len(tokens)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        tail = tokens[n_tok - n:]
        for start in range(n_tok - n - 1, -1, -1):  # latest first; a token must follow the match
            if tokens[start:start + n] == tail:
                return list(tokens[start + n:start + n + k])
    return []
    ### END SOLUTION
''')
nb.test("test_lookup_draft", "check_lookup_draft(lookup_draft)", points=2)

nb.md(r"""
Your draft on SmolLM2, measured on the two workloads where lookup should pay — the edit request above and a
quotation (`QUOTE_TEXT`, plain text that quotes a paragraph) — with `min_ngram` 1 and 3 (`FULL`: 1, 2, 3). A round drafts
with `lookup_draft(text, k)` and the target verifies the guesses in one forward (greedy: keep them while they are
the target's argmax); no guess means a plain one-token step. The tokens are checked identical to the target's.
""")

nb.code("""
@torch.no_grad()
def lookup_decode(ids, n_new, k, min_ngram):
    \"\"\"Greedy decoding with your lookup_draft as the draft; returns (ids, target calls, drafted, accepted).\"\"\"
    out = ids[0].tolist()
    cache = model.new_cache(max_len=len(out) + n_new + k + 1)
    calls = drafted = accepted = 0
    while len(out) - ids.shape[1] < n_new:
        guess = lookup_draft(out, min(k, n_new - (len(out) - ids.shape[1]) - 1), min_ngram=min_ngram)
        best = model(torch.tensor([(out + guess)[cache.length:]], device=model.device),
                     cache=cache)[0, -(len(guess) + 1):].argmax(-1).tolist()
        n = 0
        while n < len(guess) and guess[n] == best[n]:
            n += 1
        out += guess[:n] + [best[n]]
        cache.truncate(len(out) - 1)
        calls, drafted, accepted = calls + 1, drafted + len(guess), accepted + n
    return torch.tensor([out], device=ids.device), calls, drafted, accepted

quote_ids = tok(QUOTE_TEXT, return_tensors="pt").input_ids.to(model.device)
quote_ref = lib_generate(model, quote_ids, N_EDIT)
sync(); t0 = time.perf_counter(); lib_generate(model, quote_ids, N_EDIT); sync(); quote_t = time.perf_counter() - t0
lookup_runs = {}
for wname, w_ids, ref_ids, base in [("edit", edit_ids, edit_ref, edit_t), ("quote", quote_ids, quote_ref, quote_t)]:
    for min_ngram in ((1, 2, 3) if FULL else (1, 3)):
        sync(); t0 = time.perf_counter()
        ids, calls, drafted, accepted = lookup_decode(w_ids, N_EDIT, 8, min_ngram)
        sync(); dt = time.perf_counter() - t0
        lookup_runs[wname, min_ngram] = (base / dt, N_EDIT / calls, accepted / max(drafted, 1))
        print(f"{wname:5s} min_ngram={min_ngram}: {base / dt:.2f}x, {N_EDIT / calls:.2f} tokens per target call, "
              f"{accepted}/{drafted} guesses kept, identical={torch.equal(ids, ref_ids)}")
""")

nb.md("Check: `pytest weeks/18 -k ex05`")

# --- 6 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 6. The speedup model

A round runs the draft K times — each draft step costs c target steps — and the target once over K + 1 tokens,
which costs `verify_cost[K + 1]` target steps (the curve of section 1). It writes the guesses it keeps and one token
of the target's. Call α_i the probability that guess i is kept **given that guesses 0..i−1 were**. A draft as good
at every position of the round has α_i = α; one that drafts from its own guesses, like section 10's head, gets
worse along the round, α_0 > α_1 > ....

**Exercise 6 (derive).** Work out the expected number of tokens a round of K guesses writes, and the predicted
speedup: tokens per round over the round's cost in target steps. Then write `best_k(alpha, c, verify_cost) -> (k,
speedup)`: the K in 1..M−1 (`verify_cost` maps m = 1..M tokens to steps, `verify_cost[1] == 1`) with the highest
predicted speedup, and that speedup. `alpha` is a float (the same α_i = α at every position; α = 1 allowed, no
dividing by zero) or a list with one α_i per position (at least M − 1 of them). The check draws both kinds per run;
the formula follows the check.
""")

nb.exercise("best_k", """
def best_k(alpha, c: float, verify_cost: dict) -> tuple:
    \"\"\"(K, predicted speedup) maximizing tokens per round / cost of a round, K in 1..max(verify_cost) - 1; `alpha` a
    float (every position) or a list (alpha[i]: guess i kept given guesses 0..i-1 were).\"\"\"
    ### BEGIN SOLUTION
    m = max(verify_cost)
    alphas = [float(alpha)] * (m - 1) if isinstance(alpha, (int, float)) else [float(a) for a in alpha]
    best, tokens, reach = None, 1.0, 1.0
    for k in range(1, m):
        reach *= alphas[k - 1]  # token k of the round is written iff guesses 0..k-1 were all kept
        tokens += reach
        speed = tokens / (k * c + verify_cost[k + 1])
        if best is None or speed > best[1]:
            best = (k, speed)
    return best
    ### END SOLUTION
""")
nb.test("test_best_k", "check_best_k(best_k)", points=2)

nb.md(r"""
**The model, now that your check passes.** Token i of a round (i = 1..K after the first, which the round always
writes) is written only if guesses 0..i−1 were all kept, so a round writes 1 + α_0 + α_0·α_1 + ... + α_0···α_(K−1)
tokens on average; with one α, 1 + α + ... + α^K = (1 − α^(K+1)) / (1 − α) (K + 1 at α = 1). The speedup is that
over K·c + verify_cost[K + 1]. Seed 001's "accept/reject each token independently" would give 1 + α·K: verification
tests in order and stops at the first rejection. From here on the notebook uses `lib.spec_decode.speculative`'s version of the
constant-α formula (`expected_tokens_per_call`, `predicted_speedup`) and your `best_k`.

Two seed figures, recomputed with it below: "70 % acceptance with K = 4 → ~3.6 tokens per call" and "50 % → ~2.1":
with one α no K can give more than 1 / (1 − α) tokens a round (the limit K → ∞).
""")

nb.code("""
from lib.spec_decode import speculative as lab  # the lab's loop and its acceptance theory (the formula you just derived)

print("α = 0.5: " + ", ".join(f"K={k}: {lab.expected_tokens_per_call(0.5, k):.3f}" for k in (1, 2, 4, 8, 16))
      + f"; K -> ∞: {1 / (1 - 0.5):.3f} tokens a round, < 2.1")
need = min(a / 1000 for a in range(1001) if lab.expected_tokens_per_call(a / 1000, 4) >= 3.6)
print(f"α = 0.7, K = 4: {lab.expected_tokens_per_call(0.7, 4):.3f} tokens a round (3.6 would need α ≈ {need:.2f})")
mean_alpha = float(alpha_pos[:-1].mean())
print(f"section 4's int8 draft: mean α {mean_alpha:.3f}; K = 4 with that one α: "
      f"{lab.expected_tokens_per_call(mean_alpha, 4):.3f} tokens a round")
print(f"{'draft':15s} " + " ".join(f"{'pred K=' + str(k):>9s} {'meas K=' + str(k):>9s}" for k in K_MEASURE))
for name, r in table.items():  # section 5's drafts: predicted from α (T = 0, Hamlet), c and your verify curve
    print(f"{name:15s} " + " ".join(f"{lab.predicted_speedup(r['a0'], k, r['c'], curve):9.2f} "
                                    f"{r['measured'][k][0] if k in r['measured'] else float('nan'):9.2f}"
                                    for k in K_MEASURE))
""")

nb.md(r"""
The same model in two regimes: **this CPU** (the verify curve you measured, the int8 draft's c) and a
**GPU-like** regime, where scoring up to 16 tokens costs one step (a flat curve: the GPU is idle during decode)
and a draft one-tenth to one-twentieth the target's size costs c ≈ 0.05. The "2–3×" of the literature (and of
seed 002's technique table) is this model's prediction in the second regime — a model, not a measurement; the
measured speedups on this CPU are section 5's, printed above beside the model's. The best K is yours.
""")

nb.code("""
Ks = list(range(1, 16))
flat = {m: 1.0 for m in range(1, 17)}
c_int8 = table["int8 copy"]["c"]
plt.figure(figsize=(7, 4))
for j, a in enumerate([0.6, 0.8, 0.9]):
    plt.plot(Ks, [lab.predicted_speedup(a, k, 0.05, flat) for k in Ks], "-", color=f"C{j}", label=f"GPU-like, α={a}, c=0.05")
    plt.plot(Ks, [lab.predicted_speedup(a, k, c_int8, curve) for k in Ks], "--", color=f"C{j}",
             label=f"this CPU, α={a}, c={c_int8:.2f}")
plt.axhline(1, color="gray", lw=0.5)
plt.xlabel("K"); plt.ylabel("predicted speedup"); plt.legend(fontsize=7)
plt.title("Where 2–3× comes from: a flat verify curve and a cheap draft"); plt.show()
for a in (0.6, 0.8, 0.9):
    k_gpu, s_gpu = best_k(a, 0.05, flat)
    k_cpu, s_cpu = best_k(a, c_int8, curve)
    print(f"α={a}: GPU-like best K={k_gpu}, {s_gpu:.2f}x predicted; this CPU best K={k_cpu}, {s_cpu:.2f}x predicted")
""")

nb.md("Check: `pytest weeks/18 -k ex06`")

# --- 7 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 7. A draft you train, and a prediction

Seed 000 says "a draft model trained to minimise KL reaches 70–80 % acceptance". Train one and see. The draft:
two blocks of SmolLM2's shape, initialized as copies of its first two, that **share its embedding, final norm and
tied LM head, frozen** (`lib_drafts.build_distilled_draft(model, 2)`: only the blocks train). The data: the target's
own greedy answers to chat prompts (templates × topics below, none of them section 5's or 10's chat prompts),
decoded side by side, with the target's distribution of the next token kept at every position as its 32 most
likely tokens (`lib_drafts.target_answers`). The loss: KL(p ‖ q) from the target's p to the draft's q on the
answers' positions (`lib_drafts.distill_loss`; p renormalized over its 32 tokens). The last prompts are held out:
the draft never trains on their answers. `FULL = False` trains for a bounded number of steps, a minute or less on
two cores; `tools/distill_draft.py` trains longer, on other text.
""")

nb.code("""
TEMPLATES = ["Explain {} to a beginner.", "What are three tips for {}?", "Write a short story about {}.",
             "What are the pros and cons of {}?"]
TOPICS = ["gardening", "saving money", "the solar system", "cooking pasta", "public speaking", "chess",
          "electric cars", "baking bread"]
N_HELD7 = 4 if FULL else 2  # the last prompts, never trained on
texts7 = [t.format(topic) for topic in TOPICS[:8 if FULL else 4] for t in TEMPLATES]
texts7 += ["Describe the ocean in simple words.", "Why is friendship important?", "How do I get started with "
           "photography?", "Give me a list of five facts about bees."][:N_HELD7]
model.requires_grad_(False)  # the teacher, and the embedding, norm and head the draft shares, stay frozen
with torch.no_grad():
    answers = lib_drafts.target_answers(model, [chat_ids(tok, t) for t in texts7], 48 if FULL else 32)
n_train = len(texts7) - N_HELD7
train7 = {k: v[:n_train] for k, v in answers.items()}
held7 = {k: v[n_train:] for k, v in answers.items()}
print(f"{len(texts7)} prompts answered side by side: {int(train7['mask'].sum())} answer positions to train on, "
      f"{int(held7['mask'].sum())} held out; the top 32 tokens keep {float(answers['top_p'][answers['mask']].sum(-1).mean()):.3f} "
      f"of the target's probability on average")
print(repr(tok.decode(held7["tokens"][0, int(held7["prompt_len"][0]):])))
""")

nb.code("""
STEPS = 120 if FULL else 30
BATCH = 4
torch.manual_seed(0)
student = lib_drafts.build_distilled_draft(model, 2)  # copies of the target's first 2 blocks; shares the rest
blocks = list(student.layers.parameters())
for w in blocks:
    w.requires_grad_(True)
opt = torch.optim.AdamW(blocks, lr=1e-3)
losses, conditions = [], Conditions.now()
t0 = time.perf_counter()
for step in tqdm(range(STEPS), desc="distilling"):
    rows = torch.randperm(n_train)[:BATCH]
    loss = lib_drafts.distill_loss(student, train7["tokens"][rows], train7["top_p"][rows], train7["top_ids"][rows],
                                   train7["mask"][rows])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())
train_seconds = time.perf_counter() - t0
conditions.done()
for w in blocks:
    w.requires_grad_(False)
student.eval()
print(f"{STEPS} steps of {BATCH} answers in {train_seconds:.0f} s; KL {losses[0]:.2f} -> "
      f"{sum(losses[-5:]) / 5:.2f} (mean of the last 5); {conditions.line()}")
""")

nb.code("""
@torch.no_grad()
def alphas7(d, data):
    \"\"\"(α at T = 0, α at T = 1) of draft `d` on the answer positions of `data` (teacher forcing).\"\"\"
    ids, m = data["tokens"].to(dev), data["mask"].to(dev)
    lp, lq = model(ids)[m], d(ids)[m]  # [positions, vocab]
    a0 = (lp.argmax(-1) == lq.argmax(-1)).float().mean().item()
    a1 = 1 - expected_rejections(torch.softmax(lp, -1), torch.softmax(lq, -1)).item() / lp.shape[0]  # yours
    return a0, a1

rows7 = {"before training (the target's first 2 blocks)": lib_drafts.build_distilled_draft(model, 2),
         "your distilled draft": student, "int8 copy (section 5)": drafts["int8 copy"]}
alpha7 = {name: (alphas7(d, held7), alphas7(d, {k: v[:N_HELD7] for k, v in train7.items()})) for name, d in rows7.items()}
print(f"{'draft':46s} {'held out T=0':>12s} {'T=1':>6s} {'trained on T=0':>15s} {'T=1':>6s}")
for name, ((h0, h1), (t0_, t1_)) in alpha7.items():
    print(f"{name:46s} {h0:12.3f} {h1:6.3f} {t0_:15.3f} {t1_:6.3f}")
a0_held, a1_held = alpha7["your distilled draft"][0]
print(f"seed 000: 0.70-0.80; your draft on held-out answers: {a0_held:.2f} (T = 0), {a1_held:.2f} (T = 1)")
""")

nb.md(r"""
**Where "70–80 %" acceptance happens, and why not here.** Acceptance rates of that order are reported for drafts with
far more training behind them than this one: small models of the target's own family trained on its pre-training
corpus (Leviathan et al. 2023 draft for T5-XXL with T5-small and T5-base; Chen et al. 2023 for Chinchilla 70B with a
4B-parameter model) and heads like EAGLE's, trained for hours on tens of thousands of real conversations. Here the
draft saw a few thousand tokens for a minute of CPU (your figures are printed above, with the load), its blocks
start from the target's first two, and it must compress a 30-layer computation into 2. The int8 copy's α shows the
other end: a draft that *is* the target, up to rounding, agrees almost always — and costs almost a target step
(section 5). What grows α here is data and training time (`FULL = True`, `tools/distill_draft.py --minutes N`); what
keeps c low is what the draft reads (section 9 shrinks its head, section 10 gives it the target's own features).
Compare the two columns too: a draft that agrees more on the answers it trained on than on held-out ones has begun to
memorize.

Now predict what this draft does inside your own loop. If each guess is kept with probability α given the ones
before it, how many target calls does a run of `max_new_tokens` tokens make? Section 6 gave the tokens of one round;
a whole run is not just `max_new_tokens` over that: near the end a round may guess only the tokens still missing
(your loop guesses `min(K, missing - 1)`), so the last rounds write less.

**Exercise 7 (predict).** Write `expected_target_calls(alpha, k, max_new_tokens) -> float`: the expected number of
target calls (rounds) your `speculative_generate` makes to write exactly `max_new_tokens` tokens, each guess kept
with probability `alpha` given that the ones before it were, K = `k`. Exactly — no simulation (the check compares to
1e-9 on configurations drawn per run, α from 0 to 1, short runs where the end matters and long ones). Then the cell
after the check measures it with your own loop and your own draft.
""")

nb.exercise("expected_target_calls", '''
def expected_target_calls(alpha: float, k: int, max_new_tokens: int) -> float:
    """Expected target calls of a speculative run writing exactly max_new_tokens tokens, each guess kept with
    probability alpha given the ones before it were kept, at most k guesses a round."""
    ### BEGIN SOLUTION
    calls = [0.0] * (max_new_tokens + 1)  # calls[r]: expected calls with r tokens still to write
    for r in range(1, max_new_tokens + 1):
        m = min(k, r - 1)  # the round guesses at most r - 1 tokens: it writes at most r
        e = 1.0 + alpha ** m * calls[r - m - 1]  # all m kept: m + 1 tokens (the bonus)
        for j in range(1, m + 1):  # j - 1 kept, then the target's correction: j tokens
            e += alpha ** (j - 1) * (1 - alpha) * calls[r - j]
        calls[r] = e
    return calls[max_new_tokens]
    ### END SOLUTION
''')
nb.test("test_expected_target_calls", "check_expected_target_calls(expected_target_calls)", points=2)

nb.md(r"""
**The model, now that your check passes.** With r tokens still to write, a round guesses m = min(K, r − 1) tokens
and writes j ≤ m of them with probability α^(j−1)·(1 − α) (j − 1 kept, then the target's correction) or m + 1 with
probability α^m (all kept, then the bonus): calls(r) = 1 + Σ_j P(j)·calls(r − j), calls(0) = 0. For long runs
calls(n) approaches n / (1 + α + ... + α^K); for short ones, or large K, the end matters.

**Measured, with your loop and your draft**: your `speculative_generate` (T = 0) and `speculative_sample` (T = 1)
with the draft you trained, on the held-out prompts, target calls counted, beside your prediction from the α you
measured on the held-out answers. At T = 0 the run writes exactly those answers' tokens, so the prediction and the
run see the same positions: what differs is that α is not one number (section 4). At T = 1 the run samples other
text than the greedy answers α was measured on.
""")

nb.code("""
K7 = [2, 4] if FULL else [3]
N7 = 32 if FULL else 24
held_prompts = [held7["tokens"][i:i + 1, :int(held7["prompt_len"][i])].to(dev) for i in range(N_HELD7)]
g = torch.Generator(device=dev).manual_seed(7)
conditions = Conditions.now()
print(f"{'run':34s} {'α':>6s} {'calls predicted':>15s} {'measured':>9s} {'tokens per call':>16s} {'s per run':>9s}")
for k in K7:
    for temperature, alpha in ((0.0, a0_held), (1.0, a1_held)):
        calls, seconds = 0, 0.0
        for ids in held_prompts:
            counted = Counting(model)
            sync(); t0 = time.perf_counter()
            if temperature == 0.0:
                speculative_generate(counted, student, ids, N7, k=k)
            else:
                speculative_sample(counted, student, ids, N7, k=k, temperature=1.0, generator=g)
            sync(); seconds += time.perf_counter() - t0
            calls += counted.calls
        predicted = len(held_prompts) * expected_target_calls(alpha, k, N7)
        print(f"{'your loop, T=' + str(temperature) + ', K=' + str(k):34s} {alpha:6.3f} {predicted:15.2f} {calls:9d} "
              f"{len(held_prompts) * N7 / calls:16.2f} {seconds / len(held_prompts):9.2f}")
print(conditions.done().line())
""")

nb.md("Check: `pytest weeks/18 -k ex07`")

# --- 8 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 8. The ragged batch

A server decodes many sequences at once: one forward reads the weights once for all of them. Speculation in a batch
meets a problem a single sequence does not have (seed 001): after a round, **each row has kept a different number of
tokens**. Row 0 kept 4 guesses and its bonus, row 1 none; their caches now hold different lengths, the next round's
rows start at different positions, and a row that has written all its tokens is done while the others go on.

`lib/spec_decode/speculative_batch.py` gives a target that runs any set of rows, each with its own new tokens, in one forward:

```python
target = RaggedTarget(model)                  # layout="packed" (default) or "padded"
cache = target.new_cache(rows, max_len)       # one KV cache per row: cache.lengths = (positions held per row)
logits = target({0: [5, 6, 7], 2: [9]}, cache=cache)   # {0: [3, vocab], 2: [1, vocab]}; rows 1, 3 not run
cache.truncate(0, 6)                          # roll row 0 back to 6 positions; the others keep theirs
```

**Packed**, the rows' tokens are concatenated into one forward of N tokens (N = what the rows need), each token at
its own row's next position and attending only to its own row's cache. **Padded**, the forward is the rectangle a
`[B, T]` batch would run: every row of the cache, finished or not, fed as many tokens as the longest, the pads
computed and thrown away.

**Exercise 8 (design).** Write `batched_speculative_generate(target, draft, prompts, max_new_tokens, k=4)`: greedy
speculative decoding of several rows at once. `prompts` is a list of token lists, `max_new_tokens` a list (one per
row), `draft(tokens, k)` a function that returns up to k guesses for the text `tokens` (your `lookup_draft` is one);
it returns each row's prompt followed by exactly its own number of new tokens. What must hold (the check holds each):

* **each row's output equals its own single-row run**: the target's greedy tokens, and no more rounds than the row
  needs alone with the same draft — no row is held back to another's pace;
* **no row waits, and none waits for a finished row**: one target call per round carries every row that still has
  tokens to write, and a row that has written its tokens is never fed again;
* each row's cache holds only tokens of its output at every call (roll each row back on its own), and after its
  first call a row is fed at most K + 1 tokens.

The check runs Markov-chain targets and a tiny Llama through `RaggedTarget` with rows whose drafts range from
perfect to hopeless, with different prompts and numbers of tokens. Use no `lib.spec_decode.speculative` loop.
""")

nb.exercise("batched_speculative_generate", '''
def batched_speculative_generate(target, draft, prompts: list, max_new_tokens: list, k: int = 4) -> list:
    """Greedy speculative decoding of several rows in one batch: each row's prompt and exactly its own number of
    new tokens, each row identical to the row decoded alone."""
    ### BEGIN SOLUTION
    outs = [list(p) for p in prompts]
    start = [len(p) for p in prompts]
    cache = target.new_cache(len(prompts), max(len(p) + n for p, n in zip(prompts, max_new_tokens)) + k + 1)
    while True:
        guesses, feeds = {}, {}
        lengths = cache.lengths
        for row, out in enumerate(outs):
            left = max_new_tokens[row] - (len(out) - start[row])
            if left <= 0:
                continue  # finished: it leaves the batch
            m = min(k, left - 1)  # the round writes at most `left` tokens
            guesses[row] = list(draft(out, m))[:m]
            feeds[row] = (out + guesses[row])[lengths[row]:]  # what this row's cache has not seen
        if not feeds:
            return outs
        logits = target(feeds, cache=cache)  # one forward for every unfinished row
        for row, rows_logits in logits.items():
            guess = guesses[row]
            best = rows_logits[-(len(guess) + 1):].argmax(-1).tolist()
            n = 0
            while n < len(guess) and guess[n] == best[n]:
                n += 1
            outs[row] += guess[:n] + [best[n]]
            cache.truncate(row, len(outs[row]) - 1)  # this row's rollback: the others keep theirs
    ### END SOLUTION
''')
nb.test("test_batched_speculative_generate", "check_batched_speculative_generate(batched_speculative_generate)",
        points=3)

nb.md(r"""
**How the rounds go, now that your check passes.** Each round, every unfinished row gets its own guesses (up to
`min(K, tokens left − 1)`) and its own feed: the tokens its cache has not seen. One forward runs them all; each row
keeps its own prefix of guesses and one target token, and rolls its own cache back to what it kept. A row that has
written its tokens simply gets no feed. The forward's shape is the target's business: packed, it computes exactly
the fed tokens; padded, it computes a rectangle.

**What raggedness costs**, measured with your function and your `lookup_draft` (n-grams of 2 or 3 tokens) on eight
short prompts, some that repeat themselves (where lookup guesses right) and some that do not, batches of 4 and 8:
tokens per second decoding the rows one after another (a batch of one) and batched, packed and padded; the share
of the padded forwards that was padding; the share of the batch's row-slots left empty once rows finished (a static
batch cannot refill them; week 19's continuous batching does); and whether each row's output is its single-row run.
""")

nb.code("""
from lib.spec_decode.speculative_batch import RaggedTarget

ROWS8 = ["the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat",
         "Once upon a time, there was a", "To be, or not to be, that is the question. To be, or not to be, that",
         "The capital of France is", "a b c d e f g h a b c d e f g h a b c", "The best way to learn a new language is",
         "Monday, Tuesday, Wednesday, Thursday, Friday. Monday, Tuesday,", "My favourite recipe for pancakes needs"]
N8_NEW = 24 if FULL else 16
K8 = 4
rows8 = [tok(t).input_ids for t in ROWS8]
REPEATS8 = 3 if FULL else 2


def lookup8(tokens, k):
    return lookup_draft(list(tokens), k, max_ngram=3, min_ngram=2)  # your draft, n-grams of 2 or 3 tokens


def run8(target, rows):
    return batched_speculative_generate(target, lookup8, rows, [N8_NEW] * len(rows), k=K8)


alone8, alone_s = [], []
for row in rows8:  # each row decoded alone: its single-row run, and the time of a batch of one
    sync(); t0 = time.perf_counter(); alone8 += run8(RaggedTarget(model), [row]); sync()
    alone_s.append(time.perf_counter() - t0)
targets8 = {(b, layout): RaggedTarget(model, layout) for b in (4, 8) for layout in ("packed", "padded")}
outs8 = {}


def timed8(b, layout):
    def run():
        outs8[b, layout] = run8(targets8[b, layout], rows8[:b])
    return run


conditions = Conditions.now()
timings = interleaved({f"B={b} {layout}": timed8(b, layout) for b, layout in targets8}, repeats=REPEATS8, warmup=0)
conditions.done()
for b in (4, 8):
    s = targets8[b, "packed"].stats  # every timed run counted: ratios of the totals are each run's
    idle = 1 - s.row_rounds / (b * s.forwards)
    tput = {layout: b * N8_NEW / timings[f"B={b} {layout}"].best for layout in ("packed", "padded")}
    same = all(outs8[b, layout] == alone8[:b] for layout in ("packed", "padded"))
    loss = 1 - tput["padded"] / tput["packed"]
    verdict = f"padding loses {loss:.0%} of packed's" if loss >= 0 else f"padding beat packed by {-loss:.0%} in"
    print(f"B={b}: rows alone {b * N8_NEW / sum(alone_s[:b]):5.1f} tok/s; batched packed {tput['packed']:5.1f}, padded "
          f"{tput['padded']:5.1f} tok/s ({verdict} "
          f"throughput; {targets8[b, 'padded'].stats.pad_fraction:.0%} of the padded forwards' tokens were pads); "
          f"{s.forwards // REPEATS8} rounds, {idle:.0%} of the row-slots idle after their rows finished; every row "
          f"equal to its single-row run: {same}")
print(report(timings, conditions, unit="s", scale=1.0))
""")

nb.md(r"""
Read it with the load line: under load the times are noisy, and the ratios between figures of one run are what
holds. Where the rows accept very different numbers of tokens, the padded forward computes the longest row's feed
for every row, and a row that finished early still takes its slot in the rectangle; packing removes both, at the
price of a forward whose attention runs row by row. The rounds a batch takes are its slowest row's: the figure of
idle row-slots is the throughput a static batch loses to raggedness even when nothing is padded — continuous
batching (week 19) gives a finished row's slot to a new request.
""")

nb.md("Check: `pytest weeks/18 -k ex08`")

# --- 9 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 9. Beyond the anchors: FR-Spec, a smaller vocabulary for the draft's head

Section 5 showed where a draft's cost goes: any draft that ends in SmolLM2's LM head reads 49152 × 576 weights
(28 M, a fifth of the target) at **every** draft step. **FR-Spec** (Zhao et al. 2025) cuts that: the draft scores
only the N most **frequent** tokens — its head reads N × 576 weights — and every other token gets logit −∞, so
the draft never proposes it. Nothing changes on the target's side: it still verifies over the full vocabulary.

* **Greedy** output stays identical to the target's: every written token is still the target's argmax; a token
  outside the subset is simply never drafted, and the target writes it itself as the correction (or bonus) token.
* **Sampling** stays exact: q = 0 outside the subset is just another draft distribution. Section 3's proof never
  assumed q > 0 — those tokens are never proposed, and the residual (p − q)+ = p there hands them their full
  target mass after a rejection. (`tests/test_week18_lib.py` runs the chi-square test of exercise 2 with such a
  q, and checks the identity P(emit x) = p(x) exactly.) What it costs is acceptance: α falls by about the target
  mass outside the subset.

**Which corpus to count on.** The only prose in the repo is *Hamlet*, so the counts come from the **first 80 %** of
its tokens; α is then measured on the **held-out last 20 %** (counting and evaluating on the same text would
flatter the subset) and on the target's own answer to the chat prompt of section 5 (another domain: modern
prose). Tokens *Hamlet* never shows are ranked by id — a BPE tokenizer numbers tokens in merge order, so low ids
were frequent in its own training corpus. (The paper counts on a large general corpus, SlimPajama.)
""")

nb.code("""
all_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[0]  # [~52.8k] the whole play
split = int(0.8 * all_ids.numel())
counts = lib_drafts.token_counts(all_ids[:split], cfg.vocab_size)  # [vocab]: frequencies in the first 80 %
N_HELD = 512 if FULL else 256
held = all_ids[None, split:split + N_HELD].to(model.device)  # [1, N_HELD], never counted
SUBSETS = [1024, 2048, 4096, 8192, 16384, cfg.vocab_size] if FULL else [2048, 8192, cfg.vocab_size]
t_chat = chat_prompt.shape[1]
with torch.no_grad():
    p_held = model(held)[0]  # [N_HELD, vocab]
    p_chat = model(base_ids)[0, t_chat - 1:-1]  # [N_SPEED, vocab]: the target's answer, teacher forcing
print(f"{int((counts > 0).sum())} distinct tokens in the counted {split} tokens of Hamlet")

fr_bases = {"int8 copy": drafts["int8 copy"], "your distilled draft": student}  # section 7's draft

fr = {}
for bname, base in fr_bases.items():
    for n_keep in tqdm(SUBSETS, desc=f"FR-Spec, {bname}"):
        keep = lib_drafts.frequency_ranked_ids(counts, n_keep)
        d = base if n_keep == cfg.vocab_size else lib_drafts.fr_spec_draft(base, keep)
        inside = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=model.device)
        inside[keep.to(model.device)] = True
        with torch.no_grad():
            q_held = d(held, cache=d.new_cache(batch=1, max_len=N_HELD))[0]
            q_chat = d(base_ids)[0, t_chat - 1:-1]
        fr[bname, n_keep] = dict(
            draft=d,
            a0=(p_held.argmax(-1) == q_held.argmax(-1)).float().mean().item(),  # α at T = 0, held-out Hamlet
            a1=1 - expected_rejections(torch.softmax(p_held, -1), torch.softmax(q_held, -1)).item() / N_HELD,  # T = 1
            a0_chat=(p_chat.argmax(-1) == q_chat.argmax(-1)).float().mean().item(),
            cover=inside[p_held.argmax(-1)].float().mean().item(),  # target argmax inside: α0's ceiling
            c=draft_cost(d))
print(f"{'draft':18s} {'N':>6s} {'head MB':>8s} {'covers':>7s} {'α0 held':>8s} {'α1 held':>8s} {'α0 chat':>8s} "
      f"{'c':>5s} {'best K':>6s} {'pred.':>6s}")
for (bname, n_keep), r in fr.items():
    r["best_k"] = max(range(1, 9), key=lambda k: lab.predicted_speedup(r["a0"], k, r["c"], curve))
    r["pred"] = lab.predicted_speedup(r["a0"], r["best_k"], r["c"], curve)
    head_mb = n_keep * cfg.d_model * (1 if bname == "int8 copy" else 4) / 1e6
    print(f"{bname:18s} {n_keep:6d} {head_mb:8.1f} {r['cover']:7.3f} {r['a0']:8.3f} {r['a1']:8.3f} "
          f"{r['a0_chat']:8.3f} {r['c']:5.2f} {r['best_k']:6d} {r['pred']:5.2f}x")
""")

nb.code("""
fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
for i, bname in enumerate(fr_bases):
    rows = [(n, fr[bname, n]) for n in SUBSETS]
    ns = [n for n, _ in rows]
    axes[0].plot(ns, [r["a0"] for _, r in rows], "o-", color=f"C{i}", label=f"{bname}: held-out Hamlet")
    axes[0].plot(ns, [r["a0_chat"] for _, r in rows], "s--", color=f"C{i}", label=f"{bname}: chat answer")
    axes[1].plot(ns, [r["c"] for _, r in rows], "o-", color=f"C{i}", label=bname)
    axes[2].plot(ns, [r["pred"] for _, r in rows], "o-", color=f"C{i}", label=bname)
axes[0].plot(SUBSETS, [fr[next(iter(fr_bases)), n]["cover"] for n in SUBSETS], ":", color="gray",
             label="target argmax inside the subset")
for ax, title in zip(axes, ["α at T = 0 vs N", "draft cost c vs N", "predicted speedup (best K) vs N"]):
    ax.set_xscale("log", base=2); ax.set_xlabel("N (tokens the draft's head scores)"); ax.set_title(title)
axes[0].legend(fontsize=7); axes[1].legend(fontsize=7); axes[2].axhline(1, color="gray", lw=0.5); plt.show()
""")

nb.md(r"""
And briefly, measured: greedy speculation on the chat prompt with the full head and with the subset the model
predicts best, K = 2, tokens checked identical to the target's.
""")

nb.code("""
for bname in fr_bases:
    best_n = max((n for n in SUBSETS if n < cfg.vocab_size), key=lambda n: fr[bname, n]["pred"])
    sync(); t0 = time.perf_counter(); lib_generate(model, chat_prompt, N_SPEED); sync()  # side by side
    t_base = time.perf_counter() - t0
    for n_keep in (cfg.vocab_size, best_n):
        r = fr[bname, n_keep]
        st = SpecStats()
        sync(); t0 = time.perf_counter()
        ids = lib_speculative_generate(model, r["draft"], chat_prompt, N_SPEED, k=2, stats=st)
        sync(); r["measured"] = t_base / (time.perf_counter() - t0)
        print(f"{bname:18s} N={n_keep:5d} K=2: measured {r['measured']:.2f}x (predicted from α on the chat answer "
              f"{lab.predicted_speedup(r['a0_chat'], 2, r['c'], curve):.2f}x), acceptance {st.acceptance_rate:.2f}, "
              f"identical to target greedy: {torch.equal(ids, base_ids)}")
""")

nb.md(r"""
What to read off (your numbers are above):

* **c falls with N, but only by the head's share.** For the int8 copy the head is the share of its weights printed
  in section 5 (and less of its time: this CPU's eager step spends much of it outside the matmuls), so even the
  smallest N saves little. For a *small* draft — yours from section 7 — the head is most of the draft, and its c
  falls with N far more (the table above): that is the regime the paper targets (one-layer EAGLE-style drafts,
  128k-token vocabularies).
* **α falls as N shrinks**, by about the target's mass outside the subset (the dotted line bounds α at T = 0:
  the target's argmax must be inside). On held-out *Hamlet* a few thousand tokens cover almost everything; on the
  chat answer the *Hamlet* ranking covers much less — the counts must come from the workload's domain. A weak
  draft (a briefly distilled one) can even *gain* a little α from the subset, where the frequency ranking acts as a
  prior that removes some of its wrong guesses — compare your draft's rows.
* Exactness never moved: every measured run above is identical to the target's greedy output.
""")

# --- 10 ------------------------------------------------------------------------------------------------------
nb.md(r"""
## 10. A draft that reads the target: one layer on its last hidden state (EAGLE-style) with an FR-Spec head

On chat, every draft so far loses: the int8 copy has a high α but costs most of a target step (section 5); a small
separate draft is cheap but must rebuild, from tokens alone, what the target already knows (yours, section 7, agrees
with the target far less often, and less again on chat: section 9's table); prompt lookup finds little to copy in an
answer that invents its text. **EAGLE** (Li et al. 2024)
lets the draft *read* what the target knows: the target's last hidden state h_t (the vector its LM head reads),
with the embedding of the token that followed, goes through **one** small transformer layer that predicts
h_{t+1}; logits come from the target's own head rows — here only the 4096 most frequent tokens of the target's
chat answers (FR-Spec, section 9), so an output step reads 4096 × 576 weights, not 49152 × 576. To draft K tokens
it feeds itself its own predicted ĥ; after verification it re-reads the accepted tokens with the target's true
hidden states, which the verify forward has just computed (`lib/spec_decode/draft_head.py`).

It was trained by **self-distillation**: SmolLM2 answered chat prompts made from templates × topics (none of them
the prompts below), and the head learned to predict the target's next hidden state and greedy token on those
answers (`tools/train_draft_head.py`; its command, seed, data and time are stored with the weights and printed
below). The committed weights (`data/draft_head/head.pt`, int8 per row) are loaded here, not trained.

The target here is `lib.modeling.fast.FastLlama` — the same model, run by the kernel that decodes fastest on this CPU
(`lib.modeling.fast` times its kernels once per machine and prints which it chose, below) — because that is what a server
would run, and its **verify curve is different from section 1's**. Each of its kernels reads a weight once for a
few rows, but what one step costs differs: with oneDNN's packed weights a one-token step is slow enough that
scoring m ≤ 8 tokens costs about one step; the one-call C++ step (chosen on the lab's EPYC) makes every step of a
few rows much cheaper — no Python between its operations, the verify step's K + 1 tokens included — and its curve
stays low while the rows fit its loops. Both curves are measured below, with each draft's cost c relative to this target, and greedy
speculation on chat prompts (three with `FULL`), side by side with the int8 copy and prompt lookup (tokens checked identical to
the target's).
""")

nb.code("""
from lib.spec_decode import draft_head as dh
from lib.modeling.fast import FastLlama

fast = FastLlama(model)  # same tokens as `model`, faster
print("FastLlama's kernel:", fast.kernel_reason)
head = dh.load_draft_head(model)  # shares the model's embedding; one layer + fc, 4096 output rows
print("trained by:", head.meta.get("command"), "| seed", head.meta.get("seed"), "|", head.meta.get("steps"), "steps in",
      head.meta.get("train_seconds"), "s on", head.meta.get("threads"), "threads, after",
      head.meta.get("data_seconds"), "s answering the prompts;", head.meta.get("answers"), "answers trained on (",
      head.meta.get("answer_tokens"), "tokens; the command's other prompts held out)")
m_sizes = list(range(1, 10))
conditions = Conditions.now()
fast_curve = lab.verify_curve(fast, text_ids, m_sizes, context=CONTEXT, repeats=repeats)
plain_curve = {m: vc(m) for m in m_sizes}  # section 1's curve for lib.modeling.llama (sizes it did not measure interpolated)
costs8 = {"draft head": lab.relative_cost(dh.head_step(head, fast, text_ids, CONTEXT), fast, text_ids, CONTEXT),
          "int8 copy": lab.relative_cost(lab.draft_step(drafts["int8 copy"], text_ids, CONTEXT), fast, text_ids, CONTEXT),
          "prompt lookup": lab.relative_cost(lab.draft_step(drafts["prompt lookup"], text_ids, CONTEXT), fast, text_ids,
                                             CONTEXT)}
conditions.done()
print("verify curve, FastLlama: " + ", ".join(f"{m}: {fast_curve[m]:.2f}" for m in m_sizes) + f"; {conditions.line()}")
disturbed8 = impossible_verify_curve(fast_curve)
if disturbed8:
    print(disturbed8)
print("verify curve, lib.modeling.llama: " + ", ".join(f"{m}: {plain_curve[m]:.2f}" for m in m_sizes))
print("c relative to FastLlama: " + ", ".join(f"{d} {c:.3f}" for d, c in costs8.items()))
""")

nb.code("""
CHAT8 = ["What are three tips for staying healthy?", "Explain what a hash table is to a beginner.",
         "Write a short story about a robot who learns to paint."]  # benchmarks/speculative.py's chat workload
CHAT8 = CHAT8 if FULL else CHAT8[:2]
N8 = 64 if FULL else 24
HEAD_KS = [1, 2, 3, 4, 5] if FULL else [1, 2]
runs = {("draft head", k): lambda ids, k, st: dh.head_speculative_generate(fast, head, ids, N8, k=k, stats=st)
        for k in HEAD_KS}
runs["int8 copy", 2] = lambda ids, k, st: lib_speculative_generate(fast, drafts["int8 copy"], ids, N8, k=k, stats=st)
runs["prompt lookup", 4] = lambda ids, k, st: lib_speculative_generate(fast, drafts["prompt lookup"], ids, N8, k=k,
                                                                       stats=st, min_draft_prob=0.5)
prompts8 = [chat_ids(tok, t, model.device) for t in CHAT8]
t_base, refs8 = 0.0, []
times8 = {key: 0.0 for key in runs}
stats8 = {key: SpecStats() for key in runs}
same8 = {key: True for key in runs}
lib_generate(fast, prompts8[0], 4)  # warm-up
for ids in tqdm(prompts8, desc="chat prompts"):
    sync(); t0 = time.perf_counter(); ref = lib_generate(fast, ids, N8); sync(); t_base += time.perf_counter() - t0
    for (name, k), fn in runs.items():  # every run right after the baseline: ratios survive a busy machine
        sync(); t0 = time.perf_counter(); out = fn(ids, k, stats8[name, k]); sync()
        times8[name, k] += time.perf_counter() - t0
        same8[name, k] &= torch.equal(out, ref)
print(f"target (FastLlama) greedy: {len(prompts8) * N8 / t_base:.1f} tok/s; load average {os.getloadavg()[0]:.1f}")
print(f"{'draft':14s} {'K':>2s} {'α':>5s} {'c':>6s} {'tok/call':>8s} {'predicted':>9s} {'measured':>8s} identical")
result8 = {}
for (name, k), st in stats8.items():
    a = st.acceptance_rate if st.drafted else 0.0
    k_eff = max(1, round(st.drafted / st.rounds))  # prompt lookup drafts fewer than K where nothing matches
    pred = lab.predicted_speedup(a, k_eff, costs8[name], fast_curve)
    result8[name, k] = dict(a=a, pred=pred, meas=t_base / times8[name, k], tpc=st.tokens_per_call)
    print(f"{name:14s} {k:2d} {a:5.2f} {costs8[name]:6.3f} {st.tokens_per_call:8.2f} {pred:8.2f}x "
          f"{t_base / times8[name, k]:7.2f}x {same8[name, k]}")
""")

nb.md(r"""
**Why the speedup is what it is.** The model of section 6 says a round writes (1 − α^(K+1)) / (1 − α) tokens and
costs K·c + verify_cost[K + 1] steps. With the measured c and verify curve fixed, the cell below solves for the α
the head would need for 1.5× (at its best K), plots the predicted speedup against α for this c and curve, and
marks where the measured runs sit. The gap between predicted and measured is what the model leaves out: the
loop's own Python per round and per draft call, and the head's catch-up forward over the accepted tokens.
""")

nb.code("""
def best_speed(a, c, curve_):
    return max(lab.predicted_speedup(a, k, c, curve_) for k in range(1, max(curve_)))

c_head = costs8["draft head"]
lo, hi = 0.0, 1.0
for _ in range(40):  # bisection: the smallest α whose best K reaches 1.5x with this c and verify curve
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if best_speed(mid, c_head, fast_curve) >= 1.5 else (mid, hi)
alpha_head = result8["draft head", HEAD_KS[1]]["a"]
print(f"draft head: c = {c_head:.3f}; α needed for 1.5x (predicted, best K) = {hi:.2f}; α measured on chat = "
      f"{alpha_head:.2f}; predicted at the measured α = {best_speed(alpha_head, c_head, fast_curve):.2f}x")
print(f"with lib.modeling.llama's verify curve instead: α needed = "
      f"{min((a / 100 for a in range(101) if best_speed(a / 100, c_head, plain_curve) >= 1.5), default=float('nan')):.2f}")
alphas = [a / 50 for a in range(50)]
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
axes[0].plot(m_sizes, [fast_curve[m] for m in m_sizes], "o-", label=f"FastLlama ({fast.kernel} kernel)")
axes[0].plot(m_sizes, [plain_curve[m] for m in m_sizes], "s-", label="lib.modeling.llama (section 1, interpolated)")
axes[0].plot(m_sizes, m_sizes, "--", color="gray", label="m separate steps")
axes[0].set_xlabel("tokens scored in one forward (K + 1)"); axes[0].set_ylabel("steps"); axes[0].set_title("verify curves")
axes[0].legend(fontsize=7)
for name, c in costs8.items():
    axes[1].plot(alphas, [best_speed(a, c, fast_curve) for a in alphas], label=f"predicted, c = {c:.2f} ({name})")
for (name, k), r in result8.items():
    axes[1].plot(r["a"], r["meas"], "o", label=f"measured: {name}, K={k}")
axes[1].axhline(1.5, color="gray", ls=":"); axes[1].axhline(1, color="gray", lw=0.5)
axes[1].set_xlabel("α (T = 0)"); axes[1].set_ylabel("speedup over FastLlama greedy"); axes[1].legend(fontsize=6)
axes[1].set_title("speedup vs α at the measured c and verify curve"); plt.show()
""")

nb.md(r"""
What to read off (your numbers are above, with the load; a busy machine makes single ratios noisy):

* **The head is cheap**: its c is a small fraction of a FastLlama step (one block and 4096 output rows against 30
  blocks and 49152 rows), against most of a step for the int8 copy and ≈ 0 for prompt lookup. That is the regime
  the speedup model needs. How steep FastLlama's verify curve is depends on its kernel (named above): with packed
  weights a one-token step is slow enough that a few tokens cost about one step; the one-call C++ step makes every
  step of a few rows much cheaper, the verify step included, and relative to that cheaper step a verify of a few
  tokens costs more steps — a faster target leaves less for speculation to win unless its verify step is as lean as
  its decode step. Compare the two curves above; with `lib.modeling.llama` as the target the head would need another α,
  which the cell above computes.
* **What it lacks is α.** It was trained on the target's own answers to template prompts (the command, the answers,
  tokens and time are printed above; `tools/train_draft_head.py` prints its held-out agreement), and it agrees with
  the target far less on the benchmark's chat prompts, which no template resembles, and less again on its second
  and third guesses, which read its own predicted features: compare its α at K = 1 and K = 2 in the table. The cell
  above gives the α that 1.5× needs at this c and verify curve; EAGLE's authors report α ≈ 0.7–0.8 for heads trained
  for hours on tens of thousands of real conversations — the gap here is the data (template prompts, one topic
  list), not the construction, and `tools/train_draft_head.py` is where to spend more.
* **Exactness never moved**: every run is checked identical to the target's greedy tokens.
""")

nb.md(f"""
**Your target beside the lab's recorded runs.** `benchmarks/decode.py --record` decoded the same model greedily on the
lab's machine: `FastLlama` with the one-call C++ step at {recorded_md("decode", FAST_DECODE, EPYC)}, with packed
weights at {recorded_md("decode", PACKED_DECODE, EPYC)}, and `lib.modeling.llama` at {recorded_md("decode", MODEL_DECODE, EPYC)}.
Your target's figure is printed above with your machine's load; the two machines differ, and so does the kernel
`lib.modeling.fast` chose (named above). Speculation competes with the target's own step: the faster that step, the less a
verify step of K + 1 tokens saves.
""")

# --- 11 ------------------------------------------------------------------------------------------------------
nb.md(r"""
## 11. Check your understanding (written, graded by hand)

**Q5** (seed 002). Speculative decoding uses rejection sampling. A draft token has probability q(x) = 0.6 in
the draft model and p(x) = 0.3 in the target model. What is the probability it is accepted, and if it is
rejected, from which distribution does the replacement come — and why not from p? (Seed 002 uses this
notebook's letters: q = draft, p = target.)
""")
nb.answer("answer_q5", r"""
YOUR ANSWER HERE

*Mark scheme (2 points).* (1) min(1, p/q) = min(1, 0.3/0.6) = 0.5 (not min(1, q/p) = 1: the ratio is target over
draft). (2) From the residual normalize(max(p − q, 0)), the mass p has that q under-covers: then P(emit x) =
min(p(x), q(x)) + (1 − Σ min(p, q))·residual(x) = p(x). Sampling the replacement from p gives tokens q
over-proposes (like this one) more than p(x).
""", points=2)

nb.md(r"""
**Q6.** In the GPU-like regime (flat verify curve, c = 0.05), what speedup does your model predict for α = 0.8,
K = 4, and what does that number assume? Name one assumption that sections 1, 4 or 5 contradict on this CPU, with
your measured number.
""")
nb.answer("answer_q6", r"""
YOUR ANSWER HERE

*Mark scheme (2 points).* (1) (1 + 0.8 + 0.8² + 0.8³ + 0.8⁴) / (4·0.05 + 1) = 3.3616 / 1.2 = 2.80×. (2) Any of, with
the student's measurement: the same α at every position (section 4's histogram; section 7's predicted and measured
calls), a flat verify curve (section 1's and section 10's curves: a few tokens cost well over one step for
`lib.modeling.llama`), a draft costing a twentieth of a step (section 5: the int8 copy's c is most of a step), no loop
overhead.
""", points=2)

nb.md(r"""
**Q7** (written). Seed 002's decision tree puts speculative decoding on the "fits on one GPU" branch as step 4,
"if latency-critical", and not on the "No GPU / edge / laptop" branch. Explain both placements with this week's
speedup model, and say — with your measured numbers — on which workloads you would still turn it on on this CPU.
""")
nb.answer("answer_q7", r"""
YOUR ANSWER HERE

*Mark scheme (3 points).* (1) Speculation cuts **latency** at batch 1: a GPU decoding one sequence is memory-bound,
so scoring K + 1 tokens costs about one step (flat verify curve) and a small draft costs c ≈ 0.05, giving 2–3×; at
large batch the GPU is already compute-bound, verification is no longer free, and throughput gains vanish —
hence "if latency-critical" and after batching (section 8: in a batch, rows that accept different numbers of tokens
also cost padding or idle slots). (2) On a CPU/laptop the verify curve is not flat (the student's sections 1 and 10)
and any draft that reads the full 49152 × 576 LM head pays for it at every step (section 5: a large share of a
bandwidth-bound step), so the predicted speedup for realistic α is about one or below — quantization and a smaller
model help more; the cheap draft head of section 10 has a small c but its α on chat is low (the student's
figures). (3) Still worth it where α is high and c ≈ 0: prompt lookup on quoting/summarizing/editing workloads
(section 5's edit and quote runs; `benchmarks/speculative.py` prints chat, edit and quote). Model drafts want K small (2–4) because the verify curve is not flat; prompt lookup
drafts only where an n-gram matches, so a long K costs little there and pays on long copied runs.
""", points=3)

nb.write(str(REPO / "solutions" / "18" / "week18_speculative.ipynb"))
print("wrote solutions/18/week18_speculative.ipynb")
