"""Tree speculation (week 18): the draft proposes a tree of continuations, the target checks every branch in one
forward with a tree attention mask, and the longest branch it agrees with is kept.

    stats = SpecStats()
    ids = tree_speculative_generate(target, early_exit_draft(target, 8), prompt_ids, 64,
                                    tree=StaticTree((4, 2, 1)), stats=stats)
    # temperature 0: exactly lib.modeling.generate.generate(target, prompt_ids, 64)

- **The tree.** Node i holds a drafted token, its parent (-1: the root, the last token already decided) and its
  depth. `StaticTree(branching)` gives every node of depth d-1 `branching[d-1]` children (SpecInfer, Medusa).
  `DynamicTree(depth, top_k, width, budget)` is EAGLE-2's (Li et al. 2024b): each level expands only the `width`
  nodes of highest path confidence (the product of the draft's probabilities along the path), each into its
  `top_k` likeliest children; the `budget` most confident nodes of all make the tree (an ancestor is at least as
  confident as its descendants, so the kept set is a tree).
- **One forward per level for the draft, one for the target.** A node's position is the root's plus its depth;
  it attends to every position already decided and to its own ancestors, nothing else (`tree_mask`). Both
  models keep KV caches; after verification `keep_positions` keeps the accepted path's positions and drops the
  rest, the tree's counterpart of the `truncate` linear speculation uses.
- **Verification.** At temperature 0 (greedy): from the root, follow the child whose token is the target's
  argmax; stop at a node with no such child and append the target's own argmax. Output = the target's greedy
  output. At temperature > 0 the children of each node are sampled from the draft's q *without replacement*, and
  are tried in the order they were drawn (multi-draft recursive rejection sampling; SpecInfer, Miao et al. 2024;
  Jeon et al. 2024): child j is accepted with probability min(1, p(x_j) / q(x_j)); on rejection p becomes
  normalize(max(p - q, 0)) and q loses x_j (renormalized), and the next child is tried; when every child is
  rejected the token is sampled from what p has become (`tree_accept`, one node: week 18's exercise 9, a stub
  while it is graded). Each emitted token has exactly the target's law. The
  dynamic tree chooses which nodes to keep from the sampled tokens' own probabilities, which breaks that law: it
  is greedy-only here.

Works with models of `lib.modeling.llama.LlamaModel`'s shape (a `KVCache`, positions from the cache, an attention backend
that takes `mask=`); `early_exit_draft` and `random_draft` (lib.spec_decode.drafts) are such drafts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lib.attn.attention import gqa_attention
from lib.spec_decode.draft_head import DraftHead
from lib.spec_decode.speculative import SpecStats, decode_args, sample_from


# --- the tree and its mask ------------------------------------------------------------------------------------

@dataclass
class DraftTree:
    """Nodes in the order they were created (a parent always before its children)."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: a child of the root
    logconf: list[float] = field(default_factory=list)  # log of the draft's probability of the path to the node
    children: dict[int, list[int]] = field(default_factory=dict)  # node (-1: root) -> children, in drawn order
    q: dict[int, torch.Tensor] = field(default_factory=dict)  # node (-1: root) -> the draft's q [V] at that node
    origin: list[int] = field(default_factory=list)  # after `subtree`: each node's id in the tree it came from

    def __len__(self) -> int:
        return len(self.tokens)

    def depth(self, i: int) -> int:
        d = 0
        while i >= 0:
            i, d = self.parents[i], d + 1
        return d

    def add(self, parent: int, token: int, logconf: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.logconf.append(logconf)
        self.children.setdefault(parent, []).append(len(self.tokens) - 1)
        return len(self.tokens) - 1

    def subtree(self, keep: list[int]) -> "DraftTree":
        """The tree of nodes `keep` (a set closed under parents), renumbered in creation order."""
        keep = sorted(keep)
        new = {-1: -1} | {old: i for i, old in enumerate(keep)}
        out = DraftTree(origin=keep)
        for old in keep:
            out.add(new[self.parents[old]], self.tokens[old], self.logconf[old])
        out.q = {new[node]: q for node, q in self.q.items() if node in new}
        return out


def tree_mask(parents: list[int], device=None) -> torch.Tensor:
    """`[N, N]` bool: row i is True at node i and at each of its ancestors (what node i may attend to)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}'s parent {p} must be -1 (the root) or an earlier node")
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def keep_positions(cache, start: int, slots: list[int]) -> None:
    """Keep a KVCache's first `start` positions, then the positions `slots` (ascending, each >= start) moved to follow
    them, in every layer: the accepted path's K/V, scattered among the drafted tree's. `keep_positions(c, n, [])` is
    `c.truncate(n)`."""
    for layer in cache.layers:
        if not hasattr(layer, "k") or type(layer).__name__ == "RollingKVCache":
            raise ValueError(f"tree speculation keeps scattered positions, which a {type(layer).__name__} cannot "
                             f"(a ring's slots are not positions): use a full KVCache (KVCache.for_model)")
        if not 0 <= start <= layer.length or any(not start <= s < layer.length for s in slots) \
                or any(a >= b for a, b in zip(slots, slots[1:])):
            raise ValueError(f"keep_positions({start}, {slots}): the cache holds {layer.length} positions; start "
                             f"must be in 0..{layer.length} and slots ascending in {start}..{layer.length - 1}")
        if slots:
            idx = torch.tensor(slots, device=layer.k.device)
            end = start + len(slots)
            layer.k[:, :, start:end] = layer.k.index_select(2, idx)  # gathered first, then written: no overlap
            layer.v[:, :, start:end] = layer.v.index_select(2, idx)
        layer.length = start + len(slots)


class _Positions:
    """A KVCache seen by `LlamaModel.forward` with explicit positions (the tree's depths, not a running count)."""

    def __init__(self, cache, positions: torch.Tensor):
        self.cache, self.positions = cache, positions

    def __getitem__(self, i: int):
        return self.cache[i]


def tree_forward(model, cache, tokens: list[int], positions: list[int], allowed: torch.Tensor,
                 hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward of `tokens` at `positions`, appended to `cache`, row i attending where `allowed[i]` (a bool
    `[len(tokens), cache.length + len(tokens)]` over the cached positions, then the new ones). Returns logits
    `[len(tokens), V]` and, with `hidden`, the final norm's output `[len(tokens), D]` (what a DraftHead reads)."""
    device = model.device
    if allowed.shape != (len(tokens), cache.length + len(tokens)):
        raise ValueError(f"allowed must be [new, cached + new] = [{len(tokens)}, {cache.length + len(tokens)}]; "
                         f"got {tuple(allowed.shape)}")

    def masked(q, k, v, causal=True, **kwargs):
        return gqa_attention(q, k, v, causal=False, mask=allowed)

    ids = torch.tensor([tokens], device=device)
    if hasattr(model, "forward_masked"):  # lib.modeling.fast.FastLlama
        logits, h = model.forward_masked(ids, cache, positions, allowed)
        return logits[0], (h[0] if hidden else None)
    seen = []
    handle = model.norm.register_forward_hook(lambda mod, args, out: seen.append(out)) if hidden else None
    try:
        logits = model.with_attention(masked)(ids, cache=_Positions(cache, torch.tensor(positions, device=device)))
    finally:
        if handle is not None:
            handle.remove()
    return logits[0], (seen[-1][0] if hidden else None)


def _rows(decided: int, cache_len: int, n_causal: int, tree: DraftTree, nodes: list[int], slot: dict[int, int],
          device) -> torch.Tensor:
    """The mask rows of `n_causal` decided tokens (causal), then of `nodes` (the `decided` first positions, the
    node's ancestors and itself), over `cache_len` cached positions and the new ones. `slot[node]` is where a node's
    K/V lies in the cache (or will lie, for the nodes fed now)."""
    total = cache_len + n_causal + len(nodes)
    allowed = torch.zeros(n_causal + len(nodes), total, dtype=torch.bool, device=device)
    for r in range(n_causal):
        allowed[r, :cache_len + r + 1] = True
    for r, node in enumerate(nodes, start=n_causal):
        allowed[r, :decided] = True
        i = node
        while i >= 0:
            allowed[r, slot[i]] = True
            i = tree.parents[i]
    return allowed


# --- growing the tree with the draft --------------------------------------------------------------------------

@dataclass(frozen=True)
class StaticTree:
    """Every node at depth d - 1 gets `branching[d - 1]` children: (4, 2, 1) makes 4 + 8 + 8 = 20 nodes."""
    branching: tuple[int, ...]

    def __post_init__(self):
        if not self.branching or any(b < 1 for b in self.branching):
            raise ValueError(f"branching must be a non-empty tuple of counts >= 1; got {self.branching}")

    @property
    def max_nodes(self) -> int:
        return sum(math.prod(self.branching[:d + 1]) for d in range(len(self.branching)))


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's tree: `depth` levels; at each, the `width` most confident leaves get their `top_k` likeliest
    children; the `budget` most confident nodes are verified. Greedy decoding only (see the module's docstring)."""
    depth: int = 5
    top_k: int = 4
    width: int = 4
    budget: int = 24

    def __post_init__(self):
        if min(self.depth, self.top_k, self.width, self.budget) < 1:
            raise ValueError(f"depth, top_k, width and budget must be >= 1; got {self}")

    @property
    def max_nodes(self) -> int:
        return self.top_k + (self.depth - 1) * self.width * self.top_k


def _children(q: torch.Tensor, n: int, greedy: bool, generator) -> list[int]:
    """n tokens from q: its n likeliest (greedy), or a draw without replacement in drawn order (Gumbel top-k)."""
    n = min(n, int((q > 0).sum()))
    if greedy:
        return q.topk(n).indices.tolist()
    u = torch.rand(q.shape, generator=generator, device=generator.device if generator is not None else q.device)
    keys = q.log().to(u.device) - torch.log(-torch.log(u.clamp_min(1e-20)))
    return keys.topk(n).indices.tolist()


def grow_tree(shape, root_q: torch.Tensor, expand, greedy: bool, generator=None) -> DraftTree:
    """A draft tree of `shape` (StaticTree / DynamicTree) from the draft's q at the root and `expand(nodes, tree)
    -> q [len(nodes), V]`, the draft's q at each of `nodes` (called once per level)."""
    tree = DraftTree()
    tree.q[-1] = root_q
    frontier = [-1]
    levels = shape.branching if isinstance(shape, StaticTree) else (shape.top_k,) * shape.depth
    if isinstance(shape, DynamicTree) and not greedy:
        raise ValueError("a DynamicTree picks nodes by their own sampled probabilities, which breaks the target's "
                         "law at temperature > 0: use a StaticTree there")
    for level, n_children in enumerate(levels):
        if level > 0:
            if isinstance(shape, DynamicTree):
                frontier = sorted(frontier, key=lambda i: -tree.logconf[i])[:shape.width]
            if not frontier:
                break
            for node, q in zip(frontier, expand(frontier, tree)):
                tree.q[node] = q
        new = []
        for node in frontier:
            q = tree.q[node]
            base = tree.logconf[node] if node >= 0 else 0.0
            for tok in _children(q, n_children, greedy, generator):
                new.append(tree.add(node, tok, base + math.log(max(float(q[tok]), 1e-30))))
        frontier = new
    if isinstance(shape, DynamicTree) and len(tree) > shape.budget:
        ranked = sorted(range(len(tree)), key=lambda i: (-tree.logconf[i], i))[:shape.budget]
        keep = set(ranked)
        for i in ranked:  # equal confidences could leave a parent out: close the set under parents
            while tree.parents[i] >= 0 and tree.parents[i] not in keep:
                i = tree.parents[i]
                keep.add(i)
        tree = tree.subtree(sorted(keep))
    return tree


# --- verification ---------------------------------------------------------------------------------------------

def tree_accept(target_probs: torch.Tensor, draft_probs: torch.Tensor, children,
                generator: torch.Generator | None = None) -> tuple[int | None, int]:
    """One node's children, drawn from `draft_probs` (q [V]) without replacement, tried in drawn order against
    `target_probs` (p [V]): child j is accepted with probability min(1, p(x_j) / q(x_j)); on rejection p becomes
    normalize(max(p - q, 0)) and q loses x_j (renormalized). Returns (j, x_j) for the accepted child, or (None, y)
    with y sampled from what p has become when every child is rejected. The emitted token has exactly p's law."""
    p, q = target_probs.float(), draft_probs.to(target_probs.device).float()
    device = generator.device if generator is not None else p.device
    for j, x in enumerate(int(c) for c in children):
        u = torch.rand((), generator=generator, device=device).item()
        if u * float(q[x]) < float(p[x]):  # accept with probability min(1, p(x) / q(x))
            return j, x
        residual = (p - q).clamp(min=0)
        p = residual / residual.sum() if residual.sum() > 0 else p
        q = q.clone()
        q[x] = 0  # the next child was drawn from q without x
        q = q / q.sum() if q.sum() > 0 else q
    return None, sample_from(p, generator)


def verify_tree(tree: DraftTree, target_probs: torch.Tensor, greedy: bool,
                generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """`target_probs [1 + N, V]`: the target's p at the root (row 0) and at each node (row 1 + i); logits will do
    when `greedy`. Returns the accepted path (node ids, root to leaf) and the token that follows it."""
    if target_probs.dim() != 2 or target_probs.shape[0] != len(tree) + 1:
        raise ValueError(f"target_probs must be [1 + nodes, V] = [{len(tree) + 1}, V]; got "
                         f"{tuple(target_probs.shape)}")
    path, node = [], -1
    while True:
        p = target_probs[node + 1]
        kids = tree.children.get(node, [])
        if greedy:
            best = int(p.argmax())
            match = [c for c in kids if tree.tokens[c] == best]
            if not match:
                return path, best
            node = match[0]
            path.append(node)
            continue
        if not kids:  # a leaf: no child to try, the token comes from p
            return path, sample_from(p.float(), generator)
        j, token = tree_accept(p, tree.q[node].to(p.device), [tree.tokens[c] for c in kids], generator)
        if j is None:
            return path, token
        node = kids[j]
        path.append(node)


# --- the drafts: a model of the target's shape, or a head on the target's hidden states -------------------------

class _ModelDrafter:
    """A draft with a model's call shape and a KVCache (lib.spec_decode.drafts' early_exit_draft, random_draft, ...)."""
    needs_hidden = False

    def __init__(self, draft, max_len: int, dprobs, stats: SpecStats):
        self.draft, self.dprobs, self.stats = draft, dprobs, stats
        self.cache = draft.new_cache(batch=1, max_len=max_len)
        self.slot: dict[int, int] = {}

    def root(self, out: list[int]) -> torch.Tensor:
        """q at the root: the draft catches up on the decided tokens it has not seen."""
        self.n, self.slot = len(out), {}
        logits = self.draft(torch.tensor([out[self.cache.length:]], device=self.draft.device), cache=self.cache)
        self.stats.draft_calls += 1
        return self.dprobs(logits[0, -1])

    def expand(self, nodes: list[int], tree: DraftTree) -> torch.Tensor:
        first = self.cache.length
        for j, node in enumerate(nodes):
            self.slot[node] = first + j
        allowed = _rows(self.n, first, 0, tree, nodes, self.slot, self.draft.device)
        logits, _ = tree_forward(self.draft, self.cache, [tree.tokens[i] for i in nodes],
                                 [self.n - 1 + tree.depth(i) for i in nodes], allowed)
        self.stats.draft_calls += 1
        return self.dprobs(logits)

    def commit(self, path: list[int], out: list[int], hidden: torch.Tensor | None) -> None:
        """Keep the decided positions and the accepted nodes the draft fed (a prefix of the path)."""
        fed = []
        for node in path:
            if node not in self.slot:
                break
            fed.append(self.slot[node])
        keep_positions(self.cache, self.n, fed)


class _HeadDrafter:
    """lib.spec_decode.draft_head's DraftHead: entry j reads (x_{j+1}, h_j) and predicts h_{j+1} and the logits of x_{j+2}.
    Entries on the target's true hidden states are kept; entries on the head's own predictions (tree nodes) are
    dropped after each round, and the accepted tokens are fed again with the verify forward's true states."""
    needs_hidden = True

    def __init__(self, head, max_len: int, dprobs, stats: SpecStats):
        self.head, self.dprobs, self.stats = head, dprobs, stats
        self.cache = head.new_cache(batch=1, max_len=max_len)
        self.vocab = head.config.vocab_size

    def start(self, out: list[int], hidden: torch.Tensor) -> None:
        """After the target's prefill: entries j = 0 .. T-1 read x_{j+1} (the first decided token included)."""
        self.feed = (out[1:], hidden)  # hidden [1, T, D]

    def _q(self, logits: torch.Tensor) -> torch.Tensor:  # [.., N] over keep_ids -> [.., V]
        q = self.dprobs(logits)
        full = q.new_zeros(*q.shape[:-1], self.vocab)
        return full.index_copy_(-1, self.head.keep_ids, q)

    def root(self, out: list[int]) -> torch.Tensor:
        tokens, hidden = self.feed
        self.n, self.true_len = len(out), self.cache.length + len(tokens)
        logits, feat = self.head(torch.tensor([tokens], device=self.head.device), hidden, cache=self.cache)
        self.stats.draft_calls += 1
        self.feat, self.slot = {-1: feat[0, -1]}, {}
        return self._q(logits[0, -1])

    def expand(self, nodes: list[int], tree: DraftTree) -> torch.Tensor:
        first = self.cache.length
        for j, node in enumerate(nodes):
            self.slot[node] = first + j
        # entry j = n - 2 + depth reads the node's token and its parent entry's predicted hidden state
        allowed = _rows(self.true_len, first, 0, tree, nodes, self.slot, self.head.device)
        hidden = torch.stack([self.feat[tree.parents[i]] for i in nodes])[None]
        logits, feat = self.head(torch.tensor([[tree.tokens[i] for i in nodes]], device=self.head.device), hidden,
                                 cache=self.cache, positions=[self.n - 2 + tree.depth(i) for i in nodes],
                                 mask=allowed)
        self.stats.draft_calls += 1
        for j, node in enumerate(nodes):
            self.feat[node] = feat[0, j]
        return self._q(logits[0])

    def commit(self, path: list[int], out: list[int], hidden: torch.Tensor | None) -> None:
        """`hidden [1, 1 + len(path), D]`: the target's true h at the root and along the accepted path."""
        self.cache.truncate(self.true_len)
        self.feed = (out[self.n:], hidden)


# --- generation -----------------------------------------------------------------------------------------------

@torch.no_grad()
def tree_speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int,
                              tree=StaticTree((4, 2, 1)), temperature: float = 0.0,
                              generator: torch.Generator | None = None,
                              stats: SpecStats | None = None) -> torch.Tensor:
    """`[1, T + max_new_tokens]` ids: the prompt, then exactly `max_new_tokens` tokens, each round a draft tree
    (`StaticTree` / `DynamicTree`) verified in one target forward. `draft`: a model of the target's shape
    (lib.spec_decode.drafts) or a `lib.spec_decode.draft_head.DraftHead` (EAGLE-style, on the target's hidden states; the target prefills
    the prompt first). Temperature 0 gives the ids of `lib.modeling.generate.generate(target, ...)`; temperature > 0 samples
    the target's law (StaticTree only). `stats.drafted` counts tree nodes, `stats.accepted` the accepted path's."""
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft and target must share a vocabulary: {draft.config.vocab_size} vs "
                         f"{target.config.vocab_size} tokens")
    if not isinstance(tree, StaticTree | DynamicTree):
        raise ValueError(f"tree must be a StaticTree or a DynamicTree; got {tree!r}")
    depth = len(tree.branching) if isinstance(tree, StaticTree) else tree.depth
    ids, _ = decode_args("tree_speculative_generate", target, input_ids, max_new_tokens, depth, temperature)
    max_len = ids.shape[1] + max_new_tokens + tree.max_nodes + 2
    if ids.shape[1] + max_new_tokens + depth + 1 > target.config.max_seq_len:
        raise ValueError(f"prompt + max_new_tokens + tree depth + 1 exceeds the target's max_seq_len "
                         f"{target.config.max_seq_len}")
    device, greedy = target.device, temperature == 0.0
    stats = stats if stats is not None else SpecStats()
    out, t0 = ids[0].tolist(), ids.shape[1]
    if max_new_tokens == 0:
        return ids.clone()

    def probs(logits):  # the target's: logits will do for greedy verification
        return logits.float() if greedy else torch.softmax(logits.float() / temperature, dim=-1)

    def dprobs(logits):  # the draft's q: probabilities even when greedy (a DynamicTree ranks by them)
        return torch.softmax(logits.float() / (temperature or 1.0), dim=-1)

    tcache = target.new_cache(batch=1, max_len=max_len)
    drafter = (_HeadDrafter if isinstance(draft, DraftHead) else _ModelDrafter)(draft, max_len, dprobs, stats)
    if drafter.needs_hidden:  # the head reads the target's hidden states: the target prefills the prompt first
        logits, hidden = tree_forward(target, tcache, out, list(range(len(out))),
                                      _rows(0, 0, len(out), DraftTree(), [], {}, device), hidden=True)
        stats.target_calls += 1
        first = int(logits[-1].argmax()) if greedy else sample_from(probs(logits[-1]), generator)
        out.append(first)
        stats.tokens += 1
        drafter.start(out, hidden[None])
    while len(out) - t0 < max_new_tokens:
        # 1. the draft: q at the root (the last decided token), then the tree a level at a time
        n = len(out)
        grown = grow_tree(tree, drafter.root(out), drafter.expand, greedy, generator)
        origin = grown.origin or list(range(len(grown)))
        # 2. the target: its unseen decided tokens (causal), then every node (decided + ancestors + itself)
        seen, unseen = tcache.length, out[tcache.length:]
        tslot = {i: seen + len(unseen) + i for i in range(len(grown))}
        allowed = _rows(n, seen, len(unseen), grown, list(range(len(grown))), tslot, device)
        logits, hidden = tree_forward(target, tcache, unseen + grown.tokens, list(range(seen, n))
                                      + [n - 1 + grown.depth(i) for i in range(len(grown))], allowed,
                                      hidden=drafter.needs_hidden)
        stats.target_calls += 1
        # 3. the longest branch the target agrees with, and one token of its own
        path, nxt = verify_tree(grown, probs(logits[len(unseen) - 1:]), greedy, generator)
        out += [grown.tokens[i] for i in path] + [nxt]
        stats.rounds += 1
        stats.drafted += len(grown)
        stats.accepted += len(path)
        stats.tokens += len(path) + 1
        # 4. both caches keep the accepted path (the newest token stays unseen)
        keep_positions(tcache, n, [tslot[i] for i in path])
        rows = [len(unseen) - 1] + [len(unseen) + i for i in path]  # the target's h at the root and on the path
        drafter.commit([origin[i] for i in path], out, hidden[rows][None] if hidden is not None else None)
    return torch.tensor([out[:t0 + max_new_tokens]], dtype=input_ids.dtype, device=device)
