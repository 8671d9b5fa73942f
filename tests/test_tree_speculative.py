"""lib.spec_decode.tree_speculative: the tree mask, KVCache.keep, greedy identity on SmolLM2, the sampled law along a tree."""
import pytest
import torch

from lib.spec_decode.draft_head import load_draft_head
from lib.spec_decode.drafts import early_exit_draft
from lib.modeling.generate import generate
from lib.modeling.kv_cache import KVCache, LayerKVCache
from lib.modeling.llama import tiny_config
from lib.spec_decode.speculative import SpecStats, chat_ids, sample_from
from lib.spec_decode.tree_speculative import (DraftTree, DynamicTree, StaticTree, grow_tree, keep_positions,
                                              tree_mask, tree_speculative_generate, verify_tree)


def test_tree_mask_is_each_node_and_its_ancestors():
    #        root
    #       /    \
    #      0      1
    #     / \      \
    #    2   3      4
    #    |
    #    5
    parents = [-1, -1, 0, 0, 1, 2]
    ancestors_or_self = {0: {0}, 1: {1}, 2: {0, 2}, 3: {0, 3}, 4: {1, 4}, 5: {0, 2, 5}}
    mask = tree_mask(parents)
    for i, allowed in ancestors_or_self.items():
        assert {j for j in range(6) if mask[i, j]} == allowed, i
    with pytest.raises(ValueError, match="parent"):
        tree_mask([-1, 3, 0])


def test_keep_positions_moves_the_kept_positions_after_the_prefix():
    cache = KVCache([LayerKVCache(1, 2, 16, 4)])
    k = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1).expand(1, 2, 10, 4)
    cache[0].append(k, -k)
    keep_positions(cache, 3, [5, 7])
    assert cache.length == 5
    assert cache[0].k[0, 0, :5, 0].tolist() == [0, 1, 2, 5, 7]
    assert cache[0].v[0, 1, :5, 3].tolist() == [0, -1, -2, -5, -7]
    for bad in [(3, [7, 5]), (3, [2]), (3, [10]), (11, [])]:
        with pytest.raises(ValueError, match="keep_positions"):
            keep_positions(cache, *bad)
    with pytest.raises(ValueError, match="ring"):
        keep_positions(KVCache.rolling(tiny_config(), window=4), 0, [])


@pytest.mark.parametrize("draft, shape", [("early_exit", StaticTree((3, 2, 1))),
                                          ("head", DynamicTree(depth=4, top_k=3, width=3, budget=12)),
                                          ("head on FastLlama", StaticTree((4, 2, 1)))],
                         ids=["early-exit-static", "eagle-head-dynamic", "eagle-head-static-fast-target"])
def test_greedy_tree_speculation_gives_the_targets_greedy_output(smollm2, draft, shape):
    from lib.modeling.fast import FastLlama

    model, tok = smollm2
    ids = chat_ids(tok, "Write a short poem about the sea.")
    expected = generate(model, ids, 24)
    stats = SpecStats()
    target = FastLlama(model) if draft.endswith("FastLlama") else model  # its own masked forward (forward_masked)
    drafter = early_exit_draft(model, 26) if draft == "early_exit" else load_draft_head(model)
    out = tree_speculative_generate(target, drafter, ids, 24, tree=shape, stats=stats)
    assert torch.equal(out, expected)
    # the rounds kept accepted branches (KVCache.keep with slots) and rejected others: both paths ran
    assert 0 < stats.accepted < stats.drafted
    assert stats.tokens_per_call > 1.2, stats


def test_a_dynamic_tree_refuses_sampling_and_a_bad_tree_is_named(smollm2):
    target, tok = smollm2
    ids = chat_ids(tok, "Hi")
    with pytest.raises(ValueError, match="StaticTree"):
        tree_speculative_generate(target, early_exit_draft(target, 4), ids, 4, tree=DynamicTree(), temperature=1.0,
                                  generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="StaticTree or a DynamicTree"):
        tree_speculative_generate(target, early_exit_draft(target, 4), ids, 4, tree=(4, 2))
    with pytest.raises(ValueError, match="target_probs"):
        verify_tree(DraftTree(), torch.ones(3, 5), greedy=True)


# --- the law at temperature 1, on fixed tables (vocabulary of 3, two tokens deep) -------------------------------

P1 = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)  # the target: first token
P2 = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3]], dtype=torch.float64)  # second | first
Q1 = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)  # the draft, far from the target on purpose
Q2 = torch.tensor([[0.2, 0.2, 0.6], [0.5, 0.4, 0.1], [0.3, 0.3, 0.4]], dtype=torch.float64)
N = 6000


def _first_two(verify, g) -> int:
    """One round on a sampled (2, 1) tree: the first two tokens emitted (the second drawn from the target when the
    round stopped after one, as the next round would), as a cell index 3 * x1 + x2."""
    tree = grow_tree(StaticTree((2, 1)), Q1, lambda nodes, t: torch.stack([Q2[t.tokens[i]] for i in nodes]),
                     greedy=False, generator=g)
    rows = torch.stack([P1] + [P2[t] for t in tree.tokens])
    path, nxt = verify(tree, rows, False, g)
    toks = [tree.tokens[i] for i in path] + [nxt]
    if len(toks) == 1:
        toks.append(sample_from(P2[toks[0]], g))
    return 3 * toks[0] + toks[1]


def _law_failures(verify, seed: int) -> list[str]:
    """Exact binomial two-sided tests, one per cell of the 9, each at 1e-6 / 18: a correct sampler fails < 1e-6."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(9, dtype=torch.float64)
    for _ in range(N):
        counts[_first_two(verify, g)] += 1
    law = (P1[:, None] * P2).flatten()
    failures = []
    for cell in range(9):
        pmf = torch.distributions.Binomial(N, law[cell]).log_prob(torch.arange(N + 1, dtype=torch.float64)).exp()
        got = int(counts[cell])
        if pmf[:got + 1].sum() < 1e-6 / 18 or pmf[got:].sum() < 1e-6 / 18:
            failures.append(f"cell {divmod(cell, 3)}: {got} of {N}, law {float(law[cell]) * N:.0f}")
    return failures


def _p_never_updated(tree, target_probs, greedy, generator):
    """A real mistake: each child tried against the target's p itself, not against what is left of it."""
    path, node = [], -1
    while True:
        p, kids = target_probs[node + 1], tree.children.get(node, [])
        q = tree.q[node].clone() if kids else None
        for c in kids:
            x = tree.tokens[c]
            if torch.rand((), generator=generator).item() * float(q[x]) < float(p[x]):
                break
            q[x] = 0
            q /= q.sum()
        else:
            r = (p - tree.q[node]).clamp(min=0) if kids else p
            return path, sample_from(r / r.sum(), generator)
        node = c
        path.append(node)


def test_sampled_tree_keeps_the_targets_law():
    seed = int(torch.randint(0, 2**31, ()).item())
    assert _law_failures(verify_tree, seed) == [], f"seed {seed}"


def test_the_law_test_catches_a_rejection_rule_that_forgets_the_residual():
    assert _law_failures(_p_never_updated, 1) != []
