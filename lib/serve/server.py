"""An OpenAI-compatible HTTP server on the lab's engine (week 21, the capstone: serve it).

    python -m lib.serve.server --port 8000                      # SmolLM2 on 127.0.0.1:8000 (`make serve`)
    python -m lib.serve.server --prefix-caching --weights packed

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is", max_tokens=8)

The shape is vLLM's, small enough to read in one sitting:

- an **asyncio front end** (Starlette on uvicorn) turns each HTTP request into a `Submission` and awaits its
  tokens on an `asyncio.Queue`;
- **one engine thread** (`lib/serve/engine_thread.py`) owns `lib.batching.engine.LLMEngine` (nothing else touches it) and runs a
  `lib.serve.serving.ServingLoop` over it: submissions from a thread-safe inbox are admitted, each `run_once` is one
  `engine.step()` — continuous batching across every open request, prefix caching when asked — and each step's
  tokens go to the right request's queue with `loop.call_soon_threadsafe`;
- a `lib.serve.serving.TextStream` per request turns tokens into text that never changes once sent (whole UTF-8
  characters; a possible stop string held back), so streamed pieces add up to the plain answer;
- a client that disconnects mid-stream is **aborted** in the engine, its blocks freed at the next step.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both with `"stream": true` as server-sent
events), `GET /v1/models`, `GET /v1/models/{name}`, `POST /tokenize` and `POST /detokenize` (vLLM's), `GET /health`,
`GET /metrics` (Prometheus text). Sampling takes OpenAI's and vLLM's fields (`lib.modeling.sampling`: top_p, top_k, min_p,
the three penalties, logit_bias, stop_token_ids, min_tokens, ignore_eos), `n` choices and `logprobs`; a field the
server does not implement,
or does not know, is refused (`lib.serve.openai_api`). A bad request gets OpenAI's error object (`{"error": {"message",
"type", "param", "code"}}`) and never reaches the engine; a request that can never fit (prompt + max_tokens past
the model's length or the whole KV pool) is refused at once. `--api-key` (or $VLLM_API_KEY) makes every /v1
route ask for it. `--lora-modules name=path ...` serves LoRA adapters (`lib.modeling.lora`) beside the base model, as vLLM does:
a request whose `model` names one runs with it, inside the same batches as every other request.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import threading
import time
import uuid

from lib.modeling import lora
from lib.batching.engine import LLMEngine
from lib.modeling.sampling import SamplingParams
from lib.serve.engine_thread import EngineLoop, Submission
from lib.serve.openai_api import (RequestError, answer_options, check_fields, float_field, int_field, prompt_ids,
                            sampling_params)
from lib.batching.request import AdmissionError
from lib.serve.routes import build_app
from lib.serve.serving import ServingLoop, TextStream, token_bytes


# --- the HTTP front end ---------------------------------------------------------------------------------------

class Server:
    """Validates requests, tokenizes them, feeds the engine loop, and formats OpenAI's responses."""

    def __init__(self, engine: LLMEngine, tokenizer, model_name: str = "SmolLM2-135M-Instruct",
                 loop_cls=ServingLoop, text_stream_cls=TextStream, api_key: str | None = None, adapters=None):
        self.api_key = api_key
        self.adapters = dict(adapters or {})  # LoRA adapters by model name (`lib.modeling.lora.load_modules`)
        self.tok = tokenizer
        self.token_bytes = token_bytes(tokenizer)
        self._json_vocabulary = None  # lib.serve.guided's, for JSON mode: built on the first such request
        self._schema_vocabularies: dict = {}  # json_schema: per schema (its JSON text), lib.serve.guided_schema's
        self.text_stream_cls = text_stream_cls
        self.model_name = model_name
        self.engine = engine
        self.max_len = engine.config.max_seq_len
        self.loop = EngineLoop(engine, eos_token_id=tokenizer.eos_token_id, loop_cls=loop_cls, model_name=model_name)
        self.created = int(time.time())

    # -- requests --

    def parse(self, body, chat: bool) -> tuple[list[Submission], dict]:
        """A request body -> a `Submission` per prompt (a completion may send a list of prompts: strings or token-id
        lists) and the options of its answer; `RequestError` for a bad one."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        check_fields(body, chat, [self.model_name, *self.adapters])
        p = body.get("prompt")
        if not chat and isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
            if len(p) > MAX_PROMPTS:
                raise RequestError(f"at most {MAX_PROMPTS} prompts per request, got {len(p)}", param="prompt")
            subs = [self._submission({**body, "prompt": x}, chat) for x in p]
        else:
            subs = [self._submission(body, chat)]
        opts = answer_options(body, chat) | {"model": body["model"]}
        if opts["best_of"] > opts["n"]:  # ranked by the sum of their tokens' log-probabilities: record them
            subs = [dataclasses.replace(s, params=dataclasses.replace(s.params, logprobs=s.params.logprobs or 0))
                    for s in subs]
        if opts["echo"]:
            opts["echo_text"] = [b"".join(self.token_bytes[t] for t in s.prompt).decode("utf-8", "replace") for s in subs]
        return subs, opts

    def _submission(self, body: dict, chat: bool) -> Submission:
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
        params, stop_ids = sampling_params(body, temperature, max_tokens, self.engine.config.vocab_size,
                                           self.tok.eos_token_id, chat, json_guide=self.json_guide)
        # one carrier for all of it: the sampling fields, the seed, the adapter (multi-LoRA), the logprobs back
        params = dataclasses.replace(params or SamplingParams(temperature=temperature, eos_token_id=self.tok.eos_token_id),
                                     seed=seed % 2**63, lora=self.adapters.get(body["model"]))
        return Submission(prompt, max_tokens, params, stop_token_ids=stop_ids)

    def json_guide(self, schema: dict | None = None):
        """A new JSON-mode guide (`lib.serve.guided`), or with `schema` one that guides to that JSON Schema
        (`lib.serve.guided_schema`); the vocabulary's text is built once, on first use, and each schema's masks are kept
        for the next request with the same schema (the last 16 schemas)."""
        from lib.serve.guided import JsonGuide, JsonVocabulary
        from lib.serve.guided_schema import SchemaError, schema_vocabulary

        if self._json_vocabulary is None:
            self._json_vocabulary = JsonVocabulary(self.token_bytes, self.tok.eos_token_id,
                                                   self.engine.config.vocab_size)
        if schema is None:
            return JsonGuide(self._json_vocabulary)
        key = json.dumps(schema, sort_keys=True)
        vocabulary = self._schema_vocabularies.pop(key, None)
        if vocabulary is None:
            try:
                vocabulary = schema_vocabulary(self._json_vocabulary, schema)
            except SchemaError as e:
                raise RequestError(f"response_format json_schema: {e}", param="response_format") from None
        self._schema_vocabularies[key] = vocabulary  # most recently used last
        while len(self._schema_vocabularies) > 16:
            self._schema_vocabularies.pop(next(iter(self._schema_vocabularies)))
        return JsonGuide(vocabulary)

    def tokenize(self, body: dict) -> list[int]:
        """vLLM's /tokenize: a completion's `prompt` or a chat's `messages` (the template applied) -> token ids."""
        return prompt_ids(body, "messages" in body, self.tok)

    async def tokens(self, sub: Submission, is_disconnected=None):
        """Submit (unless `_submit` did), then yield ("token", id) items until ("done", reason); abort on
        cancellation or disconnect."""
        if sub.out is None:
            self._submit([sub])
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
        """Yield ("text", piece, tokens so far) as the answer's text becomes final, then ("done", finish_reason,
        tokens).

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
                        yield ("text", piece, n)
                    yield ("done", item[1], n)
                    return
                n += 1
                if item[1] in sub.stop_token_ids:  # ends the answer; its own text is not part of it
                    piece = text.finish()
                    if piece:
                        yield ("text", piece, n)
                    sub.stopped = True
                    yield ("done", "stop", n)
                    return
                piece = text.push(self.token_bytes[item[1]])
                if piece:
                    yield ("text", piece, n)
                if text.stopped:
                    sub.stopped = True  # the abort that follows ends a finished answer: counted as finished
                    yield ("done", "stop", n)
                    return
        finally:
            await agen.aclose()

    # -- responses --

    def _envelope(self, chat: bool, rid: str, stream: bool, model: str) -> dict:
        obj = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
        return {"id": rid, "object": obj, "created": int(time.time()), "model": model}

    def _choice(self, chat: bool, text: str | None, finish: str | None, stream: bool, first: bool = False,
                index: int = 0, logprobs: dict | None = None) -> dict:
        if not chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        if stream:
            delta = ({"role": "assistant", "content": ""} if first else {}) | (
                {"content": text} if text is not None else {})
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": finish}

    def _samples(self, subs: list[Submission], opts: dict) -> list[Submission]:
        """`best_of` (at least `n`) submissions per prompt, sample i·best_of + k for prompt i: sample k is seeded
        seed + k (as the engine's parallel samples are). Submitted here, all together, samples 1… as siblings of
        sample 0 (`lib.serve.engine_thread.EngineLoop.submit_all`)."""
        samples = [sub if k == 0 else Submission(sub.prompt, sub.max_tokens,
                                                 sub.params.for_another_sequence(seed=(sub.params.seed + k) % 2**63),
                                                 stop_token_ids=sub.stop_token_ids, sibling_of=sub)
                   for sub in subs for k in range(opts["best_of"])]
        self._submit(samples)  # in one go: the engine computes each prompt once and forks its samples off it
        return samples

    def _submit(self, subs: list[Submission]) -> None:
        loop = asyncio.get_running_loop()
        for sub in subs:
            sub.loop, sub.out = loop, asyncio.Queue()
        self.loop.submit_all(subs)

    def _logprobs(self, sub: Submission | None, n: int, chat: bool, start: int = 0, text_offset: int = 0,
                  prefix: list | None = None) -> dict:
        """OpenAI's logprobs object for tokens `start` to `n` of `sub`'s answer (log-softmax of the model's logits,
        recorded by the engine as it sampled), after `prefix` (echo: the prompt's entries, `_prompt_logprobs`); a
        completion's text offsets count from `text_offset` (a stream sends each chunk's tokens with the chunk,
        offsets into the whole answer)."""
        entries = [] if sub is None else list(sub.params.logprob_entries)  # the engine thread appends to it
        entries = (prefix or []) + entries[start:n]

        def piece(t):
            return self.token_bytes[t].decode("utf-8", errors="replace")

        if chat:
            return {"content": [{"token": piece(t), "logprob": lp, "bytes": list(self.token_bytes[t]),
                                 "top_logprobs": [{"token": piece(a), "logprob": v, "bytes": list(self.token_bytes[a])}
                                                  for a, v in top]} for t, lp, top in entries]}
        offsets, at = [], text_offset
        for t, _, _ in entries:
            offsets.append(at)
            at += len(piece(t))
        return {"tokens": [piece(t) for t, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [None if lp is None else {piece(a): v for a, v in top} for _, lp, top in entries],
                "text_offset": offsets}

    def _prompt_logprobs(self, prompt: list[int], k: int, adapter=None) -> list:
        """echo with logprobs: each prompt token's entry (token, log-probability given the tokens before it, the k
        most likely tokens there), from one forward of the engine's model over the prompt (log-softmax of its
        logits, as the answer's); the first token has no context, so its log-probability is None (as in vLLM)."""
        import torch

        model = self.engine.model
        with torch.inference_mode(), lora.with_adapter(model, adapter):
            logits = model(torch.tensor([prompt], device=model.device))[0].float()  # [T, vocab]
            logp = torch.log_softmax(logits[:-1], dim=-1)  # row i: the distribution of token i + 1
            chosen = logp.gather(1, torch.tensor(prompt[1:], device=logp.device).unsqueeze(1))[:, 0].tolist()
            top_v, top_i = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
            tops = [list(zip(i, v)) for i, v in zip(top_i.tolist(), top_v.tolist())]
        return [(prompt[0], None, [])] + [(t, lp, top) for t, lp, top in zip(prompt[1:], chosen, tops)]

    async def _echo_logprobs(self, subs: list[Submission], opts: dict) -> list | None:
        """Per prompt, `_prompt_logprobs` (computed off the event loop), or None without echo and logprobs."""
        if not (opts["echo"] and opts["logprobs"]):
            return None
        return [await asyncio.to_thread(self._prompt_logprobs, list(s.prompt), opts["top"], s.params.lora)
                for s in subs]

    def _total_logprob(self, sub: Submission) -> float:
        """The sum of the log-probabilities of `sub`'s answer tokens (what `best_of` ranks by)."""
        entries = sub.params.logprob_entries
        return float(sum(lp for _, lp, _ in entries))

    async def complete(self, subs: list[Submission], opts: dict, is_disconnected=None) -> dict:
        chat = opts["chat"]

        async def one(s: Submission, prompt: int):
            pieces, finish, n = [], "length", 0
            async for item in self.text_pieces(s, opts["stop"], is_disconnected):
                if item[0] == "text":
                    pieces.append(item[1])
                else:
                    finish, n = item[1], item[2]
            prefix = echoed[prompt] if echoed else None  # echo: the prompt's entries first
            return "".join(pieces), finish, n, self._logprobs(s, n, chat, prefix=prefix) if opts["logprobs"] else None

        echoed = await self._echo_logprobs(subs, opts)
        samples = self._samples(subs, opts)
        try:
            answers = await asyncio.gather(*(one(s, k // opts["best_of"]) for k, s in enumerate(samples)))
        finally:  # a sample whose task never started was submitted all the same: end it (a finished one: no-op)
            for s in samples:
                self.loop.abort(s)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        n, prompt = sum(a[2] for a in answers), sum(len(s.prompt) for s in subs)  # usage counts every candidate
        if opts["best_of"] > opts["n"]:  # per prompt, the n candidates of the highest total log-probability
            group, kept = opts["best_of"], []
            for i in range(len(subs)):
                ranked = sorted(range(i * group, (i + 1) * group), key=lambda j: -self._total_logprob(samples[j]))
                kept += [answers[j] for j in ranked[:opts["n"]]]
            answers = kept
        if opts["echo"]:
            answers = [(opts["echo_text"][k // opts["n"]] + text, *rest) for k, (text, *rest) in enumerate(answers)]
        return self._envelope(chat, rid, False, opts["model"]) | {
            "choices": [self._choice(chat, text, finish, False, index=k, logprobs=lp)
                        for k, (text, finish, _, lp) in enumerate(answers)],
            "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}}

    async def stream(self, subs: list[Submission], opts: dict):
        """Server-sent events: one chunk per text piece (each with its choice's index), a last chunk per choice with
        its finish reason, the usage when asked, then [DONE]."""
        chat = opts["chat"]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        env = self._envelope(chat, rid, True, opts["model"])
        merged: asyncio.Queue = asyncio.Queue()

        async def feed(k: int, s: Submission):
            try:
                async for item in self.text_pieces(s, opts["stop"]):
                    await merged.put((k, item))
            except RequestError as e:
                await merged.put((k, ("error", e)))
            finally:
                await merged.put((k, None))

        echoed = await self._echo_logprobs(subs, opts)
        samples = self._samples(subs, opts)
        tasks = [asyncio.ensure_future(feed(k, s)) for k, s in enumerate(samples)]
        first, open_, tokens = set(range(len(samples))), len(samples), 0
        sent = [0] * len(samples)  # per choice: tokens whose logprobs went out, and the text's length so far
        chars = [len(opts["echo_text"][k // opts["n"]]) if opts["echo"] else 0 for k in range(len(samples))]

        def logprobs_upto(k: int, n: int) -> dict | None:
            if not opts["logprobs"] or n <= sent[k]:
                return None
            lp = self._logprobs(samples[k], n, chat, start=sent[k], text_offset=chars[k])
            sent[k] = n
            return lp
        try:
            for k in range(len(samples)) if opts["echo"] else ():  # the prompt first, in each choice's first chunk
                first.discard(k)
                lp = self._logprobs(None, 0, chat, prefix=echoed[k // opts["n"]]) if echoed else None
                choice = self._choice(chat, opts["echo_text"][k // opts["n"]], None, True, True, index=k, logprobs=lp)
                chars[k] = sum(len(t) for t in lp["tokens"]) if lp else chars[k]  # the answer's offsets follow
                yield f"data: {json.dumps(env | {'choices': [choice]})}\n\n"
            while open_:
                k, item = await merged.get()
                if item is None:
                    open_ -= 1
                elif item[0] == "error":
                    yield f"data: {json.dumps(item[1].body())}\n\n"
                    break
                else:
                    text, finish = (item[1], None) if item[0] == "text" else (None, item[1])
                    tokens += item[2] if item[0] == "done" else 0
                    lp = logprobs_upto(k, item[2])
                    choice = self._choice(chat, text, finish, True, k in first, index=k, logprobs=lp)
                    chars[k] += len(text or "")
                    first.discard(k)
                    yield f"data: {json.dumps(env | {'choices': [choice]})}\n\n"
            else:
                if opts["usage"]:  # stream_options.include_usage: one more chunk, no choices, the usage
                    prompt = sum(len(s.prompt) for s in subs)
                    usage = {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}
                    yield f"data: {json.dumps(env | {'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()
            for s in samples:  # submitted by `_samples`, whether or not its task ever started (finished: no-op)
                self.loop.abort(s)


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
MAX_PROMPTS = 16  # prompts in one completion request (each with its `n` choices)


def make_server(model=None, tokenizer=None, num_blocks: int = 512, block_size: int = 16, max_num_seqs: int = 8,
                max_num_batched_tokens: int = 512, prefix_caching: bool = False, weights: str = "fp32",
                long_prefill_token_threshold: int = LONG_PREFILL_TOKEN_THRESHOLD,
                model_name: str = "SmolLM2-135M-Instruct", loop_cls=ServingLoop,
                text_stream_cls=TextStream, api_key: str | None = None, lora_modules: dict | None = None) -> Server:
    """A `Server` on SmolLM2 (or `model` + `tokenizer`). `weights`: "fp32", "packed" (lib.modeling.fast's oneDNN-packed
    fp32, same numbers), "int8" or "int4" (lib.quantization.quant_linear, weight-only, changes the numbers). `loop_cls` and
    `text_stream_cls`: the serving loop's core and the detokenizer (lib.serve.serving's, or the notebook's own).
    `lora_modules`: {model name: adapter file or `lib.modeling.lora.LoRAAdapter`}, served beside the base model."""
    if model is None:
        from lib.modeling.llama import load_smollm2

        model, tokenizer = load_smollm2()
    if weights == "packed":
        from lib.modeling.fast_kernels import pack_linears

        pack_linears(model)
    elif weights in ("int8", "int4"):
        from lib.quantization.quant_linear import quantize_linears

        model = quantize_linears(model, weights)
    elif weights != "fp32":
        raise ValueError(f"weights must be fp32, packed, int8 or int4; got {weights!r}")
    model.eval()
    engine = LLMEngine(model, num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=prefix_caching,
                       long_prefill_token_threshold=long_prefill_token_threshold)
    return Server(engine, tokenizer, model_name, loop_cls=loop_cls, text_stream_cls=text_stream_cls, api_key=api_key,
                  adapters=lora.load_modules(lora_modules or {}, model))


def default_max_num_seqs(num_blocks: int, block_size: int, tokens_each: int = 256) -> int:
    """How many requests the server runs at once unless told: as many as the KV pool holds at `tokens_each` tokens
    (a chat turn and its answer), at least 8, at most 64. With 8, 16 concurrent streams waited for the first 8 to
    finish before their first token (a median TTFT of 10 s on 2 cores); a request that runs gets its first token
    after its prefill, and a step of more rows costs less than the same rows in separate steps."""
    return max(8, min(64, num_blocks * block_size // tokens_each))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="An OpenAI-compatible server on the lab's engine (loopback only).")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--num-blocks", type=int, default=512, help="KV blocks in the pool (default 512)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="requests running at once (default: as many as the KV pool holds at 256 tokens each, "
                         "8 to 64: 32 with the default pool); the rest wait, and /metrics shows how long "
                         "(vllm:request_queue_time_seconds)")
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
    ap.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                    help="LoRA adapters (lib.modeling.lora's files) served beside the model: a request's model NAME uses one")
    args = ap.parse_args(argv)
    try:
        adapters = lora.parse_modules(args.lora_modules, args.served_model_name)
    except ValueError as e:
        ap.error(str(e))
    if args.max_num_seqs is None:
        args.max_num_seqs = default_max_num_seqs(args.num_blocks, args.block_size)
    import uvicorn

    server = make_server(num_blocks=args.num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens, prefix_caching=args.prefix_caching,
                         weights=args.weights, long_prefill_token_threshold=args.long_prefill_token_threshold,
                         model_name=args.served_model_name, api_key=args.api_key, lora_modules=adapters)
    print(f"serving {server.model_name} on http://{args.host}:{args.port}/v1 "
          f"(weights {args.weights}, prefix caching {'on' if args.prefix_caching else 'off'}, "
          f"{args.max_num_seqs} requests decoding at once{'; LoRA adapters: ' if adapters else ''}{', '.join(adapters)})",
          flush=True)
    from lib import THREADS
    from lib.bench.threads import describe

    print(describe(THREADS), flush=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # the access log, on stderr
    uvicorn.run(build_app(server), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
