# %% [markdown]
# # Week 21 — Serve it: one OpenAI-compatible server on everything so far
#
# Weeks 16–20 each built one technique and measured it alone: the KV cache, tiled attention, speculative
# decoding, the paged engine with continuous batching and prefix caching, quantized weights. A user meets
# none of them alone. They meet a **server**: an HTTP endpoint that many clients hit at once, that streams
# each answer as it is generated, and that must keep serving when a client sends nonsense or hangs up.
#
# This week you put the lab's engine behind the API every client library speaks — OpenAI's
# `/v1/completions` and `/v1/chat/completions` — and measure, with the official `openai` client and a real
# load, what each technique buys in the numbers users feel: **time to first token** (TTFT), **time per
# output token** (TPOT) and **throughput**.
#
# The HTTP front end (Starlette on uvicorn, `lib/serve/server.py`) is given. **You write the two pieces where
# serving is decided:**
#
# 1. `TextStream` — token bytes in, text out: what may be sent to a client *now*, so that nothing sent ever
#    has to change (a character split across tokens, a stop string that may be starting);
# 2. `ServingLoop` — what the engine thread does between two steps: admit new requests, cancel the ones
#    whose client left, run **one** engine step, and route each token to the request it belongs to.
#
# Then you plug both into the server, check it against `generate`, and run the ablation: the same load with
# one technique after another switched on. Three more exercises turn the measurements into the numbers a
# deployment is planned with: a model that **predicts TTFT** from the arrival rate, the prefill cost and the
# concurrency (graded on configurations it has not seen, then measured against your server), **end-to-end
# latency** from TTFT and the time between tokens, and the **cost of a million tokens**. The last section
# answers seed 002's deployment scenarios with your own numbers.
#
# **Time.** About 5 hours. The notebook is sized to run top to bottom within 3 minutes on two quiet cores; its load
# tests pace themselves by the clock, so on a busy machine it takes longer (each timed cell prints the load).
# `pytest weeks/21 -k ex01` checks one exercise from a terminal.

# %% tags=["setup"]
import codecs
import math
from collections import deque

from grader.checks.week21 import (check_cost_per_million_tokens, check_e2e_latency, check_predict_ttft,
                                  check_ServingLoop, check_TextStream)

# %%
import os
import threading
import time

import httpx
import matplotlib.pyplot as plt
import torch
from openai import OpenAI
from tqdm.auto import tqdm

from lib.modeling.generate import generate
from lib.serve.loadtest import QUESTIONS, SYSTEM, run_load_test
from lib.modeling.llama import load_smollm2
from lib.serve.server import ServerThread, make_server
from lib.serve.serving import token_bytes

torch.manual_seed(0)
model, tok = load_smollm2()
MODEL = "SmolLM2-135M-Instruct"
BYTES = token_bytes(tok)  # BYTES[token_id]: the bytes that token stands for (b"" for special tokens)
print(f"{MODEL} on {model.device}; {len(BYTES)} tokens; {torch.get_num_threads()} torch threads")

# %% [markdown]
# ## 1. A server in five boxes
#
# ```
#  client ──HTTP──►  front end (asyncio)  ──submit/cancel──►  inbox  ──►  engine thread: ServingLoop.run_once()
#    ▲                    │ one asyncio.Queue per request                       │  admit · cancel · engine.step()
#    └──── SSE chunks ◄───┴────────────── tokens (call_soon_threadsafe) ◄──────┘  route each token to its request
# ```
#
# * The **front end** parses and validates each request (a bad one gets OpenAI's error object and never
#   reaches the engine), tokenizes it, and awaits its tokens. With `"stream": true` it sends each new piece
#   of text as a server-sent event (`data: {...}`), then `data: [DONE]`.
# * **One engine thread** owns the engine — nothing else touches it, so it needs no locks. Between two steps
#   it takes what the front end queued, then steps the engine once: every open request advances together
#   (continuous batching, week 19), and a request that arrived a moment ago joins at the next step.
# * A client that hangs up is **cancelled**: its request leaves the engine and its KV blocks return to the
#   pool at once, not when its `max_tokens` would have run out.
#
# Here is lib's server on a free loopback port, asked once through the `openai` client and once in raw HTTP
# so you can see the events on the wire.

# %%
with ServerThread(make_server(model, tok, num_blocks=256, max_num_seqs=4)) as base_url:
    client = OpenAI(base_url=base_url, api_key="none")
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                       max_tokens=16, temperature=0)
    print("answer:", repr(r.choices[0].message.content), "| finish:", r.choices[0].finish_reason, "|", r.usage)
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", base_url + "/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line:
                print(line[:110])
    bad = httpx.post(base_url + "/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 0}, timeout=60)
    print(bad.status_code, bad.json())

# %% [markdown]
# ## 2. Text that never changes
#
# A streamed chunk, once sent, is on the user's screen: it cannot be taken back. Two things make the obvious
# `tok.decode([token])` per token wrong.
#
# **Tokens are bytes, not characters.** SmolLM2's tokenizer, like GPT-2's and Llama 3's, is *byte-level*:
# every token stands for a few bytes of UTF-8, and a character of 2–4 bytes (é, €, 😀) may be split across
# two tokens. Decoding the first half alone gives the replacement character `�`, and the client shows
# garbage that the next token cannot repair.

# %%
ids = tok("Café 😀 ok", add_special_tokens=False).input_ids
print("token bytes:      ", [BYTES[i] for i in ids])
print("decode each alone:", [tok.decode([i]) for i in ids])
print("decode together:  ", repr(tok.decode(ids)))

# %% [markdown]
# **Stop strings.** OpenAI's API lets a client pass `stop=["\n\n", "User:"]`: the answer ends *before* the
# first occurrence of any of them, and the stop string itself is never returned. But a stop string can be
# split across tokens too: after `"Use"` you cannot know yet whether `"r:"` follows. So text that might be
# the beginning of a stop string has to wait.
#
# **What the stream must keep.** A `TextStream(stops)` receives each token's bytes with `push(data) -> str`
# and returns the text the client may see now. Designing its state is the exercise; what it must keep is this
# (the check tests each property at every push, on random byte chunks):
#
# 1. *Never a broken character.* Only whole characters go out. Bytes that can never be UTF-8 reach the client
#    as `"\ufffd"`, exactly as `bytes.decode("utf-8", "replace")` shows them.
# 2. *Never text that may be taken back.* Nothing returned may later turn out to be part of a stop string.
# 3. *Nothing later than it must be.* Each character goes out at the first push after which no continuation
#    of the stream could make it part of a stop string (a client should see text as soon as it is certain).
# 4. *The answer ends at the first stop string*, even one that spans pushes: the text before it goes out,
#    `self.stopped` becomes `True`, and every later call returns `""`. (If two stop strings appear in the same
#    push, the answer ends before the earlier one.)
# 5. *Nothing is lost.* `finish()` returns what is still held back (an incomplete character as `"\ufffd"`),
#    or `""` if the stream stopped, so the pieces add up to exactly the whole decoded text cut before its first
#    stop string: streamed and non-streamed answers agree. An empty stop string would match everywhere: refuse
#    it with `ValueError`.
#
# A tool: the standard library's `codecs.getincrementaldecoder("utf-8")(errors="replace")` keeps the bytes of an
# incomplete character between calls.
#
# Before you write, work these by hand. `stops=["aab"]`, pushes `b"aa"`, `b"a"`, `b"b"`: what does each push
# return? `stops=["abcd", "bc"]`, one push `b"abc"`? And how much text could property 3 ever force you to hold
# back, at most?

# %% nbgrader={"grade": false, "grade_id": "TextStream", "locked": false, "schema_version": 3, "solution": true, "task": false}
class TextStream:
    """Token bytes in, certain text out (see the rule above)."""

    def __init__(self, stops=()):
        ### BEGIN SOLUTION
        stops = list(stops)
        for s in stops:
            if not isinstance(s, str) or s == "":
                raise ValueError(f"stop strings must be non-empty strings; got {s!r}")
        self.stops = stops
        self.longest = max((len(s) for s in stops), default=0)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.done = 0  # characters already returned
        self.stopped = False
        ### END SOLUTION

    def _take(self, final):
        ### BEGIN SOLUTION
        hits = [self.text.find(s, self.done) for s in self.stops]
        hits = [h for h in hits if h != -1]
        if hits:
            first = min(hits)
            out = self.text[self.done:first]
            self.done, self.stopped = first, True
            return out
        keep = 0
        if not final:
            tail = self.text[self.done:]
            for n in range(min(len(tail), self.longest - 1), 0, -1):
                if any(s[:n] == tail[-n:] for s in self.stops):
                    keep = n
                    break
        end = len(self.text) - keep
        out = self.text[self.done:end]
        self.done = end
        return out
        ### END SOLUTION

    def push(self, data):
        ### BEGIN SOLUTION
        if self.stopped:
            return ""
        self.text = self.text + self.decoder.decode(data)
        return self._take(final=False)
        ### END SOLUTION

    def finish(self):
        ### BEGIN SOLUTION
        if self.stopped:
            return ""
        self.text = self.text + self.decoder.decode(b"", True)
        return self._take(final=True)
        ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_TextStream", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_TextStream(TextStream)

# %% [markdown]
# ### The rule, now that your check passes
#
# The properties leave one way to do it:
#
# * decode incrementally, so an incomplete character waits inside the decoder (property 1), and invalid bytes come
#   out as `"\ufffd"` the moment they can no longer start a character;
# * after each push, look for every stop string in the text not yet returned: if one is there (it may start in text
#   held back from earlier pushes), return the text before the earliest, set `stopped`, and return `""` from then on;
# * otherwise hold back **the longest end of the text that is a proper beginning of some stop string**, and return the
#   rest. A character before that end can no longer be part of a stop string — every occurrence that could still
#   complete starts inside the held-back end — so property 3 forbids holding it; a character inside it could, so
#   property 2 forbids sending it. At most the longest stop string's length minus one is ever held;
# * `finish()` flushes the decoder and returns what is held (no continuation is coming).
#
# So with `stops=["aab"]` the pushes `b"aa"`, `b"a"`, `b"b"` return `""` (`"aa"` may begin `"aab"`), `"a"` (of `"aaa"`,
# only the last two may still begin it), and `""` (`"aab"` appeared: the answer is `"a"`). A rule that always holds the
# longest stop's length minus one characters (vLLM's simple one) keeps property 2 but breaks 3: it sits on text that
# can no longer be part of any stop string.

# %% [markdown]
# Your stream on a real answer, with the stop string `"\n"` (the first line only): each push's piece between
# bars. Where two bars meet, a token made nothing certain — half a character, or text that may begin the stop
# string — or came after the stop.

# %%
prompt = tok.apply_chat_template([{"role": "user", "content": "Write two short lines about the sea, with an emoji."}],
                                 tokenize=False, add_generation_prompt=True)
ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids.to(model.device)
answer = generate(model, ids, 48, eos_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()
answer = answer[:answer.index(tok.eos_token_id)] if tok.eos_token_id in answer else answer
stream = TextStream(["\n"])  # stop at the end of the first line
pieces = [stream.push(BYTES[t]) for t in answer]
pieces.append(stream.finish())
print("|".join(pieces))
full = tok.decode(answer, skip_special_tokens=True, clean_up_tokenization_spaces=False)
print("\nthe whole answer:", repr(full))
print("pieces add up to the answer cut before its first newline:", "".join(pieces) == full.split("\n")[0])

# %% [markdown]
# ## 3. The loop between two steps
#
# The engine thread runs one loop forever: take what the front end queued, step the engine, hand out the
# tokens. Everything else in the server is plumbing around it. Your `ServingLoop(engine, eos_token_id)`
# is that loop's body, with no threads and no network, so it can be tested exactly. **Designing it is the
# exercise**: below are its interface and what the server needs of it; the order of the work inside
# `run_once`, and what you keep between calls, are yours to decide.
#
# **Interface.** The front end calls `submit(request_id, prompt, max_tokens, params)` and
# `cancel(request_id)`; the engine thread calls `run_once()`, which returns a list of messages, and
# `has_work()`, which says whether there is anything left to do (the thread sleeps when there is not).
# `params` is a `lib.modeling.sampling.SamplingParams`, the one carrier of everything the request's sampling needs:
# temperature, seed, top_p, penalties, logit_bias, the LoRA adapter, which waiting request of the same
# prompt it may fork off (the server's `n`), and a list the engine fills with the request's logprobs, which
# is how they come back to the server. Your loop does not look inside it: it hands the very object on. The
# engine (week 19's `LLMEngine`, behind a view with four methods) offers `add_request(prompt, max_tokens,
# request_id=..., params=...)`, which raises `ValueError` for a request that can never fit;
# `step()`, whose outputs carry `.request_id`, `.token` and `.finished` (the request's last token);
# `abort(request_id)`, which frees a request's blocks and forgets it, finished or not; and `has_unfinished()`.
# The messages are `("token", request_id, token)`, `("done", request_id, reason)` with reason `"stop"`,
# `"length"` or `"abort"`, and `("error", request_id, message)`.
#
# **What the server needs** (the check tests each, but for the races said under *Threads*; think about how each
# can fail before you write):
#
# * *Threads.* `submit` and `cancel` run on the front end's thread while the engine thread may be inside
#   `step()`. The engine is not thread-safe, and the front end must not wait for a step. (The check sees whether
#   `submit` or `cancel` touch the engine, and makes a `submit` and a `cancel` from another thread while `run_once`
#   is inside `step()` — each must return at once —, and a `submit` while it is inside `add_request()` or
#   `abort()`, as the front end does; it cannot see every race on what both threads share: that part is yours to
#   reason out.)
# * *Order.* What the front end did takes effect in the order it did it: a cancel sent after a submit is
#   about that submission.
# * *Continuous batching.* A request submitted now runs in the very next step, whatever else is running.
# * *Latency.* The server hands out tokens and reads the network between two steps: a `run_once` never runs
#   more than one step.
# * *Exactly what the client should see.* Every generated token as a `"token"` message except the
#   end-of-sequence token, which the client never sees; then exactly one `"done"` per request the engine
#   took: `"stop"` when it produced the end-of-sequence token, `"length"` when it reached `max_tokens`,
#   `"abort"` when it was cancelled while running. Nothing for a request after its `"done"`. A cancel of a
#   request that is unknown or already over is not an error. A refused request gets its `"error"`, and the
#   server goes on serving the others.
# * *Days of uptime.* Nothing of a request that ended stays behind — in your loop or in the engine.
# * *The request as asked.* Its params reach `add_request` as submitted: a sampled request gives the sample
#   its seed gives, a `logit_bias` or `top_p` changes what is drawn, and asked-for logprobs come back.
#
# Why is admitting at the *next* `run_once` — not when a batch finishes — what makes this continuous batching?

# %% nbgrader={"grade": false, "grade_id": "ServingLoop", "locked": false, "schema_version": 3, "solution": true, "task": false}
class ServingLoop:
    """The body of the engine thread's loop: queue in, one engine step, messages out."""

    def __init__(self, engine, eos_token_id=None):
        ### BEGIN SOLUTION
        self.engine = engine
        self.eos = eos_token_id
        self.queue = deque()
        self.running = set()
        ### END SOLUTION

    def submit(self, request_id, prompt, max_tokens, params):
        ### BEGIN SOLUTION
        self.queue.append((request_id, list(prompt), max_tokens, params))
        ### END SOLUTION

    def cancel(self, request_id):
        ### BEGIN SOLUTION
        self.queue.append((request_id, None, None, None))
        ### END SOLUTION

    def has_work(self):
        ### BEGIN SOLUTION
        return len(self.queue) > 0 or self.engine.has_unfinished()
        ### END SOLUTION

    def run_once(self):
        ### BEGIN SOLUTION
        messages = []

        def end(rid, kind, value):
            self.running.discard(rid)
            self.engine.abort(rid)
            messages.append((kind, rid, value))

        while self.queue:
            rid, prompt, max_tokens, params = self.queue.popleft()
            if prompt is None:  # a cancel
                if rid in self.running:
                    end(rid, "done", "abort")
                continue
            try:
                self.engine.add_request(prompt, max_tokens, request_id=rid, params=params)
            except ValueError as e:
                messages.append(("error", rid, str(e)))
                continue
            self.running.add(rid)
        if self.engine.has_unfinished():
            for out in self.engine.step():
                rid = out.request_id  # every request in the engine is one of ours (added above)
                if self.eos is not None and out.token == self.eos:
                    end(rid, "done", "stop")
                    continue
                messages.append(("token", rid, out.token))
                if out.finished:
                    end(rid, "done", "length")
        return messages
        ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_ServingLoop", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_ServingLoop(ServingLoop)

# %% [markdown]
# ### Your loop in the server
#
# `make_server(..., loop_cls=ServingLoop, text_stream_cls=TextStream)` runs your classes inside lib's HTTP
# front end. Four clients ask at once, streamed; each answer must be what `generate` gives on that request
# alone — the server batched them, but no request may notice.

# %%
mine = make_server(model, tok, num_blocks=256, max_num_seqs=4, loop_cls=ServingLoop, text_stream_cls=TextStream)
prompts = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are"]
answers = {}
with ServerThread(mine) as base_url:
    client = OpenAI(base_url=base_url, api_key="none")

    def ask(p):
        chunks = client.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0, stream=True)
        answers[p] = "".join(c.choices[0].text for c in chunks if c.choices)

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"4 concurrent streamed requests in {time.perf_counter() - t0:.1f} s, "
          f"{mine.loop.stats['steps_total']} engine steps for {mine.loop.stats['generation_tokens_total']} tokens")

    # a client that hangs up after the first chunk
    body = {"model": MODEL, "prompt": "Count to one hundred:", "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", base_url + "/completions", json=body, timeout=60) as resp:
        next(line for line in resp.iter_lines() if line.startswith("data: {"))
    deadline = time.monotonic() + 20
    while mine.loop.stats["requests_aborted"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    print("after a disconnect: aborted", mine.loop.stats["requests_aborted"], "| KV blocks in use",
          mine.engine.blocks.num_in_use)

eos = tok.eos_token_id
for p in prompts:
    ids = tok(p, return_tensors="pt").input_ids.to(model.device)
    out = generate(model, ids, 16)[0, ids.shape[1]:].tolist()
    out = out[:out.index(eos)] if eos in out else out
    alone = tok.decode(out, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    print(f"{answers[p] == alone!s:>5}  {p!r} -> {answers[p]!r}")

# %% [markdown]
# ### JSON mode: decoding under a grammar
#
# `response_format: {"type": "json_object"}` asks for an answer that is a JSON object. A prompt cannot promise
# that; the sampler can. At every step the server's sampler (`lib.modeling.sampling`, shared with `generate` and the engine)
# sets to −∞ the logit of every token whose text would take the output out of the language of JSON objects, and
# allows the end-of-sequence token only when the object is complete — so an answer that ends by itself always
# parses (one cut by `max_tokens` is a prefix). vLLM does the same with outlines or xgrammar, llama.cpp with its
# GBNF grammars.
#
# `lib.serve.guided` builds the mask in two layers. A **pushdown automaton over bytes** (`JsonMachine`) knows JSON: its
# state is the stack of open objects and arrays, what may come next (a key, a colon, a value, a comma or a closing
# bracket), and where it is inside a string (escapes, UTF-8), a number or `true`/`false`/`null`. The **vocabulary
# layer** (`JsonVocabulary`) lifts it to tokens: a token is allowed from a state when the automaton accepts all its
# bytes. Doing that for 49,152 tokens at every step would cost a second per token in Python; two observations make
# it tens of milliseconds. Inside a string, every token without a quote, a backslash or a control character leaves
# the state unchanged, so they are allowed wholesale; elsewhere only the tokens whose first byte the state accepts
# need feeding. And masks are cached by state: the states of an answer repeat (the same depth, the same place in a
# key), so most steps cost a lookup.

# %%
import json

from lib.serve.guided import JsonGuide, JsonMachine, JsonVocabulary

json_server = make_server(model, tok, num_blocks=256, max_num_seqs=4, loop_cls=ServingLoop, text_stream_cls=TextStream)
vocabulary = JsonVocabulary(json_server.token_bytes, tok.eos_token_id, model.config.vocab_size)
machine = JsonMachine()
for prefix in ['', '{', '{"capi', '{"capital": ', '{"capital": "Par', '{"capital": "Paris"', '{"capital": "Paris"}']:
    allowed = vocabulary.mask(machine.feed_bytes(machine.start, prefix.encode()))
    sample = [tok.decode([t]) for t in allowed.nonzero().flatten()[:6].tolist()]
    print(f"after {prefix!r:24}: {int(allowed.sum()):6d} of {vocabulary.size} tokens allowed, e.g. {sample}")

with ServerThread(json_server) as base_url:
    client = OpenAI(base_url=base_url, api_key="none")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    for kind in ("text", "json_object"):
        r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=60, temperature=0,
                                           response_format={"type": kind})
        text = r.choices[0].message.content
        try:
            parsed = f"parses: {json.loads(text)!r}"
        except ValueError as e:
            parsed = f"does not parse ({e})"
        print(f"{kind:11s} finish={r.choices[0].finish_reason:6s} {text!r}\n{'':11s} {parsed}")
