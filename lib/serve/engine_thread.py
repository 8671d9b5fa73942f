"""The server's engine thread (lib.serve.server): `Submission`, one request on its way through the engine, and
`EngineLoop`, which owns the engine and runs a `ServingLoop` over it in one background thread — the only thread that
touches the engine. `submit` and `abort` are safe from any thread; tokens go back to each request's asyncio queue.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from lib.batching.engine import LLMEngine
from lib.modeling.sampling import SamplingParams
from lib.serve.server_metrics import E2E_BUCKETS, TTFT_BUCKETS, Histogram, metrics_text
from lib.serve.serving import ServingLoop

log = logging.getLogger("lib.serve.server")  # one line per request (python -m lib.serve.server prints them)


# --- the engine thread ----------------------------------------------------------------------------------------

@dataclass(eq=False)
class Submission:
    """One request on its way through the engine: what to run, and where its tokens go. `params` carries the
    request's sampling (temperature, seed, top_p, penalties, ..., its LoRA adapter) to the engine, and its logprob
    entries back (`params.logprob_entries`, filled as the engine samples when `params.logprobs` is set)."""
    prompt: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    loop: asyncio.AbstractEventLoop | None = None
    out: asyncio.Queue | None = None  # receives ("token", id), then ("done", finish_reason) or ("error", message)
    request_id: int = -1
    submitted: float = field(default_factory=time.perf_counter)
    scheduled: float | None = None  # when the engine first ran it: the wait before is its time in the queue
    first_token: float | None = None
    n_tokens: int = 0
    stopped: bool = False  # ended by a stop string: the engine's request is aborted, but the answer is complete
    stop_token_ids: frozenset = frozenset()  # a token that ends the answer (not returned as text)
    sibling_of: "Submission | None" = None  # another sample of the same prompt: forks off its computed prompt
    # (submit_all writes its request id into `params.sibling_of`, which is how the engine learns it)

    def emit(self, item) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class EngineLoop:
    """Owns the engine; runs a `ServingLoop` over it in one background thread. `submit` and `abort` are safe
    from any thread. `loop_cls`: any class with `ServingLoop`'s methods (the notebook plugs its own in)."""

    def __init__(self, engine: LLMEngine, eos_token_id: int | None = None, loop_cls=ServingLoop,
                 model_name: str = "SmolLM2-135M-Instruct"):
        self.engine = engine
        self.model_name = model_name
        self.eos_token_id = eos_token_id
        self.serving = loop_cls(engine, eos_token_id)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._live: dict[int, Submission] = {}
        self._ids = itertools.count()
        self.stats = {"requests_total": 0, "requests_finished": 0, "requests_aborted": 0, "requests_failed": 0,
                      "prompt_tokens_total": 0, "generation_tokens_total": 0, "steps_total": 0}
        self.ttft: list[float] = []  # seconds, the last 1,000 requests
        self.tpot: list[float] = []
        self.finished_by = {"stop": 0, "length": 0, "abort": 0}  # vLLM's request_success_total{finished_reason}
        self.histograms = {"vllm:time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
                           "vllm:e2e_request_latency_seconds": Histogram(E2E_BUCKETS),
                           "vllm:request_queue_time_seconds": Histogram(TTFT_BUCKETS)}
        self.queue_time: list[float] = []  # seconds from arrival to the engine's first step with it, last 1,000
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, sub: Submission) -> None:
        self.submit_all([sub])

    def submit_all(self, subs: list[Submission]) -> None:
        """Submit together: the engine thread takes them in one go, so a sample's `sibling_of` is still waiting
        when the sample arrives (the engine forks it off the computed prompt instead of computing it again)."""
        for sub in subs:
            sub.request_id = next(self._ids)
            if sub.sibling_of is not None and sub.sibling_of.request_id >= 0:  # the same logprob_entries list
                sub.params = dataclasses.replace(sub.params, sibling_of=sub.sibling_of.request_id)
        self._inbox.put(("add", subs))
        self._wake.set()

    def abort(self, sub: Submission) -> None:
        self._inbox.put(("abort", sub))
        self._wake.set()

    # -- in the engine thread only --

    def _drain(self) -> None:
        while True:
            try:
                op, sub = self._inbox.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                for one in sub:
                    self._add(one)
            elif sub.request_id in self._live:
                self.serving.cancel(sub.request_id)

    def _add(self, sub: Submission) -> None:
        self._live[sub.request_id] = sub
        self.serving.submit(sub.request_id, sub.prompt, sub.max_tokens, sub.params)  # loop_cls hands params on
        self.stats["requests_total"] += 1
        self.stats["prompt_tokens_total"] += len(sub.prompt)

    def _deliver(self, kind: str, rid, value) -> None:
        sub = self._live.get(rid)
        if sub is None:
            return
        now = time.perf_counter()
        if kind == "token":
            if sub.first_token is None:
                sub.first_token = now
                self.ttft = (self.ttft + [now - sub.submitted])[-1000:]
                self.histograms["vllm:time_to_first_token_seconds"].observe(now - sub.submitted)
            sub.n_tokens += 1
            self.stats["generation_tokens_total"] += 1
            sub.emit(("token", value))
            return
        del self._live[rid]
        if kind == "error":
            self.stats["requests_failed"] += 1
            log.info("request %s failed after %.3f s: %s", rid, now - sub.submitted, value)
            sub.emit(("error", value))
            return
        reason = "stop" if sub.stopped else value
        self.stats["requests_aborted" if reason == "abort" else "requests_finished"] += 1
        self.finished_by[reason] = self.finished_by.get(reason, 0) + 1
        self.histograms["vllm:e2e_request_latency_seconds"].observe(now - sub.submitted)
        log.info("request %s %s: %d prompt + %d completion tokens, queued %s, first token %s, %.3f s in all", rid,
                 reason, len(sub.prompt), sub.n_tokens, "to the end" if sub.scheduled is None else
                 f"{sub.scheduled - sub.submitted:.3f} s", "never" if sub.first_token is None else
                 f"after {sub.first_token - sub.submitted:.3f} s", now - sub.submitted)
        if sub.first_token is not None and sub.n_tokens > 1:
            self.tpot = (self.tpot + [(now - sub.first_token) / (sub.n_tokens - 1)])[-1000:]
        sub.emit(("done", value))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain()
            if not self.serving.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                with torch.inference_mode():
                    messages = self.serving.run_once()
            except Exception as e:  # noqa: BLE001  (never let one bad step stop the server)
                for rid in list(self._live):
                    try:
                        self.engine.abort(rid)
                    except KeyError:
                        pass
                    self._deliver("error", rid, f"the engine failed: {type(e).__name__}: {e}")
                self.serving = type(self.serving)(self.engine, self.eos_token_id)  # a fresh loop: no stale state
                continue
            self.stats["steps_total"] += 1
            self._note_scheduled()
            for kind, rid, value in messages:
                self._deliver(kind, rid, value)

    def _note_scheduled(self) -> None:
        """The requests the last step ran for the first time: their wait in the queue ends now."""
        if not self.engine.trace:
            return
        now = time.perf_counter()
        for rid, _ in self.engine.trace[-1]:
            sub = self._live.get(rid)
            if sub is not None and sub.scheduled is None:
                sub.scheduled = now
                self.queue_time = (self.queue_time + [now - sub.submitted])[-1000:]
                self.histograms["vllm:request_queue_time_seconds"].observe(now - sub.submitted)

    def metrics(self) -> str:
        """Prometheus text format: the lab's names, and vLLM's for the metrics vLLM has (lib.serve.server_metrics)."""
        return metrics_text(self)
