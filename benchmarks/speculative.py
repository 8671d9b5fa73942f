"""Speculative decoding on SmolLM2-135M (fp32, batch 1): target greedy tok/s vs each draft's speculative tok/s.

    python benchmarks/speculative.py [--new-tokens 64] [--ks 2,4,8] [--fr 8192] [--plain-target] [--drafts "int8 copy,..."]

Greedy (temperature 0), so every speculative run must give exactly the target's tokens (checked, printed).
The target is `lib.modeling.fast.FastLlama(model)`, the fastest engine here (its greedy tokens are checked against
lib.modeling.llama's too); `--plain-target` uses lib.modeling.llama itself. Workloads:
  chat   three chat requests (SmolLM2's chat template);
  edit   a chat request to fix the spelling of a paragraph (`lib.spec_decode.speculative.EDIT_REQUEST`): the answer repeats it;
  quote  a plain-text prompt that quotes a paragraph (`lib.spec_decode.speculative.QUOTE_TEXT`).
Drafts: prompt lookup (adaptive: drafts only where an n-gram matches), the int8 copy of the target, the int8 copy
with an FR-Spec head (the --fr most frequent tokens of the first 80 % of Hamlet; 0 leaves it out), the distilled
2-layer draft (plain and FR-Spec) when `tools/distill_draft.py` has built its checkpoint, the **draft head**
(`lib.spec_decode.draft_head`: one layer reading the target's last hidden state + an FR-Spec output layer, trained by
`tools/train_draft_head.py`, committed in data/draft_head/) drafting a chain of K, then the same head drafting a
static tree (4, 2, 1) and an EAGLE-2 dynamic tree each round, the same three for the EAGLE-style head of
`tools/train_eagle.py` when data/draft_head/eagle.pt exists (`lib.spec_decode.tree_speculative`: every node verified in one
forward with a tree mask; α there = accepted nodes / drafted nodes, so compare tokens per target call), an early exit (first 8 layers) and a random 2-layer
model. Before the workloads it prints the target's verify curve (one forward of m tokens / one decode step,
after 128 tokens) and each draft's cost c (one draft step / one target step); each row of the table shows the
speedup predicted from that run's α, c and verify curve next to the measured one, and the load average. Each draft runs at every K in --ks; the table shows the best K. All
figures come from this one run; ratios are what to compare across machines (a busy machine slows everything).
Every draft at every K on every workload takes about 15 minutes on a quiet 2-core CPU (5 drafts x 3 K x 3
workloads measured 11 min); --drafts, --workloads and --ks narrow it. Not a test.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch

CHAT = [
    "What are three tips for staying healthy?",
    "Explain what a hash table is to a beginner.",
    "Write a short story about a robot who learns to paint.",
]


def timed(fn):
    """(fn(), its seconds), a GPU's queued work waited for at both ends."""
    from lib.bench.roofline import sync

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--fr", type=int, default=8192, help="FR-Spec subset size for the int8/distilled drafts (0: off)")
    parser.add_argument("--plain-target", action="store_true", help="target = lib.modeling.llama itself (default: FastLlama)")
    parser.add_argument("--drafts", default="", help="comma-separated draft names to run (default: all)")
    parser.add_argument("--workloads", default="chat,edit,quote", help="comma-separated: chat, edit, quote")
    parser.add_argument("--quick", action="store_true", help="a smoke run in seconds: 8 tokens, K = 2, the chat workload")
    parser.add_argument("--record", action="store_true",
                        help="also keep this run as the machine class's committed record (results/<class>/"
                             "speculative.json) — if it was not disturbed")
    args = parser.parse_args()
    if args.quick:
        args.new_tokens, args.ks, args.workloads = 8, "2", "chat"
    ks = [int(k) for k in args.ks.split(",")]

    from lib.spec_decode import draft_head as dh
    from lib.spec_decode.drafts import PromptLookupDraft, early_exit_draft, fr_spec_draft, frequency_ranked_ids, load_distilled_draft, quantized_draft, random_draft, token_counts
    from lib.spec_decode import speculative as spec
    from lib.modeling.generate import generate
    from lib.modeling.llama import load_smollm2

    from lib.bench.records import Record
    from lib.spec_decode.tree_speculative import DynamicTree, StaticTree, tree_speculative_generate
    from lib.bench.timing import Conditions, impossible_verify_curve

    torch.manual_seed(0)
    conditions = Conditions.now()
    record = Record("speculative")
    model, tok = load_smollm2(device="cpu")
    target = model
    if not args.plain_target:
        from lib.modeling.fast import FastLlama

        target = FastLlama(model)
    print(f"torch {torch.__version__} | threads: {torch.get_num_threads()} | {args.new_tokens} new tokens, greedy | "
          f"target: {type(target).__name__} | {platform.processor() or platform.machine()} | load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    int8 = quantized_draft(model)
    drafts = {  # name -> (draft, min_draft_prob); the draft head is run by its own loop (below)
        "prompt lookup": (PromptLookupDraft(model.config.vocab_size), 0.5),
        "int8 copy": (int8, 0.0),
    }
    keep = None
    if args.fr:
        from lib.modeling.text import load_text

        text = tok(load_text("hamlet"), return_tensors="pt").input_ids[0]
        keep = frequency_ranked_ids(token_counts(text[: int(0.8 * text.numel())], model.config.vocab_size),
                                         args.fr)
        drafts[f"int8 + FR {args.fr}"] = (fr_spec_draft(int8, keep), 0.0)
    try:
        distilled = load_distilled_draft(model, 2)
        drafts["distilled 2-layer"] = (distilled, 0.0)
        if keep is not None:
            drafts[f"distilled + FR {args.fr}"] = (fr_spec_draft(distilled, keep), 0.0)
    except FileNotFoundError as err:
        print(f"(no distilled draft: {err})")
    # the committed head and, when `python tools/train_eagle.py` has built it, the EAGLE-style head (issue 60): each
    # drafting a chain of K, and the same head drafting a tree each round (lib.spec_decode.tree_speculative: K is not
    # used; the tree's nodes are verified in one forward of nodes + 1 tokens)
    for linear, prefix, path in (("draft head", "head", dh.HEAD_PATH), ("eagle head", "eagle", dh.EAGLE_PATH)):
        try:
            head = dh.load_draft_head(model, path)
        except FileNotFoundError as err:
            print(f"(no {linear}: {err})")
            continue
        drafts[linear] = (head, None)
        drafts[f"{prefix} tree 4-2-1"] = (head, StaticTree((4, 2, 1)))
        drafts[f"{prefix} dynamic tree"] = (head, DynamicTree(depth=5, top_k=4, width=4, budget=16))
    drafts["early exit 8"] = (early_exit_draft(model, 8), 0.0)
    drafts["random 2-layer"] = (random_draft(model.config), 0.0)
    if args.drafts:
        wanted = [d.strip() for d in args.drafts.split(",")]
        unknown = [d for d in wanted if d not in drafts]
        if unknown:
            raise SystemExit(f"unknown draft(s) {unknown}; available: {list(drafts)}")
        drafts = {d: drafts[d] for d in wanted}
    workloads = {"chat": [spec.chat_ids(tok, t, model.device) for t in CHAT],
                 "edit": [spec.chat_ids(tok, spec.EDIT_REQUEST, model.device)],
                 "quote": [tok(spec.QUOTE_TEXT, return_tensors="pt").input_ids.to(model.device)]}
    workloads = {w: workloads[w] for w in args.workloads.split(",")}
    n = args.new_tokens
    generate(target, next(iter(workloads.values()))[0], 4)  # warm-up

    def run(draft, min_prob, ids, k, stats):
        if isinstance(min_prob, StaticTree | DynamicTree):
            return tree_speculative_generate(target, draft, ids, n, tree=min_prob, stats=stats)
        if min_prob is None:  # the draft head reads the target's hidden states: its own loop
            return dh.head_speculative_generate(target, draft, ids, n, k=k, stats=stats)
        return spec.speculative_generate(target, draft, ids, n, k=k, stats=stats, min_draft_prob=min_prob)

    # the verify curve and each draft's c, on a text none of the workloads uses (Hamlet), after 128 tokens
    from lib.modeling.text import load_text

    text_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[:, :160].to(model.device)
    trees = [shape for _, shape in drafts.values() if isinstance(shape, StaticTree | DynamicTree)]
    tree_m = {shape: 1 + (shape.max_nodes if isinstance(shape, StaticTree) else shape.budget) for shape in trees}
    sizes = sorted(set(range(1, max(ks) + 2)) | set(tree_m.values()))
    curve = spec.verify_curve(target, text_ids, sizes, repeats=3 if args.quick else 7)
    print("verify curve (one target forward of m tokens / one decode step, after 128 tokens): "
          + ", ".join(f"m={m}: {v:.2f}" for m, v in curve.items()))
    disturbed = impossible_verify_curve(curve)
    if disturbed:
        print(disturbed)
    for m, v in curve.items():
        record.add(f"verify cost m={m}", v, "steps", False)
    costs = {}
    for dname, (draft, min_prob) in drafts.items():
        head_like = min_prob is None or isinstance(min_prob, StaticTree | DynamicTree)
        step = dh.head_step(draft, target, text_ids) if head_like else spec.draft_step(draft, text_ids)
        costs[dname] = spec.relative_cost(step, target, text_ids, repeats=3 if args.quick else 7)
    print("draft cost c (one draft step / one target step): "
          + ", ".join(f"{d}: {c:.3f}" for d, c in costs.items()))
    rows = []
    for wname, prompts in workloads.items():
        base_time, refs = 0.0, []
        for ids in prompts:
            out, dt = timed(lambda: generate(target, ids, n))
            dt = min(dt, timed(lambda: generate(target, ids, n))[1])  # best of 2: the baseline sets every ratio
            if target is not model and not torch.equal(out, generate(model, ids, n)):
                print(f"  WARNING: {type(target).__name__}'s greedy tokens differ from lib.modeling.llama's on this prompt")
            refs.append(out)
            base_time += dt
        print(f"\n[{wname}] target greedy: {len(prompts) * n / base_time:.1f} tok/s over {len(prompts)} prompt(s); each "
              f"row's speedup is against the target timed again right beside it")
        for dname, (draft, min_prob) in drafts.items():
            best = None
            for k in ks if not isinstance(min_prob, StaticTree | DynamicTree) else ks[:1]:
                total, same, st, side = 0.0, True, spec.SpecStats(), 0.0
                for ids, ref in zip(prompts, refs):
                    side += timed(lambda: generate(target, ids, n))[1]  # the baseline again, right beside this run
                    out, dt = timed(lambda: run(draft, min_prob, ids, k, st))
                    total += dt
                    same &= torch.equal(out, ref)
                rate = len(prompts) * n / total
                base = len(prompts) * n / side  # the speedup is against the side-by-side baseline (load drifts)
                a = st.acceptance_rate if st.drafted else 0.0
                # predicted: tokens per round (α from this run) / (K c + verify_cost[K + 1]); prompt lookup drafts
                # fewer than K per round (adaptive), so its prediction uses the K it drafted on average
                k_eff = max(1, round(st.drafted / st.rounds)) if st.rounds else k
                if isinstance(min_prob, StaticTree | DynamicTree):  # a tree: this run's tokens and draft calls per
                    # round over (draft calls x c + one verify of nodes + 1 tokens); α counts accepted / drafted nodes
                    # (the head's loop prefills once: that call and its token are not a round's)
                    round_tokens = st.tokens - (st.target_calls - st.rounds)
                    pred = round_tokens / max(st.draft_calls * costs[dname] + st.rounds * curve[tree_m[min_prob]], 1e-9)
                    k = "tree"
                else:
                    pred = spec.predicted_speedup(min(a, 1.0), min(k_eff, max(ks)), costs[dname], curve)
                print(f"  {dname:15s} K={k}: {rate:6.1f} tok/s ({rate / base:.2f}x, predicted {pred:.2f}x) "
                      f"identical={same} accept={a:.2f} tokens/call={st.tokens_per_call:.2f}")
                if best is None or rate / base > best[1] / best[6]:
                    best = (k, rate, same, a, st.tokens_per_call, pred, base)
            rows.append((wname, dname, best[0], best[6], best[1], best[1] / best[6], best[5], best[2], best[3], best[4],
                         costs[dname]))
    print("\n| workload | draft | best K | target tok/s | speculative tok/s | speedup | predicted | identical "
          "| acceptance α (T=0) | c | tokens per target call |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for w, d, k, b, r, s, p, same, a, tpc, c in rows:
        print(f"| {w} | {d} | {k} | {b:.1f} | {r:.1f} | {s:.2f}x | {p:.2f}x | {same} | {a:.2f} | {c:.3f} | {tpc:.2f} |")
    for w, d, k, b, r, s, p, same, a, tpc, c in rows:
        record.add(f"{w}: {d}: speedup", s, "×", True)
        record.add(f"{w}: {d}: predicted speedup", p, "×", True)
        record.add(f"{w}: {d}: acceptance α (T=0)", a, "", True)
        record.add(f"{w}: {d}: tokens per target call", tpc, "tokens", True)
        record.add(f"{w}: {d}: draft cost c", c, "steps", False)
        record.add(f"{w}: target", b, "tok/s", True)
        record.note(f"{w}: {d}: best K, identical", [k, same])
    conditions.done()
    print(conditions.line())
    warn = disturbed or (None if not conditions.busy else
                         f"measurement disturbed: other work kept the load at {conditions.others:.1f} on "
                         f"{conditions.cores} cores; read the ratios, rerun when the machine is quieter")
    if warn and not disturbed:
        print(warn)
    record.note("disturbed", warn)
    record.write(commit_as_reference=args.record and not args.quick and warn is None)


if __name__ == "__main__":
    main()
