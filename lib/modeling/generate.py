"""Autoregressive generation: greedy, temperature, top-k, top-p and min-p sampling (and lib.modeling.sampling's penalties),
with or without a KV cache.

    ids = generate(model, prompt_ids, max_new_tokens=32)        # greedy, cached
    ids = generate(model, prompt_ids, 32, use_cache=False)      # same tokens, recomputing every step
    ids = generate(model, prompt_ids, 32, temperature=0.8, top_p=0.9, generator=torch.Generator().manual_seed(0))

Returns the prompt ids followed by the new ids, `[batch, prompt_len + new]`, like transformers.
"""
from __future__ import annotations

import torch

from lib.modeling.sampling import SamplingParams, filter_logits


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None,
                min_p: float | None = None) -> torch.Tensor:
    """Next token ids `[B]` from last-position logits `[B, vocab]`. temperature 0 means greedy (argmax)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k, top_p, min_p), dim=-1)
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_token_id: int | None = None,
             return_logits: bool = False, sampling: SamplingParams | None = None):
    """Generate `max_new_tokens` after `input_ids [B, T]`; returns `[B, T + new]` (and `[B, new, vocab]` logits).

    With `eos_token_id`, generation stops early once every sequence has produced it (later positions
    of finished sequences are filled with eos). `sampling` (a `lib.modeling.sampling.SamplingParams`: penalties,
    logit_bias, min_p, min_tokens, ...) replaces `temperature`, `top_k` and `top_p`; each row is chosen by
    `sampling.choose`, as the engine and the server choose.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    input_ids = input_ids.to(model.device)
    b, t = input_ids.shape
    max_len = model.config.max_seq_len
    if t + max_new_tokens > max_len:
        raise ValueError(f"prompt ({t}) + max_new_tokens ({max_new_tokens}) = {t + max_new_tokens} exceeds "
                         f"the model's max_seq_len {max_len}")
    cache = model.new_cache(batch=b, max_len=t + max_new_tokens) if use_cache else None
    ids = input_ids
    step_logits = []
    finished = torch.zeros(b, dtype=torch.bool, device=ids.device)
    next_input = ids
    for _ in range(max_new_tokens):
        logits = model(next_input if use_cache else ids, cache=cache)[:, -1]  # [B, vocab]
        step_logits.append(logits)
        if sampling is None:
            nxt = sample_next(logits, temperature, top_k, top_p, generator)  # [B]
        else:
            nxt = torch.tensor([sampling.choose(logits[i], input_ids[i].tolist(), ids[i, t:].tolist(), generator)
                                for i in range(b)], dtype=ids.dtype, device=ids.device)
        if eos_token_id is not None:
            nxt = torch.where(finished, torch.full_like(nxt, eos_token_id), nxt)
            finished |= nxt == eos_token_id
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        next_input = nxt[:, None]
        if eos_token_id is not None and bool(finished.all()):
            break
    if return_logits:
        return ids, torch.stack(step_logits, dim=1)
    return ids
