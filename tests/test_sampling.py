"""lib.modeling.sampling, the one sampler of lib.modeling.generate, the engine and the server: each field against the distribution it
must give, written out here from its definition (OpenAI's and vLLM's), not from lib's code."""
import math

import pytest
import torch

from lib.batching.engine import LLMEngine
from lib.modeling.generate import generate
from lib.modeling.llama import tiny_model
from lib.modeling.sampling import SamplingParams

V = 12


def _logits(seed=0):
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 2


def _softmax(xs):
    m = max(x for x in xs if x != -math.inf)
    e = [math.exp(x - m) if x != -math.inf else 0.0 for x in xs]
    return [v / sum(e) for v in e]


def _close(got: torch.Tensor, want: list[float]):
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=1e-6), (got.tolist(), want)


@pytest.mark.parametrize("seed", range(5))
def test_top_p_top_k_min_p_keep_what_their_definitions_keep(seed):
    x = _logits(seed)
    p = _softmax((x / 0.7).tolist())
    order = sorted(range(V), key=lambda i: -p[i])
    for top_p in (0.1, 0.5, 0.9):
        keep, mass = set(), 0.0
        for i in order:  # the smallest set of the most likely tokens whose mass reaches top_p
            if mass >= top_p:
                break
            keep.add(i)
            mass += p[i]
        want = [p[i] / mass if i in keep else 0.0 for i in range(V)]
        _close(SamplingParams(temperature=0.7, top_p=top_p).probabilities(x), want)
    for k in (1, 3):
        keep = set(order[:k])
        want = [p[i] / sum(p[j] for j in keep) if i in keep else 0.0 for i in range(V)]
        _close(SamplingParams(temperature=0.7, top_k=k).probabilities(x), want)
    for min_p in (0.05, 0.3):
        keep = {i for i in range(V) if p[i] >= min_p * max(p)}
        want = [p[i] / sum(p[j] for j in keep) if i in keep else 0.0 for i in range(V)]
        _close(SamplingParams(temperature=0.7, min_p=min_p).probabilities(x), want)


def test_penalties_and_bias_as_defined():
    x = _logits(9)
    prompt, output = [1, 2, 2], [2, 3, 3, 3, 5]
    count = {t: output.count(t) for t in set(output)}
    want = x.tolist()
    want[4] += 5.0  # logit_bias
    want[7] -= 3.0
    for t in set(prompt) | set(output):  # repetition: divide a positive logit by r, multiply a negative one
        want[t] = want[t] / 1.3 if want[t] > 0 else want[t] * 1.3
    for t, c in count.items():
        want[t] -= 0.4 * c + 0.25  # frequency times the count, presence once
    got = SamplingParams(temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.25,
                         logit_bias={4: 5.0, 7: -3.0}).adjust(x, prompt, output)
    _close(got, want)
    assert torch.equal(x, _logits(9)), "adjust changed its input"


def test_min_tokens_and_ignore_eos_mask_the_end():
    x = torch.zeros(V)
    x[0] = 10.0  # token 0 is the end-of-sequence token, by far the likeliest
    params = SamplingParams(min_tokens=3, stop_token_ids=(5,), eos_token_id=0)
    for n_out in range(5):
        adjusted = params.adjust(x, [1], [1] * n_out)
        masked = n_out < 3
        assert (adjusted[0] == -math.inf) == masked and (adjusted[5] == -math.inf) == masked, (n_out, adjusted)
        assert params.choose(x, [1], [1] * n_out) == (1 if masked else 0)
    assert SamplingParams(ignore_eos=True, eos_token_id=0).choose(x, [1], [1] * 50) != 0


def test_plain_parameters_change_nothing_and_bad_ones_are_refused():
    x = _logits(3)
    assert SamplingParams().choose(x, [1], []) == int(x.argmax())
    assert SamplingParams().is_plain and torch.equal(SamplingParams().adjust(x, [1, 2], [3]), x)
    for bad in (dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2), dict(min_p=2.0), dict(repetition_penalty=0.0),
                dict(temperature=-1.0), dict(min_tokens=-1), dict(seed=1.5), dict(logprob_entries=())):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_sampled_frequencies_follow_the_nucleus():
    """20,000 draws at top_p 0.6: each kept token within 6 standard errors of its renormalized probability (a correct
    sampler fails this less than once in a million runs per token), the others never drawn."""
    x = _logits(4)
    params = SamplingParams(temperature=1.0, top_p=0.6)
    want = params.probabilities(x)
    g = torch.Generator().manual_seed(0)
    n = 20000
    draws = torch.tensor([params.choose(x, [], [], g) for _ in range(n)])
    freq = torch.bincount(draws, minlength=V).double() / n
    se = (want.double() * (1 - want.double()) / n).sqrt()
    assert ((freq - want.double()).abs() <= 6 * se + 1e-12).all(), (freq, want)
    assert (freq[want == 0] == 0).all()


def test_engine_and_generate_sample_alike():
    """The engine's request and lib.modeling.generate, given the same parameters and seed, write the same tokens."""
    model = tiny_model(seed=2)
    prompt = [5, 9, 3, 17]
    params = SamplingParams(temperature=0.9, top_p=0.8, top_k=20, frequency_penalty=0.5, repetition_penalty=1.2,
                            logit_bias={7: 2.0}, seed=11)  # generate takes its generator; the engine, params.seed
    want = generate(model, torch.tensor([prompt]), 12, sampling=params,
                    generator=torch.Generator().manual_seed(11))[0, len(prompt):].tolist()
    engine = LLMEngine(model, num_blocks=16, block_size=4)
    rid = engine.add_request(prompt, 12, params=params)
    while engine.has_unfinished():
        engine.step()
    assert engine.finished_outputs()[rid] == want
    greedy = generate(model, torch.tensor([prompt]), 12)[0, len(prompt):].tolist()
    rid = engine.add_request(prompt, 12, params=SamplingParams(top_p=0.5))  # temperature 0: greedy, whatever else
    while engine.has_unfinished():
        engine.step()
    assert engine.finished_outputs()[rid] == greedy


def test_params_carry_the_request_and_bring_its_logprobs_back():
    """One `SamplingParams` per request carries its temperature and seed into the engine (the add_request arguments
    may only agree with it) and brings its logprob entries back: the engine appends them to `params.logprob_entries`,
    and an `n` request's other samples, like `for_another_sequence`, get lists of their own."""
    model = tiny_model(seed=2)
    prompt = [5, 9, 3, 17]
    engine = LLMEngine(model, num_blocks=16, block_size=4, max_num_seqs=3)
    params = SamplingParams(temperature=0.8, seed=4, logprobs=2)
    rid = engine.add_request(prompt, 6, n=2, params=params)
    while engine.has_unfinished():
        engine.step()
    done = engine.finished_outputs()
    want = generate(model, torch.tensor([prompt]), 6, temperature=0.8,
                    generator=torch.Generator().manual_seed(4))[0, len(prompt):].tolist()
    assert done[rid] == want and [t for t, _, _ in params.logprob_entries] == want
    assert all(len(top) == 2 and lp <= 0 for _, lp, top in params.logprob_entries)
    other = params.for_another_sequence(seed=9)
    assert other.logprob_entries == [] and other.logprob_entries is not params.logprob_entries
    assert other == SamplingParams(temperature=0.8, seed=9, logprobs=2)  # entries are state, not a field compared
    with pytest.raises(ValueError, match="disagree with params"):
        engine.add_request(prompt, 6, temperature=0.0, params=params)
    assert engine.add_request(prompt, 6, temperature=0.8, seed=4, params=params.for_another_sequence()) is not None
