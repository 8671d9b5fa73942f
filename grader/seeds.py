"""The run's seed, and the seeds drawn from it one-way: what makes a grading run's random inputs reproducible without
the student's process being able to recompute them.

`run_seed()` is drawn once per process from 2**62 values (or read from `INFERENCE_LAB_SEED`, which every failure
prints: `grader.checks.seed_note`). It never leaves the trusted process: every generator the checks draw from is
seeded with `derived_seed(...)` of it (BLAKE2b keyed by the run's seed), and a generator handed to the student's
code crosses as another one, seeded one-way from its state (`grader.wire.handed_generator_seed`). Knowing any of
those seeds tells nothing of the run's seed or of another; and trying every run seed against one is 2**62 keyed
hashes. `grader.checks` re-exports both.
"""
from __future__ import annotations

import hashlib
import os
import random

_SEED: int | None = None
_KEYS: dict[int, bytes] = {}


def run_seed() -> int:
    """This run's seed: `INFERENCE_LAB_SEED` if set, else drawn once per process (and kept for the run) from 2**62
    values — too many to try them all against a seed drawn from it (`derived_seed`)."""
    global _SEED
    if _SEED is None:
        env = os.environ.get("INFERENCE_LAB_SEED")
        _SEED = int(env) if env not in (None, "") else random.SystemRandom().randrange(1, 2**62)
    return _SEED


def drawn_seed() -> int | None:
    """The run's seed if it has been drawn (or read) in this process, else None (nothing to keep from anyone yet)."""
    return _SEED


def derived_seed(*label) -> int:
    """A seed (63 bits) drawn one-way from this run's seed and `label` (BLAKE2b keyed by the run's seed): knowing it
    tells nothing of the run's seed or of another label's seed."""
    seed = run_seed()
    key = _KEYS.get(seed)
    if key is None:
        key = _KEYS[seed] = hashlib.sha512(f"inference-lab run seed {seed}".encode()).digest()
    digest = hashlib.blake2b(repr(label).encode(), key=key, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
