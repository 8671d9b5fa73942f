"""Week 18 — speculative decoding: the milestone checks, used by solutions/18/test_week18.py and the notebook.

One `check_<name>` per exercise; each takes the student's function and raises AssertionError with a message
that says what is wrong. The references are in lib/spec_decode/speculative.py and lib/spec_decode/drafts.py. Notation: p = target, q = draft.

The instruments live beside this file: the test models and the counted spies in `week18_models` (a Markov chain
and position tables with a model's call shape, besides tiny random Llamas and SmolLM2), the exact law of `verify`,
the cases of speculative_sample's law test and their binomial tests in `week18_law`. Their names are imported
here, so `checks.MarkovLM`, `checks.law_cases` etc. work as before from the notebook and the tests.

Every check judges what it observes: where it observes a call (`observe`: which of lib's functions ran, what was
written into the arguments), that call is one of the calls it grades, chosen at random among them where there are
many (`call_many_observing`), and its result is judged with the others' — never thrown away while the numbers come
from unobserved calls.
"""
from __future__ import annotations

import functools
import math

import torch

from grader.checks import (call_many_observing, call_on_default_device, check_on_meta, generator, observe, run_seed,
                           seed_note)
from grader.checks.week18_law import (FALSE_FAILURE, LAW_K, MAIN_RATIOS, MAIN_TRIALS, REPEATS, SAMPLE_CASES,  # noqa: F401
                                      acceptance_band, describe_law, kl_divergence, law_calls, law_cases, law_counts,
                                      law_failures, law_level, law_power, law_tests, sample_failures, sample_law,
                                      sample_level, sample_models, sample_tests)
from grader.checks.week18_models import MarkovLM, TableLM, spicy_tiny, spy, work_failures  # noqa: F401
from grader.checks import week18_batch as batch, week18_predict as predict, week18_tree as tree
from grader.harness import Week
from grader.wire import IsolationError
from lib.spec_decode import drafts
from lib.spec_decode import speculative as ref
from lib.modeling.generate import generate as ref_generate

WEEK = Week(18, "week18_speculative.ipynb", child_may_use={"lib.modeling.kv_cache": ("KVCache",)})

SMOLLM2_PROMPT = "To be, or not to be, that is the question:"
SMOLLM2_NEW_TOKENS = 64
SMOLLM2_KS = (2, 8)


def _loop_lib_calls(obs) -> list:
    """The lib.spec_decode.speculative / lib.spec_decode.drafts / lib.modeling.generate functions a loop ran, other than the test models' own cache."""
    return sorted(c for c in obs.lib_calls if c.startswith(("lib.spec_decode.speculative.", "lib.spec_decode.drafts.", "lib.modeling.generate."))
                  and not c.startswith("lib.spec_decode.drafts.TokenHistory."))


def _check_one_generation(speculative_generate, target, draft, ids, n, k, what, temperature=0.0, generator=None,
                          observed=False):
    """One run through spies: its shape, tokens (greedy: the target's greedy ids), work and rollback; `observed`:
    the run is observed, and its route judged with the rest (no lib.spec_decode.speculative, lib.spec_decode.drafts or lib.modeling.generate)."""
    log = []
    kwargs = {"k": k} if temperature == 0.0 else {"k": k, "temperature": temperature, "generator": generator}
    args = (spy(target, log, "target"), spy(draft, log, "draft"), ids, n)
    if observed:
        got, obs = observe(speculative_generate, *args, **kwargs)
        used = _loop_lib_calls(obs)
        assert not used, f"{what}: the loop must be your own (with your verify, when sampling); it called {used}"
    else:
        got = speculative_generate(*args, **kwargs)
    t_log = [f for f in log if f.who == "target"]
    assert isinstance(got, torch.Tensor), f"{what}: returned {type(got).__name__}, expected a tensor of ids"
    shape = (1, ids.shape[1] + n)
    assert tuple(got.shape) == shape and got.dtype == ids.dtype and got.device == ids.device, (
        f"{what}: returned ids of shape {tuple(got.shape)}, {got.dtype} on {got.device}; expected [1, prompt + "
        f"max_new_tokens] = {shape}, {ids.dtype} on {ids.device} (exactly max_new_tokens new tokens: draft fewer "
        f"near the end)")
    assert torch.equal(got[:, :ids.shape[1]], ids), f"{what}: the returned ids do not start with the prompt"
    output = got[0].tolist()
    if temperature == 0.0:
        want = ref_generate(target, ids, n)
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0, 1].item()
            raise AssertionError(
                f"{what}: token {bad - ids.shape[1]} differs from greedy decoding with the target alone "
                f"(got {got[0, bad].item()}, target greedy {want[0, bad].item()}). Keep draft tokens only while they "
                f"equal the target's argmax, then add the target's own token; after each round, truncate both caches "
                f"to the tokens kept. {seed_note()}")
    assert len(t_log) < len(log), f"{what}: the draft model was never called: draft with it, then verify with the target"
    bad = work_failures(log, output, k)
    assert not bad, f"{what}: {'; '.join(bad)} {seed_note()}"
    if temperature == 0.0:
        stats = ref.SpecStats()
        ref.speculative_generate(target, draft, ids, n, k=k, stats=stats)
        assert len(t_log) <= stats.target_calls + 1, (
            f"{what}: the target ran {len(t_log)} forwards (every call counts, `target(...)` or "
            f"`target.forward(...)`); speculative decoding needs {stats.target_calls} here (one per round, each "
            f"scoring all K draft tokens at once) {seed_note()}")
    return t_log


def _check_rounds_when_the_draft_is_the_target(loop, target, temperature: float) -> None:
    """At any temperature: with a draft whose law is the target's (p = q, so min(1, p/q) = 1), every draft token is
    accepted and each round writes K + 1 tokens (the K drafted and the bonus from p_K) — as many target calls as
    greedy speculation with that draft makes. A loop that keeps fewer tokens per round (one per call: it does not
    speculate; K: it drops the bonus token) makes more target calls."""
    ids, n, k = torch.tensor([[4, 5, 6]]), 30, 3
    what = f"Markov target, a draft with the target's own law (p = q), T={temperature}, K={k}"
    t_log = _check_one_generation(loop, target, MarkovLM(24, 13, like=target, noise=0.0), ids, n, k, what,
                                  temperature=temperature, generator=torch.Generator().manual_seed(run_seed() + 3))
    stats = ref.SpecStats()
    ref.speculative_generate(target, MarkovLM(24, 13, like=target, noise=0.0), ids, n, k=k, stats=stats)
    assert len(t_log) <= stats.target_calls + 1, (
        f"{what}: the target ran {len(t_log)} forwards; with p = q every draft token is accepted, so each round "
        f"writes K + 1 = {k + 1} tokens (the K drafted, then the bonus token from p_K) and {n} tokens take "
        f"{stats.target_calls} target calls. Keep every accepted token and the bonus token of each round "
        f"{seed_note()}")


def check_default_device(loop, target, draft, ids, n, k, what, **kwargs) -> torch.Tensor:
    """The loop once more with torch's default device set to `meta` where the student's code runs (the models,
    the prompt and the generator keep theirs): a tensor made without `device=` lands on `meta` and meets them, as
    it would land on the CPU beside a model on CUDA. `check_on_meta` cannot judge a loop: it reads token values."""
    log, faults = [], []
    try:
        got = call_on_default_device(loop, "meta", spy(target, log, "target", faults), spy(draft, log, "draft", faults),
                                     ids, n, k=k, **kwargs)
        error = None
    except IsolationError:
        raise
    except Exception as e:  # noqa: BLE001  (whatever the loop raised there is the verdict)
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if not faults and error is None and not (isinstance(got, torch.Tensor) and got.device == ids.device):
        error = f"it returned {getattr(got, 'device', type(got).__name__)!s} ids, the prompt is on '{ids.device}'"
    reason = faults[0] if faults else error
    assert reason is None, (
        f"{what}, run again with torch's default device set to 'meta' (the models, prompt and generator stay on the "
        f"CPU): {reason}. A tensor made without device= lands on the default device: on the CPU while the model "
        f"runs on CUDA. Make every tensor on the prompt's device (torch.tensor(..., device=input_ids.device)) and "
        f"every random draw on the generator's")
    return got


SAMPLED_VOCAB = 4  # the flat 4-token chain of `_check_generator_decides`
SAMPLED_SCALE = 0.6
SAMPLED_TEMPERATURES = (1.0, 0.5)


def sampled_law_failures(speculative_sample, g) -> list[str]:
    """Speculative sampling against the target's law at every new position, in every case of `SAMPLE_CASES`
    (K = 4, 8, 1 and 2; T = 1, 0.5 and 2; position tables, `week18_law`): each case's runs in one batch, one
    generator each, the counts of each new token tested per position and pooled over positions of one law
    (< FALSE_FAILURE false failures over all of them). Every run is also held to the work accounting of
    exercise 1 (`work_failures`: the models are the same counted spies) and must call the draft; one run of each
    case, chosen at random, is observed (its route judged, its tokens counted with the others')."""
    level = sample_level()
    for case in SAMPLE_CASES:
        target, draft, ids, labels = sample_models(case, g)
        law = sample_law(target, case.temperature)  # [new tokens, V]
        n, vocab = len(case.p), law.shape[1]
        base = int(torch.randint(0, 2**40, (), generator=g))
        logs = [[] for _ in range(case.trials)]
        calls = [((spy(target, logs[t], "target"), spy(draft, logs[t], "draft"), ids, n),
                  {"k": case.k, "temperature": case.temperature, "generator": torch.Generator().manual_seed(base + t)})
                 for t in range(case.trials)]
        watched = int(torch.randint(0, case.trials, (), generator=g))
        outs, observations = call_many_observing(speculative_sample, calls, {watched})
        what = (f"case '{case.name}' ({case.why}; K={case.k}, T={case.temperature}, {n} new tokens, "
                f"{case.trials} runs)")
        used = _loop_lib_calls(observations[watched])
        assert not used, f"{what}: speculative_sample must be your own loop (with your verify); it called {used}"
        counts = torch.zeros(n, vocab, dtype=torch.int64)
        for t, out in enumerate(outs):
            assert (isinstance(out, torch.Tensor) and tuple(out.shape) == (1, ids.shape[1] + n)
                    and torch.equal(out[:, :ids.shape[1]], ids) and bool(((out >= 0) & (out < vocab)).all())), (
                f"{what}: returned {getattr(out, 'shape', out)!r}; expected the prompt's ids and {n} new ones, "
                f"[1, {ids.shape[1]} + {n}], each in 0..{vocab - 1}")
            output = out[0].tolist()
            bad = work_failures(logs[t], output, case.k)
            assert not bad, f"{what}: {'; '.join(bad)} {seed_note()}"
            assert any(f.who == "draft" for f in logs[t]), (
                f"{what}: a run wrote {n} tokens without calling the draft: draft K tokens per round and verify them "
                f"with one target call")
            counts[torch.arange(n), out[0, ids.shape[1]:]] += 1
        bad = sample_failures(case, counts, law, labels, level)
        if bad:
            return [f"{what}: {'; '.join(bad[:3])}"]
    return []


@WEEK.exercise(1, "speculative_generate", section="2 (Greedy speculation and rollback)")
def check_speculative_generate(speculative_generate, smollm2: bool = True) -> None:
    """Greedy speculative decoding == greedy decoding with the target alone, with real work savings.

    The models are spies (`spy`): every forward counts however it is called. Judged: the tokens; target calls
    <= the reference's + 1; after the prefill, every target call has a cache and is fed <= K + 1 tokens, every
    draft call <= 2; at each call the cache holds only tokens of the output (the rollback is real).
    Markov chains (drafts from perfect to poor) and tiny Llamas with real KV caches, K in {1, 2, 3, 4, 8}; a run
    with torch's default device set to `meta` (`check_default_device`); then SmolLM2 (64 tokens) with prompt
    lookup as the draft."""
    g = generator(0)
    vocab = 24
    watched = int(torch.randint(0, 26, (), generator=g))  # the run observed: one of the 18 Markov and 8 tiny-Llama runs
    for case in range(3):
        seed = int(torch.randint(0, 2**30, (1,), generator=g))
        target = MarkovLM(vocab, seed)
        ids = torch.randint(0, vocab, (1, 3 + case), generator=g)
        for run, (noise, k) in enumerate([(0.0, 1 + case), (1.5, 1), (1.5, 2), (1.5, 4), (3.0, 8), (20.0, 3)]):
            draft = MarkovLM(vocab, seed + 1, like=target, noise=noise)
            n = 20 + 3 * case
            calls = _check_one_generation(speculative_generate, target, draft, ids, n, k,
                                          f"Markov target, draft noise {noise}, K={k}, {n} tokens",
                                          observed=watched == 6 * case + run)
            if noise == 0.0:  # a perfect draft: every round must keep all K and add one
                most = math.ceil(n / (k + 1)) + 1
                assert len(calls) <= most, (
                    f"with a draft identical to the target and K={k}, every draft token is accepted, so {n} tokens "
                    f"need at most {most} target calls; yours made {len(calls)} (tokens per call: "
                    f"{[len(c.fed) for c in calls[:8]]}...). Running the target once per token is not speculative "
                    f"decoding.")
    for j, seed in enumerate((3, 4)):
        target, draft = spicy_tiny(seed), spicy_tiny(seed + 10, scale=6.0)
        ids = torch.randint(0, target.config.vocab_size, (1, 4), generator=g)
        for run, k in enumerate((1, 3, 8)):
            _check_one_generation(speculative_generate, target, draft, ids, 24, k,
                                  f"tiny Llama (seed {seed}) with a random draft, K={k}",
                                  observed=watched == 18 + 4 * j + run)
        _check_one_generation(speculative_generate, target, drafts.early_exit_draft(target, 1), ids, 24, 2,
                              f"tiny Llama (seed {seed}) with its first layer as the draft, K=2",
                              observed=watched == 18 + 4 * j + 3)
    target, draft = spicy_tiny(3), spicy_tiny(13, scale=6.0)
    ids = torch.randint(0, target.config.vocab_size, (1, 4), generator=g)
    got = check_default_device(speculative_generate, target, draft, ids, 12, 3, "tiny Llama, K=3")
    assert torch.equal(got, ref_generate(target, ids, 12)), (
        "tiny Llama, K=3: with torch's default device set to 'meta' the tokens changed (the models and prompt on the "
        "CPU): make every tensor on the prompt's device")
    if smollm2:
        _check_smollm2(speculative_generate)


@functools.lru_cache(maxsize=1)
def smollm2_case():
    """SmolLM2 through lib.modeling.fast (the same greedy tokens as lib.modeling.llama, tested in tests/test_fast.py; about 3x
    faster on a CPU, and the check runs it for every target call), the prompt's ids and its greedy continuation
    (built once per process). The smallest gap between the two best logits on that path is 0.013, a hundred
    times what splitting the tokens into other chunks changes."""
    from lib.modeling.fast import FastLlama
    from lib.modeling.llama import shared_smollm2

    model, tok = shared_smollm2()
    fast = FastLlama(model)
    ids = tok(SMOLLM2_PROMPT, return_tensors="pt").input_ids.to(model.device)
    return fast, ids, ref_generate(fast, ids, SMOLLM2_NEW_TOKENS)


def _check_smollm2(speculative_generate):
    model, ids, want = smollm2_case()
    draft = drafts.PromptLookupDraft(model.config.vocab_size, device=model.device)
    for k in SMOLLM2_KS:
        log = []
        got = speculative_generate(spy(model, log, "target"), spy(draft, log, "draft"), ids, SMOLLM2_NEW_TOKENS, k=k)
        t_log = [f for f in log if f.who == "target"]
        assert tuple(got.shape) == tuple(want.shape), f"SmolLM2, K={k}: ids of shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0, 1].item()
            raise AssertionError(f"SmolLM2, K={k}, prompt-lookup draft: token {bad - ids.shape[1]} differs from the target's "
                                 f"greedy decoding")
        bad = work_failures(log, got[0].tolist(), k)
        assert not bad, f"SmolLM2, K={k}, prompt-lookup draft: {'; '.join(bad)}"
        assert len(t_log) < SMOLLM2_NEW_TOKENS, (
            f"SmolLM2, K={k}: {len(t_log)} target forwards for {SMOLLM2_NEW_TOKENS} tokens; the prompt-lookup draft "
            f"agrees with the target about half the time here, so speculation needs fewer calls than tokens")



@WEEK.exercise(2, "verify", section="3 (Speculative sampling)")
def check_verify(verify) -> None:
    """verify's output has the exact law of speculative sampling, cell by cell, in every case of `law_cases`.

    Per run, fresh inputs (seeded by the run's seed). Each case's calls go to verify in one batch, call t with
    its own generator; the counts of (n_accepted, next_token) are tested against the closed-form law: cells of
    probability 0 must never appear; each acceptance probability (per position, among the runs that reached
    it) and each next-token probability (per n_accepted) gets a binomial test at `law_level`, so a correct
    verify fails the check with probability < FALSE_FAILURE = 1e-6 (Chernoff bound and union bound, exact
    for any counts). Power (`law_power`, tested in tests/test_week18_checks.py): the main case runs
    MAIN_TRIALS = 42,000 times with ratios in [0.85, 0.90]; position 2 is reached by >= 0.85²·42,000 - 6 sd
    > 29,500 runs except with probability < 1e-9, and an acceptance probability off by 2 points at any
    position is then caught with probability > 0.999. Also: equal generator states give equal outputs, a CPU
    tensor never meets the inputs' device (`meta`), and one call of each case, chosen at random, is observed: its
    arguments left unchanged, none of lib's code run, its output counted with the others'."""
    g = generator(1)
    cases = law_cases(g)
    # first the cheap check: every tensor verify creates is on its inputs' device (a CUDA run with CPU tensors fails)
    for case in (cases[0], cases[3]):
        check_on_meta(verify, (case.p.float(), case.q.float(), case.x.clone()), "verify")
    level = law_level(sum(len(law_tests(c)) for c in cases))
    base = run_seed() * 1_000 % (2**62)
    for index, case in sorted(enumerate(cases), key=lambda ic: ic[1].trials):  # the cheap cases first
        seed = base + index * 10_000_000
        # one call of each case, chosen at random, observed (on copies of the inputs): its arguments are read, never
        # written (the caller still needs p and q), it runs none of lib's, and its output is counted with the others'
        calls = law_calls(case, seed)
        watched = int(torch.randint(0, case.trials, (), generator=g))
        calls[watched] = ((case.p.clone(), case.q.clone(), case.x.clone()), calls[watched][1])
        outs, observations = call_many_observing(verify, calls, {watched})
        obs = observations[watched]
        assert not obs.inputs_written, (
            f"verify wrote into its arguments ({obs.inputs_written} in-place writes into target_probs, draft_probs "
            f"or draft_tokens, {describe_law(case)}): the caller's p and q would be changed. Compute the residual in "
            f"a new tensor: (target_probs[i] - draft_probs[i]).clamp(min=0)")
        used = sorted(c for c in obs.lib_calls if c.startswith(("lib.spec_decode.speculative.", "lib.spec_decode.drafts.")))
        assert not used, f"verify must be your own; it called {used}"
        counts = law_counts(verify, case, seed, results=outs)
        bad = law_failures(case, counts, level)
        assert not bad, (f"{describe_law(case)}: verify's output does not follow the law of speculative sampling: "
                         f"{'; '.join(bad[:3])}. Accept draft token i with probability min(1, p_i/q_i), each with "
                         f"a fresh uniform from `generator`; at the first rejection sample normalize(max(p_i - q_i, "
                         f"0)); after K acceptances sample p_K. {seed_note()}")
        if case.name == "disjoint supports":  # generator=None: torch's global generator, a fresh draw every call (red
            calls = [((case.p, case.q, case.x), {"generator": None}) for _ in range(60)]  # team 11b: seeded 0 per call)
            # half observed, each replayed from the global state it began with (red team 12: a generator of the
            # notebook's own, seeded once, agrees with a replay w.p. 0.3² + 0.7² = 0.58: 30 all agree < 1e-7)
            outs = call_many_observing(verify, calls, set(torch.randperm(60, generator=g)[:30].tolist()))[0]
            tokens = {int(o[1]) for o in outs if isinstance(o, tuple) and len(o) == 2}
            assert len(tokens) > 1, (  # the next token is p's, 0.3 / 0.7: one token in 60 calls < 1e-9
                f"60 calls with generator=None ({describe_law(case)}) all gave next token {tokens}: without a "
                f"generator, draw from torch's global generator, not one seeded the same at every call {seed_note()}")
        if case.name == "one row for all positions":  # equal generator states, equal outputs
            def again():  # fresh generators each time (in-process, a call advances the one it is given)
                return [((case.p, case.q, case.x), {"generator": torch.Generator().manual_seed(seed + t)})
                        for t in range(REPEATS)]
            watched = int(torch.randint(0, REPEATS, (), generator=g))  # observed in both passes
            first, second = (call_many_observing(verify, again(), {watched})[0] for _ in range(2))
            differ = sum(a != b for a, b in zip(first, second))
            assert not differ, (
                f"{differ} of {REPEATS} calls with generators in equal states gave different outputs: draw every "
                f"random number from `generator` (torch.rand(..., generator=generator), torch.multinomial(..., "
                f"generator=generator)), never from torch's global generator {seed_note()}")


def _collision(chain: MarkovLM, prompt: list, n: int) -> float:
    """P(two independent samples of `n` tokens from `chain` at T = 1 after `prompt` are equal), exactly: a walk over
    the chain's (previous, last) token pairs carrying the probability that both runs are still equal."""
    v = len(chain.A)
    p = torch.softmax(chain.A[None, :, :].double() + chain.B[:, None, :].double(), -1)  # [prev, last, next]
    both = torch.zeros(v, v, dtype=torch.float64)
    both[prompt[-2], prompt[-1]] = 1.0
    for _ in range(n):
        both = torch.einsum("ab,abx->bx", both, p ** 2)
    return float(both.sum())


def _check_generator_decides(speculative_sample, g) -> None:
    """`generator` decides every draw: two runs from generators in equal states give equal ids, and a run from
    another state gives other ids. A draw from torch's global generator breaks the first; a loop that seeds its
    own generator breaks the second. On a flat 4-token chain, 40 new tokens, the chain drawn until a correct
    loop's runs from two states coincide with probability below 1e-9 (`_collision`, exact; a random chain is
    below it at the median by 9 orders of magnitude, so the first draw almost always is)."""
    ids = torch.tensor([[0, 1, 2]])
    for _ in range(100):
        target = MarkovLM(SAMPLED_VOCAB, int(torch.randint(0, 2**30, (), generator=g)), scale=SAMPLED_SCALE)
        if _collision(target, ids[0].tolist(), 40) < 1e-9:
            break
    draft = MarkovLM(SAMPLED_VOCAB, 1, like=target, noise=1.0)
    seed = int(torch.randint(0, 2**40, (), generator=g))
    watched = int(torch.randint(0, 5, (), generator=g))  # the run observed
    outs = []
    for i, s in enumerate((seed, seed, seed + 1, None, None)):  # None: torch's global generator, a fresh draw each run
        args = (spy(target, [], "target"), spy(draft, [], "draft"), ids, 40)
        kwargs = dict(k=3, temperature=1.0, generator=None if s is None else torch.Generator().manual_seed(s))
        if i == watched or s is None:  # the None runs replayed from the global state they began with (red team 12)
            out, obs = observe(speculative_sample, *args, **kwargs)
            used = _loop_lib_calls(obs)
            assert not used, f"speculative_sample must be your own loop (with your verify); it called {used}"
        else:
            out = speculative_sample(*args, **kwargs)
        assert isinstance(out, torch.Tensor) and tuple(out.shape) == (1, 43), (
            f"a run of 40 tokens after a prompt of 3 returned {getattr(out, 'shape', out)!r}; expected ids [1, 43]")
        outs.append(out)
    a, b, c, d, e = outs
    assert torch.equal(a, b), (
        "two runs with generators in equal states gave different ids: draw every random number from `generator` "
        "(the draft's samples, and your verify's, with generator=generator), never from torch's global generator "
        f"{seed_note()}")
    assert not torch.equal(a, c), (
        "runs with generators in different states gave the same 40 sampled tokens: the loop does not draw from "
        f"`generator` (a seed of its own, or a fixed one?) {seed_note()}")
    assert not torch.equal(d, e), ("two runs with generator=None gave the same 40 sampled tokens: without a generator, "
                                   f"draw from torch's global generator, not one seeded the same every run {seed_note()}")


@WEEK.exercise(3, "speculative_sample", section="3 (Speculative sampling)")
def check_speculative_sample(speculative_sample) -> None:
    """Speculative sampling end to end: the work accounting of `check_speculative_generate` on runs at T = 1 and
    0.5 (Markov chain, 24 tokens, K = 3; tiny Llama, K = 2; a draft with the target's own law); then the law of
    every new token against the target's (`sampled_law_failures`: six cases, K = 4, 8, 1, 2, 8 and 2 (over 64
    tokens), every position of a round and the bonus token, binomial tests, < 1e-6 false failures in all; a greedy
    draft token passed off as a sample of q, one uniform reused for a round's draft positions, a loop exact for two
    tokens and wrong after, the residual taken from p, the bonus from another row, T ignored, a draft drawn from q's
    top 50: each fails it every run, with probability >= 1 - 1e-6, tests/test_week18_sampling.py); the generator deciding every draw
    (`_check_generator_decides`); last a run with torch's default device set to `meta` (`check_default_device`)."""
    g = generator(5)
    target = MarkovLM(24, int(torch.randint(0, 2**30, (), generator=g)))
    tiny = spicy_tiny(5)
    for temperature in SAMPLED_TEMPERATURES:
        _check_one_generation(speculative_sample, target, MarkovLM(24, 12, like=target, noise=1.0),
                              torch.tensor([[1, 2, 3]]), 30, 3, f"Markov target, T={temperature}, K=3",
                              temperature=temperature, generator=torch.Generator().manual_seed(run_seed()))
        _check_rounds_when_the_draft_is_the_target(speculative_sample, target, temperature)
        _check_one_generation(speculative_sample, tiny, drafts.early_exit_draft(tiny, 1), torch.tensor([[5, 6, 7]]),
                              20, 2, f"tiny Llama, its first layer as the draft, T={temperature}, K=2",
                              temperature=temperature, generator=torch.Generator().manual_seed(run_seed() + 1))
    bad = sampled_law_failures(speculative_sample, g)
    assert not bad, (f"{bad[0]}. The new tokens do not have the target's law: draft each token by sampling "
                     f"q = softmax(draft logits / T), verify the round against p = softmax(target logits / T) with "
                     f"your `verify` (a fresh uniform per draft token), and pass `generator` to every draw "
                     f"{seed_note()}")
    _check_generator_decides(speculative_sample, g)
    got = check_default_device(speculative_sample, tiny, drafts.early_exit_draft(tiny, 1), torch.tensor([[5, 6, 7]]),
                               12, 3, "tiny Llama, T=1, K=3", temperature=1.0,
                               generator=torch.Generator().manual_seed(run_seed() + 2))
    assert tuple(got.shape) == (1, 15), f"tiny Llama, T=1, K=3, default device 'meta': ids of shape {tuple(got.shape)}"


# --- 4: the prompt-lookup draft ------------------------------------------------------------------------------

def _lookup(tokens: list, k: int, max_ngram: int, min_ngram: int) -> list:
    """The check's statement of prompt lookup, as a search over every earlier position (see check_lookup_draft)."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tokens[len(tokens) - n:]:
                return tokens[start + n:start + n + k]
    return []


def _planted(g, length: int, vocab: int) -> list:
    """Random tokens with copied stretches (what prompt lookup is for): a piece of the text so far repeated."""
    out = torch.randint(0, vocab, (4,), generator=g).tolist()
    while len(out) < length:
        if float(torch.rand((), generator=g)) < 0.5 and len(out) > 4:
            start = int(torch.randint(0, len(out) - 2, (), generator=g))
            out += out[start:start + int(torch.randint(2, 8, (), generator=g))]
        else:
            out += torch.randint(0, vocab, (int(torch.randint(1, 4, (), generator=g)),), generator=g).tolist()
    return out[:length]


def _sizes_note(tokens: list, k: int, max_ngram: int) -> str:
    """For a case past the random cases' sizes: what it asks of the search."""
    if len(tokens) <= 60 and k <= 8 and max_ngram <= 5:
        return ""
    return (f" (here the text is {len(tokens)} tokens, k = {k}, max_ngram = {max_ngram}: search the whole text, for "
            f"n-grams up to max_ngram, and return up to k tokens, whatever their sizes)")


@WEEK.exercise(5, "lookup_draft", section="5 (Drafts compared on SmolLM2)")
def check_lookup_draft(lookup_draft) -> None:
    """Prompt lookup on texts with copied stretches: the longest n-gram (max_ngram >= n >= min_ngram) that ends
    the text and occurred before, its latest earlier occurrence, and up to k tokens that followed it; [] when
    no such n-gram occurred; a clear ValueError for k < 0 or 1 <= min_ngram <= max_ngram violated."""
    g = generator(6)
    cases = [([], 3, 3, 1), ([7], 3, 3, 1), ([5, 5], 4, 3, 1), ([1, 2, 3, 1, 2], 0, 3, 1), ([1, 2, 3, 4], 3, 2, 1),
             ([1, 2, 9, 1, 2, 8, 1, 2], 2, 2, 1), ([3, 1, 2, 4, 1, 2], 3, 3, 3)]
    # sizes past the random cases' (texts < 60 tokens, k <= 8, max_ngram <= 5), so that a search that looks only at
    # the last 64 tokens, returns at most 8, or caps the n-gram at 5 is wrong somewhere: the only earlier
    # occurrence 400 tokens back; k = 20 after a long copied stretch; a 7-gram whose latest 5-gram is elsewhere
    filler = (10 + torch.randint(0, 40, (400,), generator=g)).tolist()
    # ... and past any window a search could be cut to (deque(maxlen=512), the last 2048): the only earlier occurrence
    # 3,000 to 12,000 tokens back, the distance drawn per run (red team 10's #4)
    far = (10 + torch.randint(0, 40, (int(torch.randint(3_000, 12_000, (), generator=g)),), generator=g)).tolist()
    cases += [([1, 2, 3, 4] + filler + [1, 2, 3], 3, 3, 1), ([1, 2, 3, 5] + far + [1, 2, 3], 3, 3, 1),
              (list(range(30)) + [0, 1, 2], 20, 3, 1),
              ([1, 2, 3, 4, 5, 6, 7, 50, 0, 3, 4, 5, 6, 7, 60, 1, 2, 3, 4, 5, 6, 7], 3, 7, 1)]
    for _ in range(300):
        vocab = int(torch.randint(3, 12, (), generator=g))
        tokens = _planted(g, int(torch.randint(2, 60, (), generator=g)), vocab)
        hi = int(torch.randint(1, 6, (), generator=g))
        cases.append((tokens, int(torch.randint(0, 9, (), generator=g)), hi, int(torch.randint(1, hi + 1, (), generator=g))))
    # a tenth of the cases, chosen at random, observed: their answers judged with the others', their route too
    watched = set(torch.randperm(len(cases), generator=g)[:len(cases) // 10].tolist())
    for i, (tokens, k, hi, lo) in enumerate(cases):
        want = _lookup(tokens, k, hi, lo)
        if i in watched:
            got, obs = observe(lookup_draft, list(tokens), k, max_ngram=hi, min_ngram=lo)
            used = sorted(c for c in obs.lib_calls if c.startswith("lib."))
            assert not used, f"lookup_draft must be your own; it called {used}"
        else:
            got = lookup_draft(list(tokens), k, max_ngram=hi, min_ngram=lo)
        assert isinstance(got, list) and all(type(t) is int for t in got), (
            f"lookup_draft must return a list of ints; got {got!r}")
        assert got == want, (
            f"lookup_draft({tokens if len(tokens) <= 24 else '[...' + str(tokens[-24:])[1:]}, k={k}, max_ngram={hi}, "
            f"min_ngram={lo}) = {got}; expected {want}: take the longest n-gram ending the text (n from max_ngram "
            f"down to min_ngram) that also occurs earlier, its latest earlier occurrence, and the (up to) k tokens "
            f"after it{_sizes_note(tokens, k, hi)} {seed_note()}")
    for bad in [dict(k=-1), dict(min_ngram=0), dict(max_ngram=2, min_ngram=3)]:
        kwargs = {"k": 2, "max_ngram": 3, "min_ngram": 1, **bad}
        try:
            lookup_draft([1, 2, 1, 2], kwargs.pop("k"), **kwargs)
        except ValueError:
            continue
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"lookup_draft with {bad} raised {type(e).__name__}; raise a ValueError that says "
                                 f"what is wrong") from None
        raise AssertionError(f"lookup_draft with {bad} returned an answer; bad arguments must raise a ValueError")


# --- 5: expected rejections ----------------------------------------------------------------------------------

def _own_tensor(got, want_like: torch.Tensor, what: str):
    assert isinstance(got, torch.Tensor) and got.dim() == 0, f"{what}: expected a 0-dim tensor, got {got!r}"
    assert got.dtype == want_like.dtype and got.device == want_like.device, (
        f"{what}: {got.dtype} on {got.device}; expected the inputs' {want_like.dtype} on {want_like.device}")


@WEEK.exercise(4, "expected_rejections", section="4 (Acceptance: theory and measurement)")
def check_expected_rejections(expected_rejections) -> None:
    """E[rejections] when at each of n positions a token is drawn from q_i and tested against p_i: derived from
    the one-position law, Σ_i (1 - Σ_x min(p_i(x), q_i(x))) = Σ_i TV(p_i, q_i). Random p, q in float64 and
    float32, edge cases (p = q: 0; disjoint: n; q zero where p has mass), the result's dtype/device, arguments
    unchanged, a clear error for mismatched shapes, `meta`, and the student's own code."""
    g = generator(7)
    for case in range(12):
        n, v = int(torch.randint(1, 9, (), generator=g)), int(torch.randint(2, 60, (), generator=g))
        dtype = torch.float64 if case % 2 == 0 else torch.float32
        p = torch.softmax(3 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(3 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
        if case % 3 == 0:  # q zero where p has mass
            q[:, : v // 2] = 0
            q = q / q.sum(-1, keepdim=True)
        want = float((1 - torch.minimum(p, q).sum(-1)).sum())
        got, obs = observe(expected_rejections, p.to(dtype), q.to(dtype))  # every random case observed
        assert not obs.inputs_written, "expected_rejections wrote into its arguments: compute in new tensors"
        used = sorted(c for c in obs.lib_calls if c.startswith("lib."))
        assert not used, f"expected_rejections must be your own derivation; it called {used}"
        _own_tensor(got, p.to(dtype), f"expected_rejections(p, q) for {dtype} inputs")
        tol = 1e-9 if dtype == torch.float64 else 1e-4 * n
        assert abs(float(got) - want) <= tol, (
            f"expected_rejections(p, q) for n={n} positions over V={v} tokens = {float(got):.6g}; expected "
            f"{want:.6g}. At one position a token x ~ q is accepted with probability min(1, p(x)/q(x)): average that "
            f"over q, and add up the rejections over the positions {seed_note()}")
    p = torch.softmax(torch.randn(5, 7, generator=g, dtype=torch.float64), -1)
    assert abs(float(expected_rejections(p, p.clone()))) < 1e-12, "p = q: a draft equal to the target is never rejected"
    pd = torch.zeros(4, 6, dtype=torch.float64)
    qd = torch.zeros(4, 6, dtype=torch.float64)
    pd[:, :3], qd[:, 3:] = 1 / 3, 1 / 3
    assert abs(float(expected_rejections(pd, qd)) - 4.0) < 1e-12, (
        "p and q with disjoint supports at 4 positions: every token is rejected, so E[rejections] = 4")
    try:
        expected_rejections(p, p[:, :5])
    except ValueError:
        pass
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"p [5, 7] with q [5, 5] raised {type(e).__name__}: raise a ValueError that names the "
                             f"shapes") from None
    else:
        raise AssertionError("p [5, 7] with q [5, 5] gave an answer: mismatched shapes must raise a ValueError")
    q = torch.softmax(torch.randn(5, 7, generator=g, dtype=torch.float64), -1)
    # device: all of it in tensors on the inputs' device. On `meta` tensors (shapes, no data, like tensors on a
    # GPU seen from here) it must run and return a `meta` tensor: a CPU tensor, .numpy() or .item() fails there.
    try:
        out = expected_rejections(p.float().to("meta"), q.float().to("meta"))
    except Exception as e:  # noqa: BLE001
        raise AssertionError(
            f"expected_rejections failed on inputs on another device ('meta', as they would be on 'cuda'): "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} — keep every step in tensors on the "
            f"inputs' device (no CPU tensor made without device=, no .numpy(), .cpu() or .item())") from None
    assert isinstance(out, torch.Tensor) and out.device.type == "meta", (
        f"expected_rejections on 'meta' inputs returned {out!r}: the result must stay on the inputs' device")


# --- 6, 7, 8: the models of a round and the ragged batch (week18_predict, week18_batch) -------------------------

@WEEK.exercise(6, "best_k", section="6 (The speedup model)")
def check_best_k(best_k) -> None:
    """The K that maximizes the predicted speedup for acceptance α (one for every draft position, or a list of
    them, one per position), draft cost c and a verify-cost curve (verify_cost[m] for m = 1..M; K = 1..M-1), and
    that speedup; configurations drawn per run, every call observed (`week18_predict.judge_best_k`)."""
    predict.judge_best_k(best_k)


@WEEK.exercise(7, "expected_target_calls", section="7 (A draft you train, and a prediction)")
def check_expected_target_calls(expected_target_calls) -> None:
    """The expected target calls of a speculative run of max_new_tokens tokens at acceptance α and K, exactly, on
    configurations drawn per run, every call observed (`week18_predict.judge_expected_target_calls`)."""
    predict.judge_expected_target_calls(expected_target_calls)


@WEEK.exercise(8, "batched_speculative_generate", section="8 (The ragged batch)")
def check_batched_speculative_generate(batched_speculative_generate) -> None:
    """Each row equals its own single-row run, no row waits, per-row rollback (`week18_batch.judge`)."""
    batch.judge(batched_speculative_generate)


@WEEK.exercise(9, "tree_accept", section="11 (Trees: many drafts verified in one forward)")
def check_tree_accept(tree_accept) -> None:
    """One node of a sampled tree: children drawn from q without replacement (by the check, per call), tried in
    drawn order; the emitted token's law is p and each child is accepted as often as the rule says, cell by cell
    (< 1e-6 false failures; `week18_tree.judge`)."""
    tree.judge(tree_accept)
