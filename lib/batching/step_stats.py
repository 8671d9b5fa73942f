"""The observer of an engine's steps (week 19): `lib.batching.engine.LLMEngine` hands each step to `StepStats.on_step`
after postprocessing, and reads its two records (`trace`, `step_stats`) as its own. Kept apart from the engine so
that a step's bookkeeping is not inline in the step (issue 59: stats go to an observer)."""
from __future__ import annotations

from lib.batching.request import Request


class StepStats:
    """The observer of an engine's steps: after each, `on_step` records in `trace` (request_id, tokens computed)
    of each scheduled request, and in `step_stats` the step's time and counts (sequences, tokens, blocks, slots)."""

    def __init__(self):
        self.trace: list[list[tuple[object, int]]] = []
        self.step_stats: list[dict] = []

    def on_step(self, engine, scheduled: list[tuple[Request, int]], now: float) -> None:
        running = engine.running
        self.trace.append([(req.request_id, n) for req, n in scheduled])
        self.step_stats.append(dict(
            time=now, num_seqs=len(scheduled), num_tokens=sum(n for _, n in scheduled),
            num_prefill_tokens=sum(n for _, n in scheduled if n > 1),
            blocks_in_use=engine.blocks.num_in_use,
            slots_used=sum(r.num_computed for r in running),
            slots_allocated=sum(len(r.blocks) for r in running) * engine.block_size,
            slots_preallocated=sum(len(r.prompt) + r.max_new_tokens for r in running),  # a contiguous cache's
            num_running=len(running),
        ))
