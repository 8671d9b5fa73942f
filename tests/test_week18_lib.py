"""Week 18's lib: cache rollback (truncate), verify's law, greedy speculation == target greedy, the drafts, theory."""
import math

import pytest
import torch
import torch.nn.functional as F

from grader.checks.week18_law import LawCase, law_cases, law_counts, law_failures, law_level, law_tests
from grader.checks.week18_models import MarkovLM
from lib.spec_decode import drafts
from lib.spec_decode import speculative as spec
from lib.modeling.generate import generate
from lib.modeling.kv_cache import LayerKVCache, RollingKVCache
from lib.modeling.llama import tiny_model


def _spicy(seed, scale=10.0):
    m = tiny_model(seed=seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.mul_(scale)
    return m


# --- truncate ---------------------------------------------------------------------------------------------

def test_truncate_then_decode_equals_full_forward():
    model = tiny_model(seed=1)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    junk = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(max_len=20)
    with torch.no_grad():
        model(ids[:, :8], cache=cache)
        model(junk, cache=cache)  # rejected draft tokens
        assert cache.length == 13
        cache.truncate(8)
        assert cache.length == 8 and all(layer.length == 8 for layer in cache.layers)
        got = model(ids[:, 8:], cache=cache)
        want = model(ids)[:, 8:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    cache.crop(3)
    assert cache.length == 3


def test_truncate_rejects_bad_lengths():
    layer = LayerKVCache(1, 2, 10, 4)
    layer.append(torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4))
    for bad in (-1, 5, 2.0, True):
        with pytest.raises(ValueError):
            layer.truncate(bad)
    layer.truncate(4)
    layer.truncate(0)
    assert layer.length == 0


def test_rolling_cache_truncates_only_before_it_wraps():
    ring = RollingKVCache(1, 1, 4, 2)
    for _ in range(3):
        ring.append(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    ring.truncate(1)  # nothing overwritten yet
    assert ring.length == 1
    for _ in range(5):
        ring.append(torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2))
    ring.truncate(ring.length)  # a no-op is fine
    with pytest.raises(ValueError, match="cannot roll back"):
        ring.truncate(ring.length - 1)


# --- verify -----------------------------------------------------------------------------------------------

def _law_ok(case: LawCase, seed: int):
    level = law_level(len(law_tests(case)))
    bad = law_failures(case, law_counts(spec.verify, case, seed), level)
    assert not bad, bad


@pytest.mark.parametrize("index", range(5))
def test_verify_has_the_exact_law(index):
    """lib's verify against the check's closed-form law, each case of check_verify (fewer runs; fixed seeds)."""
    case = law_cases(torch.Generator().manual_seed(index))[index]
    case.trials = min(case.trials, 4000)
    _law_ok(case, 1000 * index)


def test_verify_edge_cases_and_errors():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    assert spec.verify(p, q, torch.tensor([0])) == (0, 1)  # p(draft) = 0: rejected, residual is token 1
    n, nxt = spec.verify(p[:1], q[:0], torch.tensor([], dtype=torch.int64))  # K = 0: one sample from p_0
    assert (n, nxt) == (0, 1)
    q_greedy = torch.tensor([[0.0, 0.0, 1.0]])  # q = 0 at the draft token (a greedy draft): accept iff p > 0
    assert spec.verify(torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]), q_greedy * 0, torch.tensor([2])) == (1, 0)
    with pytest.raises(ValueError):
        spec.verify(p, q, torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        spec.verify(p, q, torch.tensor([0.0]))


def test_verify_on_meta_free_device_inputs_keeps_their_device():
    # every tensor verify creates follows its inputs (or the generator): a CPU run with a CPU generator
    p = torch.softmax(torch.randn(4, 6), -1)
    q = torch.softmax(torch.randn(3, 6), -1)
    n, nxt = spec.verify(p, q, torch.tensor([1, 2, 3]), generator=torch.Generator().manual_seed(0))
    assert 0 <= n <= 3 and 0 <= nxt < 6


# --- speculative_generate ----------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_speculation_equals_target_greedy(k):
    target = _spicy(3)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(k))
    want = generate(target, ids, 30)
    candidates = [_spicy(13, 6.0), drafts.PromptLookupDraft(128), target]
    if k == 4:
        candidates += [drafts.early_exit_draft(target, 1), drafts.quantized_draft(target), drafts.random_draft(target.config)]
    for draft in candidates:
        stats = spec.SpecStats()
        got = spec.speculative_generate(target, draft, ids, 30, k=k, stats=stats)
        assert torch.equal(got, want), type(draft).__name__
        assert stats.tokens == 30 and stats.accepted <= stats.drafted
        assert stats.target_calls == stats.rounds and stats.tokens == stats.accepted + stats.rounds
    stats = spec.SpecStats()
    spec.speculative_generate(target, target, ids, 30, k=k, stats=stats)
    assert stats.target_calls == math.ceil(30 / (k + 1)) and stats.acceptance_rate == 1.0


def test_adaptive_drafting_keeps_output_and_drafts_less():
    target = _spicy(3)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(0))
    draft = drafts.PromptLookupDraft(128)
    fixed, adaptive = spec.SpecStats(), spec.SpecStats()
    a = spec.speculative_generate(target, draft, ids, 30, k=4, stats=fixed)
    b = spec.speculative_generate(target, draft, ids, 30, k=4, stats=adaptive, min_draft_prob=0.5)
    assert torch.equal(a, b) and torch.equal(a, generate(target, ids, 30))
    assert adaptive.drafted <= fixed.drafted


def test_markov_target_needs_rollback():
    target = MarkovLM(20, 0)
    draft = MarkovLM(20, 1, like=target, noise=2.0)
    ids = torch.tensor([[1, 2, 3]])
    stats = spec.SpecStats()
    assert torch.equal(spec.speculative_generate(target, draft, ids, 40, k=4, stats=stats), generate(target, ids, 40))
    assert 0 < stats.acceptance_rate < 1


def test_sampled_speculation_matches_target_marginal():
    """Temperature 1, a poor draft: the first new token's law is the target's (chi-square, fixed seed)."""
    target = MarkovLM(6, 0, scale=1.0)
    draft = MarkovLM(6, 1, like=target, noise=2.0)
    ids = torch.tensor([[1, 2]])
    p = torch.softmax(target(ids)[0, -1].double(), -1)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(1000):
        counts[spec.speculative_generate(target, draft, ids, 3, k=2, temperature=1.0, generator=g)[0, 2]] += 1
    stat = float(((counts - 1000 * p) ** 2 / (1000 * p)).sum())
    assert stat < 45.0  # chi-square, 5 degrees of freedom: P[> 45] ≈ 1.5e-8


def test_speculative_generate_errors():
    m = tiny_model(seed=0)
    with pytest.raises(ValueError):
        spec.speculative_generate(m, m, torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError):
        spec.speculative_generate(m, m, torch.zeros(1, 3, dtype=torch.long), 4, k=0)
    with pytest.raises(ValueError):
        spec.speculative_generate(m, tiny_model(seed=0, vocab_size=64), torch.zeros(1, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError):
        spec.speculative_generate(m, m, torch.zeros(1, 250, dtype=torch.long), 10)


# --- drafts and theory ----------------------------------------------------------------------------------------

def test_prompt_lookup_guesses_the_continuation():
    d = drafts.PromptLookupDraft(50, ngram=2)
    assert d.guess([5, 6, 7, 8, 5, 6]) == 7
    assert d.guess([5, 6, 7, 8, 9, 6]) == 7  # falls back to a 1-gram match
    assert d.guess([1, 2, 3]) is None  # no match
    assert d(torch.tensor([[1, 2, 3]]))[0, -1].argmax() == 3  # ...then the logits favour repeating the last token
    cache = d.new_cache(1, 10)
    logits = d(torch.tensor([[5, 6, 7, 8, 5, 6]]), cache=cache)
    assert logits.shape == (1, 6, 50) and logits[0, -1].argmax() == 7 and cache.length == 6


def test_int8_linear_close_to_fp32_and_draft_logits_close():
    target = tiny_model(seed=2)
    w = target.layers[0].mlp.up_proj.weight
    lin = drafts.Int8Linear(w)
    assert lin.qweight.dtype == torch.int8 and lin.scale.shape == (w.shape[0],)
    assert (lin.weight - w).abs().max() <= lin.scale.max() / 2 + 1e-7  # rounding error at most half a step
    x = torch.randn(3, w.shape[1])
    assert (lin(x) - F.linear(x, w)).abs().max() < 0.05 * F.linear(x, w).abs().max()
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(0))
    q = drafts.quantized_draft(target)
    with torch.no_grad():
        a, b = torch.softmax(target(ids), -1), torch.softmax(q(ids), -1)
    assert spec.acceptance_rate(a, b).min() > 0.95
    assert target.lm_head is None and all(p.dtype == torch.float32 for p in target.parameters())  # untouched


def test_early_exit_draft_shares_weights_and_leaves_target_alone():
    target = tiny_model(seed=2, n_layers=3)
    d = drafts.early_exit_draft(target, 2)
    assert len(d.layers) == 2 and len(target.layers) == 3 and d.embed is target.embed
    assert d.layers[0] is target.layers[0] and d.config.n_layers == 2
    with pytest.raises(ValueError):
        drafts.early_exit_draft(target, 4)


def test_acceptance_theory():
    assert spec.expected_tokens_per_call(0.7, 4) == pytest.approx(2.7731, abs=1e-4)  # the seed's "3.6" is wrong
    assert spec.expected_tokens_per_call(0.5, 2) == pytest.approx(1.75)
    assert spec.expected_tokens_per_call(1.0, 4) == 5.0 and spec.expected_tokens_per_call(0.0, 4) == 1.0
    p, q = torch.tensor([0.2, 0.8]), torch.tensor([0.8, 0.2])
    assert float(spec.acceptance_rate(p, q)) == pytest.approx(0.4)
    assert float(spec.acceptance_rate(p, q)) == pytest.approx(1 - 0.5 * float((p - q).abs().sum()))  # 1 - TV
    assert spec.predicted_speedup(0.0, 1, 0.0, {2: 1.0}) == 1.0
    assert spec.predicted_speedup(0.8, 4, 0.05, {5: 1.0}) == pytest.approx(spec.expected_tokens_per_call(0.8, 4) / 1.2)
    with pytest.raises(ValueError):
        spec.expected_tokens_per_call(1.5, 2)
    with pytest.raises(ValueError):
        spec.predicted_speedup(0.5, 4, 0.1, {2: 1.0})


@pytest.mark.model
def test_smollm2_greedy_speculation_with_int8_draft(smollm2):
    model, tok = smollm2
    ids = tok("To be, or not to be, that is the question:", return_tensors="pt").input_ids
    want = generate(model, ids, 48)
    draft = drafts.quantized_draft(model)
    for k in (1, 4):
        stats = spec.SpecStats()
        assert torch.equal(spec.speculative_generate(model, draft, ids, 48, k=k, stats=stats), want)
        assert stats.acceptance_rate > 0.7


# --- FR-Spec: a frequency-ranked vocabulary subset for the draft's LM head ----------------------------------

def test_frequency_ranking_counts_and_breaks_ties_by_id():
    counts = drafts.token_counts([torch.tensor([[3, 3, 5, 1]]), torch.tensor([5, 3, 7])], 10)
    assert counts.tolist() == [0, 1, 0, 3, 0, 2, 0, 1, 0, 0]
    assert drafts.frequency_ranked_ids(counts, 5).tolist() == [3, 5, 1, 7, 0]  # ties (and unseen tokens) by id
    assert drafts.frequency_ranked_ids(counts, 10).sort().values.tolist() == list(range(10))
    for bad in (0, 11):
        with pytest.raises(ValueError):
            drafts.frequency_ranked_ids(counts, bad)
    with pytest.raises(ValueError):
        drafts.token_counts(torch.tensor([10]), 10)


def test_fr_spec_draft_restricts_the_head_and_keeps_the_rest():
    target = _spicy(3)
    keep = torch.tensor([5, 0, 17, 99, 42, 3])
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    for base in (target, drafts.early_exit_draft(target, 1), drafts.quantized_draft(target)):
        d = drafts.fr_spec_draft(base, keep)
        assert d.layers is base.layers and d.embed is base.embed
        head = d.lm_head.head
        rows = head.qweight if isinstance(head, drafts.Int8Linear) else head.weight
        assert rows.shape == (6, 64)  # N x d_model weights, not vocab x d_model
        with torch.no_grad():
            full, sub = base(ids), d(ids, cache=d.new_cache(1, 16))
        outside = torch.ones(128, dtype=torch.bool)
        outside[keep] = False
        assert torch.isinf(sub[..., outside]).all() and (sub[..., outside] < 0).all()
        torch.testing.assert_close(sub[..., keep], full[..., keep], atol=1e-4, rtol=1e-4)
        q = torch.softmax(sub, -1)
        assert q[..., outside].sum() == 0 and torch.isin(sub.argmax(-1), keep).all()
    assert target.lm_head is None  # the target is untouched
    with pytest.raises(ValueError):
        drafts.fr_spec_draft(target, torch.tensor([1, 1]))
    with pytest.raises(ValueError):
        drafts.fr_spec_draft(target, torch.tensor([128]))
    with pytest.raises(ValueError):
        drafts.fr_spec_draft(drafts.PromptLookupDraft(128), keep)


@pytest.mark.parametrize("n", [4, 32])
def test_fr_spec_greedy_speculation_equals_target_greedy(n):
    target = _spicy(3)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(n))
    want = generate(target, ids, 30)
    keep = drafts.frequency_ranked_ids(drafts.token_counts(want, 128), n)  # the target's own tokens first
    for base in (target, drafts.quantized_draft(target), _spicy(13, 6.0)):
        stats = spec.SpecStats()
        assert torch.equal(spec.speculative_generate(target, drafts.fr_spec_draft(base, keep), ids, 30, k=3,
                                                     stats=stats), want)
    # the target as its own draft, restricted to its own outputs' tokens: every draft token is accepted
    keep = torch.unique(want[0, 5:])
    stats = spec.SpecStats()
    spec.speculative_generate(target, drafts.fr_spec_draft(target, keep), ids, 30, k=3, stats=stats)
    assert stats.acceptance_rate == 1.0


def test_verify_is_exact_when_q_is_zero_outside_a_subset():
    """The exactness argument, computed: with q = 0 outside the draft's subset, P(emit x) = p(x) for every x."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(3 * torch.randn(12, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(3 * torch.randn(12, generator=g, dtype=torch.float64), -1)
    q[torch.tensor([0, 1, 2, 7, 8])] = 0.0  # the subset: 7 of 12 tokens
    q = q / q.sum()
    accept = torch.where(q > 0, torch.minimum(torch.ones_like(p), p / q.clamp(min=1e-300)), torch.zeros_like(p))
    p_reject = 1.0 - (q * accept).sum()
    residual = (p - q).clamp(min=0)
    law = q * accept + p_reject * residual / residual.sum()
    torch.testing.assert_close(law, p, atol=1e-12, rtol=0)
    assert float(p_reject) == pytest.approx(1 - float(spec.acceptance_rate(p, q)))


def test_fr_spec_sampling_keeps_the_target_law():
    """The check's exact-law test with a draft whose q is 0 outside a subset {1, 2} of 4 tokens at every
    position (as an FR-Spec head gives): the law of verify's output is still the closed form."""
    q = torch.tensor([[0.0, 0.6, 0.4, 0.0], [0.0, 0.5, 0.5, 0.0]], dtype=torch.float64)
    p = torch.tensor([[0.3, 0.2, 0.1, 0.4], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    _law_ok(LawCase("subset draft", p, q, torch.tensor([1, 2]), 4000, "q = 0 outside {1, 2}"), 7)


def test_fr_spec_sampled_speculation_runs_end_to_end():
    """Temperature 1 with an FR-Spec draft on a tiny Llama: tokens outside the subset still come out (from the
    target's residual or bonus), and the draft only ever proposes tokens inside it."""
    target = _spicy(3, 2.0)
    keep = torch.arange(0, 128, 2)  # the even token ids
    draft = drafts.fr_spec_draft(drafts.quantized_draft(target), keep)
    proposed = []
    real_call = draft.forward

    def spy(ids, cache=None):
        logits = real_call(ids, cache=cache)
        proposed.append(torch.isinf(logits[0, -1, 1::2]).all().item())
        return logits

    draft.forward = spy
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(0))
    out = spec.speculative_generate(target, draft, ids, 40, k=3, temperature=1.0,
                                    generator=torch.Generator().manual_seed(1))
    assert out.shape == (1, 45) and all(proposed) and (out[0, 5:] % 2 == 1).any()


def test_distilled_draft_loader_roundtrip_and_clear_error(tmp_path):
    target = tiny_model(seed=2, n_layers=3)
    with pytest.raises(FileNotFoundError, match="tools/distill_draft.py"):
        drafts.load_distilled_draft(target, 1, path=tmp_path / "missing.pt")
    d = drafts.build_distilled_draft(target, 1, init_from=[2])
    assert d.embed is target.embed and d.layers[0] is not target.layers[2]
    with torch.no_grad():
        for p in d.layers.parameters():
            p.add_(0.01)
    drafts.save_distilled_draft(d, tmp_path / "d.pt", steps=3)
    loaded = drafts.load_distilled_draft(target, 1, path=tmp_path / "d.pt")
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), d(ids))
    with pytest.raises(ValueError):
        drafts.load_distilled_draft(target, 2, path=tmp_path / "d.pt")
    with pytest.raises(ValueError):
        drafts.build_distilled_draft(target, 2, init_from=[0, 3])


@pytest.mark.model
def test_smollm2_fr_spec_int8_draft_is_exact_and_cheaper(smollm2):
    from lib.modeling.text import load_text

    model, tok = smollm2
    text = tok(load_text("hamlet"), return_tensors="pt").input_ids[0]
    keep = drafts.frequency_ranked_ids(drafts.token_counts(text[: int(0.8 * text.numel())], 49152), 4096)
    draft = drafts.fr_spec_draft(drafts.quantized_draft(model), keep)
    assert draft.lm_head.head.qweight.shape == (4096, 576)
    ids = tok("To be, or not to be, that is the question:", return_tensors="pt").input_ids
    stats = spec.SpecStats()
    assert torch.equal(spec.speculative_generate(model, draft, ids, 32, k=3, stats=stats), generate(model, ids, 32))
    # An int8 copy of the target agrees with it most of the time (a random draft: 0.03-0.05). How often exactly
    # depends on the int8 kernels' rounding, which differs by device and CPU class: 21/33 = 0.636 on an AMD EPYC
    # (AVX-512 VNNI), 0.556 on an Intel Xeon with AMX and on an H100 (32 tokens, K = 3: a few dozen draws).
    assert stats.acceptance_rate > 0.4, stats


# --- a draft head reading the target's hidden state (lib.spec_decode.draft_head, EAGLE-style + FR-Spec) -----------------------

def _repeat_head(target, keep):
    """A head built by hand: fc copies h_j, the block is the identity (all its matrices zero), so the predicted
    feature is h_j itself and the head drafts the target's greedy token after position j — it proposes to repeat
    the newest token. Right exactly where the target repeats itself, so rounds both accept and reject."""
    from lib.spec_decode.draft_head import DraftHead

    d = target.config.d_model
    head = DraftHead(target.config, target.embed.weight, keep, d_ff=32)
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.zeros(d, d), torch.eye(d)], dim=1))
        for name, p in head.block.named_parameters():
            if "norm" not in name:
                p.zero_()
    return head.eval()


def _looping_target():
    """A tiny target whose greedy continuation sometimes repeats its newest token and sometimes does not."""
    return _spicy(3)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_draft_head_greedy_equals_target_greedy_and_counts_alpha(k):
    from lib.spec_decode.draft_head import head_speculative_generate
    from lib.modeling.fast import FastLlama

    seed = int(torch.randint(0, 2**31, ()).item())
    print("seed", seed)
    model = _looping_target()
    keep = torch.randperm(128, generator=torch.Generator().manual_seed(seed))[:96]
    total = spec.SpecStats()
    for target in (model, FastLlama(model)):
        for prompt_seed in (0, 1, 2, seed):  # fixed prompts make sure rounds both accept and reject
            head = _repeat_head(model, keep)
            drafts = []  # (position of the drafted token, token), recorded from the head's own output
            real_forward = head.forward

            def logged(tokens, hidden, cache=None, real_forward=real_forward, head=head, drafts=drafts):
                logits, feat = real_forward(tokens, hidden, cache)
                drafts.append((cache.length + 1, int(head.keep_ids[logits[0, -1].argmax()])))
                return logits, feat

            head.forward = logged
            ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(prompt_seed))
            stats = spec.SpecStats()
            got = head_speculative_generate(target, head, ids, 40, k=k, stats=stats)
            want = generate(target, ids, 40)
            assert torch.equal(got, want)
            # α accounting, recomputed from the recorded drafts: a round is a run of consecutive positions; its
            # accepted tokens are the leading drafts equal to the target's greedy tokens
            rounds, accepted = [], 0
            for pos, tok in drafts:
                if rounds and pos == rounds[-1][-1][0] + 1 and len(rounds[-1]) < k:
                    rounds[-1].append((pos, tok))
                else:
                    rounds.append([(pos, tok)])
            for r in rounds:
                for pos, tok in r:
                    if tok != int(want[0, pos]):
                        break
                    accepted += 1
            assert stats.drafted == len(drafts) == stats.draft_calls and stats.accepted == accepted
            assert stats.tokens == 40 == 1 + stats.accepted + stats.rounds and stats.target_calls == 1 + stats.rounds
            assert all(tok in keep.tolist() for _, tok in drafts)  # FR-Spec: only kept tokens are drafted
            total.accepted += stats.accepted
            total.drafted += stats.drafted
    assert 0 < total.accepted < total.drafted  # the case exercises acceptance and rejection


def test_draft_head_sampling_keeps_the_target_law():
    """Temperature 1: the second new token (the first one drafted) has the target's marginal law, with a head
    that can only draft 6 of the 8 tokens (exact binomial bounds on three groups of tokens, per-run seed)."""
    from lib.spec_decode.draft_head import DraftHead, head_speculative_generate

    seed = int(torch.randint(0, 2**31, ()).item())
    print("seed", seed)
    target = tiny_model(seed=5, vocab_size=8)
    head = DraftHead(target.config, target.embed.weight, torch.arange(6), d_ff=32).eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        p1 = torch.softmax(target(ids)[0, -1].double(), -1)  # [8]
        seconds = torch.cat([ids.repeat(8, 1), torch.arange(8)[:, None]], dim=1)
        p2 = (p1[:, None] * torch.softmax(target(seconds)[:, -1].double(), -1)).sum(0)  # law of the 2nd token
    g = torch.Generator().manual_seed(seed)
    n = 400
    counts = torch.zeros(8, dtype=torch.float64)
    stats = spec.SpecStats()
    for _ in range(n):
        counts[head_speculative_generate(target, head, ids, 3, k=2, temperature=1.0, generator=g, stats=stats)[0, 4]] += 1
    assert 0 < stats.accepted < stats.drafted
    # Most tokens have an expected count below 1 here, where a chi-square statistic is far from its law (a run
    # once reached 86 with the law kept). So: exact binomial bounds on three groups — the target's likely token,
    # the two the head cannot draft, the other five — each at 1e-6 / 3 (a correct sampler fails < 1e-6).
    for group in ([3], [6, 7], [0, 1, 2, 4, 5]):
        p, got = float(p2[group].sum()), int(counts[group].sum())
        pmf = torch.distributions.Binomial(n, torch.tensor(p, dtype=torch.float64)).log_prob(
            torch.arange(n + 1, dtype=torch.float64)).exp()
        low, high = pmf.cumsum(0), pmf.flip(0).cumsum(0).flip(0)  # P[X <= k], P[X >= k]
        assert low[got] > 1e-6 / 6 and high[got] > 1e-6 / 6, (group, got, n * p, counts, n * p2)


def test_draft_head_loss_top1_is_the_heads_agreement():
    from lib.spec_decode.draft_head import head_loss, target_forward

    target = _looping_target()
    head = _repeat_head(target, torch.arange(128))
    ids = torch.randint(0, 128, (4, 5), generator=torch.Generator().manual_seed(0))
    seqs = generate(target, ids, 20)
    with torch.no_grad():
        logits, hidden = target_forward(target, seqs)
        labels = logits.argmax(-1)
        mask = torch.zeros_like(seqs, dtype=torch.bool)
        mask[:, 4:-1] = True
        loss, top1 = head_loss(head, seqs, hidden, labels, mask)
    # the repeat head drafts, after position j + 1, the target's greedy token after position j
    m = mask[:, 1:]
    assert top1 == pytest.approx((labels[:, :-1] == labels[:, 1:])[m].float().mean().item())
    assert torch.isfinite(loss) and loss > 0


def test_draft_head_save_load_roundtrip_and_errors(tmp_path):
    from lib.spec_decode.draft_head import DraftHead, head_speculative_generate, load_draft_head, save_draft_head

    target = tiny_model(seed=2)
    with pytest.raises(FileNotFoundError, match="tools/train_draft_head.py"):
        load_draft_head(target, tmp_path / "missing.pt")
    with pytest.raises(ValueError):
        DraftHead(target.config, target.embed.weight, torch.tensor([1, 1]))
    with pytest.raises(ValueError):
        DraftHead(target.config, target.embed.weight, torch.tensor([128]))
    torch.manual_seed(0)
    head = DraftHead(target.config, target.embed.weight, torch.tensor([5, 3, 9]), d_ff=48).eval()
    save_draft_head(head, tmp_path / "h.pt", steps=7)
    loaded = load_draft_head(target, tmp_path / "h.pt")
    assert loaded.keep_ids.tolist() == [5, 3, 9] and loaded.config.d_ff == 48 and loaded.meta["steps"] == 7
    tokens = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    hidden = torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = head(tokens, hidden)[0], loaded(tokens, hidden)[0]
    assert (got - want).abs().max() < 0.02 * want.abs().max()  # int8 per-row storage
    with pytest.raises(ValueError):
        loaded(tokens, hidden[:, :5])
    with pytest.raises(ValueError):
        head_speculative_generate(target, loaded, torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError):
        head_speculative_generate(target, loaded, torch.zeros(1, 3, dtype=torch.long), 4, k=0)
    with pytest.raises(ValueError):
        head_speculative_generate(tiny_model(seed=0, vocab_size=64), loaded, torch.zeros(1, 3, dtype=torch.long), 4)


@pytest.mark.model
def test_smollm2_committed_draft_head_is_exact_and_drafts_the_target(smollm2):
    """The committed head (data/draft_head/head.pt) on a chat prompt it was not trained on: greedy output equal to
    the target's, and α well above a head that knows nothing (measured 0.14–0.20 per drafted token on the
    benchmark's chat prompts; a random head of this shape agrees on ≈ 0)."""
    from lib.spec_decode.draft_head import head_speculative_generate, load_draft_head
    from lib.modeling.fast import FastLlama

    model, tok = smollm2
    head = load_draft_head(model)
    assert head.keep_ids.numel() == 4096 and head.meta["seed"] == 0
    target = FastLlama(model)
    ids = spec.chat_ids(tok, "Explain what a hash table is to a beginner.")
    stats = spec.SpecStats()
    assert torch.equal(head_speculative_generate(target, head, ids, 32, k=2, stats=stats), generate(target, ids, 32))
    assert stats.acceptance_rate > 0.05
