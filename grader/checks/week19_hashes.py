"""Week 19's block hashes at the sizes the property cases in grader/checks/week19.py do not reach.

- `assert_hash_entropy`: 2^19 different prefixes (one call, block size 1) must get 2^19 different hashes. By the
  birthday bound, n values drawn from 2^b collide with probability 1 - exp(-n(n-1) / 2^(b+1)): for n = 2^19 that is
  1 - exp(-32) ~ 1 - 1e-14 at b = 32 (however the 32 bits are spread over 64 or more: the count of distinct values
  does not care how they are written), 1 - exp(-16) at 33 bits, and about 2^38 / 2^65 ~ 7e-9 for an honest 64-bit
  hash. The widest hash must also have at least 56 bits (a hash truncated to 32 bits says so at once).
- `assert_long_chain`: prompts of 65 to 160 blocks: a change in block i changes the hash of block i and of every
  later block, and of no earlier one (a chain that stops beyond 64 blocks passed the short cases).

Separate from week19.py, which calls both from `check_block_hashes`; nothing here calls the student's code except
through the function it is given.
"""
from __future__ import annotations

import math
import random

from grader.checks import seed_note
from grader.checks.week19_sim import hash_bits

ENTROPY_PREFIXES = 1 << 19


def assert_hash_entropy(block_hashes, rng: random.Random) -> None:
    """2^19 prefixes of one random sequence (block size 1): all their hashes differ, and the widest has >= 56 bits
    (the width first: a hash truncated to 32 bits or fewer says so at once)."""
    n = ENTROPY_PREFIXES
    tokens = [rng.randrange(50000) for _ in range(n)]
    hs = block_hashes(tokens, 1)
    assert isinstance(hs, list) and len(hs) == n, (
        f"block_hashes of {n} tokens with block_size 1 returned {len(hs) if isinstance(hs, list) else hs!r}; "
        f"expected a list of {n} hashes {seed_note()}")
    width = max(hash_bits(h) for h in hs)
    assert width >= 56, (
        f"the widest of {n} block hashes has {width} bits: a hash kept to 32 bits (or fewer) has too few bits, and "
        f"collides almost surely in a cache of a million blocks (1 - exp(-n^2 / 2^33) at n = 10^6), and a "
        f"collision hands one request another's KV blocks. Keep at least 64 bits of the hash {seed_note()}")
    distinct = len(set(hs))
    # c collisions among n values of b bits: c ~ n^2 / 2^(b+1), so b ~ log2(n^2 / (2c))
    bits = math.log2(n * n / (2 * (n - distinct))) if distinct < n else 0
    assert distinct == n, (
        f"{n} different prefixes (2^19) got only {distinct} different hashes, too few bits: your hash carries about "
        f"{bits:.0f} bits of entropy, however wide it is written (a 32-bit hash collides here with probability "
        f"1 - exp(-32), a 64-bit one with probability ~7e-9). A cache of a million blocks then hands one request "
        f"another's KV blocks: keep at least 64 bits of entropy through the chain, not 32 bits spread over 64 "
        f"{seed_note()}")


def assert_long_chain(block_hashes, rng: random.Random, cases: int = 3) -> None:
    """Prompts of 65-160 blocks (block size 1-4): a token changed in block i changes exactly the hashes of blocks
    i, i+1, ..., the last; one case changes a block past the 64th, one a block before it."""
    for case in range(cases):
        bs = rng.randint(1, 4)
        k = rng.randint(65, 160)
        tokens = [rng.randrange(50000) for _ in range(k * bs)]
        hs = block_hashes(tokens, bs)
        assert isinstance(hs, list) and len(hs) == k, (
            f"block_hashes of {k * bs} tokens with block_size {bs} returned "
            f"{len(hs) if isinstance(hs, list) else hs!r} hashes; expected {k} {seed_note()}")
        i = rng.randrange(64, k) if case == 0 else rng.randrange(0, 64)
        changed = list(tokens)
        changed[i * bs + rng.randrange(bs)] += 1
        hc = block_hashes(changed, bs)
        assert hc[:i] == hs[:i], (f"a prompt of {k} blocks (block_size {bs}): changing a token in block {i} changed "
                                  f"the hashes of earlier blocks {seed_note()}")
        later = [j for j in range(i, k) if hc[j] == hs[j]]
        assert not later, (
            f"a prompt of {k} blocks (block_size {bs}): changing a token in block {i} left the hashes of blocks "
            f"{later[:8]}{'...' if len(later) > 8 else ''} unchanged: every block's hash must chain the previous "
            f"block's, however long the prompt (a hit on block j means blocks 0..j all match) {seed_note()}")
