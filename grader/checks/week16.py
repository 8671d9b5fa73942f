"""Week 16 — the KV cache and GQA: the milestone checks, used by solutions/16/test_week16.py and the notebook."""
from __future__ import annotations

import torch

from grader.harness import Week
from lib import kv_cache as ref

WEEK = Week(16, "week16_kv_cache.ipynb")


@WEEK.exercise(2, "causal_mask", section="2 (The causal mask)")
def check_causal_mask(causal_mask) -> None:
    for q_len, kv_len in [(1, 1), (5, 5), (1, 9), (3, 8), (4, 4), (2, 7), (16, 16), (1, 300)]:
        got = causal_mask(q_len, kv_len)
        assert isinstance(got, torch.Tensor), f"causal_mask({q_len}, {kv_len}) returned {type(got).__name__}, expected a torch.Tensor"
        assert tuple(got.shape) == (q_len, kv_len), (
            f"causal_mask({q_len}, {kv_len}) has shape {tuple(got.shape)}; expected ({q_len}, {kv_len}) = [q_len, kv_len]")
        assert got.dtype == torch.bool, f"causal_mask({q_len}, {kv_len}) has dtype {got.dtype}; expected torch.bool (True = may attend)"
        want = ref.causal_mask(q_len, kv_len)
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0].tolist()
            raise AssertionError(
                f"causal_mask({q_len}, {kv_len}) is wrong at query {bad[0]}, key {bad[1]}: got {bool(got[bad[0], bad[1]])}. "
                f"The queries are the LAST {q_len} of {kv_len} positions: query i may see key j iff j <= i + {kv_len - q_len}.")
