"""An OpenAI-compatible HTTP server on the lab's engine (week 21, the capstone: serve it).

    python -m lib.server --port 8000                      # SmolLM2 on 127.0.0.1:8000 (`make serve`)
    python -m lib.server --prefix-caching --weights packed

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is", max_tokens=8)

The shape is vLLM's, small enough to read in one sitting:

- an **asyncio front end** (Starlette on uvicorn) turns each HTTP request into a `Submission` and awaits its
  tokens on an `asyncio.Queue`;
- **one engine thread** owns `lib.engine.LLMEngine` (nothing else touches it) and runs a
  `lib.serving.ServingLoop` over it: submissions from a thread-safe inbox are admitted, each `run_once` is one
  `engine.step()` — continuous batching across every open request, prefix caching when asked — and each step's
  tokens go to the right request's queue with `loop.call_soon_threadsafe`;
- a `lib.serving.TextStream` per request turns tokens into text that never changes once sent (whole UTF-8
  characters; a possible stop string held back), so streamed pieces add up to the plain answer;
- a client that disconnects mid-stream is **aborted** in the engine, its blocks freed at the next step.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both with `"stream": true` as server-sent
events), `GET /v1/models`, `GET /v1/models/{name}`, `POST /tokenize` and `POST /detokenize` (vLLM's), `GET /health`,
`GET /metrics` (Prometheus text). Sampling takes OpenAI's and vLLM's fields (`lib.sampling`: top_p, top_k, min_p,
the three penalties, logit_bias, stop_token_ids, min_tokens, ignore_eos); a field the server does not implement,
or does not know, is refused (`lib.openai_api`). A bad request gets OpenAI's error object (`{"error": {"message",
"type", "param", "code"}}`) and never reaches the engine; a request that can never fit (prompt + max_tokens past
the model's length or the whole KV pool) is refused at once. `--api-key` (or $VLLM_API_KEY) makes every /v1
route ask for it.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import itertools
import json
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import torch

from lib.engine import AdmissionError, LLMEngine
from lib.openai_api import (RequestError, answer_options, check_fields, float_field, int_field, prompt_ids,
                            sampling_params)
from lib.sampling import SamplingParams
from lib.server_metrics import E2E_BUCKETS, TTFT_BUCKETS, Histogram, metrics_text
from lib.serving import ServingLoop, TextStream, token_bytes

log = logging.getLogger("lib.server")  # one line per request (python -m lib.server prints them)


# --- the engine thread ----------------------------------------------------------------------------------------

@dataclass(eq=False)
class Submission:
    """One request on its way through the engine: what to run, and where its tokens go."""
    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    loop: asyncio.AbstractEventLoop | None = None
    out: asyncio.Queue | None = None  # receives ("token", id), then ("done", finish_reason) or ("error", message)
    request_id: int = -1
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    n_tokens: int = 0
    stopped: bool = False  # ended by a stop string: the engine's request is aborted, but the answer is complete
    params: SamplingParams | None = None  # the other sampling fields (top_p, penalties, ...); None: plain
    stop_token_ids: frozenset = frozenset()  # a token that ends the answer (not returned as text)

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
                           "vllm:e2e_request_latency_seconds": Histogram(E2E_BUCKETS)}
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
        sub.request_id = next(self._ids)
        self._inbox.put(("add", sub))
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
                self._live[sub.request_id] = sub
                if sub.params is not None:  # the engine takes them at add_request, whatever loop_cls passes on
                    self.engine.sampling_for[sub.request_id] = sub.params
                self.serving.submit(sub.request_id, sub.prompt, sub.max_tokens, sub.temperature, sub.seed)
                self.stats["requests_total"] += 1
                self.stats["prompt_tokens_total"] += len(sub.prompt)
            elif sub.request_id in self._live:
                self.serving.cancel(sub.request_id)

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
        self.engine.sampling_for.pop(rid, None)
        if kind == "error":
            self.stats["requests_failed"] += 1
            log.info("request %s failed after %.3f s: %s", rid, now - sub.submitted, value)
            sub.emit(("error", value))
            return
        reason = "stop" if sub.stopped else value
        self.stats["requests_aborted" if reason == "abort" else "requests_finished"] += 1
        self.finished_by[reason] = self.finished_by.get(reason, 0) + 1
        self.histograms["vllm:e2e_request_latency_seconds"].observe(now - sub.submitted)
        log.info("request %s %s: %d prompt + %d completion tokens, first token %s, %.3f s in all", rid, reason,
                 len(sub.prompt), sub.n_tokens, "never" if sub.first_token is None else
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
            for kind, rid, value in messages:
                self._deliver(kind, rid, value)

    def metrics(self) -> str:
        """Prometheus text format: the lab's names, and vLLM's for the metrics vLLM has (lib.server_metrics)."""
        return metrics_text(self)


# --- the HTTP front end ---------------------------------------------------------------------------------------

class Server:
    """Validates requests, tokenizes them, feeds the engine loop, and formats OpenAI's responses."""

    def __init__(self, engine: LLMEngine, tokenizer, model_name: str = "SmolLM2-135M-Instruct",
                 loop_cls=ServingLoop, text_stream_cls=TextStream, api_key: str | None = None):
        self.api_key = api_key
        self.tok = tokenizer
        self.token_bytes = token_bytes(tokenizer)
        self.text_stream_cls = text_stream_cls
        self.model_name = model_name
        self.engine = engine
        self.max_len = engine.config.max_seq_len
        self.loop = EngineLoop(engine, eos_token_id=tokenizer.eos_token_id, loop_cls=loop_cls, model_name=model_name)
        self.created = int(time.time())

    # -- requests --

    def parse(self, body, chat: bool) -> tuple[Submission, dict]:
        """A request body -> its `Submission` and the options of its answer; `RequestError` for a bad one."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        check_fields(body, chat, self.model_name)
        prompt = prompt_ids(body, chat, self.tok)
        room = self.max_len - len(prompt)
        if room < 1:
            raise RequestError(f"the prompt has {len(prompt)} tokens; this model's context is {self.max_len}",
                               param="messages" if chat else "prompt", code="context_length_exceeded")
        max_tokens = int_field(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                               else "max_tokens", min(16 if not chat else 256, room), 1, room)
        try:  # the engine's own admission rule, so the server and the engine never disagree
            prompt = self.engine.admissible(prompt, max_tokens)
        except AdmissionError as e:
            raise RequestError(str(e), param={"prompt": "messages" if chat else "prompt", "n": "n"}.get(e.field, "max_tokens"),
                               code=e.code) from None
        temperature = float_field(body, "temperature", 1.0, 0.0, 2.0)
        seed = body.get("seed")
        seed = int_field(body, "seed", 0, -2**63, 2**63 - 1) if seed is not None else int.from_bytes(
            uuid.uuid4().bytes[:4], "little")
        opts = answer_options(body, chat)
        params, stop_ids = sampling_params(body, temperature, max_tokens, self.engine.config.vocab_size,
                                           self.tok.eos_token_id)
        return Submission(prompt, max_tokens, temperature, seed % 2**63, params=params, stop_token_ids=stop_ids), opts

    def tokenize(self, body: dict) -> list[int]:
        """vLLM's /tokenize: a completion's `prompt` or a chat's `messages` (the template applied) -> token ids."""
        return prompt_ids(body, "messages" in body, self.tok)

    async def tokens(self, sub: Submission, is_disconnected=None):
        """Submit, then yield ("token", id) items until ("done", reason); abort on cancellation or disconnect."""
        sub.loop = asyncio.get_running_loop()
        sub.out = asyncio.Queue()
        self.loop.submit(sub)
        done = False
        try:
            while True:
                try:
                    item = await asyncio.wait_for(sub.out.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if is_disconnected is not None and await is_disconnected():
                        return
                    continue
                if item[0] == "error":
                    done = True
                    raise RequestError(item[1], status=500, kind="server_error")
                yield item
                if item[0] == "done":
                    done = True
                    return
        finally:
            if not done:
                self.loop.abort(sub)

    async def text_pieces(self, sub: Submission, stops: list[str], is_disconnected=None):
        """Yield ("text", piece) as the answer's text becomes final, then ("done", finish_reason, tokens).

        A `TextStream` turns token bytes into text: whole characters only, a possible stop string held back, so
        the streamed pieces concatenate to exactly the non-streamed text; a stop string ends the request (and is
        not returned), as in OpenAI's API."""
        text = self.text_stream_cls(stops)
        n = 0
        agen = self.tokens(sub, is_disconnected)
        try:
            async for item in agen:
                if item[0] == "done":
                    piece = text.finish()
                    if piece:
                        yield ("text", piece)
                    yield ("done", item[1], n)
                    return
                n += 1
                if item[1] in sub.stop_token_ids:  # ends the answer; its own text is not part of it
                    piece = text.finish()
                    if piece:
                        yield ("text", piece)
                    sub.stopped = True
                    yield ("done", "stop", n)
                    return
                piece = text.push(self.token_bytes[item[1]])
                if piece:
                    yield ("text", piece)
                if text.stopped:
                    sub.stopped = True  # the abort that follows ends a finished answer: counted as finished
                    yield ("done", "stop", n)
                    return
        finally:
            await agen.aclose()

    # -- responses --

    def _envelope(self, chat: bool, rid: str, stream: bool) -> dict:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
        return {"id": rid, "object": obj, "created": int(time.time()), "model": self.model_name}

    def _choice(self, chat: bool, text: str | None, finish: str | None, stream: bool, first: bool = False) -> dict:
        if not chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if stream:
            delta = ({"role": "assistant", "content": ""} if first else {}) | (
                {"content": text} if text is not None else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}

    async def complete(self, sub: Submission, opts: dict, is_disconnected=None) -> dict:
        chat = opts["chat"]
        pieces, finish, n = [], "length", 0
        async for item in self.text_pieces(sub, opts["stop"], is_disconnected):
            if item[0] == "text":
                pieces.append(item[1])
            else:
                finish, n = item[1], item[2]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        return self._envelope(chat, rid, False) | {
            "choices": [self._choice(chat, "".join(pieces), finish, False)],
            "usage": {"prompt_tokens": len(sub.prompt), "completion_tokens": n,
                      "total_tokens": len(sub.prompt) + n}}

    async def stream(self, sub: Submission, opts: dict):
        """Server-sent events: one chunk per text piece, a last chunk with the finish reason, then [DONE]."""
        chat = opts["chat"]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        env = self._envelope(chat, rid, True)
        first = True
        try:
            async for item in self.text_pieces(sub, opts["stop"]):
                if item[0] == "text":
                    yield f"data: {json.dumps(env | {'choices': [self._choice(chat, item[1], None, True, first)]})}\n\n"
                else:
                    yield f"data: {json.dumps(env | {'choices': [self._choice(chat, None, item[1], True, first)]})}\n\n"
                    if opts["usage"]:  # stream_options.include_usage: one more chunk, no choices, the usage
                        usage = {"prompt_tokens": len(sub.prompt), "completion_tokens": item[2],
                                 "total_tokens": len(sub.prompt) + item[2]}
                        yield f"data: {json.dumps(env | {'choices': [], 'usage': usage})}\n\n"
                first = False
        except RequestError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
        yield "data: [DONE]\n\n"


def build_app(server: Server):
    """The Starlette application; the engine thread starts and stops with it."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def error(e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def completions(request: Request, chat: bool):
        try:
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"the request body is not valid JSON: {e}") from None
            sub, opts = server.parse(body, chat)
            if opts["stream"]:
                return StreamingResponse(server.stream(sub, opts), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            return JSONResponse(await server.complete(sub, opts, request.is_disconnected))
        except RequestError as e:
            return error(e)

    def card() -> dict:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "inference-lab",
                "max_model_len": server.max_len}

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [card()]})

    async def model(request: Request):
        if request.path_params["name"] != server.model_name:
            return error(RequestError(f"the model '{request.path_params['name']}' does not exist; this server serves "
                                      f"'{server.model_name}'", status=404, param="model", code="model_not_found"))
        return JSONResponse(card())

    async def json_body(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    async def tokenize(request: Request):
        """vLLM's /tokenize: {"prompt": text} or {"messages": [...]} (the chat template applied) -> the ids."""
        try:
            ids = server.tokenize(await json_body(request))
        except RequestError as e:
            return error(e)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": server.max_len})

    async def detokenize(request: Request):
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
        try:
            ids = (await json_body(request)).get("tokens")
            vocab = server.engine.config.vocab_size
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                    for t in ids):
                raise RequestError(f"'tokens' must be a list of token ids (0 to {vocab - 1})", param="tokens")
        except RequestError as e:
            return error(e)
        return JSONResponse({"prompt": server.tok.decode(ids)})

    async def health(request: Request):
        ok = server.loop.alive
        return JSONResponse({"status": "ok" if ok else "engine thread stopped"}, status_code=200 if ok else 503)

    async def metrics(request: Request):
        return PlainTextResponse(server.loop.metrics(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc):
        return error(RequestError(f"no route {request.method} {request.url.path}", status=404, code="not_found"))

    @asynccontextmanager
    async def lifespan(app):
        server.loop.start()
        try:
            yield
        finally:
            server.loop.stop()

    async def text_completions(request: Request):
        return await completions(request, chat=False)

    async def chat_completions(request: Request):
        return await completions(request, chat=True)

    routes = [Route("/v1/completions", text_completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models), Route("/v1/models/{name:path}", model), Route("/health", health),
              Route("/metrics", metrics), Route("/tokenize", tokenize, methods=["POST"]),
              Route("/detokenize", detokenize, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    if server.api_key is None:
        return app

    async def with_key(scope, receive, send):  # --api-key: every /v1 route needs "Authorization: Bearer KEY"
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given, f"Bearer {server.api_key}"):
                response = error(RequestError("a valid API key is required: send 'Authorization: Bearer KEY' (the "
                                              "server's --api-key)", status=401, code="invalid_api_key"))
                return await response(scope, receive, send)
        return await app(scope, receive, send)

    return with_key


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """`server` on a free loopback port, in a background thread of this process (tests, the notebook):

        with ServerThread(make_server(...)) as base_url:      # "http://127.0.0.1:PORT/v1"
            OpenAI(base_url=base_url, api_key="none").completions.create(...)

    On exit the server stops accepting, the engine thread ends, and nothing is left listening."""

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        port = port or free_port(host)
        self.server, self.host, self.port = server, host, port
        self.base_url = f"http://{host}:{port}/v1"
        self._uv = uvicorn.Server(uvicorn.Config(build_app(server), host=host, port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._uv.run, name="http", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._uv.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        return self.base_url

    def __exit__(self, *exc) -> None:
        self._uv.should_exit = True
        self._thread.join(timeout=30)


# Most prompt tokens one request gets in one step (of the 512-token budget): a short request sent during a long
# prefill starts at the next step. Measured by benchmarks/long_prefill.py (week 21's README has the figures).
LONG_PREFILL_TOKEN_THRESHOLD = 256


def make_server(model=None, tokenizer=None, num_blocks: int = 512, block_size: int = 16, max_num_seqs: int = 8,
                max_num_batched_tokens: int = 512, prefix_caching: bool = False, weights: str = "fp32",
                long_prefill_token_threshold: int = LONG_PREFILL_TOKEN_THRESHOLD,
                model_name: str = "SmolLM2-135M-Instruct", loop_cls=ServingLoop,
                text_stream_cls=TextStream, api_key: str | None = None) -> Server:
    """A `Server` on SmolLM2 (or `model` + `tokenizer`). `weights`: "fp32", "packed" (lib.fast's oneDNN-packed
    fp32, same numbers), "int8" or "int4" (lib.quant_linear, weight-only, changes the numbers). `loop_cls` and
    `text_stream_cls`: the serving loop's core and the detokenizer (lib.serving's, or the notebook's own)."""
    if model is None:
        from lib.model import load_smollm2

        model, tokenizer = load_smollm2()
    if weights == "packed":
        from lib.fast import pack_linears

        pack_linears(model)
    elif weights in ("int8", "int4"):
        from lib.quant_linear import quantize_linears

        model = quantize_linears(model, weights)
    elif weights != "fp32":
        raise ValueError(f"weights must be fp32, packed, int8 or int4; got {weights!r}")
    model.eval()
    engine = LLMEngine(model, num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=prefix_caching,
                       long_prefill_token_threshold=long_prefill_token_threshold)
    return Server(engine, tokenizer, model_name, loop_cls=loop_cls, text_stream_cls=text_stream_cls, api_key=api_key)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="An OpenAI-compatible server on the lab's engine (loopback only).")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--num-blocks", type=int, default=512, help="KV blocks in the pool (default 512)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=8, help="requests decoding at once (default 8)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget of one step")
    ap.add_argument("--long-prefill-token-threshold", type=int, default=LONG_PREFILL_TOKEN_THRESHOLD,
                    help=f"most prompt tokens one request gets per step, so short requests are not held up by a long "
                         f"prefill (default {LONG_PREFILL_TOKEN_THRESHOLD}; 0: no cap)")
    ap.add_argument("--prefix-caching", action="store_true", help="share computed prompt blocks between requests")
    ap.add_argument("--weights", default="fp32", choices=["fp32", "packed", "int8", "int4"])
    ap.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                    help="the key every /v1 request must send as 'Authorization: Bearer KEY' (default: $VLLM_API_KEY; "
                         "none: no key needed)")
    ap.add_argument("--served-model-name", default="SmolLM2-135M-Instruct", help="the model name requests must give")
    args = ap.parse_args(argv)
    import uvicorn

    server = make_server(num_blocks=args.num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens, prefix_caching=args.prefix_caching,
                         weights=args.weights, long_prefill_token_threshold=args.long_prefill_token_threshold,
                         model_name=args.served_model_name, api_key=args.api_key)
    print(f"serving {server.model_name} on http://{args.host}:{args.port}/v1 "
          f"(weights {args.weights}, prefix caching {'on' if args.prefix_caching else 'off'})", flush=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # the access log, on stderr
    uvicorn.run(build_app(server), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
