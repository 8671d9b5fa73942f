"""One sampler for `lib.modeling.generate`, the engine and the server: the fields OpenAI's and vLLM's APIs take.

    params = SamplingParams(temperature=0.8, top_p=0.9, frequency_penalty=0.5, logit_bias={50256: -100})
    logits = params.adjust(logits, prompt, output)         # bias, penalties, min_tokens: what any temperature sees
    token = params.choose(logits, prompt, output, generator)   # adjust, then greedy at temperature 0, else sample

The order, as vLLM's sampler: `logit_bias` is added and, before `min_tokens` tokens, the end-of-sequence and
`stop_token_ids` tokens are masked; then the penalties — `repetition_penalty` r (tokens seen in the prompt or the
output: a positive logit divided by r, a negative one multiplied), `frequency_penalty` (minus f times the token's
count in the output) and `presence_penalty` (minus p once a token has appeared in the output); then the
temperature; then `min_p` (tokens below min_p times the top probability dropped), `top_k` and `top_p` (the
smallest set whose probability reaches top_p). At temperature 0 the token is the argmax of the adjusted logits:
with the defaults that is the plain argmax, so greedy decoding is unchanged.

A `SamplingParams` is also the one carrier of a request's parameters through the serving stack (the server, its
`ServingLoop`, `LLMEngine.add_request(..., params=params)`): besides the sampling fields it holds the request's
`seed`, its `lora` adapter, `sibling_of` (the id of a waiting request of the same prompt to fork off: how the
server's `n` and `best_of` share a prompt) and `logprob_entries`, the list the engine appends the request's
`(token, logprob, [(alternative, logprob), ...])` to when `logprobs` is set — the way results come back. That list
and `guide` are the request's mutable state: one params object per request (`for_another_sequence` gives another
sequence its own).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1): off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict = field(default_factory=dict)  # {token id: bias added to its logit}
    stop_token_ids: tuple = ()
    min_tokens: int = 0  # before this many output tokens, eos and stop_token_ids cannot be drawn
    eos_token_id: int | None = None  # masked before min_tokens, and always with ignore_eos
    ignore_eos: bool = False  # the eos token is masked: the answer runs to its length
    logprobs: int | None = None  # record each chosen token's log-probability and this many alternatives (the engine)
    # Guided decoding (`lib.serve.guided.JsonGuide`): `guide.allowed(output) -> bool [vocab]`, the only tokens that may
    # come next; one guide per sequence (`guide.fork()` for another), as it follows the sequence's output.
    guide: object | None = None
    # The request's LoRA adapter (`lib.modeling.lora.LoRAAdapter`; None: the base model): not a sampling field, but a request's
    # parameters travel as this one object, so the engine applies it to the request's rows (multi-LoRA serving).
    lora: object | None = None
    # What the engine's request needs besides sampling: the seed of its generator (sampled at temperature > 0; sample
    # k of an `n` request is seeded seed + k), and `sibling_of`, the id of a *waiting* request with the same prompt
    # that this one forks off when that prompt is computed, instead of computing it again (`LLMEngine.add_request`).
    seed: int = 0
    sibling_of: object | None = None
    # Where the engine records each chosen token's (token, logprob, [(alternative, logprob), ...]) when `logprobs`
    # is set: this request's own list (a new one per params object; not compared), read back by whoever submitted.
    logprob_entries: list = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self):
        bad = []
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            bad.append(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.logprob_entries, list):
            bad.append(f"logprob_entries must be a list, got {type(self.logprob_entries).__name__}")
        if not self.temperature >= 0:
            bad.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            bad.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            bad.append(f"top_k must be -1, 0 (both: off) or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            bad.append(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            bad.append(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            bad.append(f"logprobs must be from 0 to 20, got {self.logprobs}")
        if self.min_tokens < 0:
            bad.append(f"min_tokens must be >= 0, got {self.min_tokens}")
        if bad:
            raise ValueError("; ".join(bad))

    def for_another_sequence(self, **changes) -> "SamplingParams":
        """These params for another sequence (a fork, another choice), with `changes` (`seed=...`): the same
        fields, and mutable state of its own — an empty `logprob_entries` and, if guided, a fork of the guide."""
        if self.guide is not None and "guide" not in changes:
            changes["guide"] = self.guide.fork()
        return dataclasses.replace(self, **changes, logprob_entries=[])

    @property
    def is_plain(self) -> bool:
        """True when `adjust` changes nothing."""
        return (not self.logit_bias and self.presence_penalty == 0 and self.frequency_penalty == 0
                and self.repetition_penalty == 1 and not self._masked(0) and self.guide is None)

    def _masked(self, n_output: int) -> list[int]:
        ids = []
        if self.eos_token_id is not None and (self.ignore_eos or n_output < self.min_tokens):
            ids.append(self.eos_token_id)
        if n_output < self.min_tokens:
            ids.extend(self.stop_token_ids)
        return ids

    def adjust(self, logits: torch.Tensor, prompt: Sequence[int], output: Sequence[int]) -> torch.Tensor:
        """`logits [vocab]` (a new tensor; the input is left alone) with the bias, the masks and the penalties, for
        a sequence whose prompt and output so far are given."""
        out = logits.float().clone()
        vocab = out.shape[-1]
        for token, bias in self.logit_bias.items():
            out[int(token)] += float(bias)
        masked = self._masked(len(output))
        if masked:
            out[torch.tensor(masked, device=out.device)] = float("-inf")
        if self.repetition_penalty != 1 and (len(prompt) or len(output)):
            seen = torch.zeros(vocab, dtype=torch.bool, device=out.device)
            seen[torch.tensor(list(prompt) + list(output), device=out.device)] = True
            r = self.repetition_penalty
            out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)
        if (self.frequency_penalty or self.presence_penalty) and len(output):
            counts = torch.bincount(torch.tensor(list(output), device=out.device), minlength=vocab)[:vocab].float()
            out = out - self.frequency_penalty * counts - self.presence_penalty * (counts > 0).float()
        if self.guide is not None:
            allowed = self.guide.allowed(output).to(out.device)
            if allowed.shape[-1] != vocab:
                raise ValueError(f"the guide's mask covers {allowed.shape[-1]} tokens; the logits have {vocab}")
            out = out.masked_fill(~allowed, float("-inf"))
        return out

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution a token is drawn from at this temperature (> 0), from adjusted `logits [..., vocab]`."""
        scaled = logits.float() / self.temperature
        return torch.softmax(filter_logits(scaled, self.top_k, self.top_p, self.min_p), dim=-1)

    def choose(self, logits: torch.Tensor, prompt: Sequence[int], output: Sequence[int],
               generator: torch.Generator | None = None) -> int:
        """The next token of one sequence from its last position's `logits [vocab]`."""
        adjusted = logits if self.is_plain else self.adjust(logits, prompt, output)
        if self.temperature == 0:
            return int(adjusted.argmax())
        probs = self.probabilities(adjusted)
        if generator is not None and generator.device != probs.device:
            probs = probs.to(generator.device)
        return int(torch.multinomial(probs[None], 1, generator=generator)[0, 0])  # as sample_next draws a row


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None,
                  min_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit below min_p times the top probability, outside the top-k, and outside the smallest
    set whose probability reaches top_p (the top token always stays). `logits [..., vocab]`, a new tensor."""
    logits = logits.clone()
    if min_p:
        probs = torch.softmax(logits, dim=-1)
        logits[probs < min_p * probs.amax(dim=-1, keepdim=True)] = float("-inf")
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits[logits < kth] = float("-inf")
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = (probs.cumsum(dim=-1) - probs) >= top_p  # the tokens ranked above it already reach top_p
        sorted_logits[drop] = float("-inf")
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits
