"""Generation: cached == uncached on many random configurations; sampling does what it says."""

import pytest
import torch

from lib.modeling.generate import generate, sample_next
from lib.modeling.sampling import filter_logits
from lib.modeling.kv_cache import CacheOverflowError
from lib.modeling.llama import tiny_model

CONFIGS = [  # (n_heads, n_kv_heads, n_layers, d_model): MHA, GQA and MQA, odd sizes included
    (4, 4, 2, 64), (4, 2, 2, 64), (4, 1, 2, 64), (6, 3, 3, 48), (9, 3, 2, 72), (8, 1, 1, 64), (2, 2, 4, 32),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n_heads,n_kv_heads,n_layers,d_model", CONFIGS)
def test_cached_equals_uncached_greedy(seed, n_heads, n_kv_heads, n_layers, d_model):
    model = tiny_model(seed=seed, n_heads=n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers, d_model=d_model)
    prompt = torch.randint(0, 128, (2, 5 + seed), generator=torch.Generator().manual_seed(seed))
    a, la = generate(model, prompt, 20, use_cache=True, return_logits=True)
    b, lb = generate(model, prompt, 20, use_cache=False, return_logits=True)
    assert torch.equal(a, b)
    assert (la - lb).abs().max().item() <= 1e-4


def test_cached_equals_uncached_sampling_with_same_seed():
    model = tiny_model(seed=7)
    prompt = torch.tensor([[1, 2, 3]])
    runs = [generate(model, prompt, 30, use_cache=c, temperature=1.2, top_k=50, top_p=0.95,
                     generator=torch.Generator().manual_seed(123)) for c in (True, False)]
    assert torch.equal(*runs)


def test_output_starts_with_the_prompt_and_has_the_right_length():
    model = tiny_model(seed=1)
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = generate(model, prompt, 9)
    assert out.shape == (1, 13) and torch.equal(out[:, :4], prompt)


def test_eos_stops_generation():
    model = tiny_model(seed=2)
    prompt = torch.tensor([[3, 4]])
    free = generate(model, prompt, 10)
    eos = int(free[0, 4])  # the third generated token: declare it the end of sequence
    stopped = generate(model, prompt, 10, eos_token_id=eos)
    first = (free[0, 2:] == eos).nonzero()[0].item()
    assert stopped.shape[1] == 2 + first + 1 and stopped[0, -1] == eos


def test_cache_overflow_is_a_clear_error():
    model = tiny_model(seed=0)
    cache = model.new_cache(batch=1, max_len=8)
    model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
    with pytest.raises(CacheOverflowError, match="max_len"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert torch.isfinite(filter_logits(logits, top_k=2)).tolist() == [[True, True, False, False, False]]
    # top_p=0.8: 0.5 + 0.2 = 0.7 < 0.8, so the third token (0.15) is needed too
    assert torch.isfinite(filter_logits(logits, top_p=0.8)).tolist() == [[True, True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.5)).tolist() == [[True, False, False, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=1e-9)).sum() == 1  # the top token always stays


def test_sampling_follows_the_distribution():
    """Temperature-1 sampling of a known distribution: counts within 6 standard deviations (fails < 1e-8)."""
    p = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    n = 20000
    logits = torch.log(p).expand(n, -1)
    draws = sample_next(logits, temperature=1.0, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=5).float()
    sd = torch.sqrt(n * p * (1 - p))
    assert ((counts - n * p).abs() <= 6 * sd).all(), f"counts {counts.tolist()} vs expected {(n * p).tolist()}"


def test_temperature_sharpens_and_top_k_restricts():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    n = 20000
    logits = torch.log(p).expand(n, -1)
    g = torch.Generator().manual_seed(1)
    cold = torch.bincount(sample_next(logits, temperature=0.5, generator=g), minlength=4).float() / n
    q = p ** 2 / (p ** 2).sum()  # temperature 0.5 squares the probabilities
    assert ((cold - q).abs() <= 6 * torch.sqrt(q * (1 - q) / n)).all()
    top2 = sample_next(logits, temperature=1.0, top_k=2, generator=g)
    assert set(top2.unique().tolist()) == {0, 1}
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits[:1], temperature=-1.0)
