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
by memory traffic, not arithmetic: scoring **several** tokens in one pass costs little more than scoring one.
**Speculative decoding** exploits that: a cheap **draft** guesses the next K tokens, the **target** scores all
of them in one forward, and we keep the longest prefix the target agrees with, plus one token of the
target's own. Done right, the output is **exactly** what the target alone would produce — token for token
when greedy, in distribution when sampling. This week you build it on SmolLM2, prove both kinds of exactness,
measure acceptance against theory, and find out honestly when it is faster on this CPU and why.

**Notation** (everywhere in this notebook and in `lib/speculative.py`): **p is the target** distribution,
**q is the draft**. Seed quiz 002 Q5 uses the same letters; the TV-distance paper in the resources (seed 004)
calls the draft p and the target q — read it with the letters swapped.

**You will write** four pieces: greedy speculative decoding with cache rollback, the verification step of
speculative sampling, and the two formulas of acceptance theory. Check them with `pytest weeks/18`.

`FULL = True` below runs the longer measurements (more repeats and positions); the default runs the whole
notebook in about two minutes on two cores.
""")

nb.setup("""
import math

import torch

from lib.kv_cache import KVCache
from grader.checks.week18 import (check_speculative_generate, check_verify, check_acceptance_rate,
                                  check_expected_tokens_per_call, check_predicted_speedup, check_answer_q5,
                                  check_answer_q6)
""")

nb.code("""
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from grader.checks import week18 as checks
from lib import speculative as lab  # the lab's reference, to compare against (not to call in your exercises)
from lib.generate import generate as lib_generate
from lib.model import shared_smollm2
from lib.text import load_text

FULL = False  # True: more repeats, positions and tokens (several minutes)
torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32; do not modify it
cfg = model.config
print(f"{torch.get_num_threads()} CPU threads, device {model.device}")
""")

# --- 1 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 1. Why it can work: the verify-cost curve

Speculation trades draft work for fewer target calls. It only pays if the target scoring K + 1 tokens costs
much less than K + 1 separate steps. Measure it: fill a cache with 128 tokens of *Hamlet*, then time one forward
of m new tokens after it (rolling the cache back to 128 each time with `KVCache.truncate`, the rollback this
week relies on), relative to m = 1.
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
    t0 = time.perf_counter()
    model(text_ids[:, CONTEXT:CONTEXT + m], cache=cache)
    return time.perf_counter() - t0

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
print(f"one decode step after {CONTEXT} tokens: {1e3 * step_time[1]:.1f} ms")
for m in sizes:
    print(f"m = {m:2d} new tokens: {verify_cost[m]:.2f} steps  ({verify_cost[m] / m:.2f} per token)")
plt.figure(figsize=(6, 3.5))
plt.plot(sizes, [verify_cost[m] for m in sizes], "o-", label="measured")
plt.plot(sizes, sizes, "--", color="gray", label="m separate steps")
plt.axhline(1, color="gray", lw=0.5)
plt.xlabel("tokens scored in one forward (K + 1)"); plt.ylabel("time / one decode step")
plt.title("The verify-cost curve (SmolLM2, fp32, this CPU)"); plt.legend(); plt.show()
""")

nb.md(r"""
Scoring two or three tokens costs barely more than one — the weights are read once either way — but the
curve is **not flat**: by 8–16 tokens the arithmetic starts to show and a forward costs about two steps
(measured while writing this lab: 2 → 1.04–1.11, 4 → 1.5–1.6, 8 → 1.9, 16 → 2.1; your figures are above).
On a datacenter GPU the curve stays near 1 up to tens of tokens; section 6 shows what that changes.
Keep `verify_cost`: the speedup model uses it.
""")

# --- 2 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 2. Greedy speculation and rollback

One **round** of greedy speculation, with the sequence so far `out` (the last token not yet in either cache):

1. the draft proposes K tokens greedily, one forward each, on its own KV cache;
2. the target scores `out`'s last token and the K draft tokens **in one forward** on its cache: K + 1 rows
   of logits; its argmax in row i is what greedy decoding would write after draft token i;
3. keep draft tokens while they equal the target's argmax (n of them), then append the target's argmax
   at the first disagreement — or, if all K agree, its argmax after the last one (the **bonus** token):
   every round writes n + 1 tokens with one target call;
4. **roll back**: both caches now hold positions of rejected draft tokens. Truncate each to the tokens kept
   (`cache.truncate(len(out) - 1)`); the next round feeds each model whatever it has not seen yet.

Near the end, draft fewer tokens so that exactly `max_new_tokens` come out. Every token written is the
target's argmax given the tokens before it, so the output is **identical** to greedy decoding with the
target alone, whatever the draft — a bad draft only costs time.

**Exercise 1.** Write `speculative_generate(target, draft, input_ids, max_new_tokens, k=4)` (greedy). Both
models are called as `model(ids [1, t], cache=c)` with `c = model.new_cache(batch=1, max_len=...)`, and
`c.length`, `c.truncate(n)`. Use your own loop (no `lib.speculative`, no `lib.generate`). The check runs
Markov-chain and tiny-Llama targets with drafts from perfect to hopeless (it counts target calls: token by
token does not pass), and SmolLM2 for 64 tokens with K ∈ {1, 2, 4, 8} (the draft there is prompt lookup: section 5).
""")

nb.exercise("speculative_generate", '''
@torch.no_grad()
def speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int = 4) -> torch.Tensor:
    """Greedy speculative decoding: [1, T + max_new_tokens] ids, identical to greedy decoding with `target`."""
    ### BEGIN SOLUTION
    out = input_ids[0].tolist()
    t0 = len(out)
    max_len = t0 + max_new_tokens + k + 1
    t_cache, d_cache = target.new_cache(batch=1, max_len=max_len), draft.new_cache(batch=1, max_len=max_len)
    device = input_ids.device
    while len(out) - t0 < max_new_tokens:
        kk = min(k, max_new_tokens - (len(out) - t0) - 1)  # the round adds kk + 1 tokens at most
        drafted = []
        for _ in range(kk):
            unseen = (out + drafted)[d_cache.length:]
            logits = draft(torch.tensor([unseen], device=device), cache=d_cache)  # [1, t, vocab]
            drafted.append(int(logits[0, -1].argmax()))
        unseen = (out + drafted)[t_cache.length:]
        logits = target(torch.tensor([unseen], device=device), cache=t_cache)[0, -(kk + 1):]  # [kk + 1, vocab]
        best = logits.argmax(-1).tolist()
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
    \"\"\"Counts a model's calls (and passes everything else through).\"\"\"
    def __init__(self, m):
        self.m, self.calls = m, 0
    def __call__(self, *a, **kw):
        self.calls += 1
        return self.m(*a, **kw)
    def __getattr__(self, name):
        return getattr(self.m, name)

prompt_ids = tok(checks.SMOLLM2_PROMPT, return_tensors="pt").input_ids.to(model.device)
N_NEW = 64
greedy_ids = checks.smollm2_case()[2]  # lib_generate(model, prompt_ids, 64), already computed by the check
drafts = {"prompt lookup": lab.PromptLookupDraft(cfg.vocab_size), "int8 copy": lab.quantized_draft(model)}
for name, d in drafts.items():
    for k in ([2, 4] if FULL else [4]):
        counted = Counting(model)
        ids = speculative_generate(counted, d, prompt_ids, N_NEW, k=k)
        print(f"{name:22s} K={k}: identical to target greedy: {torch.equal(ids, greedy_ids)}; "
              f"{counted.calls} target calls for {N_NEW} tokens")
print(repr(tok.decode(greedy_ids[0, prompt_ids.shape[1]:])))
""")

nb.md("Check: `pytest weeks/18 -k ex01`")

# --- 3 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 3. Speculative sampling: `verify`

Sampling is where most write-ups stop at "accept if it looks likely". The exact rule (Leviathan et al. 2023,
Chen et al. 2023): draft token x_i was drawn from q_i; **accept it with probability min(1, p_i(x_i) / q_i(x_i))**.
At the first rejection, sample the replacement from the **residual** normalize(max(p_i − q_i, 0)); if all K
are accepted, sample a bonus token from p_K.

Why it is exact, for one position: P(emit x) = q(x)·min(1, p(x)/q(x)) + P(reject)·residual(x)
= min(p(x), q(x)) + (1 − Σ min(p, q)) · (p(x) − min(p(x), q(x))) / (1 − Σ min(p, q)) = p(x).
The residual is exactly the mass of p that q under-covers. Sample the replacement from p instead and tokens
that q over-proposes come out too often; accept with min(1, q/p) (the letters swapped) and tokens the target
never writes (p = 0) slip through.

**Exercise 2.** Write `verify(target_probs [K+1, V], draft_probs [K, V], draft_tokens [K], generator=None)
-> (n_accepted, next_token)`. Use `generator` for every random draw (`torch.rand(..., generator=generator)`,
`torch.multinomial(..., generator=generator)`). The check tests exact cases, then the **law**: on a 4-token
vocabulary with a draft that proposes tokens the target never writes, it runs speculative sampling
6,000 times for K = 1, 2, 3 and compares the joint law of the first two emitted tokens with the target's by a
chi-square test, with a bound a correct `verify` exceeds less than once in a million runs.
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
        u = torch.rand((), generator=generator).item()
        if u * q_x < p_x:  # u < p/q without dividing; p = 0 is never accepted
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp(min=0)  # [V]: the mass q under-covers
        if residual.sum() <= 0:  # p == q: a rejection had probability 0
            residual = target_probs[i]
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator))
    ### END SOLUTION
''')

nb.test("test_verify", "check_verify(verify)", points=3)

nb.md(r"""
The milestone, in a picture: the check's test law (p(x1)·p(x2 | x1) on 4 tokens) against 6,000 runs of your
`verify` with K = 2, and the same with the residual replaced by p (the classic bug). The chi-square
statistic and its bound are printed; the bound is the (1 − 10⁻⁶/3) quantile of the chi-square law.
""")

nb.code("""
def wrong_residual(tp, dp, tokens, generator=None):
    \"\"\"verify with the classic bug: after a rejection, sample from p instead of (p - q)+.\"\"\"
    n, nxt = verify(tp, dp, tokens, generator=generator)
    if n == tokens.shape[0]:  # all accepted: the bonus token from p_K is right
        return n, nxt
    return n, int(torch.multinomial(tp[n], 1, generator=generator))  # wrong: should be (p_n - q_n)+

law = torch.tensor(checks._P1)[:, None] * torch.tensor(checks._P2)  # [4, 4] target joint law
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
for ax, (name, fn) in zip(axes, [("your verify", verify), ("residual sampled from p", wrong_residual)]):
    counts = checks.joint_law_counts(fn, 2, checks.VERIFY_TRIALS, checks.VERIFY_SEED + 2)
    stat, df, bound, impossible = checks.chi_square(counts)
    freq = (counts / counts.sum()).flatten()
    ax.bar(range(16), law.flatten(), color="lightgray", label="target law p(x1) p(x2|x1)")
    ax.plot(range(16), freq, "o", color="C0" if stat <= bound else "C3", label="observed")
    ax.set_title(f"{name}: χ² = {stat:.0f} (df {df}, bound {bound:.1f})", fontsize=9)
    ax.set_xticks(range(16), [f"{a}{b}" for a in range(4) for b in range(4)], fontsize=7)
    print(f"{name:25s} chi-square {stat:8.1f}, df {df}, bound {bound:.1f}, impossible pairs emitted: {impossible}")
axes[0].legend(fontsize=8); axes[0].set_ylabel("probability"); plt.show()
""")

nb.md(r"""
The same `verify` drives `lab.speculative_generate(..., temperature=1.0)` on SmolLM2 (the reference; it
calls `lab.verify`). The int8 draft is accepted most of the time (with `FULL`, prompt lookup too: a point-mass
q is rarely accepted at T = 1); the law of what comes out is the target's either way.
""")

nb.code("""
g = torch.Generator().manual_seed(0)
for name, d in (drafts.items() if FULL else [("int8 copy", drafts["int8 copy"])]):
    st = lab.SpecStats()
    ids = lab.speculative_generate(model, d, prompt_ids, 32, k=4, temperature=1.0, generator=g, stats=st)
    print(f"{name:22s} T=1, K=4: accepted {st.accepted}/{st.drafted} = {st.acceptance_rate:.2f}, "
          f"{st.tokens_per_call:.2f} tokens per target call")
print(repr(tok.decode(ids[0, prompt_ids.shape[1]:])))
""")

nb.md("Check: `pytest weeks/18 -k ex02`")

# --- 4 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 4. Acceptance: theory and measurement

A token drawn from q is accepted with probability α = Σ_x q(x)·min(1, p(x)/q(x)) = **Σ_x min(p(x), q(x))**
= 1 − TV(p, q). The expected number of rejections is therefore the sum over tested positions of the total
variation distances (the theorem in seed 004, with its letters swapped), and no unbiased rejection scheme
does better.

If every draft token is accepted independently with the same α, a round keeps i draft tokens with
probability α^i(1 − α) and always adds one token, so the expected **tokens per target call** is
1 + α + α² + … + α^K = **(1 − α^(K+1)) / (1 − α)** (K + 1 when α = 1). The seed's "α = 0.7, K = 4 → 3.6 tokens
per call" is wrong: it is 2.77 (3.6 would need α ≈ 0.83).

**Exercise 3.** `acceptance_rate(p, q)`: α for distributions along the last axis (`[..., V] -> [...]`).
**Exercise 4.** `expected_tokens_per_call(alpha, k)`.
""")

nb.exercise("acceptance_rate", '''
def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """α = Σ_x min(p(x), q(x)) over the last axis."""
    ### BEGIN SOLUTION
    return torch.minimum(p, q).sum(-1)
    ### END SOLUTION
''')
nb.test("test_acceptance_rate", "check_acceptance_rate(acceptance_rate)", points=1)

nb.exercise("expected_tokens_per_call", '''
def expected_tokens_per_call(alpha: float, k: int) -> float:
    """(1 - α^(K+1)) / (1 - α): tokens per target call with K draft tokens each accepted w.p. α."""
    ### BEGIN SOLUTION
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    ### END SOLUTION
''')
nb.test("test_expected_tokens_per_call", "check_expected_tokens_per_call(expected_tokens_per_call)", points=1)

nb.md(r"""
**Measurement.** Read a stretch of *Hamlet* once with the target and once with a draft (teacher forcing: both
see the real text) and compute α at every position with your `acceptance_rate` (T = 1). Then *run* the
acceptance test — draw x from q, call your `verify` with K = 1 — at every position, several times: the
fraction accepted must match the mean α (equivalently: rejections = Σ TV), within 5 % over ≥ 2,000 tests.
The draft here is the int8 copy of the target.
""")

nb.code("""
N_POS = 2048 if FULL else 512
DRAWS = 4
with torch.no_grad():
    p_all = torch.softmax(model(text_ids[:, :N_POS])[0], -1)  # [N_POS, vocab]
    int8 = drafts["int8 copy"]
    q_all = torch.softmax(int8(text_ids[:, :N_POS])[0], -1)
alpha_pos = acceptance_rate(p_all, q_all)  # [N_POS]
g = torch.Generator().manual_seed(1)
accepted = tested = 0
for i in tqdm(range(N_POS - 1), desc="acceptance tests"):  # row i + 1 exists
    for _ in range(DRAWS):
        x = torch.multinomial(q_all[i], 1, generator=g)  # [1]
        n, _ = verify(p_all[i:i + 2], q_all[i:i + 1], x, generator=g)  # row i + 1 only serves as a bonus row
        accepted += n
        tested += 1
measured, predicted = accepted / tested, alpha_pos[:-1].mean().item()
print(f"{tested} acceptance tests: accepted {measured:.4f}; mean Σ min(p, q) = {predicted:.4f} "
      f"(relative difference {abs(measured - predicted) / predicted:.1%})")
print(f"rejections: measured {tested - accepted}, predicted Σ TV = {DRAWS * (1 - alpha_pos[:-1]).sum().item():.0f}")
""")

nb.md(r"""
Tokens per target call: the formula assumes one α for every position; real text mixes easy and hard
positions. Run `lab.speculative_generate` at T = 1 with the same draft and compare the measured tokens per
call with the formula at the measured mean α.
""")

nb.code("""
n_tok = 96 if FULL else 32
Ks = [1, 2, 4, 8] if FULL else [1, 4]
g = torch.Generator().manual_seed(2)
tpc = {}
for k in tqdm(Ks, desc="speculative runs"):
    st = lab.SpecStats()
    lab.speculative_generate(model, int8, text_ids[:, :64], n_tok, k=k, temperature=1.0, generator=g, stats=st)
    tpc[k] = (st.tokens / st.rounds, st.acceptance_rate)
a = predicted
kk = torch.arange(1, 11)
plt.figure(figsize=(6, 3.5))
plt.plot(kk, [expected_tokens_per_call(a, int(k)) for k in kk], "-", label=f"(1-α^(K+1))/(1-α), α = {a:.2f}")
plt.plot(list(tpc), [v[0] for v in tpc.values()], "o", label="measured (SmolLM2, int8 draft, T=1)")
plt.xlabel("K"); plt.ylabel("tokens per target call"); plt.legend(fontsize=8)
plt.title("Acceptance theory vs measurement"); plt.show()
for k, (t, acc) in tpc.items():
    print(f"K={k}: measured {t:.2f} tokens per call (acceptance {acc:.2f}); formula {expected_tokens_per_call(a, k):.2f}")
""")

nb.md(r"""
The formula is an idealization: α varies from position to position (histogram below), and a run of easy
positions keeps more tokens than the average α predicts, so the measured tokens per call can exceed the
formula at the mean α for large K — the mean α of each *round* is what matters.
""")

nb.code("""
plt.figure(figsize=(6, 3))
plt.hist(alpha_pos.numpy(), bins=40)
plt.xlabel("α at one position (Σ min(p, q))"); plt.ylabel("positions")
plt.title("Per-position α, int8 draft, T = 1"); plt.show()
""")

nb.md("Check: `pytest weeks/18 -k ex03` and `-k ex04`")


# --- 5 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 5. Drafts compared on SmolLM2

Four kinds of draft, all with a model's call shape (`lib/speculative.py`):

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
            t0 = time.perf_counter()
            d(text_ids[:, CONTEXT:CONTEXT + 1], cache=c)
            out.append((time.perf_counter() - t0) / forward_time(1))
    return float(torch.tensor(out).median())

chat_ids = lab.chat_ids(tok, "What are three tips for staying healthy?", model.device)  # the chat template, [1, t]
candidates = {
    "random 2-layer": (lab.random_draft(cfg), 0.0),
    "early exit 4": (lab.early_exit_draft(model, 4), 0.0),
    "early exit 20": (lab.early_exit_draft(model, 20), 0.0),
    "int8 copy": (drafts["int8 copy"], 0.0),
    "prompt lookup": (lab.PromptLookupDraft(cfg.vocab_size), 0.5),
}
N_ALPHA = 1024 if FULL else 256
N_SPEED = 64 if FULL else 32
K_MEASURE = [1, 2, 4, 8] if FULL else [2, 4]
MEASURE = set(candidates) if FULL else {"int8 copy", "prompt lookup"}  # wall-clock runs (the others: FULL)
with torch.no_grad():
    p_logits = model(text_ids[:, :N_ALPHA])[0]  # [N_ALPHA, vocab], read once for every draft
base_ids, base_t = None, math.inf
for _ in range(2):
    t0 = time.perf_counter(); base_ids = lib_generate(model, chat_ids, N_SPEED); base_t = min(base_t, time.perf_counter() - t0)
table = {}
for name, (d, min_prob) in tqdm(candidates.items(), desc="drafts"):
    with torch.no_grad():
        q_logits = d(text_ids[:, :N_ALPHA], cache=d.new_cache(batch=1, max_len=N_ALPHA))[0]  # [N_ALPHA, vocab]
    a0 = (p_logits.argmax(-1) == q_logits.argmax(-1)).float().mean().item()  # T = 0: argmax agreement
    a1 = acceptance_rate(torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)).mean().item()  # T = 1
    c = draft_cost(d)
    measured = {}
    for k in (K_MEASURE if name in MEASURE else []):
        st = lab.SpecStats()
        t0 = time.perf_counter()
        ids = lab.speculative_generate(model, d, chat_ids, N_SPEED, k=k, stats=st, min_draft_prob=min_prob)
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
    t0 = time.perf_counter(); edit_ref = lib_generate(model, edit_ids, N_EDIT); edit_t = min(edit_t, time.perf_counter() - t0)
print(repr(tok.decode(edit_ref[0, edit_ids.shape[1]:])))
lookup = lab.PromptLookupDraft(cfg.vocab_size)
for k in tqdm([2, 8], desc="prompt lookup, edit request"):
    st = lab.SpecStats()
    t0 = time.perf_counter()
    ids = lab.speculative_generate(model, lookup, edit_ids, N_EDIT, k=k, stats=st, min_draft_prob=0.5)
    dt = time.perf_counter() - t0
    print(f"K={k}: {edit_t / dt:.2f}x the target's greedy ({N_EDIT / edit_t:.1f} tok/s), identical={torch.equal(ids, edit_ref)}, "
          f"acceptance {st.acceptance_rate:.2f}, tokens per target call {st.tokens_per_call:.2f}")
""")

# --- 6 -------------------------------------------------------------------------------------------------------
nb.md(r"""
## 6. The speedup model

A round costs K draft steps (K·c target steps) and one target forward over K + 1 tokens (`verify_cost[K + 1]`
target steps), and yields (1 − α^(K+1))/(1 − α) tokens on average:

speedup(K) = [(1 − α^(K+1)) / (1 − α)] / [K·c + verify_cost(K + 1)].

**Exercise 5.** Write `predicted_speedup(alpha, k, c, verify_cost)` (`verify_cost` maps a number of tokens to
its cost in target steps, `verify_cost[1] == 1`).
""")

nb.exercise("predicted_speedup", """
def predicted_speedup(alpha: float, k: int, c: float, verify_cost) -> float:
    \"\"\"Tokens per round over the cost of a round, in target steps.\"\"\"
    ### BEGIN SOLUTION
    tokens = float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return tokens / (k * c + verify_cost[k + 1])
    ### END SOLUTION
""")
nb.test("test_predicted_speedup", "check_predicted_speedup(predicted_speedup)", points=2)

nb.md(r"""
The same model in two regimes: **this CPU** (the verify curve you measured, the int8 draft's c) and a
**GPU-like** regime, where scoring up to 16 tokens costs one step (a flat curve: the GPU is idle during decode)
and a draft one-tenth to one-twentieth the target's size costs c ≈ 0.05. The 2–3× of the literature (and of seed
002's technique table) lives in the second regime; on this CPU the curve rises and c is large, and the same α
buys much less.
""")

nb.code("""
flat = {m: 1.0 for m in range(1, 17)}
c_int8 = table["int8 copy"]["c"]
plt.figure(figsize=(7, 4))
for j, a in enumerate([0.6, 0.8, 0.9]):
    plt.plot(Ks, [predicted_speedup(a, k, 0.05, flat) for k in Ks], "-", color=f"C{j}", label=f"GPU-like, α={a}, c=0.05")
    plt.plot(Ks, [predicted_speedup(a, k, c_int8, curve) for k in Ks], "--", color=f"C{j}",
             label=f"this CPU, α={a}, c={c_int8:.2f}")
plt.axhline(1, color="gray", lw=0.5)
plt.xlabel("K"); plt.ylabel("predicted speedup"); plt.legend(fontsize=7)
plt.title("Where 2–3× comes from: a flat verify curve and a cheap draft"); plt.show()
for a in (0.6, 0.8, 0.9):
    best_gpu = max(Ks, key=lambda k: predicted_speedup(a, k, 0.05, flat))
    best_cpu = max(Ks, key=lambda k: predicted_speedup(a, k, c_int8, curve))
    print(f"α={a}: GPU-like best K={best_gpu}, {predicted_speedup(a, best_gpu, 0.05, flat):.2f}x; "
          f"this CPU best K={best_cpu}, {predicted_speedup(a, best_cpu, c_int8, curve):.2f}x")
r = table["int8 copy"]
for k, (meas, same, tpc_) in r["measured"].items():
    print(f"int8 draft, K={k}: predicted {predicted_speedup(r['a0'], k, r['c'], curve):.2f}x, measured {meas:.2f}x")
""")

nb.md("Check: `pytest weeks/18 -k ex05`")

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
            a1=acceptance_rate(torch.softmax(p_held, -1), torch.softmax(q_held, -1)).mean().item(),  # T = 1
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
    t0 = time.perf_counter(); lib_generate(model, chat_ids, N_SPEED); t_base = time.perf_counter() - t0  # side by side
    for n_keep in (cfg.vocab_size, best_n):
        r = fr[bname, n_keep]
        st = lab.SpecStats()
        t0 = time.perf_counter()
        ids = lab.speculative_generate(model, r["draft"], chat_ids, N_SPEED, k=2, stats=st)
        r["measured"] = t_base / (time.perf_counter() - t0)
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
## 8. Check your understanding

**Q5** (seed 002). Speculative decoding uses rejection sampling. A draft token has probability q(x) = 0.6 in
the draft model and p(x) = 0.3 in the target model. What is the acceptance probability? (Seed 002 uses the same
letters as this notebook: q = draft, p = target. The TV-distance paper in seed 004 swaps them.)
""")
nb.exercise("answer_q5", """
def answer_q5() -> float:
    ### BEGIN SOLUTION
    return min(1.0, 0.3 / 0.6)
    ### END SOLUTION
""")
nb.test("test_answer_q5", "check_answer_q5(answer_q5)", points=1)

nb.md(r"""
**Q6.** In the GPU-like regime (flat verify curve, c = 0.05), what speedup does the model predict for α = 0.8,
K = 4?
""")
nb.exercise("answer_q6", """
def answer_q6() -> float:
    ### BEGIN SOLUTION
    return ((1 - 0.8 ** 5) / (1 - 0.8)) / (4 * 0.05 + 1.0)
    ### END SOLUTION
""")
nb.test("test_answer_q6", "check_answer_q6(answer_q6)", points=1)

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
hence "if latency-critical" and after batching. (2) On a CPU/laptop the verify curve rises (measured: ≈ 1.5 steps for
5 tokens, ≈ 2 for 16) and any draft sharing the 49152 × 576 LM head has c ≥ 0.2, so the predicted speedup for
realistic α is ≈ 1× or below — quantization and a smaller model help more. (3) Still worth it where α is high and
c ≈ 0: prompt lookup on quoting/summarizing/editing workloads (section 5's edit request; `benchmarks/speculative.py`
prints chat, edit and quote). Model drafts want K small (2–4) because the verify curve is not flat; prompt lookup
drafts only where an n-gram matches, so a long K costs little there and pays on long copied runs.
""", points=3)

nb.write(str(REPO / "solutions" / "18" / "week18_speculative.ipynb"))
print("wrote solutions/18/week18_speculative.ipynb")
