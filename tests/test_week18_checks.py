"""Week 18's checks accept the reference and reject each wrong route (listed in solutions/18/README.md)."""
import pytest
import torch

from grader.checks import week18 as checks
from lib import speculative as spec
from lib.generate import generate


def _rejects(check, fn, match=None, errors=AssertionError, **kwargs):
    with pytest.raises(errors, match=match):
        check(fn, **kwargs)


# --- 1: speculative_generate --------------------------------------------------------------------------------

def _greedy_spec(target, draft, ids, n, k=4, rollback_draft=True, rollback_target=True):
    """A correct greedy speculative loop (its own), with switches that break the rollback."""
    out = ids[0].tolist()
    t0 = len(out)
    tc, dc = target.new_cache(1, t0 + n + k + 1), draft.new_cache(1, t0 + n + k + 1)
    while len(out) - t0 < n:
        kk = min(k, n - (len(out) - t0) - 1)
        drafted = []
        for _ in range(kk):
            drafted.append(int(draft(torch.tensor([(out + drafted)[dc.length:]]), cache=dc)[0, -1].argmax()))
        best = target(torch.tensor([(out + drafted)[tc.length:]]), cache=tc)[0, -(kk + 1):].argmax(-1).tolist()
        m = 0
        while m < kk and drafted[m] == best[m]:
            m += 1
        out += drafted[:m] + [best[m]]
        if rollback_target:
            tc.truncate(min(tc.length, len(out) - 1))
        if rollback_draft:
            dc.truncate(min(dc.length, len(out) - 1))
    return torch.tensor([out])


def test_speculative_generate_accepts_an_own_loop():
    # (lib's own speculative_generate is rejected by design: the check forbids calling lib.speculative)
    checks.check_speculative_generate(_greedy_spec, smollm2=False)


def test_speculative_generate_rejects_target_alone():
    _rejects(checks.check_speculative_generate, lambda t, d, ids, n, k=4: generate(t, ids, n), smollm2=False)


def test_speculative_generate_rejects_token_by_token_with_an_idle_draft():
    def one_by_one(t, d, ids, n, k=4):
        d(ids)  # touch the draft, then decode with the target alone, one call per token
        return generate(t, ids, n)
    _rejects(checks.check_speculative_generate, one_by_one, smollm2=False)


def test_speculative_generate_rejects_lib_under_another_name():
    _rejects(checks.check_speculative_generate, lambda t, d, ids, n, k=4: spec.speculative_generate(t, d, ids, n, k=k),
             match="own loop", smollm2=False)


def test_speculative_generate_rejects_missing_rollbacks():
    _rejects(checks.check_speculative_generate,
             lambda t, d, ids, n, k=4: _greedy_spec(t, d, ids, n, k, rollback_target=False), smollm2=False,
             errors=(AssertionError, IndexError))  # the loop itself breaks: the target returns too few logits
    _rejects(checks.check_speculative_generate,
             lambda t, d, ids, n, k=4: _greedy_spec(t, d, ids, n, k, rollback_draft=False), smollm2=False,
             errors=(AssertionError, IndexError))


def test_speculative_generate_rejects_wrong_length():
    _rejects(checks.check_speculative_generate,
             lambda t, d, ids, n, k=4: _greedy_spec(t, d, ids, n + 1, k)[:, :ids.shape[1] + n + (n % 2)],
             smollm2=False)


# --- 2: verify ------------------------------------------------------------------------------------------------

def _verify(target_probs, draft_probs, draft_tokens, generator=None, residual="p_minus_q", ratio="p_over_q"):
    k = draft_tokens.shape[0]
    for i in range(k):
        x = int(draft_tokens[i])
        p, q = float(target_probs[i, x]), float(draft_probs[i, x])
        r = (p / q if q > 0 else 1.0) if ratio == "p_over_q" else (q / p if p > 0 else float("inf"))
        if torch.rand((), generator=generator).item() < min(1.0, r):
            continue
        res = (target_probs[i] - draft_probs[i]).clamp(min=0) if residual == "p_minus_q" else target_probs[i]
        if res.sum() <= 0:
            res = target_probs[i]
        return i, int(torch.multinomial(res, 1, generator=generator))
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator))


def test_verify_accepts_an_own_version():
    checks.check_verify(_verify)


def test_verify_rejects_residual_from_p():
    _rejects(checks.check_verify, lambda *a, generator=None: _verify(*a, generator=generator, residual="p"),
             match="law")


def test_verify_rejects_flipped_ratio_that_accepts_p_zero_tokens():
    _rejects(checks.check_verify, lambda *a, generator=None: _verify(*a, generator=generator, ratio="q_over_p"))


def test_verify_rejects_always_accept():
    def always(tp, dp, tok, generator=None):
        k = tok.shape[0]
        return k, int(torch.multinomial(tp[k], 1, generator=generator))
    _rejects(checks.check_verify, always)


def test_verify_rejects_lib_under_another_name():
    _rejects(checks.check_verify, lambda *a, generator=None: spec.verify(*a, generator=generator), match="your own")


def test_chi_square_statistic_of_the_wrong_residual_is_far_above_the_bound():
    counts = checks.joint_law_counts(lambda *a, generator=None: _verify(*a, generator=generator, residual="p"),
                                     2, checks.VERIFY_TRIALS, 1)
    stat, df, bound, _ = checks.chi_square(counts)
    assert stat > 2 * bound, (stat, bound)


# --- 3, 4: theory -------------------------------------------------------------------------------------------

def test_acceptance_rate_check():
    checks.check_acceptance_rate(spec.acceptance_rate)
    _rejects(checks.check_acceptance_rate, lambda p, q: (p * q).sum(-1))
    _rejects(checks.check_acceptance_rate, lambda p, q: torch.clamp(p / q, max=1).mean(-1))
    _rejects(checks.check_acceptance_rate, lambda p, q: torch.minimum(p, q).sum())  # not per distribution


def test_expected_tokens_per_call_check():
    checks.check_expected_tokens_per_call(spec.expected_tokens_per_call)
    _rejects(checks.check_expected_tokens_per_call, lambda a, k: 3.6 if (a, k) == (0.7, 4) else
             spec.expected_tokens_per_call(a, k))
    _rejects(checks.check_expected_tokens_per_call, lambda a, k: 1 + a * k)  # every token accepted independently
    _rejects(checks.check_expected_tokens_per_call, lambda a, k: (1 - a ** k) / (1 - a) if a < 1 else k)  # no bonus


# --- 5, 6: speedup model, quiz ------------------------------------------------------------------------------

def test_predicted_speedup_check():
    def own(alpha, k, c, verify_cost):
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
        return tokens / (k * c + verify_cost[k + 1])
    checks.check_predicted_speedup(own)
    _rejects(checks.check_predicted_speedup, spec.predicted_speedup, match="own formula")
    _rejects(checks.check_predicted_speedup, lambda a, k, c, v: own(a, k, 0.0, v))  # the draft costs nothing
    _rejects(checks.check_predicted_speedup, lambda a, k, c, v: own(a, k, c, {**v, k + 1: v[k]}))  # verifies K, not K + 1
    _rejects(checks.check_predicted_speedup, lambda a, k, c, v: own(a, k, c, {m: 1.0 for m in v}))  # assumes a flat curve


def test_quiz_checks():
    checks.check_answer_q5(lambda: 0.5)
    _rejects(checks.check_answer_q5, lambda: 2.0, match="upside down")
    _rejects(checks.check_answer_q5, lambda: 0.3)
    checks.check_answer_q6(lambda: spec.expected_tokens_per_call(0.8, 4) / 1.2)
    _rejects(checks.check_answer_q6, lambda: spec.expected_tokens_per_call(0.8, 4))
