"""The model's attention backends agree: the lab's GQA attention, torch SDPA, and naive attention on repeated KV heads."""
import pytest
import torch

from lib.attn.attention import expand_kv, gqa_attention, naive_attention, repeat_kv, sdpa_attention
from lib.attn.masks import sliding_window_mask


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1), (9, 3)])
@pytest.mark.parametrize("tq,tk", [(7, 7), (1, 12), (4, 10)])
def test_backends_agree(heads, kv_heads, tq, tk):
    g = torch.Generator().manual_seed(heads * 100 + tq * 10 + tk)
    q = torch.randn(2, heads, tq, 16, generator=g)
    k, v = (torch.randn(2, kv_heads, tk, 16, generator=g) for _ in range(2))
    ref = gqa_attention(q, k, v, causal=True)
    assert (sdpa_attention(q, k, v, causal=True) - ref).abs().max() < 1e-5
    assert (expand_kv(naive_attention)(q, k, v, causal=True) - ref).abs().max() < 1e-5
    mask = sliding_window_mask(tq, tk, window=3)
    assert (sdpa_attention(q, k, v, causal=True, mask=mask) - gqa_attention(q, k, v, causal=True, mask=mask)).abs().max() < 1e-5


def test_gqa_is_mha_on_repeated_heads():
    q = torch.randn(1, 6, 5, 8)
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mha = gqa_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), causal=True)
    assert torch.allclose(gqa_attention(q, k, v, causal=True), mha, atol=1e-6)
    # query head h reads KV head h // 3
    assert torch.equal(repeat_kv(k, 3)[:, 4], k[:, 1])


def test_bad_head_counts_are_a_clear_error():
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        gqa_attention(torch.randn(1, 6, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8))
