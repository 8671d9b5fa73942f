"""Each week-19 check accepts the solution notebook's code and rejects the wrong routes a student might take,
graded the way `pytest weeks/19` and autograde grade a student: the submission runs in an isolated child process
(grader.isolation) and the check sees it through proxies.

The wrong routes are ordinary functions and classes of tests/_week19_routes.py and tests/_week19_attention_routes.py
(paged attention's); `child` sends their source to one child process (as a notebook cell would define them) and the
checks get proxies. Each gives the right numbers, or would but for the flaw named, by a route the exercise forbids;
its comment says why it must fail and the test here the `match`, the one-line reason it gets.
"""
import importlib.util
import inspect
import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grader.checks import week19 as checks
from grader.harness import ReferenceUse, exercise_cells, load_exercises
from grader.isolation import Session
from grader.view import ViewSpec
from lib.batching import blocks as ref_blocks, engine as ref_engine

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "19" / checks.WEEK.notebook


def _sibling(name):
    """A module beside this file (the tests run with --import-mode=importlib: a sibling is loaded by its path),
    registered in sys.modules so that inspect.getsource finds its classes."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROUTES, ATTENTION_ROUTES = _sibling("_week19_routes"), _sibling("_week19_attention_routes")
WRONG = ROUTES.WRONG + ATTENTION_ROUTES.WRONG
PREFIX_CACHE_ROUTES, scales_pool_in_place = ROUTES.PREFIX_CACHE_ROUTES, ATTENTION_ROUTES.scales_pool_in_place

HEADER = """
import math
import torch
from lib.batching import blocks as ref_blocks, engine as ref_engine
from lib.batching import paged as ref
"""
# lib's own schedule, exec'd under another name: the child's audit hook refuses to compile a copy of the answer key,
# so its cell (a cell of its own) raises, naming lib's function
LIB_COPY = """
import inspect as _inspect
from lib.batching.paged import blocks_needed
exec(compile(_inspect.getsource(ref_engine.schedule).replace("def schedule(", "def lib_copy_schedule("),
             "<student cell>", "exec"))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """The wrong routes, defined in an isolated child process as a notebook's cells would define them."""
    cells = {gid: src for _, gid, src in exercise_cells(json.loads(NOTEBOOK.read_text()))}
    source = HEADER + "\nWORKSPACE = torch.empty(1 << 22)\n\n" + "\n\n".join(
        textwrap.dedent(inspect.getsource(c)) for c in WRONG)
    source += "\n".join(["\nfrom collections import OrderedDict", cells["BlockAllocator"], cells["PrefixCache"], PREFIX_CACHE_ROUTES])
    # Most routes are lib's parts with one thing broken: they need lib whole, as on a machine without Landlock's
    # read restriction (grader.view); what the week's view does to them is tests/test_integrity.py's subject.
    # Each route must be rejected by its own rule, not by the per-call time limit: a slow one (a whole-row route
    # took 36 s quiet) ran past 60 s on a loaded 2-core machine and was stopped instead.
    session = Session(tmp_path_factory.mktemp("nb") / "week19_wrong_routes.ipynb", view=ViewSpec.everything(19),
                      call_timeout=300)
    session.load([(0, None, source), (1, None, HEADER + LIB_COPY)])
    yield session
    session.close()


@pytest.fixture(scope="module")
def ex():
    """The solution notebook's code, isolated as a student's is: what each check must accept."""
    exercises = load_exercises(NOTEBOOK, isolated=True)
    yield exercises
    exercises.close()


def _rejects(child, check, name, match):
    with pytest.raises(AssertionError, match=match):
        check(child.get(name))


def test_blocks_needed(ex, child):
    checks.check_blocks_needed(ex.blocks_needed)
    _rejects(child, checks.check_blocks_needed, "rounds_down", "round up")
    _rejects(child, checks.check_blocks_needed, "one_too_many", "expected")


def test_slots_wasted(ex, child):
    checks.check_slots_wasted(ex.slots_wasted)
    _rejects(child, checks.check_slots_wasted, "full_block_wasted", "expected 28")
    _rejects(child, checks.check_slots_wasted, "seed_constant", "last block")


@pytest.mark.parametrize("name, match", [
    ("NoRefCounts", "num_free|ref_count"),
    ("NeverReuses", "returned|KeyError|did not raise|ref_count"),  # numbers past the pool, never runs out, no ref_count
    ("SilentDoubleFree", "did not raise"),
    ("VagueError", "OutOfBlocksError"),
    ("ForksFreeBlocks", r"fork\(\d+\) of a free block"),
    ("NegativeIds", r"\(-1\) on a pool"),
    ("Int8Counts", "owners"),
])
def test_block_allocator_wrong_routes(child, name, match):
    _rejects(child, checks.check_BlockAllocator, name, match)


def test_block_allocator_accepts_the_solution(ex):
    checks.check_BlockAllocator(ex.BlockAllocator)


def test_slot_mapping(ex, child):
    checks.check_slot_mapping(ex.slot_mapping)
    _rejects(child, checks.check_slot_mapping, "contiguous_slots", "differs")
    _rejects(child, checks.check_slot_mapping, "int32_slots", "dtype")


def test_paged_attention_accepts_the_solution(ex):
    checks.check_paged_attention(ex.paged_attention)


@pytest.mark.parametrize("name, match", [
    ("gather_then_attend", "contiguous copy of the longest"),
    ("sdpa_on_materialized", "_scaled_dot_product"),
    ("calls_lib_attention", "lib.batching.paged"),
    ("ignores_lengths", "differs"),
    ("workspace_gather", "combined .* elements|buffers made before the call"),  # out= into a pre-made buffer
    ("workspace_online", "buffers made before the call"),  # the same, then an online softmax: only the writes show
    ("workspace_by_block", "buffers made before the call"),  # filled block by block: still the whole sequence
    ("chunked_gather_full_row", "combined .* elements|contiguous copy of the longest"),  # whole-row softmax; or its scores pass the memory bound
    ("per_head_full_row", "combined .* elements|contiguous copy of the longest"),
    ("per_sequence_all_heads", "contiguous copy of the longest"),  # deterministic: the longest is >= 1500 keys
    ("scale_quarter", "differs"),  # head_dim varies: 0.25 is right for 16 only
    ("no_device", "mixed in a CPU tensor"),
    ("scales_pool_in_place", "changed argument|changed its arguments"),  # k_pool scaled: later steps read it
    ("numpy_route", "no exponential"),
    ("numpy_per_head_decoy_exp", "read by torch ops 0.00 times"),
    ("sdpa_popped", "no exponential"),
    ("two_pass_softmax", "median full block of K was read 2.0 times"),  # every case
    ("per_query_head_online", "not once per query head"),  # the GQA cases: K read once per query head of a group
])
def test_paged_attention_wrong_routes(child, name, match):
    _rejects(child, checks.check_paged_attention, name, match)


def test_observe_counts_reads_of_an_argument():
    """Observation.reads_of: views read nothing, a gather reads what it gathers, any other op each element once."""
    from grader.checks import observe

    pool = torch.randn(6, 4, 8)
    q = torch.randn(8)

    def once(pool):
        return (pool[torch.tensor([1, 3])] @ q).sum() + (pool[4] @ q).sum()  # blocks 1, 3 gathered, 4 by a view

    def twice(pool):
        first = (pool[torch.tensor([1, 3])] @ q).amax()
        return first + torch.exp(pool[torch.tensor([1, 3])] @ q).sum()

    def expanded(pool):  # broadcasting a view to 5 copies reads its elements once
        return (pool[2].unsqueeze(0).expand(5, 4, 8) * 2).sum()

    assert observe(once, pool, _observe_reads=(0,))[1].reads_of(0) == [0, 1, 0, 1, 1, 0]
    assert observe(twice, pool, _observe_reads=(0,))[1].reads_of(0) == [0, 2, 0, 2, 0, 0]
    assert observe(expanded, pool, _observe_reads=(0,))[1].reads_of(0) == [0, 0, 1, 0, 0, 0]
    assert observe(once, pool)[1].reads_of(0) == []  # not asked for


def test_observe_counts_writes_into_premade_buffers():
    """Observation.premade_bytes: the high-water mark of what a call wrote into buffers made before it (not its
    arguments, not what it allocated, not torch.tensor's data)."""
    from grader.checks import observe

    buffer = torch.zeros(1000)
    x = torch.randn(10, 8)

    def out_into_buffer(x):
        torch.mul(x, 2, out=buffer[40:120].view(10, 8))  # elements 40..119: 480 bytes from the buffer's start
        return buffer[40:120].sum()

    def fresh_only(x):
        y = torch.empty(10, 8)
        y.copy_(x)
        z = torch.tensor([0.0])
        z.add_(1)
        return y.sum() + z

    def into_argument(x):
        x.mul_(1)
        return x

    assert observe(out_into_buffer, x)[1].premade_bytes == 120 * 4
    assert observe(fresh_only, x)[1].premade_bytes == 0
    _, obs = observe(into_argument, x)
    assert obs.premade_bytes == 0 and obs.inputs_written == 1


def test_paged_attention_in_place_scaling_rejected_in_process():
    """Tensor arguments changed in place, where the check and the code share a process (the notebook's graded
    cell): the check compares every argument with its clone. Through the isolation the child makes the same
    comparison (grader.isolation's ArgumentChanged): test_paged_attention_wrong_routes[scales_pool_in_place]."""
    with pytest.raises(AssertionError, match="changed its arguments"):
        checks.check_paged_attention(scales_pool_in_place)


def test_block_hashes(ex, child):
    checks.check_block_hashes(ex.block_hashes)
    checks.check_block_hashes(ref_blocks.block_hashes)  # sha256-based: the property check takes any good hash
    _rejects(child, checks.check_block_hashes, "unchained", "chain")
    _rejects(child, checks.check_block_hashes, "with_partial", "FULL")
    _rejects(child, checks.check_block_hashes, "chained_sum", "not their sum")
    _rejects(child, checks.check_block_hashes, "additive_chain", "order of the blocks")
    _rejects(child, checks.check_block_hashes, "twenty_bits", "too few bits")
    _rejects(child, checks.check_block_hashes, "thirty_two_bits", "bits: a hash kept to 32 bits")


def test_prefix_cache_accepts_the_solution(ex):
    checks.check_PrefixCache(ex.PrefixCache)


@pytest.mark.parametrize("name, match", [
    ("EvictsInUse", "in use|least recently freed"),  # evicts an owned block, or the wrong free one
    ("EvictsNewest", "least recently freed"),
    ("EvictsBeforeUncached", "must go first"),
    ("NoTokenCompare", "collision is a miss"),
    ("ForgetsOnFree", "has not been evicted|must go first|least recently freed"),  # the model still has it cached
    ("ForksUncounted", "ref_count"),
])
def test_prefix_cache_wrong_routes(child, name, match):
    _rejects(child, checks.check_PrefixCache, name, match)


def test_schedule_accepts_the_solution(ex):
    checks.check_schedule(ex.schedule)


@pytest.mark.parametrize("name, match", [
    ("ignores_budget", "token budget|leaves it waiting"),  # over the budget, or (whole prompts only) admits too few
    ("last_come_first", "first come first served"),
    ("preempts_oldest", "most recently admitted"),
    ("never_chunks", "leaves it waiting"),
    ("never_preempts", "new blocks"),
    ("fixed_chunk", "cut by the budget only"),
    ("admits_while_preempting", "admits nobody"),
    ("credits_blocks", "freeable blocks"),  # only the shared-block steps catch it
    ("slot_per_request", "sequences; max_num_seqs is"),
    ("calls_lib_schedule", "lib.batching.engine.schedule"),
    # a verbatim copy is found; since schedule has its own token threshold (grader/copy_thresholds.py) the unit
    # named may be the class it is a helper of (a higher ratio to its 60 %), still naming schedule
    ("lib_copy_schedule", r"lib.batching.engine.(LLMEngine with `)?schedule"),
])
def test_schedule_wrong_routes(child, name, match):
    _rejects(child, checks.check_schedule, name, match)


def test_engine_accepts_the_solution(ex):
    checks.check_engine(*(getattr(ex, name) for name in checks._PARTS))


@pytest.mark.parametrize("part, name, match", [
    ("slot_mapping", "contiguous_slots", "not what generate gives|slot_mapping.* expected"),  # keys land elsewhere
    ("paged_attention", "ignores_lengths", "not what generate gives"),  # attends to empty slots of the last block
    ("BlockAllocator", "NeverReuses", "ref_count|not what generate gives|Error"),  # no ref_count; blocks past the pool
    ("schedule", "never_preempts", "more blocks than|not what generate gives"),
    ("paged_attention", "scales_pool_in_place", "changed argument"),  # the engine's pool, scaled at every decode
])
def test_engine_wrong_parts(ex, child, part, name, match):
    """One part of the solution's engine replaced by a wrong route (through the isolated path): the engine's
    output differs from generate's, or the engine trips over the part."""
    parts = [child.get(name) if p == part else getattr(ex, p) for p in checks._PARTS]
    with pytest.raises(AssertionError, match=match):
        checks.check_engine(*parts)


def test_predict_steps_accepts_the_solution(ex):
    checks.check_predict_steps(ex.predict_steps)


@pytest.mark.parametrize("name, match", [
    ("decode_steps_only", "LLMEngine took"),
    ("runs_the_engine", "without running the engine"),
])
def test_predict_steps_wrong_routes(child, name, match):
    _rejects(child, checks.check_predict_steps, name, match)


def test_lib_reference_is_reported(tmp_path, ex):
    """Behind the week's view (lib readable, as without Landlock): lib's code under the exercise's own name, exec'd
    from lib's source (another file name): ReferenceUse for ex04 (a class whose short methods are lib's bytecode), and
    for ex06 (a function, a copy by its statements) the child refuses to compile it, the cell's error naming lib's
    code; lib's PrefixCache subclassed for ex08; the engine of ex10 on lib's parts; through the isolated path."""
    copy = HEADER + """
import inspect as _inspect
from lib.batching.paged import blocks_needed, OutOfBlocksError
exec(compile(_inspect.getsource(ref.{name}), "<student cell>", "exec"))
"""
    source = HEADER + """
PrefixCache = type("PrefixCache", (ref_blocks.PrefixCache,), {})  # lib's, under the exercise's name
"""
    session = Session(tmp_path / "week19_lib_copy.ipynb", view=ViewSpec.everything(19))  # behind the view
    try:
        session.load([(0, None, copy.format(name="BlockAllocator")), (1, None, copy.format(name="paged_attention")),
                      (2, None, source)])
        # (its methods are short: no one is a copy by statements, but their bytecode is lib's)
        with pytest.raises(ReferenceUse, match=r"is lib's own code \(lib.batching.paged.BlockAllocator"):
            checks.check_BlockAllocator(session.get("BlockAllocator"))
        with pytest.raises(AssertionError, match=r"is a copy of lib's lib.batching.paged.paged_attention.*does not compile"):
            checks.check_paged_attention(session.get("paged_attention"))
        with pytest.raises(AssertionError, match="lib.batching.blocks.PrefixCache"):
            checks.check_PrefixCache(session.get("PrefixCache"))
        parts = [session.get(p) if p in ("BlockAllocator", "PrefixCache") else getattr(ex, p) for p in checks._PARTS]
        with pytest.raises(AssertionError, match="runs on lib's parts: `BlockAllocator`.*PrefixCache"):
            checks.check_engine(*parts)
    finally:
        session.close()


def test_quiz():
    checks.check_answer_q1(lambda: 1 - 28 / 4128)
    with pytest.raises(AssertionError):
        checks.check_answer_q1(lambda: 0.963)  # the seed's "96.3 % utilization", not this example's
    checks.check_answer_q3(lambda: 1600 / 1100)
    with pytest.raises(AssertionError):
        checks.check_answer_q3(lambda: 2.5)  # the seed's "2-3x"
    assert math.isclose(ref_engine.simulate_steps([50, 200] * 32, 8, "static") /
                        ref_engine.simulate_steps([50, 200] * 32, 8, "continuous"), 1600 / 1100)
