"""Week 18's ragged batch (exercise 8, registered by `grader.checks.week18`): batched speculative decoding where each
row accepts a different number of tokens per round.

The student's `batched_speculative_generate(target, draft, prompts, max_new_tokens, k)` gets a counted door on a
target that runs several rows in one forward (`target({row: [tokens]}, cache=cache)`, per-row `cache.lengths` and
`cache.truncate(row, n)`: lib.spec_decode.speculative_batch's interface) and a draft function `draft(tokens, k) -> [guesses]`.
Judged, per row, against the row decoded alone (the same draft, greedy verification, one row):

- **each row's output equals its own single-row run**: the target's greedy tokens, exactly max_new_tokens of them;
- **no row waits, for a finished row or any other**: every forward carries every row that has tokens left to write
  (a row is in forwards 0, 1, ..., P_b - 1 and in none after), and P_b is at most R_b + 1, R_b being the rounds the
  row takes alone (one more allowed for a separate prefill of the prompts) — a batch held back to its slowest row,
  rows run one forward each, a finished row fed again, each fails;
- **per-row rollback**: at every forward a row's cache holds only tokens of its output, and after its first forward a
  row is fed at most K + 1 tokens (its last token kept and its guesses).

The drafts make the batch ragged on purpose: per row, a perfect draft (every guess kept: K + 1 tokens a round), a
hopeless one (none kept: one token a round), one wrong at positions set by a hash of the text, and one that guesses
nothing at every other length. They are deterministic functions of the text and prefix-consistent
(draft(t, m) == draft(t, k)[:m]), so a row's rounds do not depend on how far its last round drafts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grader.checks import generator, observe, seed_note
from grader.checks.week18_models import MarkovLM, spicy_tiny
from lib.modeling.generate import generate as ref_generate


class RowCaches:
    """One single-row cache per row, with the interface of lib.spec_decode.speculative_batch.RaggedKVCache."""

    def __init__(self, caches: list):
        self.caches = caches
        self.rows = len(caches)

    @property
    def lengths(self) -> tuple:
        return tuple(c.length for c in self.caches)

    def truncate(self, row: int, n: int) -> None:
        if not isinstance(row, int) or not 0 <= row < self.rows:
            raise ValueError(f"truncate(row, n): row must be in 0..{self.rows - 1}; got {row!r}")
        self.caches[row].truncate(n)


class RowWise:
    """A one-row model (MarkovLM) with RaggedTarget's interface: each fed row runs on its own cache."""

    def __init__(self, model):
        self.model, self.config, self.device = model, model.config, model.device

    def new_cache(self, rows: int, max_len: int) -> RowCaches:
        return RowCaches([self.model.new_cache(1, max_len) for _ in range(rows)])

    def __call__(self, feeds: dict, cache: RowCaches) -> dict:
        return {row: self.model(torch.tensor([list(toks)]), cache=cache.caches[row])[0] for row, toks in feeds.items()}


@dataclass
class Fed:
    """One row's part of one forward: the tokens fed and the tokens its cache held before."""
    fed: list
    held: list


def ragged_spy(target, log: list):
    """`target` behind a counted door: each forward `spy(feeds, cache=c)` (or `.forward`) is appended to `log` as
    {row: Fed}. Caches must come from `spy.new_cache(rows, max_len)`."""
    shadows = []  # (cache, [tokens per row])

    def run(feeds, cache=None):
        if not isinstance(feeds, dict) or not feeds:
            raise ValueError(f"the target takes {{row: [token ids], ...}} (at least one row); got {type(feeds).__name__}")
        index = next((i for i, (c, _) in enumerate(shadows) if c is cache), None)
        if index is None:
            raise ValueError("pass a cache made by this target's new_cache(rows, max_len)")
        rows = shadows[index][1]
        entry = {}
        for row, toks in feeds.items():
            if not isinstance(row, int) or not 0 <= row < len(rows):
                raise ValueError(f"row {row!r}: rows are 0..{len(rows) - 1}")
            toks = [int(t) for t in toks]
            if not toks:
                raise ValueError(f"row {row} was fed no tokens: leave a row out of the feeds instead")
            del rows[row][cache.lengths[row]:]  # what a truncate left
            entry[row] = Fed(toks, list(rows[row]))
            rows[row].extend(toks)
        log.append(entry)
        return target({row: f.fed for row, f in entry.items()}, cache)

    class Target:
        __slots__ = ()
        config = target.config
        device = target.device

        def __call__(self, feeds, cache=None):
            return run(feeds, cache)

        def forward(self, feeds, cache=None):
            return run(feeds, cache)

        def new_cache(self, rows: int, max_len: int):
            cache = target.new_cache(rows, max_len)
            shadows.append((cache, [[] for _ in range(rows)]))
            return cache

    return Target()


def oracle_draft(refs: list, vocab: int):
    """The check's draft: row r (found by its prompt) guesses its greedy continuation `refs[r]` with row r's flaw
    (r % 4: none, every guess wrong, guess j wrong when a hash of (length, j) says so, no guess at even lengths)."""
    def draft(tokens, k):
        tokens, k = [int(t) for t in tokens], int(k)
        for r, ref in enumerate(refs):
            if tokens == ref[:len(tokens)]:
                break
        else:
            return []  # off the greedy path (a wrong loop): no guess
        kind, n = r % 4, len(tokens)
        if kind == 3 and n % 2 == 0:
            return []
        out = []
        for j, t in enumerate(ref[n:n + max(k, 0)]):
            wrong = kind == 1 or (kind == 2 and (n * 7919 + j * 104729) % 3 == 0)
            out.append((t + 1) % vocab if wrong else t)
        return out
    return draft


def alone(target, draft, prompt: list, n: int, k: int) -> tuple[list, int]:
    """The row decoded by itself (one-row model `target`): its tokens and its rounds (target calls)."""
    out, rounds = list(prompt), 0
    cache = target.new_cache(1, len(prompt) + n + k + 2)
    while len(out) - len(prompt) < n:
        m = min(k, n - (len(out) - len(prompt)) - 1)
        guess = list(draft(out, m))[:m]
        best = target(torch.tensor([(out + guess)[cache.length:]]), cache=cache)[0, -(len(guess) + 1):].argmax(-1)
        j = 0
        while j < len(guess) and guess[j] == int(best[j]):
            j += 1
        out += guess[:j] + [int(best[j])]
        cache.truncate(len(out) - 1)
        rounds += 1
    return out, rounds


def _case(g, single, ragged, vocab: int, rows: int, k: int, what: str, least: int = 6, most: int = 28,
          edges: bool = False) -> tuple:
    prompts = [[r] + torch.randint(0, vocab, (int(torch.randint(2, 7, (), generator=g)),), generator=g).tolist()
               for r in range(rows)]
    ns = [int(torch.randint(least, most, (), generator=g)) for _ in range(rows)]
    if edges:  # (red team 12) two rows with one prompt (a row's state kept by its prompt merges them), and rows
        # asked for 0, 1 and 2 new tokens (the edge that written-once code gets wrong: a first token always written)
        prompts[1] = list(prompts[0])
        ns[1] = ns[0] + 1 + int(torch.randint(0, 5, (), generator=g))
        ns[2:5] = [int(n) for n in torch.randperm(3, generator=g)]
    refs = [ref_generate(single, torch.tensor([p]), n + k + 2)[0].tolist() for p, n in zip(prompts, ns)]
    draft = oracle_draft(refs, vocab)
    expect = [alone(single, draft, p, n, k) for p, n in zip(prompts, ns)]
    return what, ragged, draft, prompts, ns, k, expect


def failures(log: list, outs, prompts: list, ns: list, k: int, expect: list) -> list[str]:
    """What the log and the outputs show wrong (see the module's text); [] when nothing. The cache of each row is
    judged against that row's own output (a rollback fault is named as such even where it also changed tokens)."""
    if not isinstance(outs, (list, tuple)) or len(outs) != len(prompts):
        return [f"returned {type(outs).__name__} of {len(outs) if hasattr(outs, '__len__') else '?'} rows; expected a "
                f"list of {len(prompts)} lists of ids (each row's prompt and its new tokens)"]
    outs = [list(o) if isinstance(o, (list, tuple)) else o for o in outs]
    for b, out in enumerate(outs):
        if not isinstance(out, list) or not all(isinstance(t, int) for t in out) or len(out) != len(prompts[b]) + ns[b]:
            return [f"row {b}: returned {len(out) if isinstance(out, list) else out!r} ids; expected a list of ints, its "
                    f"prompt ({len(prompts[b])}) and exactly {ns[b]} new tokens"]
    seen = [[f for f, entry in enumerate(log) if b in entry] for b in range(len(prompts))]
    for b, forwards in enumerate(seen):
        if forwards != list(range(len(forwards))):
            missing = next(f for f in range(len(forwards) + 1) if f not in forwards)
            return [f"row {b} was left out of forward {missing} while it still had tokens to write (it was fed in "
                    f"forwards {forwards[:12]}{'...' if len(forwards) > 12 else ''}): one forward a round carries "
                    f"every unfinished row, none waits"]
        for f in forwards:
            fed = log[f][b]
            if fed.held != outs[b][:len(fed.held)]:
                return [f"before forward {f} row {b}'s cache held {len(fed.held)} positions, not all of them tokens "
                        f"of its output: roll each row back to the tokens it kept (cache.truncate(row, n))"]
            if f > 0 and len(fed.fed) > k + 1:
                return [f"forward {f} fed row {b} {len(fed.fed)} tokens; a round feeds a row its last token kept and "
                        f"at most K = {k} guesses (its cache holds the rest)"]
            if len(fed.held) + 1 >= len(prompts[b]) + ns[b] and f > 0:
                return [f"forward {f} fed row {b} after it had written its {ns[b]} tokens: a finished row leaves "
                        f"the batch"]
    for b, (out, (want, rounds)) in enumerate(zip(outs, expect)):
        if out != want:
            bad = next(i for i, (x, y) in enumerate(zip(out, want)) if x != y)
            return [f"row {b}: token {bad - len(prompts[b])} differs from the row decoded alone (greedy: the "
                    f"target's own choice); keep a guess only while it equals the target's argmax"]
        if len(seen[b]) > rounds + 1:
            return [f"row {b} was in {len(seen[b])} forwards; decoded alone with the same draft it needs {rounds} "
                    f"rounds: each row keeps its own accepted tokens every round (no row held back to another's)"]
    return []


def judge(batched_speculative_generate, watched_lib_prefixes=("lib.spec_decode.speculative.", "lib.modeling.generate.")) -> None:
    """Markov chains (rows run one by one behind the interface) and a tiny Llama through lib's packed
    RaggedTarget (real per-row KV caches and positions); rows of 3 to 6 with different prompts, max_new_tokens and
    draft flaws, K in 2..4 (one batch with two rows of one prompt and rows asked for 0, 1 and 2 tokens), and a wide batch of 16-32 rows with K in 8..12. One run, chosen at random, is observed: it may use none of lib's loops."""
    from lib.spec_decode.speculative_batch import RaggedTarget

    g = generator(11)
    cases = []
    for j, (rows, k) in enumerate([(4, 3), (6, 2), (5, 4), (6, 3)]):
        chain = MarkovLM(24, int(torch.randint(0, 2**30, (), generator=g)))
        edges = j == 3
        cases.append(_case(g, chain, RowWise(chain), 24, rows, k, f"Markov target, {rows} rows, K={k}"
                           + (", rows 0 and 1 with one prompt, rows 2-4 asked for 0-2 tokens" if edges else ""),
                           edges=edges))
    # a wide batch and a long draft, every run (FINDINGS6 #23, #24: at most 6 rows per forward, K capped at 4):
    # 16-32 rows, K 8-12, each row writing 3K-6K tokens, so a perfect-draft row alone takes at most 6 rounds and a
    # cap of K at 4 or fewer costs it more than the one spare round
    rows, k = int(torch.randint(16, 33, (), generator=g)), int(torch.randint(8, 13, (), generator=g))
    chain = MarkovLM(48, int(torch.randint(0, 2**30, (), generator=g)))
    cases.append(_case(g, chain, RowWise(chain), 48, rows, k, f"Markov target, {rows} rows, K={k}", 3 * k, 6 * k))
    tiny = spicy_tiny(int(torch.randint(0, 2**20, (), generator=g)))
    cases.append(_case(g, tiny, RaggedTarget(tiny), tiny.config.vocab_size, 4, 3,
                       "tiny Llama (lib.spec_decode.speculative_batch.RaggedTarget, packed), 4 rows, K=3"))
    watched = int(torch.randint(0, len(cases), (), generator=g))
    for i, (what, ragged, draft, prompts, ns, k, expect) in enumerate(cases):
        log = []
        args = (ragged_spy(ragged, log), draft, [list(p) for p in prompts], list(ns), k)
        if i == watched:
            outs, obs = observe(batched_speculative_generate, *args)
            used = sorted(c for c in obs.lib_calls if c.startswith(watched_lib_prefixes))
            assert not used, f"{what}: the batched loop must be your own; it called {used}"
        else:
            outs = batched_speculative_generate(*args)
        bad = failures(log, outs, prompts, ns, k, expect)
        assert not bad, (f"{what} (max_new_tokens {ns}, rows decoded alone take {[r for _, r in expect]} rounds): "
                         f"{bad[0]} {seed_note()}")
