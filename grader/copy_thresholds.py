"""The token threshold of each reference unit (`grader.similarity.ratio`): `similarity.TOKEN_THRESHOLD`, raised for
the references an honest variant written apart from them came near (and the statement threshold likewise, below).

Why not a threshold that depends on the unit's size alone: short units share more by chance, but the honest and
the copied scores overlap at the same size. Measured (issue 54, after red team 6; 103 honest variants: the 39 of
tests/fixtures/honest/ and the 64 of tests/fixtures/redteam/v*/, written from the release notebooks without the
solution; 32 copies: the 19 reworded ones of tests/fixtures/copies/ and the red teams' 13 `*lib*` ones), the highest
token share each reaches against any reference, by the size of the side that share is of (fingerprints, the idiom
and the release's code out):

    size (fingerprints)   honest: n, highest shares (size)             copies: n, lowest shares (size)
    60-99                 69: 0.596 (#22, 99), 0.516 (64), 0.505 (93)  19: 0.622 (98), 0.635 (96), 0.658 (73)
    100-149               24: 0.541 (111), 0.459 (133), 0.454 (108)    13: 0.629 (132), 0.717 (120), 0.718 (104)
    150 and more           7: 0.115 (156), 0.038 (210)                  0 (a copy's best share is on its short side)

Around 100 fingerprints an honest batched_speculative_generate (0.596) and a split copy of lib's forward (0.622)
sit 4 % apart; the best rule of the form T + z * sqrt(T (1 - T) / n) (a share's binomial spread on n fingerprints;
T = 0.42, z = 3.8 fitted on all of the above) leaves the nearest of each 2 % from its threshold (0.979, 1.021).
Size buys nothing: what sets an honest score is how much of the code the exercise's interface dictates (a batched
loop over `new_cache`, `lengths`, `truncate` and a dict of feeds is written one way), a property of the reference.

So the threshold is set per reference where it has been measured: at least the highest token share an honest
variant written apart from the reference reaches against it (rounded up to the hundredth), divided by `MARGIN`,
the margin every other honest variant keeps (tests/test_similarity.py); `TOKEN_THRESHOLD` elsewhere. A copy of such
a reference must then hold that much of it: a reworded copy of the solution's batched_speculative_generate holds
72 % (tests/fixtures/copies/w18_batched_speculative_generate__solution_reworded.py). tests/test_similarity.py
recomputes each entry from its variant, so an entry is a measurement, not a setting.
"""
from __future__ import annotations

from types import MappingProxyType

MARGIN = 0.9  # of its threshold, the most an honest variant may score (tests/test_similarity.py: MARGIN)

# reference unit (as `References.names` spells it): (the highest token share of an honest variant written apart
# from it, rounded up to the next hundredth, that variant's file under tests/fixtures/)
HONEST_HIGHEST = MappingProxyType({
    "the instructor's solution (its `batched_speculative_generate`)":
        (0.60, "redteam/v6/w18_bsg_honest_dictfeeds.py"),  # red team 6, #22: 0.596
    "lib's lib.batching.engine.schedule": (0.55, "redteam/v6/w19_sched_honest_twophase.py"),  # red team 6, #17: 0.541
    # red team 11's honest loop, written from the notebook: 0.582 of the class's and its run_once's tokens (0.97 of the
    # flat 0.6); a reworded copy holds 0.84
    "lib's lib.serve.serving.ServingLoop": (0.59, "redteam/v11/w21_servingloop_honest.py"),
    "lib's lib.serve.serving.ServingLoop.run_once": (0.59, "redteam/v11/w21_servingloop_honest.py"),
})  # read-only: the child holds this module too (it judges code the notebook compiles: `grader.child_guard`)


# gguf-py's quantizers (week 20's references beside lib's and the solution's) are a few lines of numpy each: at the
# general threshold a paste tidied as a student tidies anyway (np.divide(..., where=), a chain cut in two, the nibbles
# packed by halves) got under it (red team 8: #11 0.59, #13 0.56, #15 0.48). Their threshold is sized the same way,
# lowered rather than raised: on the highest token share any honest week-20 variant (the 35 written apart from
# gguf-py, measured by red team 7's follow-up) reaches against any of gguf-py's units, / MARGIN.
GGUF_PREFIX = "gguf-py's "
GGUF_HONEST_HIGHEST = (0.37, "redteam/v7/w20_q8_honest.py")  # 0.364, against Q8_0.quantize_blocks with np_roundf


# The same for the statement share (`similarity.THRESHOLD` elsewhere): red team 11b's honest schedule, written from
# the notebook, holds 0.722 of lib's schedule's statements (0.90 of the flat 0.8: a scheduler's branches are what the
# exercise's rules dictate); a reworded copy of lib's holds 0.97 of its tokens.
HONEST_STATEMENTS = MappingProxyType({
    "lib's lib.batching.engine.schedule": (0.73, "redteam/v11b/w19_schedule_honest.py"),
})


def statement_threshold(reference: str | None, default: float) -> float:
    """The statement share at which a unit is a copy of `reference` (None: `default`, the general threshold)."""
    if reference not in HONEST_STATEMENTS:
        return default
    return max(default, HONEST_STATEMENTS[reference][0] / MARGIN)


def token_threshold(reference: str | None, default: float) -> float:
    """The token share at which a unit is a copy of `reference` (None: `default`, the general threshold)."""
    if reference is not None and reference.startswith(GGUF_PREFIX):
        return GGUF_HONEST_HIGHEST[0] / MARGIN
    if reference not in HONEST_HIGHEST:
        return default
    return max(default, HONEST_HIGHEST[reference][0] / MARGIN)
