"""Week 19's paged attention in bf16 and fp16 (below `checks/week19.py`, whose `check_paged_attention` calls
`assert_low_precision` once per dtype).

The contract the notebook states: q and the pools may be bf16 or fp16; the result has q's dtype and is as accurate as
an fp32 computation rounded once at the end (upcast each block read, keep the scores, the running max and sum and the
running output in fp32). The case: B = 2, one sequence of 12,000-16,000 keys and one of 1-300, 2 KV heads, the
inputs drawn in fp32 and rounded to the dtype; the reference is contiguous attention over those rounded values in
fp32. The bound, per element: |got - reference| <= eps * (|reference| + the largest |reference| of its row), eps
the dtype's machine epsilon (2^-7 for bf16, 2^-10 for fp16).

- An fp32 computation rounded once to the dtype errs by at most eps/2 * |reference| (round to nearest), half the
  bound, whatever the draw; measured (lib, the solution's algorithm, 275 seeds per dtype, head_dim 16-64): at most
  0.25 of the bound.
- Accumulating in the dtype (FINDINGS5.md #22: scores, running max, sum and output in bf16 or fp16, positions as a
  float of the dtype) errs past it: over the same 275 seeds, bf16 at least 5.7x the bound (median 15x; the log of
  the ratio has mean 2.66 and sd 0.34, so a pass lies 7.8 sd out: a false pass well under 1e-6 on bf16 alone), fp16
  at least 2.5x (fp16 positions past 2,048 are inexact, so the mask is wrong near a long sequence's end).

The call is observed like the fp32 cases' (no lib, no SDPA, every op classified, an exponential torch saw, no
reduction over a whole row) and its result is the one judged.
"""
from __future__ import annotations

import torch

from grader.checks import assert_classified, observe, seed_note
from grader.checks.week19_sim import LONG_CASE, contiguous_reference, exponentials, paged_case, sdpa_ops

LOW_PRECISION_KEYS = (12_000, 16_000)  # the long sequence's keys: the more additions in half, the larger the error


def low_precision_case(g: torch.Generator, dtype: torch.dtype, d: int) -> tuple[dict, torch.Tensor]:
    """(paged_case's dict with q and the pools in `dtype`, the fp32 reference over those rounded values)."""
    c = paged_case(g, LONG_CASE, d, long_keys=LOW_PRECISION_KEYS)
    q, k_pool, v_pool, tables, lens = c["args"]
    q, k_pool, v_pool = (t.to(dtype) for t in (q, k_pool, v_pool))
    c["args"] = (q, k_pool, v_pool, tables, lens)
    return c, contiguous_reference(q.float(), k_pool.float(), v_pool.float(), c["tables"], c["lens"])


def within_bound(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> tuple[float, int]:
    """(the largest ratio of |got - want| to the bound over the elements, its flat index); <= 1 passes."""
    eps = torch.finfo(dtype).eps
    want = want.double()
    allowed = eps * (want.abs() + want.abs().amax(-1, keepdim=True))
    ratio = (got.double() - want).abs() / allowed
    worst = int(ratio.argmax())
    return float(ratio.flatten()[worst]), worst


def assert_low_precision(paged_attention, g: torch.Generator, dtype: torch.dtype, d: int, forbidden: tuple) -> None:
    """The case in `dtype`, observed: the route's rules of the fp32 cases (`forbidden`: lib's modules it may not
    call), then the dtype and the bound."""
    c, want = low_precision_case(g, dtype, d)
    args = c["args"]
    before = [a.clone() for a in args]
    got, obs = observe(paged_attention, *args)
    what = (f"paged_attention on {dtype} inputs: block_size={c['bs']}, n_heads={c['h']}, n_kv_heads={c['hkv']}, "
            f"head_dim={d}, context_lens={c['lens']}")
    assert isinstance(got, torch.Tensor), f"{what}: returned {type(got).__name__}, expected a torch.Tensor"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert got.dtype == dtype, (f"{what}: returned {got.dtype}; the result has the inputs' dtype (compute in fp32, "
                                f"then `.to(q.dtype)` at the end)")
    assert all(torch.equal(a, a0) for a, a0 in zip(args, before)), f"{what}: changed its arguments in place"
    lib_used = sorted(n for n in obs.lib_calls if n.startswith(forbidden))
    assert not lib_used, f"{what}: calls {lib_used}; write the attention yourself"
    assert not sdpa_ops(obs), f"{what}: calls {sdpa_ops(obs)} (SDPA); compute the scores and the softmax yourself"
    assert_classified(obs, what)
    assert exponentials(obs), f"{what}: the observer saw no exponential: compute with torch ops on the inputs"
    red = obs.max_reduction_extent()
    assert red <= 512, f"{what}: one reduction combined {red} elements: a softmax over a whole row. {seed_note()}"
    longest = 2 * max(c["lens"]) * c["hkv"] * d * 4  # one sequence's K and V, contiguous, fp32
    made = obs.peak_bytes + obs.premade_bytes
    assert made < longest / 2, (f"{what}: allocated {made} bytes at peak, as much as a contiguous fp32 copy of the "
                                f"longest sequence's keys and values ({longest} bytes): upcast a few blocks at a time")
    assert bool(torch.isfinite(got).all()), f"{what}: contains NaN or inf {seed_note()}"
    ratio, at = within_bound(got, want, dtype)
    eps = torch.finfo(dtype).eps
    assert ratio <= 1.0, (
        f"{what}: differs from fp32 attention over the same {dtype} values by {ratio:.1f}x what rounding allows at "
        f"flat index {at} (|error| <= {eps:g} * (|reference| + the row's largest |reference|); an fp32 computation "
        f"rounded once at the end errs by at most half that). Sums of thousands of terms in {dtype} lose the small "
        f"ones: upcast q and each block of K and V you read to fp32 (`.float()`), keep the scores, the running max "
        f"and sum, the running output and the positions in fp32 (or int64), and return `.to(q.dtype)`. {seed_note()}")
