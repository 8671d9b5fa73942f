"""Builds solutions/18/week18_speculative.ipynb (run: python tools/weeks/week18.py)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.nbbuild import Notebook  # noqa: E402

nb = Notebook()

nb.md(r"""
# Week 18 — Speculative decoding: draft, verify, reject, and prove it exact

Decoding one token costs one pass over all the weights, and on this CPU (like on a GPU) that pass is limited
by memory traffic, not arithmetic: scoring **several** tokens in one pass costs less than scoring them one by one
(how much less is measured in section 1, and it depends on the machine and the matmul kernels: on the lab's quiet
2-core EPYC `lib.model` scored 2 tokens in 1.5–1.6 steps but 5–8 tokens in 1.2–1.4, and the packed `FastLlama`
2–9 tokens in about 1.1 — not "barely more than one" everywhere, and not a smooth curve).
**Speculative decoding** exploits that: a cheap **draft** guesses the next K tokens, the **target** scores all
of them in one forward, and we keep the longest prefix the target agrees with, plus one token of the
target's own. Done right, the output is **exactly** what the target alone would produce — token for token
when greedy, in distribution when sampling. This week you build it on SmolLM2, prove both kinds of exactness,
measure acceptance against theory, and find out honestly when it is faster on this CPU and why.

**Notation** (everywhere in this notebook and in `lib/speculative.py`): **p is the target** distribution,
**q is the draft**. Seed quiz 002 Q5 uses the same letters; the TV-distance paper in the resources (seed 004)
calls the draft p and the target q — read it with the letters swapped.

**You will write** the decoder's parts: greedy speculative decoding with cache rollback, the verification step
of speculative sampling and the sampling loop around it, the expected number of rejections (derived, not
given), the prompt-lookup draft, and the best K for a measured verify curve (derived). Check them with
`pytest weeks/18`; the written answers of section 9 are graded by hand.

`FULL = True` below runs the longer measurements (more repeats and positions); the default runs the whole
notebook in about two minutes on two cores.
""")

nb.setup("""
import math

import torch

from lib.kv_cache import KVCache
from grader.checks.week18 import (check_speculative_generate, check_verify, check_speculative_sample,
                                  check_expected_rejections, check_lookup_draft, check_best_k)
""")

nb.code("""
import dataclasses
import os
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from grader.checks import week18 as checks
from lib import roofline
from lib import speculative as lab  # the lab's reference, to compare against (not to call in your exercises)
from lib.generate import generate as lib_generate
from lib.model import shared_smollm2
from lib.text import load_text
from lib.timing import Conditions, Timed, impossible_verify_curve, warning

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
plt.title("The verify-cost curve (SmolLM2, fp32, this CPU)" + ("\nMEASUREMENT DISTURBED: rerun when quieter" if disturbed else ""))
plt.legend(); plt.show()
""")

nb.md(r"""
Scoring m tokens costs much less than m steps — the weights are read once either way — but not always "barely
more than one", and the curve need not be smooth: the matmul library picks its kernel by the number of rows. On
the lab's 2-core AMD EPYC, quiet (load < 1, two runs of 9 repeats), `lib.model` cost 1.53–1.58 steps for 2 tokens
and 1.83–1.87 for 3, but only 1.39–1.43 for 4, 1.22–1.35 for 5–8 and 1.54–1.57 for 16 (the kernel for 2–3 rows is
the slow one); a quiet 2-core Xeon measured 1.04–1.11 for 2 tokens and 1.5–1.6 for 4. Your figures are above, and the cell below
prints what each extra token adds. A round that verifies K + 1 tokens has to win back `verify_cost[K + 1]` steps.
On a datacenter GPU the curve stays near 1 up to tens of tokens; section 6 shows what that changes.
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

One **round** of greedy speculation, with the sequence so far `out` (the last token not yet in either cache):

1. the draft proposes K tokens greedily, one forward each, on its own KV cache;
2. the target scores `out`'s last token and the K draft tokens **in one forward** on its cache: K + 1 rows
   of logits; row 0 is its prediction after `out`'s last token, row i (i ≥ 1) after draft token i − 1 — so
   draft token i is right when it equals the argmax of row i;
3. keep draft tokens while they equal the target's argmax (n of them), then append the target's argmax
   at the first disagreement — or, if all K agree, its argmax after the last one (the **bonus** token):
   every round writes n + 1 tokens with one target call;
4. **roll back**: both caches now hold positions of rejected draft tokens. Truncate each to the tokens kept
   (`cache.truncate(len(out) - 1)`); the next round feeds each model whatever it has not seen yet.

Near the end, draft fewer tokens so that exactly `max_new_tokens` come out. Every token written is the
target's argmax given the tokens before it, so the output is **identical** to greedy decoding with the
target alone, whatever the draft — a bad draft only costs time. (Identical *as arithmetic*: a forward over
K + 1 tokens is not bitwise the K + 1 one-token steps; the cell after the exercise measures the difference
and when it can flip a token.)

**Exercise 1.** Write `speculative_generate(target, draft, input_ids, max_new_tokens, k=4)` (greedy). Both
models are called as `model(ids [1, t], cache=c)` with `c = model.new_cache(batch=1, max_len=...)`, and
`c.length`, `c.truncate(n)`. Use your own loop (no `lib.speculative`, no `lib.generate`). The check runs
Markov-chain and tiny-Llama targets with drafts from perfect to hopeless (it counts target calls: token by
token does not pass), and SmolLM2 for 64 tokens with K ∈ {2, 8} (the draft there is prompt lookup: section 5).
The models it hands you count every forward, `target(...)` or `target.forward(...)`: after the prefill a target
call may feed at most K + 1 tokens and a draft call at most 2 (the last draft token and the target's, after a
round that kept all K), and at the start of each round each cache must hold only tokens of the output.
Last, it runs your loop once more with torch's default device set to `meta` (the models and the prompt stay on
the CPU): a tensor made without `device=` lands there and is refused, as it would land on the CPU beside a model
on CUDA — make the ids you feed with `device=input_ids.device`.
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
drafts = {"prompt lookup": lab.PromptLookupDraft(cfg.vocab_size, device=model.device),  # drafts on the model's device
          "int8 copy": lab.quantized_draft(model)}
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
only under that condition — not on every input, and less so in fp16, whose rounding error is ~1000× fp32's).
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

Sampling is where most write-ups stop at "accept if it looks likely". The exact rule (Leviathan et al. 2023,
Chen et al. 2023): draft token x_i was drawn from q_i; **accept it with probability min(1, p_i(x_i) / q_i(x_i))**.
At the first rejection, sample the replacement from the **residual** normalize(max(p_i − q_i, 0)); if all K
are accepted, sample a bonus token from p_K.

Why it is exact, for one position: P(emit x) = q(x)·min(1, p(x)/q(x)) + P(reject)·residual(x). The first
term is min(p(x), q(x)); the second must supply the rest, p(x) − min(p(x), q(x)) = max(p(x) − q(x), 0), which is
the residual's shape — and it does exactly when P(reject) equals the residual's normaliser Σ_y max(p(y) − q(y), 0)
(section 4 has you work out P(reject) and see that it does). The residual is exactly the mass of p that q
under-covers. Sample the replacement from p instead and tokens
that q over-proposes come out too often; accept with min(1, q/p) (the letters swapped) and tokens the target
never writes (p = 0) slip through.

**Exercise 2.** Write `verify(target_probs [K+1, V], draft_probs [K, V], draft_tokens [K], generator=None)
-> (n_accepted, next_token)` (two ints). Draw every random number from `generator`, on the inputs' device
(`torch.rand((), generator=generator, device=target_probs.device)`, `torch.multinomial(..., generator=generator)`);
leave the arguments unchanged (the caller still needs p and q).

The check knows the **exact law** of your output. For fixed inputs, with a_i = min(1, p_i(x_i)/q_i(x_i)) and
r_i = normalize(max(p_i − q_i, 0)): P(n = j, next = y) = a_0 ··· a_(j−1) · (1 − a_j) · r_j(y) for j < K, and
a_0 ··· a_(K−1) · p_K(y) for j = K. Per run (seed printed) it draws p, q and draft tokens with every ratio strictly
between 0 and 1 at every position (K = 3, so the third draft token and the bonus after it are tested), plus
edge cases (p = q, disjoint supports, a ratio above 1 first, q zero where p has mass) and a longer round (K = 6:
three sure acceptances, then three uncertain ones), calls your `verify` 42,000 + 5 × 4,000 times, and tests every
acceptance probability and every next-token probability against the law. A correct `verify` fails less than once in a million runs; one whose acceptance probability is off by
2 points at any position fails with probability above 0.999 (the cell after the exercise shows how).
""")

nb.exercise("verify", '''
def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling: accept draft token i w.p. min(1, p_i/q_i); on rejection sample (p_i - q_i)+;
    if all K are accepted, a bonus token from p_K. Returns (n_accepted, next_token)."""
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
**Exercise 3.** Around your `verify`, write the sampling loop: `speculative_sample(target, draft, input_ids,
max_new_tokens, k=4, temperature=1.0, generator=None)`. It is exercise 1's loop with three changes: the draft
*samples* its tokens from q = softmax(draft logits / T) (keep each q row), the target's K + 1 rows become
p = softmax(target logits / T), and your `verify` decides what is kept; roll both caches back as before. Pass
`generator` to every draw. The check runs it with counted models (the work rules of exercise 1), then 760
times on models whose law is set per position, at K = 4, 8, 1 and 2 and T = 1, 0.5 and 2, and tests the law
of **every** new token against the target's — each position of a round, the token after a rejection and the
bonus token after K acceptances — under the same work rules; it runs your loop from generators in equal states
(the ids must be equal) and in different ones (they must differ); and last with torch's default device set to
`meta`, as in exercise 1. A draft token that is q's argmax instead of a sample of q, one uniform reused for a
round's draft positions, or a loop exact for two tokens and wrong after them fails it every run.
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

**Exercise 4.** Write `expected_rejections(p [n, V], q [n, V]) -> 0-dim tensor`: the expected number of rejected
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
**Tokens per target call, from your own runs.** If every draft token were accepted with the same probability α
(given the ones before it), a round of K would write a number of tokens you will derive in section 6. Seed
001 says "accept/reject each token independently": that is not what verify does — it tests in order and stops
at the first rejection, so token i is tested only if tokens 0..i−1 were kept, and α varies from position to
position. Run your `speculative_sample` (T = 1, the int8 draft) with counting models and compare the tokens
per target call you measure with what the constant-α model predicts at the α you just measured
(`lab.expected_tokens_per_call`, the lab's version of the formula you derive in section 6).
""")

nb.code("""
n_tok = 96 if FULL else 32
Ks = [1, 2, 4, 8] if FULL else [1, 4]
g = torch.Generator(device=model.device).manual_seed(2)
tpc = {}
for k in tqdm(Ks, desc="your speculative_sample"):
    t_count, d_count = Counting(model), Counting(int8)
    speculative_sample(t_count, d_count, text_ids[:, :64], n_tok, k=k, temperature=1.0, generator=g)
    accepted = n_tok - t_count.calls  # each target call (round) writes its accepted tokens plus one
    tpc[k] = (n_tok / t_count.calls, accepted / d_count.calls)  # tokens per call, acceptance among drafted
kk = torch.arange(1, 11)
plt.figure(figsize=(6, 3.5))
plt.plot(kk, [lab.expected_tokens_per_call(alpha_measured, int(k)) for k in kk], "-",
         label=f"constant α = {alpha_measured:.2f}")
plt.plot(list(tpc), [v[0] for v in tpc.values()], "o", label="measured (your speculative_sample, int8 draft, T=1)")
plt.xlabel("K"); plt.ylabel("tokens per target call"); plt.legend(fontsize=8)
plt.title("Acceptance theory vs measurement"); plt.show()
for k, (t, acc) in tpc.items():
    print(f"K={k}: measured {t:.2f} tokens per call (acceptance {acc:.2f} of drafted); constant-α model "
          f"{lab.expected_tokens_per_call(alpha_measured, k):.2f}")
""")

nb.md(r"""
The constant-α model is an idealization: α varies from position to position (histogram below), and a run of
easy positions keeps more tokens than the mean α predicts, so measured tokens per call can exceed the model at
large K. The seed's "α = 0.5 → ~2.1 tokens per call" cannot happen under it for any K: the tokens per round are
bounded by their K → ∞ limit, computed in the next cell (seed 002's "α = 0.7, K = 4 → 3.6" is also too high).
""")

nb.code("""
alpha_pos = torch.minimum(p_all, q_all).sum(-1)  # [N_POS]: α at each position
print("α = 0.5: " + ", ".join(f"K={k}: {lab.expected_tokens_per_call(0.5, k):.3f}" for k in (1, 2, 4, 8, 16))
      + f"; K -> ∞: {1 / (1 - 0.5):.3f} < 2.1")
print(f"α = 0.7, K = 4: {lab.expected_tokens_per_call(0.7, 4):.3f} tokens per call (3.6 would need α ≈ 0.83)")
plt.figure(figsize=(6, 3))
plt.hist(alpha_pos.cpu().numpy(), bins=40)
plt.xlabel("α at one position (int8 draft, T = 1)"); plt.ylabel("positions")
plt.title("Per-position α"); plt.show()
""")

nb.md("Check: `pytest weeks/18 -k ex04`")


# --- 5 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 5. Drafts compared on SmolLM2

Four kinds of draft, all with a model's call shape (`lib/drafts.py`):

* **random 2-layer** model with SmolLM2's vocabulary: the α ≈ 0 baseline (the seed says "≈ 1/vocab"; it is
  Σ min(p, q), which two broad distributions make a few percent);
* **early exit**: the target's first L layers + its final norm + LM head — free to build, shares every weight,
  but the intermediate layers were never trained to predict tokens;
* **int8 copy** of the target: every linear layer (and the LM head) with int8 per-output-channel weights —
  the same model up to rounding, so α is high; its cost c is what decides;
* **prompt lookup**: no model; guess that the text repeats an n-gram seen before (drafts only where one
  matches, `min_draft_prob=0.5`).

For each: α at T = 0 (argmax agreement) and T = 1 on *Hamlet* (teacher forcing, `lab.alpha_profile`), the draft's
cost c (one draft step / one target step, after a 128-token cache), the speedup the model of section 6 predicts
from α, c and the verify curve of section 1, and the measured wall-clock speedup of greedy speculation on a
chat prompt (tokens identical to the target's, checked).
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

chat_ids = lab.chat_ids(tok, "What are three tips for staying healthy?", model.device)  # the chat template, [1, t]
candidates = {
    "random 2-layer": (lab.random_draft(cfg, device=model.device), 0.0),
    "early exit 4": (lab.early_exit_draft(model, 4), 0.0),
    "early exit 20": (lab.early_exit_draft(model, 20), 0.0),
    "int8 copy": (drafts["int8 copy"], 0.0),
    "prompt lookup": (lab.PromptLookupDraft(cfg.vocab_size, device=model.device), 0.5),
}
N_ALPHA = 1024 if FULL else 256
N_SPEED = 64 if FULL else 32
K_MEASURE = [1, 2, 4, 8] if FULL else [2, 4]
MEASURE = set(candidates) if FULL else {"int8 copy", "prompt lookup"}  # wall-clock runs (the others: FULL)
with torch.no_grad():
    p_logits = model(text_ids[:, :N_ALPHA])[0]  # [N_ALPHA, vocab], read once for every draft
base_ids, base_t = None, math.inf
for _ in range(2):
    sync(); t0 = time.perf_counter(); base_ids = lib_generate(model, chat_ids, N_SPEED); sync()
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
        st = lab.SpecStats()
        sync(); t0 = time.perf_counter()
        ids = lab.speculative_generate(model, d, chat_ids, N_SPEED, k=k, stats=st, min_draft_prob=min_prob)
        sync()
        measured[k] = (base_t / (time.perf_counter() - t0), torch.equal(ids, base_ids), st.tokens_per_call)
    table[name] = dict(a0=a0, a1=a1, c=c, measured=measured)
print(f"target greedy on the chat prompt: {N_SPEED / base_t:.1f} tok/s")
print(f"{'draft':15s} {'α T=0':>6s} {'α T=1':>6s} {'c':>6s} " + " ".join(f"{'pred K=' + str(k):>9s} {'meas K=' + str(k):>9s}" for k in K_MEASURE) + "  identical")
for name, r in table.items():
    cells = " ".join(f"{lab.predicted_speedup(r['a0'], k, r['c'], curve):9.2f} {r['measured'][k][0] if k in r['measured'] else float('nan'):9.2f}" for k in K_MEASURE)
    print(f"{name:15s} {r['a0']:6.2f} {r['a1']:6.2f} {r['c']:6.2f} {cells}  {all(m[1] for m in r['measured'].values())}")
""")

nb.code("""
Ks = list(range(1, 16))
plt.figure(figsize=(7, 4))
for i, (name, r) in enumerate(table.items()):
    plt.plot(Ks, [lab.predicted_speedup(r["a0"], k, r["c"], curve) for k in Ks], "-", color=f"C{i}", label=f"{name} (predicted)")
    plt.plot(list(r["measured"]), [m[0] for m in r["measured"].values()], "o", color=f"C{i}")
plt.axhline(1, color="gray", lw=0.5)
plt.xlabel("K (draft tokens per round)"); plt.ylabel("speedup over target greedy")
plt.title("Speedup vs K: lines predicted (α at T=0 on Hamlet), dots measured (chat prompt)")
plt.legend(fontsize=7); plt.show()
""")

nb.md(r"""
What the table says (your numbers are above; while writing this lab, on a busy 2-core machine, α at T = 0 / T = 1 on
*Hamlet*: random 0.02 / 0.03, early exit 4 layers 0.04 / 0.05, 20 layers 0.20 / 0.21, int8 copy 0.96 / 0.96,
prompt lookup 0.22 / 0.20 — the same in every run; c, which moves with the machine's load: random 0.01–0.05,
early exit 4 layers 0.15–0.26, 20 layers 0.39–0.71, int8 0.46–0.74, lookup ≈ 0):

* a draft that shares the **LM head** pays for it at every draft step: 49152 × 576 weights are 28 M of the
  target's 135 M, so c ≥ 0.2 for any such draft, and early exit also pays for its L layers;
* the **int8 copy** has the α the seed promises (its "70–80 % acceptance at T = 1" is met here by this draft, not
  by a trained small one: 0.96), but on this CPU its c is 0.5–0.75 — eager PyTorch spends much of a step outside
  the matmuls (norms, RoPE, attention, Python), which int8 does not shrink — and the loop adds its own overhead
  per draft call (measured 0.7–0.85×, predicted 0.85–1.3× in different runs): no reliable gain here;
* **prompt lookup** costs nothing, and pays exactly where the output repeats the input (quoting, summarizing,
  code editing); `benchmarks/speculative.py` measures it on chat, editing and quoting prompts, and the cells
  after the table try an edit here.
A small draft *distilled* from SmolLM2 is the classic fifth option: `python tools/distill_draft.py --minutes 10`
trains a 2-layer draft that shares the target's embedding and LM head (frozen) on KL to the target, and
`lab.load_distilled_draft(model, 2)` loads it (section 7 uses it when its checkpoint exists). Measured while
designing this lab, a 4-layer draft reached α ≈ 0.4 in domain and 0.13 on chat after 11 CPU-minutes and ran 0.93×
at K = 1 — it shares the full LM head, which section 7 shrinks.
""")

nb.md(r"""
**Where prompt lookup pays: an answer that repeats the prompt.** Ask the model to fix the spelling of a paragraph
(`lab.EDIT_REQUEST`, an invented paragraph with two typos — asked to repeat a *famous* text, this small model
paraphrases it from memory instead, and there is little to look up). Most of the answer is the paragraph again,
so the n-gram guesses are right for long runs, and a long K is cheap where the verify curve of section 1 is low.
""")

nb.code("""
edit_ids = lab.chat_ids(tok, lab.EDIT_REQUEST, model.device)
N_EDIT = 48
edit_ref, edit_t = None, math.inf
for _ in range(2):
    sync(); t0 = time.perf_counter(); edit_ref = lib_generate(model, edit_ids, N_EDIT); sync()
    edit_t = min(edit_t, time.perf_counter() - t0)
print(repr(tok.decode(edit_ref[0, edit_ids.shape[1]:])))
lookup = lab.PromptLookupDraft(cfg.vocab_size, device=model.device)
for k in tqdm([2, 8], desc="prompt lookup, edit request"):
    st = lab.SpecStats()
    sync(); t0 = time.perf_counter()
    ids = lab.speculative_generate(model, lookup, edit_ids, N_EDIT, k=k, stats=st, min_draft_prob=0.5)
    sync(); dt = time.perf_counter() - t0
    print(f"K={k}: {edit_t / dt:.2f}x the target's greedy ({N_EDIT / edit_t:.1f} tok/s), identical={torch.equal(ids, edit_ref)}, "
          f"acceptance {st.acceptance_rate:.2f}, tokens per target call {st.tokens_per_call:.2f}")
""")

nb.md(r"""
**Exercise 5: your prompt-lookup draft.** Prompt lookup guesses that the text repeats itself: take the longest
n-gram that ends the text (n from `max_ngram` down to `min_ngram`) and also occurs earlier, take its **latest**
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
quotation (`lab.QUOTE_TEXT`, plain text that quotes a paragraph) — with `min_ngram` 1 and 3 (`FULL`: 1, 2, 3). A round drafts
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

quote_ids = tok(lab.QUOTE_TEXT, return_tensors="pt").input_ids.to(model.device)
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
which costs `verify_cost[K + 1]` target steps (the curve of section 1). It writes the accepted draft tokens plus
one. Assume each draft token is accepted with the same probability α given that the ones before it were
(section 4 showed how far real text is from that).

**Exercise 6.** Derive the expected number of tokens a round writes and the predicted speedup (tokens per round
over the round's cost in target steps), then write `best_k(alpha, c, verify_cost) -> (k, speedup)`: the K in
1..M−1 (`verify_cost` maps m = 1..M tokens to steps, `verify_cost[1] == 1`) with the highest predicted speedup,
and that speedup. α = 1 is allowed (no dividing by zero).
""")

nb.exercise("best_k", """
def best_k(alpha: float, c: float, verify_cost: dict) -> tuple:
    \"\"\"(K, predicted speedup) maximizing tokens per round / cost of a round, K in 1..max(verify_cost) - 1.\"\"\"
    ### BEGIN SOLUTION
    best = None
    for k in range(1, max(verify_cost)):
        tokens = sum(alpha ** i for i in range(k + 1))  # token i is written iff draft tokens 0..i-1 were all kept
        speed = tokens / (k * c + verify_cost[k + 1])
        if best is None or speed > best[1]:
            best = (k, speed)
    return best
    ### END SOLUTION
""")
nb.test("test_best_k", "check_best_k(best_k)", points=2)

nb.md(r"""
The same model in two regimes: **this CPU** (the verify curve you measured, the int8 draft's c) and a
**GPU-like** regime, where scoring up to 16 tokens costs one step (a flat curve: the GPU is idle during decode)
and a draft one-tenth to one-twentieth the target's size costs c ≈ 0.05. The "2–3×" of the literature (and of
seed 002's technique table) is this model's prediction in the second regime — a model, not a measurement; the
measured speedups on this CPU are section 5's (chat: ≈ 1× at best; prompt lookup on the edit and quote
workloads: your numbers above). The curves use `lab.predicted_speedup` (the formula you derived); the best K
is yours.
""")

nb.code("""
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
r = table["int8 copy"]
for k, (meas, same, tpc_) in r["measured"].items():
    print(f"int8 draft, K={k}: predicted {lab.predicted_speedup(r['a0'], k, r['c'], curve):.2f}x, measured {meas:.2f}x")
""")

nb.md("Check: `pytest weeks/18 -k ex06`")

# --- 7 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 7. Beyond the anchors: FR-Spec, a smaller vocabulary for the draft's head

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
counts = lab.token_counts(all_ids[:split], cfg.vocab_size)  # [vocab]: frequencies in the first 80 %
N_HELD = 512 if FULL else 256
held = all_ids[None, split:split + N_HELD].to(model.device)  # [1, N_HELD], never counted
SUBSETS = [1024, 2048, 4096, 8192, 16384, cfg.vocab_size] if FULL else [2048, 4096, 8192, cfg.vocab_size]
t_chat = chat_ids.shape[1]
with torch.no_grad():
    p_held = model(held)[0]  # [N_HELD, vocab]
    p_chat = model(base_ids)[0, t_chat - 1:-1]  # [N_SPEED, vocab]: the target's answer, teacher forcing
print(f"{int((counts > 0).sum())} distinct tokens in the counted {split} tokens of Hamlet")

fr_bases = {"int8 copy": drafts["int8 copy"]}
try:  # the distilled draft, only if tools/distill_draft.py has been run on this machine (never required)
    fr_bases["distilled 2-layer"] = lab.load_distilled_draft(model, 2)
except FileNotFoundError as err:
    print(f"(no distilled draft: {err})")

fr = {}
for bname, base in fr_bases.items():
    for n_keep in tqdm(SUBSETS, desc=f"FR-Spec, {bname}"):
        keep = lab.frequency_ranked_ids(counts, n_keep)
        d = base if n_keep == cfg.vocab_size else lab.fr_spec_draft(base, keep)
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
    sync(); t0 = time.perf_counter(); lib_generate(model, chat_ids, N_SPEED); sync()  # side by side
    t_base = time.perf_counter() - t0
    for n_keep in (cfg.vocab_size, best_n):
        r = fr[bname, n_keep]
        st = lab.SpecStats()
        sync(); t0 = time.perf_counter()
        ids = lab.speculative_generate(model, r["draft"], chat_ids, N_SPEED, k=2, stats=st)
        sync(); r["measured"] = t_base / (time.perf_counter() - t0)
        print(f"{bname:18s} N={n_keep:5d} K=2: measured {r['measured']:.2f}x (predicted from α on the chat answer "
              f"{lab.predicted_speedup(r['a0_chat'], 2, r['c'], curve):.2f}x), acceptance {st.acceptance_rate:.2f}, "
              f"identical to target greedy: {torch.equal(ids, base_ids)}")
""")

nb.md(r"""
What to read off (your numbers are above):

* **c falls with N, but only by the head's share.** For the int8 copy the head is about a fifth of its weights
  (and much less of its time: this CPU's eager step is dominated by per-op overhead, section 5), so even N = 2048
  saves little. For a *small* draft — the distilled 2-layer one, when its checkpoint exists — the head is most of
  the draft and FR-Spec cuts c severalfold (measured while writing this lab: 0.21 → 0.08 at N = 2048): that is the
  regime the paper targets (one-layer EAGLE-style drafts, 128k-token vocabularies).
* **α falls as N shrinks**, by about the target's mass outside the subset (the dotted line bounds α at T = 0:
  the target's argmax must be inside). On held-out *Hamlet* a few thousand tokens cover almost everything; on the
  chat answer the *Hamlet* ranking covers much less — the counts must come from the workload's domain. A weak
  draft (a briefly distilled one) can even *gain* a little α from the subset: the frequency ranking is a prior
  that removes some of its wrong guesses.
* Exactness never moved: every measured run above is identical to the target's greedy output.
""")

# --- 8 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 8. A draft that reads the target: one layer on its last hidden state (EAGLE-style) with an FR-Spec head

On chat, every draft so far loses: the int8 copy has α ≈ 0.9 but costs c ≈ 0.5–0.75 of a step; a small separate
draft is cheap but must rebuild, from tokens alone, what the target already knows (the distilled one reached α ≈
0.1 on chat); prompt lookup finds little to copy in an answer that invents its text. **EAGLE** (Li et al. 2024)
lets the draft *read* what the target knows: the target's last hidden state h_t (the vector its LM head reads),
with the embedding of the token that followed, goes through **one** small transformer layer that predicts
h_{t+1}; logits come from the target's own head rows — here only the 4096 most frequent tokens of the target's
chat answers (FR-Spec, section 7), so an output step reads 4096 × 576 weights, not 49152 × 576. To draft K tokens
it feeds itself its own predicted ĥ; after verification it re-reads the accepted tokens with the target's true
hidden states, which the verify forward has just computed (`lib/draft_head.py`).

It was trained by **self-distillation**: SmolLM2 answered chat prompts made from templates × topics (none of them
the prompts below), and the head learned to predict the target's next hidden state and greedy token on those
answers (`tools/train_draft_head.py`; its command, seed, data and time are stored with the weights and printed
below). The committed weights (`data/draft_head/head.pt`, int8 per row) are loaded here, not trained.

The target here is `lib.fast.FastLlama` — the same model, run by the kernel that decodes fastest on this CPU
(`lib.fast` times its kernels once per machine and prints which it chose, below) — because that is what a server
would run, and its **verify curve is different from section 1's**. Each of its kernels reads a weight once for a
few rows, but what one step costs differs: with oneDNN's packed weights a one-token step is slow enough that
scoring m ≤ 8 tokens costs about one step; the one-call C++ step (chosen on the lab's EPYC) makes every step of a
few rows much cheaper — no Python between its operations, the verify step's K + 1 tokens included — and its curve
stays low while the rows fit its loops. Both curves are measured below, with each draft's cost c relative to this target, and greedy
speculation on three chat prompts, side by side with the int8 copy and prompt lookup (tokens checked identical to
the target's).
""")

nb.code("""
from lib import draft_head as dh
from lib.fast import FastLlama

fast = FastLlama(model)  # same tokens as `model`, faster
print("FastLlama's kernel:", fast.kernel_reason)
head = dh.load_draft_head(model)  # shares the model's embedding; one layer + fc, 4096 output rows
print("trained by:", head.meta.get("command"), "| seed", head.meta.get("seed"), "|", head.meta.get("steps"), "steps in",
      head.meta.get("train_seconds"), "s on", head.meta.get("threads"), "threads, after",
      head.meta.get("data_seconds"), "s answering", head.meta.get("answers"), "prompts (",
      head.meta.get("answer_tokens"), "answer tokens)")
m_sizes = list(range(1, 10))
fast_curve = lab.verify_curve(fast, text_ids, m_sizes, context=CONTEXT, repeats=repeats)
plain_curve = lab.verify_curve(model, text_ids, m_sizes, context=CONTEXT, repeats=repeats)
costs8 = {"draft head": lab.relative_cost(dh.head_step(head, fast, text_ids, CONTEXT), fast, text_ids, CONTEXT),
          "int8 copy": lab.relative_cost(lab.draft_step(drafts["int8 copy"], text_ids, CONTEXT), fast, text_ids, CONTEXT),
          "prompt lookup": lab.relative_cost(lab.draft_step(drafts["prompt lookup"], text_ids, CONTEXT), fast, text_ids,
                                             CONTEXT)}
print("verify curve, FastLlama: " + ", ".join(f"{m}: {fast_curve[m]:.2f}" for m in m_sizes))
print("verify curve, lib.model: " + ", ".join(f"{m}: {plain_curve[m]:.2f}" for m in m_sizes))
print("c relative to FastLlama: " + ", ".join(f"{d} {c:.3f}" for d, c in costs8.items()))
""")

nb.code("""
CHAT8 = ["What are three tips for staying healthy?", "Explain what a hash table is to a beginner.",
         "Write a short story about a robot who learns to paint."]  # benchmarks/speculative.py's chat workload
N8 = 64 if FULL else 32
HEAD_KS = [1, 2, 3, 4, 5] if FULL else [2, 3, 4]
runs = {("draft head", k): lambda ids, k, st: dh.head_speculative_generate(fast, head, ids, N8, k=k, stats=st)
        for k in HEAD_KS}
runs["int8 copy", 2] = lambda ids, k, st: lab.speculative_generate(fast, drafts["int8 copy"], ids, N8, k=k, stats=st)
runs["prompt lookup", 4] = lambda ids, k, st: lab.speculative_generate(fast, drafts["prompt lookup"], ids, N8, k=k,
                                                                       stats=st, min_draft_prob=0.5)
prompts8 = [lab.chat_ids(tok, t, model.device) for t in CHAT8]
t_base, refs8 = 0.0, []
times8 = {key: 0.0 for key in runs}
stats8 = {key: lab.SpecStats() for key in runs}
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
print(f"with lib.model's verify curve instead: α needed = "
      f"{min((a / 100 for a in range(101) if best_speed(a / 100, c_head, plain_curve) >= 1.5), default=float('nan')):.2f}")
alphas = [a / 50 for a in range(50)]
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
axes[0].plot(m_sizes, [fast_curve[m] for m in m_sizes], "o-", label=f"FastLlama ({fast.kernel} kernel)")
axes[0].plot(m_sizes, [plain_curve[m] for m in m_sizes], "s-", label="lib.model (section 1)")
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
What to read off (your numbers are above). While writing this lab the two cores were shared with other jobs
(load average 9–11, so every absolute time was 20–40× slower than quiet and single ratios were noisy):

* **The head is cheap**: c ≈ 0.05–0.09 of a FastLlama step (one block and 4096 output rows against 30 blocks and
  49152 rows), against 0.8–1.6 for the int8 copy and ≈ 0 for prompt lookup. That is the regime the speedup
  model needs. How steep FastLlama's verify curve is depends on its kernel: packed weights kept it near 1 for a
  few tokens on a quiet machine; the C++ step is about twice as fast per token, and relative to it a verify
  costs 1.13 / 1.23 / 1.38 steps for 2 / 3 / 4 tokens on the lab's EPYC (1.6–1.8 while the verify step still ran
  Python between its operations) — a faster target leaves less for speculation to win unless its verify step is
  as lean as its decode step. With `lib.model` as the target (section 1's curve) the head would need another α, which
  the cell above computes.
* **What it lacks is α.** Trained for 8 minutes (1,085 steps) on 40,636 tokens of the target's own answers to 368
  template prompts, it agrees with the target on 0.55 of held-out next tokens (teacher forced, one token ahead;
  `data/README.md`), but far less on the benchmark's chat prompts, which no template resembles, and less again on
  the second and third draft tokens, which read its own predicted features: α there was 0.27 / 0.17 / 0.13 / 0.10
  per drafted token at K = 1 / 2 / 3 / 4, 1.10× at K = 1 on a quiet machine (a head trained on a quarter of the
  data agreed on 0.39 held out and got 0.22 / 0.14 / 0.10 at K = 1 / 2 / 3 on chat, 1.03×). It ends its training at 0.995 top-1 on its own training answers: it memorizes them. The cell
  above gives the α that 1.5× needs at this c and verify curve; EAGLE's authors report α ≈ 0.7–0.8 for heads
  trained for hours on tens of thousands of real conversations — the gap here is the data (384 template prompts,
  one topic list), not the construction, and `tools/train_draft_head.py` is where to spend more.
* **Exactness never moved**: every run is checked identical to the target's greedy tokens.
""")

# --- 9 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 9. Check your understanding (written, graded by hand)

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
the student's measurement: the same α at every position (section 4's histogram), a flat verify curve (section 1:
the student's curve — on the lab's EPYC `lib.model` took 1.5–1.6 steps for 2 tokens, the packed FastLlama about 1.1),
a draft costing 5 % of a step (section 5: the int8 copy's c ≈ 0.5–0.8), no loop overhead.
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
hence "if latency-critical" and after batching. (2) On a CPU/laptop the verify curve is not flat (the student's
section 1; on the lab's EPYC, quiet, `lib.model` 1.5–1.6 steps for 2 tokens, 1.2–1.3 for 5, 1.5–1.6 for 16) and any
draft sharing the 49152 × 576 LM head has c ≥ 0.2, so the predicted speedup for realistic α is ≈ 1× or below —
quantization and a smaller model help more; a cheap draft head (c ≈ 0.1) gets 1.0–1.2× on chat with its α of
0.1–0.3. (3) Still worth it where α is high and
c ≈ 0: prompt lookup on quoting/summarizing/editing workloads (section 5's edit request; `benchmarks/speculative.py`
prints chat, edit and quote). Model drafts want K small (2–4) because the verify curve is not flat; prompt lookup
drafts only where an n-gram matches, so a long K costs little there and pays on long copied runs.
""", points=3)

nb.write(str(REPO / "solutions" / "18" / "week18_speculative.ipynb"))
print("wrote solutions/18/week18_speculative.ipynb")
