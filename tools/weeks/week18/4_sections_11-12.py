# %% [markdown]
# ## 11. Trees: many drafts verified in one forward
#
# Section 10's head agrees with the target on few of its guesses on chat (its α is printed above). A linear round of
# K guesses then spends a verify forward of K + 1 tokens to write barely more than one: guess 2 is worth scoring only
# if guess 1 was right, so when α is low most of the forward's rows score continuations of a guess that already
# failed. The forward would be better spent on **alternatives**: the draft's second and third choices for the *same*
# position, each with its own continuation — a **tree** of guesses, scored in one forward (SpecInfer, Medusa, EAGLE-2).
#
# **Work it out before reading on.** With α the probability that one guess is the target's token: how many tokens
# does a linear round of K guesses write per target call, and how quickly do more guesses stop paying? If the draft's
# b likeliest tokens contain the target's token with probability α_b, what does a tree with b_1 children at the root
# and b_2 under each child write per call — and what does its verify forward cost, in the units of the verify curve
# (a tree of N nodes is one forward of N + 1 tokens)?
#
# The cell measures α_b for the head on the target's own greedy answers to section 10's chat prompts (teacher
# forcing: one target forward and one head forward per prompt; the head's first level only, where it reads the
# target's true hidden state). The target in this section is `model` (`lib.modeling.llama`), not FastLlama: a tree's verify
# forward needs an attention that takes the tree's mask, which `lib.modeling.llama` has; so its costs are relative to
# `model`'s step, and its verify curve is section 1's.

# %%
PROMPTS11 = prompts8 if FULL else prompts8[:1]  # section 10's chat prompts (one without FULL: the time budget)
refs11 = [lib_generate(model, ids, N8) for ids in PROMPTS11]  # the target's greedy answers
TOP_B = [1, 2, 3, 4, 8]
hits11, total11 = dict.fromkeys(TOP_B, 0), 0
with torch.no_grad():
    for ids, ref in zip(PROMPTS11, refs11):
        _, hidden = dh.target_forward(model, ref)  # [1, T, D]: what the target's LM head reads
        logits, _ = head(ref[:, 1:], hidden[:, :-1])  # entry j reads (x_{j+1}, h_j) and scores x_{j+2}
        t_p = ids.shape[1]  # the head drafts from the answer's second token on (the first is the prefill's)
        guesses = head.keep_ids[logits[0, t_p - 1:-1].topk(max(TOP_B), -1).indices]  # [answer - 1, 8] tokens
        truth = ref[0, t_p + 1:]
        for b in TOP_B:
            hits11[b] += int((guesses[:, :b] == truth[:, None]).any(-1).sum())
        total11 += truth.numel()
alpha_b = {b: hits11[b] / total11 for b in TOP_B}
print(f"the head's top-b agreement with the target's greedy answers ({total11} tokens): "
      + ", ".join(f"α_{b} = {a:.2f}" for b, a in alpha_b.items()))

# %% [markdown]
# **Worked out.** A linear round writes 1 + α + α² + … + α^K tokens (section 6): at α = 0.2 the second guess adds
# 0.04 of a token and costs a row of the forward. A tree with b_1 children at the root, b_2 under each, … writes one
# token of the target's own, plus one more for each level whose path the target follows: 1 + α_{b_1} + α_{b_1}·α_{b_2}
# + …, if each level's agreement is its first level's (optimistic: deeper levels read the head's own predicted
# features). Its N = b_1 + b_1·b_2 + … nodes cost a verify forward of N + 1 tokens, `curve[N + 1]` steps (section 1's
# curve), and the head runs once per level, c each. The cell puts both in section 6's model, with the head's c
# measured against `model`: trees of at most 15 nodes, so that every verify lies on the curve section 1 measured.

# %%
def tree_tokens_model(branching):
    """Tokens per target call of a StaticTree(branching) at the head's measured top-b agreement (first level)."""
    out, reach = 1.0, 1.0
    for b in branching:
        reach *= alpha_b[b]
        out += reach
    return out


def tree_nodes(branching):
    return sum(math.prod(branching[:d + 1]) for d in range(len(branching)))


conditions = Conditions.now()
c11 = {"draft head": lab.relative_cost(dh.head_step(head, model, text_ids, CONTEXT), model, text_ids, CONTEXT),
       "prompt lookup": lab.relative_cost(lab.draft_step(drafts["prompt lookup"], text_ids, CONTEXT), model, text_ids,
                                          CONTEXT)}
conditions.done()
print("c relative to model's step: " + ", ".join(f"{d} {c:.3f}" for d, c in c11.items()) + f"; {conditions.line()}")
c_head = c11["draft head"]
plans11 = {f"linear K={k}": (1,) * k for k in (1, 2, 3)} | {f"static tree {b}": b for b in [
    (2,), (4,), (8,), (2, 2), (4, 1), (4, 2), (2, 2, 1), (3, 2, 1)]}
pred11 = {}
print(f"{'draft shape':20s} {'nodes':>5s} {'tok/call':>8s} {'verify':>7s} {'predicted':>9s}")
for name, b in plans11.items():
    n = tree_nodes(b)
    pred11[name] = tree_tokens_model(b) / (len(b) * c_head + curve[n + 1])
    print(f"{name:20s} {n:5d} {tree_tokens_model(b):8.2f} {curve[n + 1]:7.2f} {pred11[name]:8.2f}x")

# %% [markdown]
# **One forward for the whole tree: the tree attention mask.** Each node is one token of one continuation; it sits at
# position (the root's position + its depth), and it may attend to the decided text, to its own ancestors and to
# itself — never to a sibling or a cousin, which belong to other continuations. With the nodes written parent before
# child, the verify forward is one forward of the N nodes (after the root's token) whose mask inside the tree is
# `lib.spec_decode.tree_speculative.tree_mask(parents)`; the row of node i gives the target's p after the path to i. Below, a
# tree with two children at the root, two under the first and one under the second, then one more level.

# %%
from lib.spec_decode.tree_speculative import DynamicTree, StaticTree, tree_mask, tree_speculative_generate

parents11 = [-1, -1, 0, 0, 1, 2]  # node i's parent (-1: the root, the last decided token)
mask11 = tree_mask(parents11)
depth11 = []
for parent in parents11:
    depth11.append(1 if parent < 0 else depth11[parent] + 1)
print("node:      " + " ".join(f"{i}" for i in range(len(parents11))))
print("parent:    " + " ".join("r" if p < 0 else str(p) for p in parents11))
print("position:  " + " ".join(f"{d}" for d in depth11) + "   (the root's position + depth)")
for i in range(len(parents11)):
    print(f"row {i} sees: " + " ".join("■" if mask11[i, j] else "·" for j in range(len(parents11))))

# %% [markdown]
# **Exercise 9 (derive).** At temperature > 0 the tree's tokens are *sampled*: a node's n children are n distinct
# tokens drawn from the draft's q at that node **without replacement** (child 0 from q, child 1 from q without child
# 0, …), and the target must still write every token with exactly its own law p. Write
# `tree_accept(target_probs, draft_probs, children, generator=None)`, the rule at one node:
#
# * `target_probs` p `[V]` and `draft_probs` q `[V]`: the target's and the draft's distributions at the node;
#   `children` `[n]` int64: the tokens, in the order they were drawn;
# * try the children in that order, each accepted or rejected with a fresh uniform from `generator`; return
#   `(j, children[j])` for the first child you accept, or `(None, y)` when you accept none, y drawn from `generator`.
#
# What must hold (the check tests each, cell by cell, on inputs drawn per run, its seed printed): over the draws of
# the children, the token you return has **exactly** the law p, for any p and q; and each child, in its turn, is
# accepted with the largest probability that keeps the law exact given the rejections before it — so a function that
# ignores the children and samples p, which keeps the law, fails. With one child this is section 3's `verify` at one
# position; the question is what the target still owes after a rejection, and from which distribution the *next*
# child was drawn. Leave p and q unchanged (compute in new tensors), and use no lib code.

# %% nbgrader={"grade": false, "grade_id": "tree_accept", "locked": false, "schema_version": 3, "solution": true, "task": false}
def tree_accept(target_probs: torch.Tensor, draft_probs: torch.Tensor, children: torch.Tensor, generator=None):
    """One node of a sampled draft tree: (index of the accepted child, its token), or (None, a token drawn from
    what the target still owes) when every child is rejected."""
    ### BEGIN SOLUTION
    p, q = target_probs.double(), draft_probs.double()
    for j in range(children.shape[0]):
        x = int(children[j])
        if torch.rand((), generator=generator).item() * float(q[x]) < float(p[x]):  # min(1, p(x)/q(x))
            return j, x
        residual = (p - q).clamp(min=0)  # what the target still owes after this rejection
        p = residual / residual.sum()
        q = q.clone()
        q[x] = 0  # the next child was drawn from q without x
        q = q / q.sum()
    if generator is not None:  # a generator draws on its own device
        p = p.to(generator.device)
    return None, int(torch.multinomial(p, 1, generator=generator))
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_tree_accept", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_tree_accept(tree_accept)

# %% [markdown]
# **The rule, now that your check passes** (multi-draft recursive rejection sampling; SpecInfer, Miao et al. 2024):
# child j is accepted with probability min(1, p(x_j)/q(x_j)); on a rejection p becomes the residual
# normalize(max(p − q, 0)) and q loses x_j (renormalized), and the next child is tried against them; when all are
# rejected the token is drawn from what p has become. **Why it is exact:** with one child it is section 3's rule:
# P(emit y) = min(p(y), q(y)) + (1 − Σ min(p, q))·residual(y) = p(y). After the first child is rejected, the target
# still owes the residual — the token it emits from here must have that law — and the remaining children are a
# draw without replacement from q without x_1: the same problem with (residual, q without x_1), so the same rule
# applies one child further, and at the end the residual itself is sampled. The natural mistakes the check catches
# (tests/test_week18_tree.py computes each one's probability of passing, ≤ 1e-6): keeping p after a rejection (the
# emitted tokens lean to what q over-proposes); keeping q — the rule for children drawn *with* replacement, i.i.d.,
# which judges child 2 against a q that still holds child 1; zeroing x without renormalizing q; one uniform for
# every child (a child after a rejection is then accepted only if its ratio beats the last one's); trying only the
# first child (exact, but it throws the other children away); sampling p (exact, and nothing accepted).
#
# Greedy (T = 0) trees need none of this: follow the child that is the target's argmax. `lib.spec_decode.tree_speculative`
# uses your rule's twin in `verify_tree` at T > 0, where a `StaticTree` is required: EAGLE-2's dynamic tree keeps the
# nodes whose *sampled* tokens were likeliest, and that choice changes the law.

# %% [markdown]
# Check: `pytest weeks/18 -k ex09`

# %% [markdown]
# **Measured: a linear head, two trees and prompt lookup on chat.** The same head and chat prompt(s) as above,
# `model` as the target, greedy (T = 0, every output checked identical to the target's): the head linear at K = 2,
# `tree_speculative_generate` with the static tree the model above liked best and with a dynamic tree (EAGLE-2: each
# level expands the 2 most confident leaves into their 4 likeliest children; the 10 most confident nodes are
# verified), and prompt lookup at K = 4. For each: α per drafted token, accepted tokens per round, tokens per
# target call, the predicted speedup (the model above for the linear head and the static tree; for the dynamic
# tree, whose shape follows the head's confidence, from its measured tokens per call, nodes and levels per round), then
# the measured one. Every run is timed right after the target alone, as in section 10.

# %%
best_static = max((b for name, b in plans11.items() if name.startswith("static")),
                  key=lambda b: pred11[f"static tree {b}"])
runs11 = {
    "head, linear K=2": lambda ids, st: dh.head_speculative_generate(model, head, ids, N8, k=2, stats=st),
    f"head, static tree {best_static}": lambda ids, st: tree_speculative_generate(
        model, head, ids, N8, tree=StaticTree(best_static), stats=st),
    "head, dynamic tree (10 nodes)": lambda ids, st: tree_speculative_generate(
        model, head, ids, N8, tree=DynamicTree(depth=4, top_k=4, width=2, budget=10), stats=st),
    "prompt lookup, K=4": lambda ids, st: lib_speculative_generate(model, drafts["prompt lookup"], ids, N8, k=4,
                                                                   stats=st, min_draft_prob=0.5),
}
costs11 = {name: c11["prompt lookup" if name.startswith("prompt") else "draft head"] for name in runs11}
base11, times11 = 0.0, dict.fromkeys(runs11, 0.0)
stats11 = {name: SpecStats() for name in runs11}
same11 = dict.fromkeys(runs11, True)
for ids, ref in zip(PROMPTS11, refs11):
    sync(); t0 = time.perf_counter(); lib_generate(model, ids, N8); sync(); base11 += time.perf_counter() - t0
    for name, fn in runs11.items():
        sync(); t0 = time.perf_counter(); out = fn(ids, stats11[name]); sync()
        times11[name] += time.perf_counter() - t0
        same11[name] &= torch.equal(out, ref)
print(f"load average {os.getloadavg()[0]:.1f}; target (model) greedy {len(PROMPTS11) * N8 / base11:.1f} tok/s")
print(f"{'draft':32s} {'α':>5s} {'acc/round':>9s} {'tok/call':>8s} {'predicted':>9s} {'measured':>8s} identical")
result11 = {}
for name, st in stats11.items():
    levels = st.draft_calls / st.rounds  # draft forwards per round (a tree: one per level)
    nodes = max(1, min(round(st.drafted / st.rounds), max(curve) - 1))
    if name.startswith("head, linear"):
        pred = pred11["linear K=2"]
    elif "static" in name:
        pred = pred11[f"static tree {best_static}"]
    else:  # from its measured tokens per call and its shape (no closed form for α)
        pred = st.tokens_per_call / (levels * costs11[name] + curve[nodes + 1])
    result11[name] = dict(tpc=st.tokens_per_call, pred=pred, meas=base11 / times11[name])
    print(f"{name:32s} {st.acceptance_rate:5.2f} {st.accepted / st.rounds:9.2f} {st.tokens_per_call:8.2f} "
          f"{pred:8.2f}x {base11 / times11[name]:7.2f}x {same11[name]}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
names11 = list(result11)
xs = range(len(names11))
axes[0].bar(xs, [result11[n]["tpc"] for n in names11], color="C0")
axes[0].set_title("tokens per target call"); axes[0].axhline(1, color="gray", lw=0.5)
axes[1].bar([x - 0.2 for x in xs], [result11[n]["pred"] for n in names11], 0.4, label="predicted", color="C1")
axes[1].bar([x + 0.2 for x in xs], [result11[n]["meas"] for n in names11], 0.4, label="measured", color="C2")
axes[1].set_title("speedup over model's greedy"); axes[1].axhline(1, color="gray", lw=0.5); axes[1].legend(fontsize=7)
for ax in axes:
    ax.set_xticks(list(xs)); ax.set_xticklabels([n.replace(", ", "\n") for n in names11], fontsize=7)
plt.show()

# %% [markdown]
# What to read off (your numbers are above, with the load):
#
# * **A tree writes more per call than a line at the same α**: the extra rows score alternatives for the position that
#   most often fails, not continuations of a guess that already failed. How much more is what top-b agreement says:
#   the measured tokens per call sit near the model's, lower where the head's deeper levels (on its own predicted
#   features) agree less than its first.
# * **It pays only where the verify curve lets it**: N + 1 rows cost `curve[N + 1]` steps. Where the curve climbs
#   (compare sections 1 and 10), a wide tree's extra agreement is eaten by its forward; the model above picks the
#   shape before you run it, and the measurement says how far the model's assumptions hold (the loop's Python per
#   round, the head's catch-up on the accepted path).
# * **Exactness never moved**: every run is identical to the target's greedy output; at T > 0 the same trees keep
#   the target's law through your `tree_accept` (StaticTree only).

# %% [markdown]
# ## 12. Check your understanding (written, graded by hand)
#
# **Q5** (seed 002). Speculative decoding uses rejection sampling. A draft token has probability q(x) = 0.6 in
# the draft model and p(x) = 0.3 in the target model. What is the probability it is accepted, and if it is
# rejected, from which distribution does the replacement come — and why not from p? (Seed 002 uses this
# notebook's letters: q = draft, p = target.)

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_q5", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE
#
# *Mark scheme (2 points).* (1) min(1, p/q) = min(1, 0.3/0.6) = 0.5 (not min(1, q/p) = 1: the ratio is target over
# draft). (2) From the residual normalize(max(p − q, 0)), the mass p has that q under-covers: then P(emit x) =
# min(p(x), q(x)) + (1 − Σ min(p, q))·residual(x) = p(x). Sampling the replacement from p gives tokens q
# over-proposes (like this one) more than p(x).

# %% [markdown]
# **Q6.** In the GPU-like regime (flat verify curve, c = 0.05), what speedup does your model predict for α = 0.8,
# K = 4, and what does that number assume? Name one assumption that sections 1, 4 or 5 contradict on this CPU, with
# your measured number.

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_q6", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE
#
# *Mark scheme (2 points).* (1) (1 + 0.8 + 0.8² + 0.8³ + 0.8⁴) / (4·0.05 + 1) = 3.3616 / 1.2 = 2.80×. (2) Any of, with
# the student's measurement: the same α at every position (section 4's histogram; section 7's predicted and measured
# calls), a flat verify curve (section 1's and section 10's curves: a few tokens cost well over one step for
# `lib.modeling.llama`), a draft costing a twentieth of a step (section 5: the int8 copy's c is most of a step), no loop
# overhead.

# %% [markdown]
# **Q7** (written). Seed 002's decision tree puts speculative decoding on the "fits on one GPU" branch as step 4,
# "if latency-critical", and not on the "No GPU / edge / laptop" branch. Explain both placements with this week's
# speedup model, and say — with your measured numbers — on which workloads you would still turn it on on this CPU.

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_q7", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# YOUR ANSWER HERE
#
# *Mark scheme (3 points).* (1) Speculation cuts **latency** at batch 1: a GPU decoding one sequence is memory-bound,
# so scoring K + 1 tokens costs about one step (flat verify curve) and a small draft costs c ≈ 0.05, giving 2–3×; at
# large batch the GPU is already compute-bound, verification is no longer free, and throughput gains vanish —
# hence "if latency-critical" and after batching (section 8: in a batch, rows that accept different numbers of tokens
# also cost padding or idle slots). (2) On a CPU/laptop the verify curve is not flat (the student's sections 1 and 10)
# and any draft that reads the full 49152 × 576 LM head pays for it at every step (section 5: a large share of a
# bandwidth-bound step), so the predicted speedup for realistic α is about one or below — quantization and a smaller
# model help more; the cheap draft head of section 10 has a small c but its α on chat is low (the student's
# figures). (3) Still worth it where α is high and c ≈ 0: prompt lookup on quoting/summarizing/editing workloads
# (section 5's edit and quote runs; `benchmarks/speculative.py` prints chat, edit and quote). Model drafts want K small (2–4) because the verify curve is not flat; prompt lookup
# drafts only where an n-gram matches, so a long K costs little there and pays on long copied runs.
