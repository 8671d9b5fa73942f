"""Week 18's test models and the spies its loop checks hand the student instead of the models.

Separate from the checks (grader/checks/week18.py) because they are the instruments, not the verdicts: the same
`MarkovLM` and `spy` serve exercises 1 and 3, the notebook's demos and tests/test_week18_checks.py.

`MarkovLM` is a second-order Markov chain with a model's call shape whose "cache" is the token history. It is fast,
its greedy path wanders, and it punishes a missing rollback: a history that still holds rejected tokens gives
other logits. `TableLM` gives each new position a law of its own (the sampling law test's models). `spy` puts a
model behind a counted door that logs every forward however it is invoked.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lib.modeling.llama import ModelConfig, tiny_model
from lib.spec_decode.drafts import TokenHistory  # the token-history "cache" of the test models

# --- test models ----------------------------------------------------------------------------------------

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

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> TokenHistory:
        return TokenHistory(max_len or self.config.max_seq_len)

    def __call__(self, input_ids: torch.Tensor, cache: TokenHistory | None = None) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"MarkovLM takes input_ids [1, t]; got {tuple(input_ids.shape)}")
        history = cache if cache is not None else TokenHistory(self.config.max_seq_len)
        start = history.length
        history.tokens.extend(input_ids[0].tolist())
        seq = torch.tensor(history.tokens)
        prev = torch.cat([seq.new_zeros(1), seq[:-1]])  # the token before each position (0 before the first)
        rows = torch.arange(start, len(history.tokens))
        return (self.A[seq[rows]] + self.B[prev[rows]])[None]  # [1, t, vocab]

    forward = __call__


class TableLM:
    """A model whose next-token logits depend only on which new token it predicts: row r of `logits` [rows, V]
    for new token r, counted from the end of a prompt of `prompt_len` tokens (zeros, a uniform law, inside the
    prompt and past the table). Same call shape and cache as `MarkovLM`, so the law of what a loop writes at each
    position is the table's row by row: the week-18 law test designs p and q per position with it."""

    def __init__(self, logits: torch.Tensor, prompt_len: int):
        self.logits = logits.float()
        self.prompt_len = prompt_len
        vocab = logits.shape[1]
        self.config = ModelConfig(vocab_size=vocab, d_model=1, n_layers=1, n_heads=1, n_kv_heads=1, d_ff=1,
                                  max_seq_len=4096)
        self.device = torch.device("cpu")

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> TokenHistory:
        return TokenHistory(max_len or self.config.max_seq_len)

    def __call__(self, input_ids: torch.Tensor, cache: TokenHistory | None = None) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"TableLM takes input_ids [1, t]; got {tuple(input_ids.shape)}")
        history = cache if cache is not None else TokenHistory(self.config.max_seq_len)
        start = history.length
        history.tokens.extend(input_ids[0].tolist())
        rows = torch.arange(start, len(history.tokens)) + 1 - self.prompt_len  # the new token each position predicts
        inside = (rows >= 0) & (rows < self.logits.shape[0])
        out = torch.zeros(len(rows), self.logits.shape[1])
        out[inside] = self.logits[rows[inside]]
        return out[None]  # [1, t, vocab]

    forward = __call__


def spicy_tiny(seed: int, scale: float = 10.0):
    """A tiny random Llama with weights scaled up, so that its greedy path does not repeat one token."""
    model = tiny_model(seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(scale)
    return model


# --- 1 ------------------------------------------------------------------------------------------------
# The student's loop gets spies, not the models: objects with the models' call shape (`config`, `device`,
# `new_cache`, `__call__` and `forward`) and no way to the model except through a counted forward. Every
# forward is logged with the tokens fed, the cache it ran on and that cache's contents before the call (a
# shadow of the tokens each cache holds, rebuilt from cache.length, so a truncate is seen as it happened).

@dataclass
class Forward:
    """One forward the student's loop ran: which model ("target" or "draft"), the tokens fed, the cache's index
    (None: no cache) and the tokens that cache held before the call."""
    who: str
    fed: list
    cache: int | None
    held: list


def spy(model, log: list, who: str, faults: list | None = None):
    """`model` behind a counted door: every call, as `spy(ids, cache=c)` or `spy.forward(ids, cache=c)`, is
    appended to `log` as a `Forward(who, ...)`. Caches must come from `spy.new_cache`. Ids on another device than
    the model's are refused, and the refusal is also appended to `faults` (a loop that catches the error is
    still judged). The model runs under `with torch.device(its device)`, whatever default the caller set."""
    shadows = []  # (cache, tokens it holds): the cache object is kept so its id is never reused
    home = torch.device(model.device)

    def run(input_ids, cache=None):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"the model takes input_ids [1, t]; got {getattr(input_ids, 'shape', input_ids)!r}")
        if input_ids.device != home:
            fault = (f"the {who} was called with ids on '{input_ids.device}', the model is on '{home}'")
            if faults is not None:
                faults.append(fault)
            raise ValueError(f"{fault}: make the ids on the prompt's device")
        fed = input_ids[0].tolist()
        index, held = None, []
        if cache is not None:
            index = next((i for i, (c, _) in enumerate(shadows) if c is cache), None)
            if index is None:
                raise ValueError("pass a cache made by this model's new_cache(batch=1, max_len=...)")
            tokens = shadows[index][1]
            del tokens[cache.length:]  # what a truncate left
            held = list(tokens)
            tokens.extend(fed)
        log.append(Forward(who, fed, index, held))
        with torch.device(home):
            return model(input_ids, cache=cache)

    class Model:
        __slots__ = ()
        config = model.config
        device = model.device

        def __call__(self, input_ids, cache=None):
            return run(input_ids, cache)

        def forward(self, input_ids, cache=None):
            return run(input_ids, cache)

        def new_cache(self, batch: int = 1, max_len: int | None = None):
            with torch.device(home):
                cache = model.new_cache(batch=batch, max_len=max_len)
            shadows.append((cache, []))
            return cache

    return Model()


def work_failures(log: list, output: list, k: int) -> list[str]:
    """What the logs show wrong with a speculative loop that wrote `output` (the prompt and the new tokens):
    a target call after the prefill without a cache or fed more than K + 1 tokens; a cache holding a token
    that is not the output's at the start of a round (no rollback); a draft call after its prefill fed more
    than 2 tokens (the last draft token and the target's, after a round that kept all K)."""
    target_log = [f for f in log if f.who == "target"]
    bad = []
    for j, f in enumerate(target_log[1:], 1):
        if f.cache is None:
            bad.append(f"target call {j} ran without a cache (fed {len(f.fed)} tokens): keep a KV cache per model")
        elif len(f.fed) > k + 1:
            bad.append(f"target call {j} was fed {len(f.fed)} tokens; a round feeds the last token kept and at most "
                       f"K = {k} draft tokens (K + 1), the rest is in the cache")
    for j, f in enumerate(target_log):
        if f.cache is not None and f.held != output[:len(f.held)]:
            bad.append(f"before target call {j} its cache held {len(f.held)} positions, not all of them tokens "
                       f"of the output: rejected draft tokens were left in it (truncate to the tokens kept)")
    # the draft: its first call is its prefill; after that, at most 2 tokens per call, and at the start of
    # each round (its first call after a target call) its cache holds only tokens of the output
    j = -1
    for i, f in enumerate(log):
        if f.who != "draft":
            continue
        j += 1
        if j > 0 and (f.cache is None or len(f.fed) > 2):
            bad.append(f"draft call {j} was fed {len(f.fed)} tokens" + (" without a cache" if f.cache is None else "")
                       + ": after its prefill the draft needs at most the 2 tokens its cache has not seen")
        round_start = i == 0 or log[i - 1].who == "target"
        if round_start and f.cache is not None and f.held != output[:len(f.held)]:
            bad.append(f"before draft call {j} its cache held {len(f.held)} positions, not all of them tokens of "
                       f"the output: roll the draft's cache back to the tokens kept too")
        if bad:
            break
    return bad[:2]
