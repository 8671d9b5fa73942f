"""Week 19, issue 54 (fourth round): what the block-hash and scheduler checks let through at sizes their property
cases did not reach, through the isolated path (`child` sends the routes' source to one child process, after the
solution notebook's cells, and the checks get proxies, as `pytest weeks/19` gives them a student's code):

- a block hash with 32 bits of entropy spread over 64 (the 8,000 prefixes judged before caught about 24 bits or
  fewer): `week19_hashes.assert_hash_entropy` counts the distinct hashes of 2^19 prefixes;
- a chain that stops beyond 64 blocks (every case had 48 blocks or fewer): `assert_long_chain`, 65-160 blocks;
- a scheduler that preempts one request too many when more than 6 run (every exact-amount step had 3-5 running):
  three of `amount_step(busy=True)`, 7-12 running.

Honest alternatives (a sha256 chain returned as a hex string, blake2b kept to 64 bits) pass.
"""
import inspect
import json
import math
import random
import textwrap
from pathlib import Path

import pytest

from grader.checks import week19 as checks
from grader.checks.week19_hashes import ENTROPY_PREFIXES, assert_hash_entropy
from grader.checks.week19_sim import preemptions_needed
from grader.checks.week19_steps import amount_step
from grader.harness import exercise_cells
from grader.isolation import Session

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "19" / checks.WEEK.notebook


def spread_32bit(token_ids, block_size):
    """Chained, but the chain's state is kept to 32 bits and then multiplied out over 64 (odd factor, xor-shift):
    every hash is 64 bits wide, with only 2^32 possible values."""
    out, state = [], 0
    for i in range(len(token_ids) // block_size):
        state = hash((state, tuple(token_ids[i * block_size:(i + 1) * block_size]))) & 0xFFFFFFFF
        wide = (state * 0xD6E8FEB86659FD93 + 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF
        out.append(wide ^ (wide >> 29))
    return out


def chain_stops_at_64(token_ids, block_size):
    """Chained for prompts of up to 64 blocks; a longer prompt's blocks are hashed with their depth only."""
    n = len(token_ids) // block_size
    out, prev = [], None
    for i in range(n):
        block = tuple(token_ids[i * block_size:(i + 1) * block_size])
        prev = hash(((i if n > 64 else prev), block))
        out.append(prev)
    return out


def sha256_hex_chain(token_ids, block_size):
    """Honest: sha256 over the previous hex digest and the block's tokens, kept whole as a hex string."""
    import hashlib
    out, prev = [], ""
    for i in range(len(token_ids) // block_size):
        body = prev + ":" + ",".join(str(t) for t in token_ids[i * block_size:(i + 1) * block_size])
        prev = hashlib.sha256(body.encode()).hexdigest()
        out.append(prev)
    return out


def blake2b_64(token_ids, block_size):
    """Honest: blake2b with an 8-byte digest over the previous hash and the block's tokens, as an int."""
    import hashlib
    out, prev = [], 0
    for i in range(len(token_ids) // block_size):
        block = token_ids[i * block_size:(i + 1) * block_size]
        data = prev.to_bytes(8, "little") + b"".join(int(t).to_bytes(4, "little") for t in block)
        prev = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        out.append(prev)
    return out


def preempts_one_more_when_busy(running, waiting, free_blocks, block_size, token_budget, max_num_seqs,
                                chunked_prefill=True):
    """The notebook's schedule, but when it preempts and more than 6 requests run, the newest survivor is preempted
    too ("to be safe next step")."""
    plan = schedule(running, waiting, free_blocks, block_size, token_budget, max_num_seqs,  # noqa: F821
                    chunked_prefill)
    if plan["preempt"] and len(running) > 6:
        alive = [r["id"] for r in running if r["id"] not in plan["preempt"]]
        if len(alive) > 1:
            plan = {"preempt": plan["preempt"] + [alive[-1]], "run": [e for e in plan["run"] if e[0] != alive[-1]]}
    return plan


ROUTES = [spread_32bit, chain_stops_at_64, sha256_hex_chain, blake2b_64, preempts_one_more_when_busy]


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """The solution notebook's cells, then the routes, in one isolated child process."""
    cells = [src for _, _, src in exercise_cells(json.loads(NOTEBOOK.read_text()))]
    source = "\n\n".join(textwrap.dedent(inspect.getsource(r)) for r in ROUTES)
    session = Session(tmp_path_factory.mktemp("nb") / "week19_hashes.ipynb", view=checks.WEEK.view(), call_timeout=300)
    session.load([(i, None, src) for i, src in enumerate(cells)] + [(len(cells), None, source)])
    yield session
    session.close()


@pytest.mark.parametrize("name", ["sha256_hex_chain", "blake2b_64"])
def test_honest_hashes_pass(child, name):
    checks.check_block_hashes(child.get(name))


def test_a_32bit_hash_spread_over_64_is_rejected(child):
    """Every hash is 64 bits wide (the width test passes it); among 2^19 prefixes it collides about 32 times."""
    with pytest.raises(AssertionError, match=r"different hashes, too few bits: your hash carries about 3[0-4] bits of entropy"):
        checks.check_block_hashes(child.get("spread_32bit"))


def test_a_chain_that_stops_beyond_64_blocks_is_rejected(child):
    with pytest.raises(AssertionError, match=r"blocks \(block_size \d\): changing a token in block \d+ left the "
                                             r"hashes of blocks .* however long the prompt"):
        checks.check_block_hashes(child.get("chain_stops_at_64"))


def test_preempting_one_more_when_busy_is_rejected(child):
    with pytest.raises(AssertionError, match="already frees the blocks") as err:
        checks.check_schedule(child.get("preempts_one_more_when_busy"))
    running = str(err.value).split("running [", 1)[1].split("], waiting", 1)[0]
    assert running.count("'id'") > 6, str(err.value)[:400]


def test_busy_steps_need_exactly_one_preemption():
    """The steps the busy route is caught on: 7-12 running, and one preemption frees enough for all the others."""
    rng = random.Random(0)
    for _ in range(200):
        s = amount_step(rng, busy=(7, 12))
        assert 7 <= len(s["running"]) <= 12
        assert preemptions_needed(s["running"], s["free"], s["bs"], s["budget"]) == 1


def test_the_entropy_bound():
    """The rates in week19_hashes' docstring, from the birthday bound: an honest 64-bit hash fails < 1e-6 of runs, a
    32-bit one passes < 1e-6 of runs; and the test itself, on random 32- and 64-bit values (no student code)."""
    n = ENTROPY_PREFIXES
    assert -math.expm1(-n * (n - 1) / 2 ** 65) < 1e-8
    assert math.exp(-n * (n - 1) / 2 ** 33) < 1e-13
    table = random.Random(1)

    def uniform(bits):
        return lambda tokens, bs: [table.getrandbits(bits) | (1 << 63) for _ in range(len(tokens) // bs)]

    assert_hash_entropy(uniform(64), random.Random(2))
    with pytest.raises(AssertionError, match="3[0-4] bits of entropy"):
        assert_hash_entropy(lambda t, bs: [v * 0x9E3779B97F4A7C15 % 2 ** 64 for v in uniform(32)(t, bs)],
                            random.Random(3))
