"""lib.fast.FastLlama is the same function as lib.model.LlamaModel: greedy tokens identical, logits within
1e-4 + 1e-5·|logit| (fp32 sums taken in another order: the packed oneDNN path's largest difference on SmolLM2
was 1.02e-4, on a logit of 15.4, a relative 7e-6)."""
import pytest
import torch

from lib.fast import FastLlama, can_pack
from lib.generate import generate
from lib.model import tiny_model


PACKED = [False] + ([True] if can_pack("cpu", torch.float32) else [])


@pytest.mark.parametrize("packed", PACKED)
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_tiny_logits_cached_and_uncached(n_heads, n_kv_heads, packed):
    model = tiny_model(seed=n_heads + n_kv_heads, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=48 if n_heads == 6 else 64)
    fast = FastLlama(model, packed=packed)
    assert fast.packed == packed
    ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), model(ids), atol=1e-4, rtol=0)
        c_ref, c_fast = model.new_cache(2, 32), fast.new_cache(2, 32)
        for chunk in (ids[:, :5], ids[:, 5:8], ids[:, 8:9], ids[:, 9:]):  # prefill, a 3-token verify, decode
            torch.testing.assert_close(fast(chunk, cache=c_fast), model(chunk, cache=c_ref), atol=1e-4, rtol=0)
    assert torch.equal(generate(fast, ids, 24), generate(model, ids, 24))
    assert torch.equal(generate(fast, ids, 8, use_cache=False), generate(model, ids, 8))


def test_bad_input_and_overflow_are_clear_errors():
    fast = FastLlama(tiny_model(seed=0))
    with pytest.raises(ValueError, match="input_ids must be"):
        fast(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="max_seq_len"):
        fast(torch.zeros(1, fast.config.max_seq_len + 1, dtype=torch.long))


def test_packed_is_chosen_only_where_it_applies():
    assert not FastLlama(tiny_model(seed=0), dtype=torch.bfloat16).packed  # oneDNN's packing is for fp32 here
    with pytest.raises(ValueError, match="packed=True needs float32"):
        FastLlama(tiny_model(seed=0), dtype=torch.bfloat16, packed=True)
    assert not FastLlama(tiny_model(seed=0), compile=True).packed  # inductor cannot lower the packed op
    if can_pack("cpu", torch.float32):
        with pytest.raises(ValueError, match="cannot be combined with compile"):
            FastLlama(tiny_model(seed=0), compile=True, packed=True)


def test_meta_device_creates_nothing_on_the_cpu():
    model = tiny_model(seed=0).to("meta")
    fast = FastLlama(model)
    assert not fast.packed
    out = fast(torch.zeros(1, 3, dtype=torch.long, device="meta"), cache=fast.new_cache(1, 8))
    assert out.device.type == "meta" and out.shape == (1, 3, model.config.vocab_size)


@pytest.mark.model
@pytest.mark.parametrize("packed", PACKED)
def test_smollm2_logits_and_64_greedy_tokens(smollm2, packed):
    model, tok = smollm2
    fast = FastLlama(model, packed=packed)
    ids = torch.tensor([tok.encode("The history of the printing press begins")])
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), model(ids), atol=1e-4, rtol=1e-5)
    assert torch.equal(generate(fast, ids, 64), generate(model, ids, 64))
