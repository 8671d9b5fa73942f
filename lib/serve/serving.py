"""The core of a serving loop, without the network (week 21): what runs between two engine steps.

    loop = ServingLoop(engine, eos_token_id=tok.eos_token_id)
    loop.submit("a", prompt_ids, 32, SamplingParams(temperature=0.7, seed=1))  # from the front end: queue one
    loop.cancel("b")                                     # the client went away
    for kind, rid, value in loop.run_once():             # admit, cancel, one engine step, route its tokens
        ...  # ("token", rid, token_id) / ("done", rid, "stop" | "length" | "abort") / ("error", rid, message)

    stream = TextStream(stops=["\\n\\n"])                 # one per request: token bytes in, printable text out
    piece = stream.push(token_bytes[token_id])           # the text that became certain with this token
    rest = stream.finish()                               # what was held back, at the end

`lib.serve.server` runs a `ServingLoop` in its engine thread and a `TextStream` per request; the notebook's own
versions plug into the same server (`make_server(loop_cls=..., text_stream_cls=...)`).
"""
from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lib.modeling.sampling import SamplingParams


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, inverted: the printable character that stands for each byte -> the byte.

    Byte-level tokenizers (GPT-2, Llama 3, SmolLM2) spell every byte with one printable character: bytes that
    are printable Latin-1 stand for themselves, the other 68 (control characters, space, ...) are shifted to
    U+0100 onwards in byte order (so a space is 'Ġ', U+0120)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {c: b for b, c in chars.items()}


def token_bytes(tokenizer) -> list[bytes]:
    """The bytes each token id stands for (special tokens: b""), so that for any ids
    `b"".join(map(table.__getitem__, ids)).decode("utf-8", "replace") == tokenizer.decode(ids, skip_special_tokens=True,
    clean_up_tokenization_spaces=False)` — checked in tests/test_serving.py."""
    alphabet = byte_level_alphabet()
    special = set(tokenizer.all_special_ids) | {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
                                                 if getattr(t, "special", False)}
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(b"")
        elif all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        else:  # an added token spelled in plain text
            out.append(piece.encode())
    return out


class TextStream:
    """Token bytes in, text out, as soon as it is certain — and never a character that will change.

    `push(b)` returns the text that became final with these bytes: complete UTF-8 characters only (a character
    split across tokens waits for its last byte), and not the longest end of the text that could still be the
    start of a stop string (held back until the next bytes decide). When a stop string appears, the text before
    it is returned, `stopped` turns True, and every later push returns "". `finish()` returns what was held
    back (an incomplete character becomes U+FFFD, as `bytes.decode("utf-8", "replace")` does). So the pieces
    concatenate to exactly the full decoded text, cut before the first stop string."""

    def __init__(self, stops: Sequence[str] = ()):
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stops)!r}")
        self.stops = list(stops)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # decoded so far (complete characters)
        self._sent = 0  # characters of _text already returned
        self.stopped = False

    def _release(self, final: bool) -> str:
        # A stop string cannot start in text already returned: its start would have been held back.
        cut = min((i for i in (self._text.find(s, self._sent) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            piece, self._sent, self.stopped = self._text[self._sent:cut], cut, True
            return piece
        end = len(self._text)
        if not final:  # hold back the longest end of the text that is a proper prefix of a stop string
            for h in range(min(len(self._text) - self._sent, max((len(s) - 1 for s in self.stops), default=0)), 0, -1):
                if any(s.startswith(self._text[end - h:]) for s in self.stops):
                    end -= h
                    break
        piece, self._sent = self._text[self._sent:end], end
        return piece

    def push(self, data: bytes) -> str:
        if self.stopped:
            return ""
        self._text += self._decoder.decode(bytes(data))
        return self._release(final=False)

    def finish(self) -> str:
        if self.stopped:
            return ""
        self._text += self._decoder.decode(b"", final=True)
        return self._release(final=True)


class ServingLoop:
    """What a server's engine thread does between two steps, synchronously: admit, cancel, step, route.

    `submit` and `cancel` only queue (the front end calls them); `run_once` does the work in arrival order:
    each queued submission goes into the engine (a request the engine refuses gets ("error", rid, message) at
    once and nothing else), each cancel aborts its request and frees its blocks (("done", rid, "abort")), then
    — if anything is running — **one** engine step, whose tokens go out as ("token", rid, token). A request
    ends with ("done", rid, "stop") at the end-of-sequence token (not sent) or ("done", rid, "length") at
    max_tokens; its record is then dropped from the engine. Nothing is sent for a request after its "done"."""

    def __init__(self, engine, eos_token_id: int | None = None):
        self.engine = engine
        self.eos_token_id = eos_token_id
        self._inbox: deque = deque()
        self._live: set = set()

    def submit(self, request_id, prompt: Sequence[int], max_tokens: int, params: SamplingParams) -> None:
        """Queue a request. `params` (`lib.modeling.sampling.SamplingParams`: temperature, seed, the other sampling fields,
        the adapter) goes to `engine.add_request(..., params=params)` as it is: the engine records the request's
        logprobs into it, which is how they come back to the server."""
        self._inbox.append(("add", request_id, list(prompt), max_tokens, params))

    def cancel(self, request_id) -> None:
        self._inbox.append(("cancel", request_id))

    def has_work(self) -> bool:
        return bool(self._inbox) or self.engine.has_unfinished()

    def _end(self, request_id) -> None:
        self._live.discard(request_id)
        self.engine.abort(request_id)  # frees the blocks of a running request, forgets a finished one

    def run_once(self) -> list[tuple]:
        out: list[tuple] = []
        while self._inbox:
            item = self._inbox.popleft()
            if item[0] == "add":
                _, rid, prompt, max_tokens, params = item
                try:
                    self.engine.add_request(prompt, max_tokens, request_id=rid, params=params)
                except ValueError as e:
                    out.append(("error", rid, str(e)))
                    continue
                self._live.add(rid)
            elif item[1] in self._live:  # a cancel of a request still running
                self._end(item[1])
                out.append(("done", item[1], "abort"))
        if not self.engine.has_unfinished():
            return out
        for ev in self.engine.step():
            rid = ev.request_id
            if rid not in self._live:
                continue
            if self.eos_token_id is not None and ev.token == self.eos_token_id:
                self._end(rid)
                out.append(("done", rid, "stop"))
                continue
            out.append(("token", rid, ev.token))
            if ev.finished:
                self._end(rid)
                out.append(("done", rid, "length"))
        return out
