# %% [markdown]
# ## 5. Drafts compared on SmolLM2
#
# Four kinds of draft, all with a model's call shape (`lib/spec_decode/drafts.py`):
#
# * **random 2-layer** model with SmolLM2's vocabulary: the α ≈ 0 baseline (the seed says "≈ 1/vocab"; it is
#   Σ min(p, q), which two broad distributions make a few percent);
# * **early exit**: the target's first L layers + its final norm + LM head — free to build, shares every weight,
#   but the intermediate layers were never trained to predict tokens;
# * **int8 copy** of the target: every linear layer (and the LM head) with int8 per-output-channel weights —
#   the same model up to rounding, so α is high; its cost c is what decides;
# * **prompt lookup**: no model; guess that the text repeats an n-gram seen before (drafts only where one
#   matches, `min_draft_prob=0.5`).
#
# For each: α at T = 0 (argmax agreement) and T = 1 on *Hamlet* (teacher forcing: both models read the real text; T =
# 1 with your `expected_rejections`), the draft's cost c (one draft step / one target step, after a 128-token cache),
# and the measured wall-clock speedup of greedy speculation on a chat prompt (tokens identical to the target's,
# checked). What the model of section 6 predicts from α, c and the verify curve comes after its check.

# %%
def vc(m):
    """The verify curve of section 1 at m tokens (interpolated between measured sizes)."""
    xs = sorted(verify_cost)
    if m in verify_cost:
        return verify_cost[m]
    hi = min((x for x in xs if x > m), default=xs[-1]); lo = max(x for x in xs if x < m)
    return verify_cost[lo] + (verify_cost[hi] - verify_cost[lo]) * (m - lo) / (hi - lo)

curve = {m: vc(m) for m in range(1, 17)}

def draft_cost(d):
    """One draft step after a 128-token context, in target steps (median of side-by-side ratios)."""
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
N_ALPHA = 1024 if FULL else 64 if QUICK else 256
N_SPEED = 64 if FULL else 8 if QUICK else 32
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

# %% [markdown]
# What the table says (your numbers are above; α is the same in every run, c moves with the machine's load):
#
# * a draft that shares the **LM head** pays for it at every draft step: its weights are the share of the target's
#   printed above. If a step's time were its bytes, no such draft could cost less than that share of a target step;
#   a measured c can come out lower (compare early exit 4), because a target step's time is not only its bytes —
#   this CPU's eager step also spends time outside the matmuls, in norms, RoPE, attention and Python, and a 4-layer
#   draft does less of that. Early exit also pays for its L layers;
# * the **int8 copy** is the same model up to rounding, so its α is high — the seed's "70–80 % acceptance" comes
#   easily to a draft that *is* the target; section 7 asks what a small trained draft reaches — but on this CPU its c
#   is far from small: eager PyTorch spends much of a step outside the matmuls, which int8 does not shrink, and the
#   loop adds its own overhead per draft call;
# * **prompt lookup** costs nothing, and pays exactly where the output repeats the input (quoting, summarizing,
#   code editing); `benchmarks/speculative.py` measures it on chat, editing and quoting prompts, and the cells
#   after the table try an edit here.
#
# A small draft *distilled* from SmolLM2 is the classic fifth option: section 7 has you train one.

# %% [markdown]
# **Where prompt lookup pays: an answer that repeats the prompt.** Ask the model to fix the spelling of a paragraph
# (`EDIT_REQUEST`, an invented paragraph with two typos — asked to repeat a *famous* text, this small model
# paraphrases it from memory instead, and there is little to look up). Most of the answer is the paragraph again,
# so the n-gram guesses are right for long runs, and a long K is cheap where the verify curve of section 1 is low.

# %%
edit_ids = chat_ids(tok, EDIT_REQUEST, model.device)
N_EDIT = 12 if QUICK else 48
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

# %% [markdown]
# **Exercise 5 (practice): your prompt-lookup draft.** The rule is given here; turning it into a search with its
# edge cases (the longest n-gram, its latest occurrence, nothing when none matches) is the exercise. Prompt lookup
# guesses that the text repeats itself: take the longest n-gram that ends the text (n from `max_ngram` down to `min_ngram`) and also occurs earlier, take its **latest**
# earlier occurrence, and propose the (up to) k tokens that followed it there. No n-gram of at least `min_ngram`
# tokens seen before: propose nothing — which is adaptive K: the round verifies only what the draft is sure of.
# Write `lookup_draft(tokens: list[int], k, max_ngram=3, min_ngram=1) -> list[int]` (a `ValueError` for k < 0 or
# unless 1 ≤ min_ngram ≤ max_ngram).

# %% nbgrader={"grade": false, "grade_id": "lookup_draft", "locked": false, "schema_version": 3, "solution": true, "task": false}
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

# %% nbgrader={"grade": true, "grade_id": "test_lookup_draft", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_lookup_draft(lookup_draft)

# %% [markdown]
# Your draft on SmolLM2, measured on the two workloads where lookup should pay — the edit request above and a
# quotation (`QUOTE_TEXT`, plain text that quotes a paragraph) — with `min_ngram` 1 and 3 (`FULL`: 1, 2, 3). A round drafts
# with `lookup_draft(text, k)` and the target verifies the guesses in one forward (greedy: keep them while they are
# the target's argmax); no guess means a plain one-token step. The tokens are checked identical to the target's.

# %%
@torch.no_grad()
def lookup_decode(ids, n_new, k, min_ngram):
    """Greedy decoding with your lookup_draft as the draft; returns (ids, target calls, drafted, accepted)."""
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

# %% [markdown]
# Check: `pytest weeks/18 -k ex05`

# %% [markdown]
# ## 6. The speedup model
#
# A round runs the draft K times — each draft step costs c target steps — and the target once over K + 1 tokens,
# which costs `verify_cost[K + 1]` target steps (the curve of section 1). It writes the guesses it keeps and one token
# of the target's. Call α_i the probability that guess i is kept **given that guesses 0..i−1 were**. A draft as good
# at every position of the round has α_i = α; one that drafts from its own guesses, like section 10's head, gets
# worse along the round, α_0 > α_1 > ....
#
# **Exercise 6 (derive).** Work out the expected number of tokens a round of K guesses writes, and the predicted
# speedup: tokens per round over the round's cost in target steps. Then write `best_k(alpha, c, verify_cost) -> (k,
# speedup)`: the K in 1..M−1 (`verify_cost` maps m = 1..M tokens to steps, `verify_cost[1] == 1`) with the highest
# predicted speedup, and that speedup. `alpha` is a float (the same α_i = α at every position; α = 1 allowed, no
# dividing by zero) or a list with one α_i per position (at least M − 1 of them). The check draws both kinds per run;
# the formula follows the check.

# %% nbgrader={"grade": false, "grade_id": "best_k", "locked": false, "schema_version": 3, "solution": true, "task": false}
def best_k(alpha, c: float, verify_cost: dict) -> tuple:
    """(K, predicted speedup) maximizing tokens per round / cost of a round, K in 1..max(verify_cost) - 1; `alpha` a
    float (every position) or a list (alpha[i]: guess i kept given guesses 0..i-1 were)."""
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

# %% nbgrader={"grade": true, "grade_id": "test_best_k", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_best_k(best_k)

# %% [markdown]
# **The model, now that your check passes.** Token i of a round (i = 1..K after the first, which the round always
# writes) is written only if guesses 0..i−1 were all kept, so a round writes 1 + α_0 + α_0·α_1 + ... + α_0···α_(K−1)
# tokens on average; with one α, 1 + α + ... + α^K = (1 − α^(K+1)) / (1 − α) (K + 1 at α = 1). The speedup is that
# over K·c + verify_cost[K + 1]. Seed 001's "accept/reject each token independently" would give 1 + α·K: verification
# tests in order and stops at the first rejection. From here on the notebook uses `lib.spec_decode.speculative`'s version of the
# constant-α formula (`expected_tokens_per_call`, `predicted_speedup`) and your `best_k`.
#
# Two seed figures, recomputed with it below: "70 % acceptance with K = 4 → ~3.6 tokens per call" and "50 % → ~2.1":
# with one α no K can give more than 1 / (1 − α) tokens a round (the limit K → ∞).

# %%
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

# %% [markdown]
# The same model in two regimes: **this CPU** (the verify curve you measured, the int8 draft's c) and a
# **GPU-like** regime, where scoring up to 16 tokens costs one step (a flat curve: the GPU is idle during decode)
# and a draft one-tenth to one-twentieth the target's size costs c ≈ 0.05. The "2–3×" of the literature (and of
# seed 002's technique table) is this model's prediction in the second regime — a model, not a measurement; the
# measured speedups on this CPU are section 5's, printed above beside the model's. The best K is yours.

# %%
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

# %% [markdown]
# Check: `pytest weeks/18 -k ex06`

# %% [markdown]
# ## 7. A draft you train, and a prediction
#
# Seed 000 says "a draft model trained to minimise KL reaches 70–80 % acceptance". Train one and see. The draft:
# two blocks of SmolLM2's shape, initialized as copies of its first two, that **share its embedding, final norm and
# tied LM head, frozen** (`lib_drafts.build_distilled_draft(model, 2)`: only the blocks train). The data: the target's
# own greedy answers to chat prompts (templates × topics below, none of them section 5's or 10's chat prompts),
# decoded side by side, with the target's distribution of the next token kept at every position as its 32 most
# likely tokens (`lib_drafts.target_answers`). The loss: KL(p ‖ q) from the target's p to the draft's q on the
# answers' positions (`lib_drafts.distill_loss`; p renormalized over its 32 tokens). The last prompts are held out:
# the draft never trains on their answers. `FULL = False` trains for a bounded number of steps, a minute or less on
# two cores; `tools/distill_draft.py` trains longer, on other text.

# %%
TEMPLATES = ["Explain {} to a beginner.", "What are three tips for {}?", "Write a short story about {}.",
             "What are the pros and cons of {}?"]
TOPICS = ["gardening", "saving money", "the solar system", "cooking pasta", "public speaking", "chess",
          "electric cars", "baking bread"]
N_HELD7 = 4 if FULL else 2  # the last prompts, never trained on
texts7 = [t.format(topic) for topic in TOPICS[:8 if FULL else 1 if QUICK else 4] for t in TEMPLATES]
texts7 += ["Describe the ocean in simple words.", "Why is friendship important?", "How do I get started with "
           "photography?", "Give me a list of five facts about bees."][:N_HELD7]
model.requires_grad_(False)  # the teacher, and the embedding, norm and head the draft shares, stay frozen
with torch.no_grad():
    answers = lib_drafts.target_answers(model, [chat_ids(tok, t) for t in texts7], 48 if FULL else 8 if QUICK else 32)
n_train = len(texts7) - N_HELD7
train7 = {k: v[:n_train] for k, v in answers.items()}
held7 = {k: v[n_train:] for k, v in answers.items()}
print(f"{len(texts7)} prompts answered side by side: {int(train7['mask'].sum())} answer positions to train on, "
      f"{int(held7['mask'].sum())} held out; the top 32 tokens keep {float(answers['top_p'][answers['mask']].sum(-1).mean()):.3f} "
      f"of the target's probability on average")
print(repr(tok.decode(held7["tokens"][0, int(held7["prompt_len"][0]):])))

# %%
STEPS = 120 if FULL else 4 if QUICK else 30
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

# %%
@torch.no_grad()
def alphas7(d, data):
    """(α at T = 0, α at T = 1) of draft `d` on the answer positions of `data` (teacher forcing)."""
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

# %% [markdown]
# **Where "70–80 %" acceptance happens, and why not here.** Acceptance rates of that order are reported for drafts with
# far more training behind them than this one: small models of the target's own family trained on its pre-training
# corpus (Leviathan et al. 2023 draft for T5-XXL with T5-small and T5-base; Chen et al. 2023 for Chinchilla 70B with a
# 4B-parameter model) and heads like EAGLE's, trained for hours on tens of thousands of real conversations. Here the
# draft saw a few thousand tokens for a minute of CPU (your figures are printed above, with the load), its blocks
# start from the target's first two, and it must compress a 30-layer computation into 2. The int8 copy's α shows the
# other end: a draft that *is* the target, up to rounding, agrees almost always — and costs almost a target step
# (section 5). What grows α here is data and training time (`FULL = True`, `tools/distill_draft.py --minutes N`); what
# keeps c low is what the draft reads (section 9 shrinks its head, section 10 gives it the target's own features).
# Compare the two columns too: a draft that agrees more on the answers it trained on than on held-out ones has begun to
# memorize.
#
# Now predict what this draft does inside your own loop. If each guess is kept with probability α given the ones
# before it, how many target calls does a run of `max_new_tokens` tokens make? Section 6 gave the tokens of one round;
# a whole run is not just `max_new_tokens` over that: near the end a round may guess only the tokens still missing
# (your loop guesses `min(K, missing - 1)`), so the last rounds write less.
#
# **Exercise 7 (predict).** Write `expected_target_calls(alpha, k, max_new_tokens) -> float`: the expected number of
# target calls (rounds) your `speculative_generate` makes to write exactly `max_new_tokens` tokens, each guess kept
# with probability `alpha` given that the ones before it were, K = `k`. Exactly — no simulation (the check compares to
# 1e-9 on configurations drawn per run, α from 0 to 1, short runs where the end matters and long ones). Then the cell
# after the check measures it with your own loop and your own draft.

# %% nbgrader={"grade": false, "grade_id": "expected_target_calls", "locked": false, "schema_version": 3, "solution": true, "task": false}
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

# %% nbgrader={"grade": true, "grade_id": "test_expected_target_calls", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_expected_target_calls(expected_target_calls)

# %% [markdown]
# **The model, now that your check passes.** With r tokens still to write, a round guesses m = min(K, r − 1) tokens
# and writes j ≤ m of them with probability α^(j−1)·(1 − α) (j − 1 kept, then the target's correction) or m + 1 with
# probability α^m (all kept, then the bonus): calls(r) = 1 + Σ_j P(j)·calls(r − j), calls(0) = 0. For long runs
# calls(n) approaches n / (1 + α + ... + α^K); for short ones, or large K, the end matters.
#
# **Measured, with your loop and your draft**: your `speculative_generate` (T = 0) and `speculative_sample` (T = 1)
# with the draft you trained, on the held-out prompts, target calls counted, beside your prediction from the α you
# measured on the held-out answers. At T = 0 the run writes exactly those answers' tokens, so the prediction and the
# run see the same positions: what differs is that α is not one number (section 4). At T = 1 the run samples other
# text than the greedy answers α was measured on.

# %%
K7 = [2, 4] if FULL else [3]
N7 = 32 if FULL else 8 if QUICK else 24
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

# %% [markdown]
# Check: `pytest weeks/18 -k ex07`
