"""The engine's record of a request (week 19): its prompt and output, its block table, how far its tokens are computed,
its sampling parameters (`lib.modeling.sampling.SamplingParams`) and its times. `LLMEngine` (`lib.batching.engine`) creates and
updates them; `lib.batching.blocks.BlockManager` reads and writes their blocks; a step's tokens come back as `StepOutput`s.
A request the engine can never run is refused with an `AdmissionError`; an id it does not know raises
`UnknownRequestError`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lib.modeling.sampling import SamplingParams


class UnknownRequestError(KeyError, ValueError):
    """A request id the engine does not know (never added, aborted, or already collected)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class AdmissionError(ValueError):
    """A request the engine can never run (`LLMEngine.admissible`): `field` is the part of the request at fault
    ("prompt", "max_tokens", "n"), `code` OpenAI's error code where one fits."""

    def __init__(self, message: str, field: str, code: str | None = None):
        super().__init__(message)
        self.field, self.code = field, code


@dataclass(eq=False)
class Request:
    request_id: object
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)  # the block table
    num_computed: int = 0  # tokens whose K and V are in the cache
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks registered so far
    num_cached_prompt: int = 0  # prompt tokens found in the prefix cache (last admission)
    num_preemptions: int = 0
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: bool = False
    padding: list[int] = field(default_factory=list)  # static batching: tokens run after finishing, thrown away
    # temperature, seed (its generator's), top_p, penalties, logit_bias, lora, ... (lib.modeling.sampling): their one record
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1  # parallel sampling: samples still to fork off when the prompt is done
    generator: torch.Generator | None = None
    serial: int = 0  # the engine's int id of the request (what the scheduler sees)
    swapped: list | None = None  # preempted by swapping: its blocks' K and V per layer, in host memory
    siblings: list = field(default_factory=list)  # requests of its own that wait to fork off its prompt (`sibling_of`)
    sibling_of: "Request | None" = None  # the request whose prompt this one waits to fork off

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output + self.padding

    @property
    def lora(self):
        """The request's LoRA adapter (`params.lora`, lib.modeling.lora), or None: the base model."""
        return self.params.lora

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output) + len(self.padding)


@dataclass(frozen=True)
class StepOutput:
    """One token produced by a step."""
    request_id: object
    token: int
    finished: bool
