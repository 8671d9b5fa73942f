"""Speculative decoding (week 18): a cheap draft proposes K tokens, the target checks them in one forward.

    stats = SpecStats()
    ids = speculative_generate(target, early_exit_draft(target, 8), prompt_ids, 64, k=4, stats=stats)
    # temperature 0: exactly lib.modeling.generate.generate(target, prompt_ids, 64); stats.tokens_per_call > 1
    ids = speculative_generate(target, draft, prompt_ids, 64, k=4, temperature=1.0, generator=g)
    # temperature > 0: every token has the target's law (speculative sampling, `verify`)

Notation, everywhere in this lab: **p is the target**, **q is the draft** (Leviathan et al. 2023; Chen et al.
2023). Seed quiz 002 uses the same letters; the TV-distance paper in seed 004 swaps them.

- `verify(target_probs, draft_probs, draft_tokens)`: accept draft token i with probability min(1, p_i/q_i), in
  order; at the first rejection sample from normalize(max(p_i - q_i, 0)); if all K are accepted, a bonus
  token from p_K. The output has exactly the target's law, whatever q is.
- `speculative_generate`: both models keep KV caches; after each verification the rejected positions are
  dropped with `KVCache.truncate` (week 16's cache).
- Drafts (in `lib/spec_decode/drafts.py`, imported from there), each with a model's call shape
  `draft(ids [1, t], cache=...) -> logits [1, t, vocab]` and `draft.new_cache(batch, max_len)`:
  `PromptLookupDraft` (n-gram match, no weights), `early_exit_draft` (the target's first L layers + final norm +
  LM head), `random_draft` (a small random model) and `quantized_draft` (the target with int8
  per-output-channel weights), `load_distilled_draft` (a small draft trained by `tools/distill_draft.py`).
- FR-Spec (Zhao et al. 2025, also in `lib/spec_decode/drafts.py`): `token_counts` / `frequency_ranked_ids` rank the
  vocabulary by frequency in a corpus, and `fr_spec_draft(draft, keep_ids)` gives a draft whose LM head computes
  logits over those ids only (N × d_model weights instead of vocab × d_model); every other token gets logit
  -inf, so q = 0 there and the draft never proposes it. The target still verifies over the full vocabulary: the
  output stays exact.
- Workloads for the benchmark and notebook: `chat_ids(tok, text)` (one user turn in the chat template),
  `EDIT_REQUEST` and `QUOTE_TEXT` (answers that repeat an invented `PARAGRAPH`: where prompt lookup pays).
- Acceptance theory: `acceptance_rate(p, q)` = Σ min(p, q) = 1 - TV(p, q) and `expected_tokens_per_call(α, K)`
  = (1 - α^(K+1)) / (1 - α); `predicted_speedup` puts them together with the draft's cost and the measured
  cost of verifying K + 1 tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lib.bench.roofline import sync


# --- acceptance theory --------------------------------------------------------------------------------------

def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """α = Σ_x min(p(x), q(x)) over the last axis: the probability that a token drawn from q is accepted.

    Equals 1 - TV(p, q) (total variation distance). `p`, `q`: `[..., vocab]` probabilities; returns `[...]`."""
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape [..., vocab]; got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(-1)


def expected_tokens_per_call(alpha: float, k: int) -> float:
    """Expected tokens produced per target call with K drafted tokens each accepted with probability α:
    1 + α + ... + α^K = (1 - α^(K+1)) / (1 - α)  (K + 1 when α = 1). α=0.7, K=4 gives 2.77 (not 3.6)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is a probability, in [0, 1]; got {alpha}")
    if k < 0:
        raise ValueError(f"k (draft tokens per round) must be >= 0; got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, verify_cost) -> float:
    """Wall-clock speedup over plain decoding: tokens per round / cost of a round, in units of one target step.

    A round runs the draft K times (`c` = one draft step / one target step) and the target once on K + 1
    tokens, which costs `verify_cost[K + 1]` target steps (`verify_cost[1] == 1`; a dict or a sequence indexed
    by the number of tokens). On a GPU the verify cost is ≈ 1 up to tens of tokens; on this CPU it is not."""
    if c < 0:
        raise ValueError(f"c (draft cost relative to the target) must be >= 0; got {c}")
    try:
        v = float(verify_cost[k + 1])
    except (KeyError, IndexError):
        raise ValueError(f"verify_cost has no entry for {k + 1} tokens (K + 1 with K={k})") from None
    return expected_tokens_per_call(alpha, k) / (k * c + v)


@torch.no_grad()
def alpha_profile(target, draft, ids: torch.Tensor, temperature: float = 1.0, chunk: int = 256) -> torch.Tensor:
    """α at every position of a text `ids [1, n]` (teacher forcing): Σ_x min(p(x), q(x)) for the next token,
    `[n]`. At temperature 0, 1.0 where the draft's argmax equals the target's, else 0.0. Both models read the
    text once, `chunk` tokens per forward, with their KV caches (no [n, vocab] logits are kept)."""
    if ids.dim() == 1:
        ids = ids[None]
    n = ids.shape[1]
    tc, dc = _new_cache(target, n), _new_cache(draft, n)
    out = []
    for start in range(0, n, chunk):
        piece = ids[:, start:start + chunk].to(target.device)
        lp, lq = target(piece, cache=tc)[0], draft(piece, cache=dc)[0]  # [c, vocab] each
        if temperature == 0.0:
            out.append((lp.argmax(-1) == lq.argmax(-1)).float())
        else:
            out.append(acceptance_rate(torch.softmax(lp / temperature, -1), torch.softmax(lq / temperature, -1)))
    return torch.cat(out)


# --- verification (speculative sampling) --------------------------------------------------------------------

def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    dev = generator.device if generator is not None else device
    return torch.rand((), generator=generator, device=dev).item()


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling: how many draft tokens to keep, and the token that follows them.

    `target_probs [K+1, V]`: p at each of the K draft positions and at the one after them;
    `draft_probs [K, V]`: q at the K draft positions; `draft_tokens [K]` (int64), token i drawn from q_i.
    Token i is accepted with probability min(1, p_i(x_i) / q_i(x_i)), in order. At the first rejection the
    next token is sampled from normalize(max(p_i - q_i, 0)); if all K are accepted, a bonus token is sampled
    from p_K. Returns `(n_accepted, next_token)`; the tokens kept are `draft_tokens[:n_accepted]` then
    `next_token`, and they have exactly the target's law.
    """
    if target_probs.dim() != 2 or draft_probs.dim() != 2 or draft_tokens.dim() != 1:
        raise ValueError(f"verify needs target_probs [K+1, V], draft_probs [K, V], draft_tokens [K]; got "
                         f"{tuple(target_probs.shape)}, {tuple(draft_probs.shape)}, {tuple(draft_tokens.shape)}")
    k = draft_tokens.shape[0]
    if target_probs.shape[0] != k + 1 or draft_probs.shape[0] != k or target_probs.shape[1] != draft_probs.shape[1]:
        raise ValueError(f"with K={k} draft tokens, target_probs must be [K+1, V] = [{k + 1}, V] and draft_probs "
                         f"[K, V] with the same V; got {tuple(target_probs.shape)} and {tuple(draft_probs.shape)}")
    if draft_tokens.dtype != torch.int64:
        raise ValueError(f"draft_tokens must be int64 token ids; got {draft_tokens.dtype}")
    p_at = target_probs[torch.arange(k, device=target_probs.device), draft_tokens].tolist() if k else []
    q_at = draft_probs[torch.arange(k, device=draft_probs.device), draft_tokens].tolist() if k else []
    for i in range(k):
        # accept with probability min(1, p/q): u < p/q, written u*q < p so that q = 0 (a greedy draft's pick
        # outside its own support) cannot divide by zero, and p = 0 is never accepted.
        if _uniform(generator, target_probs.device) * q_at[i] < p_at[i]:
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp(min=0)  # (p - q)+: the mass q under-covers
        if residual.sum() <= 0:  # p == q up to rounding: a rejection had probability 0; p is the right law
            residual = target_probs[i]
        return i, sample_from(residual, generator)
    return k, sample_from(target_probs[k], generator)


# --- generation ---------------------------------------------------------------------------------------------

@dataclass
class SpecStats:
    """Counters that `speculative_generate(..., stats=SpecStats())` adds to."""
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # of those, kept
    target_calls: int = 0  # target forwards (the prefill included)
    draft_calls: int = 0  # draft forwards
    rounds: int = 0  # draft-then-verify rounds
    tokens: int = 0  # new tokens produced

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_call(self) -> float:
        """New tokens per target call (the prefill call included)."""
        return self.tokens / self.target_calls if self.target_calls else float("nan")


def _new_cache(model, max_len: int):
    make = getattr(model, "new_cache", None)
    return make(batch=1, max_len=max_len) if make is not None else None


def decode_args(who: str, target, input_ids: torch.Tensor, max_new_tokens: int, k: int,
                temperature: float) -> tuple[torch.Tensor, int]:
    """The argument checks every speculative decoder here shares (`speculative_generate`, lib.spec_decode.draft_head's
    `head_speculative_generate`): returns the prompt as `[1, T >= 1]` ids on the target's device and the cache
    length a run needs (T + max_new_tokens + k + 1), or raises a ValueError that says what is wrong."""
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"{who} decodes one sequence: input_ids must be [1, T >= 1]; got {tuple(input_ids.shape)}")
    if k < 1:
        raise ValueError(f"k (draft tokens per round) must be >= 1; got {k}")
    if max_new_tokens < 0 or temperature < 0:
        raise ValueError(f"max_new_tokens and temperature must be >= 0; got {max_new_tokens}, {temperature}")
    ids = input_ids.to(target.device)
    max_len = ids.shape[1] + max_new_tokens + k + 1
    if max_len > target.config.max_seq_len:
        raise ValueError(f"prompt ({ids.shape[1]}) + max_new_tokens ({max_new_tokens}) + k + 1 = {max_len} exceeds "
                         f"the target's max_seq_len {target.config.max_seq_len}")
    return ids, max_len


@torch.no_grad()
def speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0, generator: torch.Generator | None = None,
                         stats: SpecStats | None = None, min_draft_prob: float = 0.0) -> torch.Tensor:
    """`[1, T + max_new_tokens]` ids: the prompt, then exactly `max_new_tokens` tokens decoded speculatively.

    Each round the draft proposes up to `k` tokens (fewer near the end), the target scores them all in one
    forward, and `verify` keeps a prefix plus one token of its own. Both models keep KV caches; rejected
    positions are dropped with `truncate`. Temperature 0 gives the ids of `lib.modeling.generate.generate(target, ...)`
    (greedy: keep draft tokens while they equal the target's argmax); temperature > 0 samples the target's
    law at that temperature. Pass a `SpecStats` as `stats` to count drafted, accepted and target calls.
    With `min_draft_prob > 0` a round stops drafting once the draft gives its own token less than that
    probability (adaptive K: a prompt-lookup draft with no match drafts nothing); exactness is unaffected.
    """
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft and target must share a vocabulary: {draft.config.vocab_size} vs "
                         f"{target.config.vocab_size} tokens")
    ids, max_len = decode_args("speculative_generate", target, input_ids, max_new_tokens, k, temperature)
    device = target.device
    t0 = ids.shape[1]
    tcache, dcache = _new_cache(target, max_len), _new_cache(draft, max_len)
    stats = stats if stats is not None else SpecStats()
    out = ids[0].tolist()
    greedy = temperature == 0.0

    def probs(logits):  # [t, V] -> the distributions we sample from
        return torch.softmax(logits.float() / temperature, dim=-1)

    while len(out) - t0 < max_new_tokens:
        kk = min(k, max_new_tokens - (len(out) - t0) - 1)  # leave room for the token verify adds
        # 1. draft kk tokens, one at a time, feeding the draft whatever its cache has not seen yet
        drafted, q_rows = [], []
        for _ in range(kk):
            seen = dcache.length if dcache is not None else 0
            feed = torch.tensor([(out + drafted)[seen:]], device=device)  # everything, without a cache
            logits = draft(feed, cache=dcache)[0, -1]  # [V]
            stats.draft_calls += 1
            if greedy:
                tok = int(logits.argmax())
                if min_draft_prob > 0 and torch.softmax(logits.float(), -1)[tok] < min_draft_prob:
                    break  # the draft is unsure: verify what we have
                drafted.append(tok)
            else:
                q = probs(logits[None])[0]
                tok = sample_from(q, generator)
                if min_draft_prob > 0 and q[tok] < min_draft_prob:
                    break
                q_rows.append(q)
                drafted.append(tok)
        kk = len(drafted)
        # 2. the target scores the unseen prefix and the kk draft tokens in one forward
        seen = tcache.length
        feed = torch.tensor([(out + drafted)[seen:]], device=device)
        logits = target(feed, cache=tcache)[0, -(kk + 1):]  # [kk + 1, V]: after each draft token, and before
        stats.target_calls += 1
        # 3. keep a prefix of the draft, plus one token of the target's
        if greedy:
            best = logits.argmax(-1).tolist()  # the target's greedy choice at each of the kk + 1 positions
            n = 0
            while n < kk and drafted[n] == best[n]:
                n += 1
            nxt = best[n]
        else:
            n, nxt = verify(probs(logits), torch.stack(q_rows) if q_rows else logits.new_zeros(0, logits.shape[-1]),
                            torch.tensor(drafted, dtype=torch.int64, device=device), generator)
        out += drafted[:n] + [nxt]
        stats.rounds += 1
        stats.drafted += kk
        stats.accepted += n
        stats.tokens += n + 1
        # 4. roll back: each cache keeps only positions whose tokens were kept (the newest token is unseen)
        tcache.truncate(min(tcache.length, len(out) - 1))
        if dcache is not None:
            dcache.truncate(min(dcache.length, len(out) - 1))
    return torch.tensor([out], dtype=input_ids.dtype, device=device)


# --- workloads ---------------------------------------------------------------------------------------------

# Prompts where the answer repeats the prompt, so prompt lookup has something to find (benchmark and notebook).
# The paragraph is invented on purpose: asked to repeat a famous text (Hamlet's soliloquy), SmolLM2-135M
# paraphrases it from memory, and prompt lookup then has nothing to match (acceptance 0.27 measured).
PARAGRAPH = ("The library opens at nine in the morning and closes at six in the evening on weekdays. On Saturdays it "
             "opens at ten and closes at four, and on Sundays it is closed. Members may borrow up to eight books at a "
             "time for three weeks, and a book may be renewed twice unless another member has reserved it.")
EDIT_REQUEST = ("Fix the spelling mistakes in this paragraph and return it.\n\n"  # a chat request (apply the template)
                + PARAGRAPH.replace("morning", "mornin").replace("borrow", "borow"))
QUOTE_TEXT = f"The paragraph below is quoted exactly.\n\nOriginal: {PARAGRAPH}\n\nQuoted exactly: \""  # plain text


def chat_ids(tok, text: str, device=None) -> torch.Tensor:
    """`[1, t]` ids of one user turn in the tokenizer's chat template, ready for the assistant's answer."""
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]  # newer transformers return a BatchEncoding
    return ids.to(device) if device is not None else ids



# --- measuring a draft's cost ------------------------------------------------------------------------------

@torch.no_grad()
def verify_curve(target, ids: torch.Tensor, sizes, context: int = 128, repeats: int = 5) -> dict:
    """`{m: cost of one target forward of m new tokens after `context` cached ones, in one-token steps}` — the
    median of `repeats` side-by-side ratios (each m-token forward next to a one-token one, so that a busy
    machine slows both). `ids [1, >= context + max(sizes)]` is any text."""
    import time

    cache = target.new_cache(1, context + max(sizes))
    target(ids[:, :context], cache=cache)

    def seconds(m):
        cache.truncate(context)
        sync(target.device)  # both ends: a GPU runs asynchronously
        start = time.perf_counter()
        target(ids[:, context:context + m], cache=cache)
        sync(target.device)
        return time.perf_counter() - start

    seconds(1)  # warm-up
    return {m: float(torch.tensor([seconds(m) / seconds(1) for _ in range(repeats)]).median()) for m in sizes}


@torch.no_grad()
def relative_cost(step, target, ids: torch.Tensor, context: int = 128, repeats: int = 7) -> float:
    """c: seconds of `step()` (one draft step; it resets its own state) over one target decode step after
    `context` tokens of `ids [1, > context]`, the median of `repeats` side-by-side ratios."""
    import time

    cache = target.new_cache(1, context + 1)
    target(ids[:, :context], cache=cache)

    def target_step():
        cache.truncate(context)
        sync(target.device)  # both ends: a GPU runs asynchronously
        start = time.perf_counter()
        target(ids[:, context:context + 1], cache=cache)
        sync(target.device)
        return time.perf_counter() - start

    def draft_step():
        sync(target.device)
        start = time.perf_counter()
        step()
        sync(target.device)
        return time.perf_counter() - start

    draft_step(), target_step()  # warm-up
    return float(torch.tensor([draft_step() / target_step() for _ in range(repeats)]).median())


def draft_step(draft, ids: torch.Tensor, context: int = 128):
    """A `relative_cost` step for a draft with a model's call shape: one token after `context` cached ones."""
    cache = draft.new_cache(batch=1, max_len=context + 1)
    with torch.no_grad():
        draft(ids[:, :context], cache=cache)

    def step():
        cache.truncate(context)
        with torch.no_grad():
            draft(ids[:, context:context + 1], cache=cache)

    return step


