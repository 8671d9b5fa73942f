"""Week 18 — speculative decoding: the milestone checks, used by solutions/18/test_week18.py and the notebook.

One `check_<name>` per exercise; each takes the student's function and raises AssertionError with a message
that says what is wrong. The references are in lib/speculative.py. Notation: p = target, q = draft.

Test models: besides tiny random Llamas and SmolLM2, the checks use `MarkovLM`, a second-order Markov chain
with a model's call shape whose "cache" is the token history. It is fast, its greedy path wanders, and it
punishes a missing rollback: a history that still holds rejected tokens gives other logits.
"""
from __future__ import annotations

import functools
import math

import torch

from grader.checks import CountingModel, call_many, generator, observe, seed_note
from grader.harness import Week
from lib import speculative as ref
from lib.generate import generate as ref_generate
from lib.model import ModelConfig, tiny_model

WEEK = Week(18, "week18_speculative.ipynb")

SMOLLM2_PROMPT = "To be, or not to be, that is the question:"
SMOLLM2_NEW_TOKENS = 64
SMOLLM2_KS = (1, 2, 4, 8)
FALSE_FAILURE = 1e-6  # statistical checks: a correct implementation fails less often than this


# --- test models ----------------------------------------------------------------------------------------

class _History:
    # The same as lib.speculative's token-history cache, written again on purpose: the student's code truncates
    # this cache, and a call into lib.speculative during the student's run is what ex01's route check rejects.
    def __init__(self, max_len: int):
        self.tokens: list[int] = []
        self.max_len = max_len

    @property
    def length(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"truncate({n}): the cache holds {len(self.tokens)} positions")
        del self.tokens[n:]

    crop = truncate


class MarkovLM:
    """logits(next | ..., a, b) = A[b] + B[a]: a second-order Markov chain with a language model's call shape.

    `model(ids [1, t], cache=model.new_cache(1, n)) -> logits [1, t, vocab]`; the cache is the token history
    (`length`, `truncate(n)`, `crop(n)`), so the logits depend on every token the cache holds."""

    def __init__(self, vocab_size: int, seed: int, scale: float = 3.0, like: "MarkovLM | None" = None,
                 noise: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        self.config = ModelConfig(vocab_size=vocab_size, d_model=1, n_layers=1, n_heads=1, n_kv_heads=1, d_ff=1,
                                  max_seq_len=4096)
        self.device = torch.device("cpu")
        if like is None:
            self.A = scale * torch.randn(vocab_size, vocab_size, generator=g)
            self.B = scale * torch.randn(vocab_size, vocab_size, generator=g)
        else:  # a draft: the target's tables plus noise
            self.A = like.A + noise * torch.randn(vocab_size, vocab_size, generator=g)
            self.B = like.B + noise * torch.randn(vocab_size, vocab_size, generator=g)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> _History:
        return _History(max_len or self.config.max_seq_len)

    def __call__(self, input_ids: torch.Tensor, cache: _History | None = None) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"MarkovLM takes input_ids [1, t]; got {tuple(input_ids.shape)}")
        history = cache if cache is not None else _History(self.config.max_seq_len)
        start = history.length
        history.tokens.extend(input_ids[0].tolist())
        seq = torch.tensor(history.tokens)
        prev = torch.cat([seq.new_zeros(1), seq[:-1]])  # the token before each position (0 before the first)
        rows = torch.arange(start, len(history.tokens))
        return (self.A[seq[rows]] + self.B[prev[rows]])[None]  # [1, t, vocab]

    forward = __call__


def _spicy_tiny(seed: int, scale: float = 10.0):
    """A tiny random Llama with weights scaled up, so that its greedy path does not repeat one token."""
    model = tiny_model(seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(scale)
    return model


# --- 1 ------------------------------------------------------------------------------------------------

def _check_one_generation(speculative_generate, target, draft, ids, n, k, what):
    spy_t, spy_d = CountingModel(target), CountingModel(draft)
    got = speculative_generate(spy_t, spy_d, ids, n, k=k)
    want = ref_generate(target, ids, n)
    stats = ref.SpecStats()
    ref.speculative_generate(target, draft, ids, n, k=k, stats=stats)
    assert isinstance(got, torch.Tensor), f"{what}: returned {type(got).__name__}, expected a tensor of ids"
    assert tuple(got.shape) == tuple(want.shape), (
        f"{what}: returned ids of shape {tuple(got.shape)}; expected [1, prompt + max_new_tokens] = "
        f"{tuple(want.shape)} (exactly max_new_tokens new tokens: draft fewer near the end)")
    if not torch.equal(got.cpu(), want.cpu()):
        bad = (got.cpu() != want.cpu()).nonzero()[0, 1].item()
        raise AssertionError(
            f"{what}: token {bad - ids.shape[1]} differs from greedy decoding with the target alone "
            f"(got {got[0, bad].item()}, target greedy {want[0, bad].item()}). Keep draft tokens only while they "
            f"equal the target's argmax, then add the target's own token; after each round, truncate both caches "
            f"to the tokens kept. {seed_note()}")
    assert spy_d.calls, f"{what}: the draft model was never called: draft tokens with it, then verify with the target"
    calls = len(spy_t.calls)
    assert calls <= stats.target_calls + 1, (
        f"{what}: the target was called {calls} times; speculative decoding needs {stats.target_calls} here (one "
        f"call per round, each round scoring all K draft tokens at once). Too many calls usually means a cache that "
        f"was not rolled back, so the draft (or the target) sees rejected tokens. {seed_note()}")
    return spy_t.calls


@WEEK.exercise(1, "speculative_generate", section="2 (Greedy speculation and rollback)")
def check_speculative_generate(speculative_generate, smollm2: bool = True) -> None:
    """Greedy speculative decoding == greedy decoding with the target alone, with fewer target calls.

    Markov chains (drafts from perfect to poor) and tiny Llamas with real KV caches, K in {1, 2, 4, 8};
    then SmolLM2 (64 tokens) with prompt lookup as the draft (no weights: cheap, and it agrees about half the time)."""
    g = generator(0)
    vocab = 24
    for case in range(4):
        seed = int(torch.randint(0, 2**30, (1,), generator=g))
        target = MarkovLM(vocab, seed)
        ids = torch.randint(0, vocab, (1, 3 + case), generator=g)
        for noise, k in [(0.0, 1 + case), (1.5, 1), (1.5, 2), (1.5, 4), (3.0, 8), (20.0, 3)]:
            draft = MarkovLM(vocab, seed + 1, like=target, noise=noise)
            n = 20 + 3 * case
            calls = _check_one_generation(speculative_generate, target, draft, ids, n, k,
                                          f"Markov target, draft noise {noise}, K={k}, {n} tokens")
            if noise == 0.0:  # a perfect draft: every round must keep all K and add one
                most = math.ceil(n / (k + 1)) + 1
                assert len(calls) <= most, (
                    f"with a draft identical to the target and K={k}, every draft token is accepted, so {n} tokens "
                    f"need at most {most} target calls; yours made {len(calls)} (tokens per call: {calls[:8]}...). "
                    f"Running the target once per token is not speculative decoding.")
    for seed in (3, 4):
        target, draft = _spicy_tiny(seed), _spicy_tiny(seed + 10, scale=6.0)
        ids = torch.randint(0, target.config.vocab_size, (1, 4), generator=g)
        for k in (1, 3, 8):
            _check_one_generation(speculative_generate, target, draft, ids, 24, k,
                                  f"tiny Llama (seed {seed}) with a random draft, K={k}")
        _check_one_generation(speculative_generate, target, ref.early_exit_draft(target, 1), ids, 24, 2,
                              f"tiny Llama (seed {seed}) with its first layer as the draft, K=2")
    # The route: no lib.speculative, no lib.generate inside.
    target = MarkovLM(vocab, 7)
    _, obs = observe(speculative_generate, target, MarkovLM(vocab, 8, like=target, noise=1.0),
                     torch.tensor([[1, 2, 3]]), 12, k=3)
    used = sorted(c for c in obs.lib_calls if c.startswith(("lib.speculative.", "lib.generate.")))
    assert not used, f"speculative_generate must be your own loop; it called {used}"
    if smollm2:
        _check_smollm2(speculative_generate)


@functools.lru_cache(maxsize=1)
def smollm2_case():
    """SmolLM2, the prompt's ids, its greedy continuation and a prompt-lookup draft (built once per process)."""
    from lib.model import shared_smollm2

    model, tok = shared_smollm2()
    ids = tok(SMOLLM2_PROMPT, return_tensors="pt").input_ids.to(model.device)
    return model, ids, ref_generate(model, ids, SMOLLM2_NEW_TOKENS), ref.PromptLookupDraft(model.config.vocab_size, device=model.device)


def _check_smollm2(speculative_generate):
    model, ids, want, draft = smollm2_case()
    for k in SMOLLM2_KS:
        spy = CountingModel(model)
        got = speculative_generate(spy, draft, ids, SMOLLM2_NEW_TOKENS, k=k)
        assert tuple(got.shape) == tuple(want.shape), f"SmolLM2, K={k}: ids of shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if not torch.equal(got.cpu(), want.cpu()):
            bad = (got.cpu() != want.cpu()).nonzero()[0, 1].item()
            raise AssertionError(f"SmolLM2, K={k}, prompt-lookup draft: token {bad - ids.shape[1]} differs from the target's "
                                 f"greedy decoding")
        assert len(spy.calls) < SMOLLM2_NEW_TOKENS, (
            f"SmolLM2, K={k}: {len(spy.calls)} target calls for {SMOLLM2_NEW_TOKENS} tokens; the prompt-lookup draft "
            f"agrees with the target about half the time here, so speculation needs fewer calls than tokens")


# --- 2 ------------------------------------------------------------------------------------------------

def chi2_sf(x: float, df: int) -> float:
    """P[χ²_df > x] (the regularized upper incomplete gamma function)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def chi2_bound(df: int, tail: float) -> float:
    """The x with P[χ²_df > x] = tail, by bisection."""
    lo, hi = 0.0, 10.0 * df + 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > tail else (lo, mid)
    return hi


# Conditional tables of a two-token law on a 4-token vocabulary: p (target) and q (draft), p(x2 | x1) per row.
# q puts mass where p has none (token 3 first, token 0 second): accepting such a token is a hard failure.
_P1 = [0.50, 0.30, 0.20, 0.00]
_Q1 = [0.10, 0.30, 0.20, 0.40]
_P2 = [[0.00, 0.60, 0.10, 0.30], [0.00, 0.10, 0.10, 0.80], [0.00, 0.50, 0.50, 0.00], [0.00, 0.25, 0.25, 0.50]]
_Q2 = [[0.70, 0.10, 0.10, 0.10], [0.25, 0.25, 0.25, 0.25], [0.20, 0.10, 0.60, 0.10], [0.10, 0.20, 0.30, 0.40]]
VERIFY_TRIALS = 6000
VERIFY_KS = (1, 2, 3)
VERIFY_SEED = 18_000  # fixed seed family of the statistical test (bound sized for it)


def joint_law_counts(verify, k: int, trials: int, seed: int) -> torch.Tensor:
    """Counts [4, 4] of the first two tokens emitted by speculative sampling with `verify` (K draft tokens
    from q, verified against p; after a rejection at the first token, the second comes from p directly)."""
    p1, q1 = torch.tensor(_P1, dtype=torch.float64), torch.tensor(_Q1, dtype=torch.float64)
    p2, q2 = torch.tensor(_P2, dtype=torch.float64), torch.tensor(_Q2, dtype=torch.float64)
    uniform = torch.full((4,), 0.25, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(4, 4, dtype=torch.int64)
    trial_drafts, calls = [], []
    for t in range(trials):
        drafts, q_rows, p_rows = [], [], [p1]
        for i in range(k):  # the draft's chain: token 1 from q1, token 2 from q2(. | token 1), later ones uniform
            q = q1 if i == 0 else q2[drafts[0]] if i == 1 else uniform
            drafts.append(int(torch.multinomial(q, 1, generator=gen)))
            q_rows.append(q)
            p_rows.append(p2[drafts[0]] if i == 0 else uniform)  # p after the draft tokens so far
        trial_drafts.append(drafts)
        # each trial verifies with its own generator, so all trials go to verify in one batch (call_many)
        calls.append(((torch.stack(p_rows), torch.stack(q_rows), torch.tensor(drafts, dtype=torch.int64)),
                      {"generator": torch.Generator().manual_seed(seed * 100_003 + t)}))
    results = call_many(verify, calls)
    for drafts, out in zip(trial_drafts, results):
        n, nxt = int(out[0]), int(out[1])
        emitted = drafts[:n] + [nxt]
        if len(emitted) < 2:  # rejected at the first token: the next round samples the second from p
            emitted.append(int(torch.multinomial(p2[emitted[0]], 1, generator=gen)))
        counts[emitted[0], emitted[1]] += 1
    return counts


def chi_square(counts: torch.Tensor) -> tuple[float, int, float, list]:
    """(statistic, degrees of freedom, bound, impossible cells hit) for counts against p(x1) p(x2 | x1)."""
    law = torch.tensor(_P1, dtype=torch.float64)[:, None] * torch.tensor(_P2, dtype=torch.float64)  # [4, 4]
    n = counts.sum().item()
    possible = law > 0
    impossible = [tuple(ix) for ix in (counts.gt(0) & ~possible).nonzero().tolist()]
    expected = n * law[possible]
    stat = float(((counts[possible].double() - expected) ** 2 / expected).sum())
    df = int(possible.sum()) - 1
    return stat, df, chi2_bound(df, FALSE_FAILURE / len(VERIFY_KS)), impossible


@WEEK.exercise(2, "verify", section="3 (Speculative sampling)")
def check_verify(verify) -> None:
    """Exact cases (perfect draft, impossible draft tokens, shapes), then the law: the first two emitted tokens
    must follow p(x1) p(x2 | x1), by a chi-square test sized so a correct verify fails < 1e-6 of runs."""
    g = generator(1)
    for case in range(30):
        k, v = 1 + case % 5, 3 + case % 7
        q = torch.softmax(2 * torch.randn(k, v, generator=g), -1)
        tokens = torch.multinomial(q, 1, generator=g)[:, 0]
        p = torch.softmax(2 * torch.randn(k + 1, v, generator=g), -1)
        p[:k] = q  # the draft is the target: every token is accepted, then a bonus token from p_K
        p[k, case % v] = 0.0
        p[k] /= p[k].sum()
        out = verify(p, q, tokens, generator=g)
        assert isinstance(out, tuple) and len(out) == 2, f"verify must return (n_accepted, next_token); got {out!r}"
        n, nxt = int(out[0]), int(out[1])
        assert n == k, (f"draft == target (q_i = p_i at every position), K={k}: every token must be accepted "
                        f"(min(1, p/q) = 1), but verify returned n_accepted={n} {seed_note()}")
        assert nxt != case % v and 0 <= nxt < v, (
            f"all K={k} accepted: the bonus token is sampled from p_K (target_probs[K]), which gives token "
            f"{case % v} probability 0, but verify returned {nxt} {seed_note()}")
        # the same, with the target giving probability 0 to draft token j: reject there, never emit it
        j = case % k
        p2 = p.clone()
        p2[j, tokens[j]] = 0.0
        p2[j] /= p2[j].sum()
        n, nxt = (int(x) for x in verify(p2, q, tokens, generator=g))
        assert n == j, (f"K={k}: p_{j}(draft token {j}) = 0 (the target never writes it), so verify must stop at "
                        f"position {j}; it returned n_accepted={n} (accept with probability min(1, p/q), not "
                        f"min(1, q/p)) {seed_note()}")
        assert nxt != int(tokens[j]), (
            f"K={k}: after rejecting draft token {j}, the next token comes from normalize(max(p - q, 0)), which "
            f"gives the rejected token (p = 0) probability 0; verify returned it {seed_note()}")
    for k in VERIFY_KS:
        counts = joint_law_counts(verify, k, VERIFY_TRIALS, VERIFY_SEED + k)
        stat, df, bound, impossible = chi_square(counts)
        assert not impossible, (
            f"K={k}: speculative sampling emitted token pairs the target gives probability 0: {impossible}. "
            f"A token with p(x) = 0 must never be accepted (accept with probability min(1, p/q)), nor resampled "
            f"(the residual is max(p - q, 0)).")
        assert stat <= bound, (
            f"K={k}: the first two emitted tokens do not follow the target's law: chi-square {stat:.1f} with {df} "
            f"degrees of freedom over {VERIFY_TRIALS} runs, bound {bound:.1f} (a correct verify exceeds it with "
            f"probability < {FALSE_FAILURE:g}). Observed counts {counts.tolist()}. Check the residual: after a "
            f"rejection sample from normalize(max(p_i - q_i, 0)), not from p_i.")
    # The route: not lib's verify under another name.
    p = torch.softmax(torch.randn(3, 5, generator=g), -1)
    q = torch.softmax(torch.randn(2, 5, generator=g), -1)
    _, obs = observe(verify, p, q, torch.tensor([1, 2]), generator=torch.Generator().manual_seed(0))
    used = sorted(c for c in obs.lib_calls if c.startswith("lib.speculative."))
    assert not used, f"verify must be your own; it called {used}"


# --- 3 ------------------------------------------------------------------------------------------------

@WEEK.exercise(3, "acceptance_rate", section="4 (Acceptance: theory and measurement)")
def check_acceptance_rate(acceptance_rate) -> None:
    g = generator(2)
    for shape in [(5,), (3, 7), (2, 4, 49)]:
        p = torch.softmax(3 * torch.randn(shape, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(3 * torch.randn(shape, generator=g, dtype=torch.float64), -1)
        got = acceptance_rate(p, q)
        want = ref.acceptance_rate(p, q)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape), (
            f"acceptance_rate(p, q) for p, q of shape {shape}: expected a tensor of shape {tuple(want.shape)} "
            f"(one α per distribution, summed over the last axis), got {getattr(got, 'shape', got)}")
        err = (got.double() - want).abs().max().item()
        assert err < 1e-9, (f"acceptance_rate differs from Σ_x min(p(x), q(x)) by {err:.3g}: a token x drawn from q "
                            f"is accepted with probability min(1, p(x)/q(x)); average that over q {seed_note()}")
    p = torch.tensor([0.2, 0.8], dtype=torch.float64)
    assert abs(float(acceptance_rate(p, p)) - 1.0) < 1e-12, "a draft equal to the target is always accepted: α = 1"
    assert abs(float(acceptance_rate(p, p.flip(0))) - 0.4) < 1e-12, "p = (0.2, 0.8), q = (0.8, 0.2) gives α = 0.4"


@WEEK.exercise(4, "expected_tokens_per_call", section="4 (Acceptance: theory and measurement)")
def check_expected_tokens_per_call(expected_tokens_per_call) -> None:
    got = float(expected_tokens_per_call(0.7, 4))
    assert abs(got - 2.7731) < 1e-3, (
        f"expected_tokens_per_call(0.7, 4) = {got:.4f}; expected 1 + 0.7 + 0.7² + 0.7³ + 0.7⁴ = 2.7731 (the seed's "
        f"3.6 is wrong: it would need α ≈ 0.83)")
    g = generator(3)
    cases = [(0.0, 3), (1.0, 4), (0.5, 1), (0.999999, 8)] + [
        (float(torch.rand((), generator=g)), int(torch.randint(1, 12, (), generator=g))) for _ in range(20)]
    for alpha, k in cases:
        got, want = float(expected_tokens_per_call(alpha, k)), ref.expected_tokens_per_call(alpha, k)
        assert abs(got - want) < 1e-6 * max(1.0, want), (
            f"expected_tokens_per_call({alpha:.6g}, {k}) = {got:.6g}; expected (1 - α^(K+1)) / (1 - α) = {want:.6g} "
            f"(K + 1 when α = 1): token i of the round is kept when the i draft tokens before it were all accepted "
            f"{seed_note()}")


# --- 5 ------------------------------------------------------------------------------------------------

@WEEK.exercise(5, "predicted_speedup", section="6 (The speedup model)")
def check_predicted_speedup(predicted_speedup) -> None:
    g = generator(4)
    for case in range(25):
        alpha = float(torch.rand((), generator=g))
        k = int(torch.randint(1, 12, (), generator=g))
        c = float(torch.rand((), generator=g)) * 0.8
        curve = torch.cumsum(0.3 * torch.rand(16, generator=g), 0)
        verify_cost = {m: 1.0 + float(curve[m - 2]) if m > 1 else 1.0 for m in range(1, 17)}
        got = float(predicted_speedup(alpha, k, c, verify_cost))
        want = ref.predicted_speedup(alpha, k, c, verify_cost)
        assert abs(got - want) <= 1e-6 * want, (
            f"predicted_speedup(alpha={alpha:.4f}, k={k}, c={c:.4f}, verify_cost) = {got:.5g}; expected {want:.5g}: "
            f"a round yields (1 - α^(K+1))/(1 - α) tokens and costs K draft steps (K·c target steps) plus one target "
            f"forward of K + 1 tokens (verify_cost[K + 1] steps) {seed_note()}")
    flat = {m: 1.0 for m in range(1, 17)}
    got = float(predicted_speedup(0.8, 4, 0.05, flat))
    assert abs(got - 2.8013) < 1e-3, f"GPU-like regime (flat verify, c = 0.05), α = 0.8, K = 4: expected 2.80, got {got:.3f}"
    _, obs = observe(predicted_speedup, 0.5, 2, 0.1, flat)
    used = sorted(c for c in obs.lib_calls if c.startswith("lib.speculative."))
    assert not used, f"predicted_speedup must be your own formula; it called {used}"


# --- 6 ------------------------------------------------------------------------------------------------

@WEEK.exercise(6, "answer_q5", section="8 (Check your understanding)")
def check_answer_q5(answer_q5) -> None:
    got = float(answer_q5())
    if abs(got - 2.0) < 1e-6 or abs(got - 1.0) < 1e-6:
        raise AssertionError(f"answer_q5() = {got}: that is min(1, q/p), the ratio upside down. Accept with "
                             f"min(1, p(x)/q(x)), p the target (0.3), q the draft (0.6)")
    assert abs(got - 0.5) < 1e-9, f"answer_q5() = {got}: accept with probability min(1, p(x)/q(x))"


@WEEK.exercise(6, "answer_q6", section="8 (Check your understanding)")
def check_answer_q6(answer_q6) -> None:
    got = float(answer_q6())
    want = ref.expected_tokens_per_call(0.8, 4) / (4 * 0.05 + 1.0)
    assert abs(got - want) < 5e-3, (
        f"answer_q6() = {got:.3f}: tokens per round (1 - α^(K+1))/(1 - α) with α = 0.8, K = 4, over the cost of a "
        f"round in target steps, K·c + 1 with c = 0.05 and a flat verify curve")
