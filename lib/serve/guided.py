"""Guided decoding: JSON mode (`response_format: {"type": "json_object"}`) as a mask over the vocabulary.

The model proposes logits over 49,152 tokens; the guide allows only the tokens whose text keeps the output a
prefix of some JSON object, and allows the end-of-sequence token only once the object is complete. So every
answer that ends by itself parses (one cut by `max_tokens` may not, as with any server). The same idea runs in
vLLM (outlines, xgrammar) and llama.cpp (GBNF grammars): an automaton over characters, lifted to tokens.

- `JsonMachine`: a pushdown automaton over characters. A state is a small tuple (hashable, so masks can be
  cached by state): the stack of open containers, what is expected next, and the detail inside a string,
  number or literal. `step(state, ch)` returns the next state or None (not JSON any more); `complete(state)`.
- `JsonVocabulary`: the tokenizer's tokens as text, once per tokenizer; `mask(state)` is the boolean [vocab] of
  the tokens allowed from a state, cached by state. Computing one mask walks only the tokens whose first
  character the state accepts, and inside a string it takes every token without a quote, a backslash or a
  control character at once (they leave the state unchanged): a few tens of milliseconds per new state.
- `JsonGuide`: one request's guide (`lib.modeling.sampling.SamplingParams(guide=...)`): `allowed(output_ids)`.

Whitespace is limited to MAX_WS = 12 characters in a row (room for a newline and an indent; unlimited, a constrained
small model can pad with newlines until `max_tokens`), and a string to 512 bytes. The machine reads bytes, so tokens that hold pieces of a
UTF-8 character are allowed inside strings when the pieces add up to characters; special tokens never are.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

WS = " \t\n\r"
MAX_WS = 12  # whitespace characters in a row (a newline and an indent)
MAX_STRING = 512  # characters in one string
_NUMBER_CHARS = set("0123456789+-.eE")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}

# A state: (stack, mode, detail, ws). stack: a string of "o" (object) and "a" (array), innermost last.
# mode: "value" (a value is expected; detail "first" right after "[" where "]" may close instead, "top" before the
# top-level object), "key" (a key string is expected; detail "first" right after "{" where "}" may close), "colon",
# "after" (a value just ended: "," or the closing bracket), "done" (the top-level object is complete),
# "string" (detail: (is_key, escape, length): escape 0, 1 after a backslash, 2-5 in \\uXXXX, -1 to -3 inside a
# UTF-8 character; length in bytes), "number" (detail: the number's part so far), "literal" (detail:
# the characters still to come).


class JsonMachine:
    """A character-level JSON recogniser whose top-level value must be an object."""

    start = ("", "value", "top", 0)

    @staticmethod
    def complete(state) -> bool:
        return state is not None and state[1] == "done"

    def feed_bytes(self, state, data: bytes):
        """`feed` for UTF-8 bytes (the machine reads bytes: one character per byte, as latin-1 decodes them)."""
        return self.feed(state, data.decode("latin-1"))

    def feed(self, state, text: str):
        """The state after each character of `text`, a string of bytes (each character < 256), or None."""
        for ch in text:
            state = self.step(state, ch)
            if state is None:
                return None
        return state

    def step(self, state, ch: str):
        stack, mode, detail, ws = state
        if mode == "string":
            return self._string(stack, detail, ch)
        if mode == "number":
            nxt = self._number(detail, ch)
            if nxt is not None:
                return (stack, "number", nxt, 0)
            if detail[-1] not in "0123456789":  # "-", "1.", "1e", "1e+" cannot end a number
                return None
            return self.step(self.after_value(stack), ch)
        if mode == "literal":
            if ch != detail[0]:
                return None
            return (stack, "literal", detail[1:], 0) if len(detail) > 1 else self.after_value(stack)
        if ch in WS:
            return None if ws >= MAX_WS or mode == "done" else (stack, mode, detail, ws + 1)
        if mode == "value":
            if detail == "top":
                return (stack + "o", "key", "first", 0) if ch == "{" else None
            if ch == "]" and detail == "first":
                return self.after_value(stack[:-1])
            return self._begin_value(stack, ch)
        if mode == "key":
            if ch == '"':
                return (stack, "string", (True, 0, 0), 0)
            if ch == "}" and detail == "first":
                return self.after_value(stack[:-1])
            return None
        if mode == "colon":
            return (stack, "value", "", 0) if ch == ":" else None
        if mode == "after":
            top = stack[-1]
            if ch == ",":
                return (stack, "key", "", 0) if top == "o" else (stack, "value", "", 0)
            if (ch == "}" and top == "o") or (ch == "]" and top == "a"):
                return self.after_value(stack[:-1])
            return None
        return None  # "done": nothing may follow

    @staticmethod
    def after_value(stack):
        return (stack, "after", "", 0) if stack else ("", "done", "", 0)

    def _begin_value(self, stack, ch):
        if ch == "{":
            return (stack + "o", "key", "first", 0)
        if ch == "[":
            return (stack + "a", "value", "first", 0)
        if ch == '"':
            return (stack, "string", (False, 0, 0), 0)
        if ch == "-" or ch.isdigit() and ch.isascii():
            return (stack, "number", ch, 0)
        if ch in _LITERALS:
            return (stack, "literal", _LITERALS[ch], 0)
        return None

    def _string(self, stack, detail, ch):
        is_key, escape, length = detail
        if length >= MAX_STRING:
            return None
        if escape == 1:  # after a backslash
            if ch in '"\\/bfnrt':
                return (stack, "string", (is_key, 0, length + 1), 0)
            return (stack, "string", (is_key, 5, length + 1), 0) if ch == "u" else None
        if escape > 1:  # hex digits of \\uXXXX still to come: escape - 1 of them
            if ch not in "0123456789abcdefABCDEF":
                return None
            return (stack, "string", (is_key, escape - 1 if escape > 2 else 0, length + 1), 0)
        code = ord(ch)
        if escape < 0:  # inside a UTF-8 character: -escape continuation bytes (0x80-0xBF) still to come
            return (stack, "string", (is_key, escape + 1, length + 1), 0) if 0x80 <= code <= 0xBF else None
        if ch == '"':
            return (stack, "colon", "", 0) if is_key else self.after_value(stack)
        if ch == "\\":
            return (stack, "string", (is_key, 1, length + 1), 0)
        if code < 0x20:
            return None
        if code >= 0x80:  # the lead byte of a UTF-8 character says how many bytes follow
            follow = 1 if 0xC2 <= code <= 0xDF else 2 if 0xE0 <= code <= 0xEF else 3 if 0xF0 <= code <= 0xF4 else 0
            return (stack, "string", (is_key, -follow, length + 1), 0) if follow else None
        return (stack, "string", (is_key, 0, length + 1), 0)

    @staticmethod
    def _number(so_far: str, ch: str):
        """The number extended by `ch`, or None if `ch` cannot extend it (JSON's grammar: -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?)."""
        if ch not in _NUMBER_CHARS:
            return None
        last = so_far[-1]
        body = so_far.lstrip("-")
        if ch.isdigit():
            if body == "0":  # no leading zeros
                return None
            return so_far + ch
        if ch == ".":
            return so_far + ch if last.isdigit() and "." not in so_far and "e" not in so_far.lower() else None
        if ch in "eE":
            return so_far + ch if last.isdigit() and "e" not in so_far.lower() else None
        if ch in "+-":
            return so_far + ch if last in "eE" else None
        return None


def _whole_utf8(text: str) -> bool:
    try:
        text.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class JsonVocabulary:
    """The tokens of one tokenizer as text, and the mask of allowed tokens for each machine state (cached)."""

    def __init__(self, token_bytes: Sequence[bytes], eos_token_id: int | None, vocab_size: int | None = None):
        """`token_bytes`: what each token id stands for (`lib.serve.serving.token_bytes(tokenizer)`: special tokens b"");
        `vocab_size`: the model's (its logits' length; ids past the tokenizer's are never allowed)."""
        size = vocab_size or len(token_bytes)
        self.size = size
        self.eos = eos_token_id
        # Each token's bytes, one character per byte (latin-1): the machine reads bytes, so a token that holds a
        # piece of a UTF-8 character is allowed inside a string exactly when the pieces add up to characters.
        self.texts: list[str | None] = [
            ((token_bytes[i] if i < len(token_bytes) else b"").decode("latin-1") or None) for i in range(size)]
        texts = self.texts
        self.machine = JsonMachine()
        # Inside a string, a token of whole UTF-8 characters without a quote, a backslash or a control character
        # leaves the state unchanged (but for its length).
        plain = [t is not None and not any(c in '"\\' or ord(c) < 0x20 for c in t) and _whole_utf8(t) for t in texts]
        self.plain = torch.tensor(plain)
        # Tokens by their first character; and, for the structural modes (where whitespace only counts), by their
        # leading whitespace (k characters) and the first character after it.
        self.by_first: dict[str, list[int]] = {}
        self.by_ws_first: dict[tuple[int, str], list[int]] = {}
        self.ws_only: dict[int, list[int]] = {}
        for i, t in enumerate(texts):
            if t is None:
                continue
            self.by_first.setdefault(t[0], []).append(i)
            rest = t.lstrip(WS)
            k = len(t) - len(rest)
            if k > MAX_WS:
                continue
            if rest:
                self.by_ws_first.setdefault((k, rest[0]), []).append(i)
            else:
                self.ws_only.setdefault(k, []).append(i)
        self._special_in_string = [i for i, t in enumerate(texts) if t is not None and not plain[i]]
        self._plain_ids = [i for i, p in enumerate(plain) if p]
        self._longest = max((len(t) for t in texts if t is not None), default=0)
        self._masks: dict = {}

    def _cached(self, key, compute) -> torch.Tensor:
        found = self._masks.get(key)
        if found is None:
            if len(self._masks) > 4096:
                self._masks.clear()
            found = self._masks[key] = compute()
        return found

    def mask(self, state) -> torch.Tensor:
        """bool [vocab]: the tokens whose whole text the machine accepts from `state` (end-of-sequence: once the
        object is complete, and then alone)."""
        stack, mode, detail, ws = state
        if mode == "done":
            return self._cached(state, self._done)
        if mode in ("value", "key", "colon", "after"):  # whitespace changes nothing but the count of it
            per_k = self._cached((stack, mode, detail), lambda: self._structural((stack, mode, detail, 0)))
            return self._cached(state, lambda: torch.stack(per_k[:MAX_WS - ws + 1]).any(0))
        if mode == "string" and detail[1] == 0:
            is_key, _, length = detail
            if length + self._longest <= MAX_STRING:  # no token can reach the length limit: the length is moot
                return self._cached((stack, mode, (is_key, 0, -1), 0),
                                    lambda: self._string((stack, mode, (is_key, 0, 0), 0), None))
            return self._cached(state, lambda: self._string(state, length))
        return self._cached(state, lambda: self._by_first(state))

    def _done(self) -> torch.Tensor:
        allowed = torch.zeros(self.size, dtype=torch.bool)
        if self.eos is not None:
            allowed[self.eos] = True
        return allowed

    def _feed_all(self, state, ids, allowed) -> None:
        feed = self.machine.feed
        for i in ids:
            if feed(state, self.texts[i]) is not None:
                allowed[i] = True

    def _structural(self, state) -> list[torch.Tensor]:
        """For k = 0..MAX_WS: the tokens with k leading whitespace characters accepted from `state` (ws count 0)."""
        per_k = []
        rest_state = {c: self.machine.step(state, c) for c in {c for _, c in self.by_ws_first}}
        for k in range(MAX_WS + 1):
            allowed = torch.zeros(self.size, dtype=torch.bool)
            allowed[self.ws_only.get(k, [])] = k > 0
            for (kk, c), ids in self.by_ws_first.items():
                if kk == k and rest_state[c] is not None:
                    self._feed_all(state, ids, allowed)
            per_k.append(allowed)
        return per_k

    def _string(self, state, length: int | None) -> torch.Tensor:
        allowed = torch.zeros(self.size, dtype=torch.bool)
        if length is None:
            allowed |= self.plain
        else:
            allowed[[i for i in self._plain_ids if length + len(self.texts[i]) <= MAX_STRING]] = True
        self._feed_all(state, self._special_in_string, allowed)
        return allowed

    def _by_first(self, state) -> torch.Tensor:
        """Escapes, numbers, literals: every token whose first character the state accepts, fed whole (a number
        that may end here also takes what may follow a value: that set is the "after" state's mask)."""
        allowed = torch.zeros(self.size, dtype=torch.bool)
        stack, mode, detail, _ = state
        number = mode in ("number", "integer")  # "integer": lib.serve.guided_schema's (no fraction, no exponent)
        firsts = _NUMBER_CHARS if number else self.by_first.keys()
        for c in firsts:
            if c in self.by_first and self.machine.step(state, c) is not None:
                self._feed_all(state, self.by_first[c], allowed)
        if number and detail[-1].isdigit():
            allowed |= self.mask(self.machine.after_value(stack))
        return allowed


class JsonGuide:
    """One sequence's guide: `allowed(output_ids)` for the tokens generated so far (fed incrementally)."""

    def __init__(self, vocabulary: JsonVocabulary):
        self.vocabulary = vocabulary
        self.state = vocabulary.machine.start
        self.seen = 0

    def allowed(self, output: Sequence[int]) -> torch.Tensor:
        if len(output) < self.seen:  # a different sequence (a preempted request restarts): start over
            self.state, self.seen = self.vocabulary.machine.start, 0
        for token in output[self.seen:]:
            text = self.vocabulary.texts[int(token)] if int(token) < self.vocabulary.size else None
            if text is None or self.state is None:
                self.state = None
                break
            self.state = self.vocabulary.machine.feed(self.state, text)
        self.seen = len(output)
        if self.state is None:
            raise ValueError("guided decoding: the output so far is not a JSON prefix (a token was chosen outside "
                             "the mask)")
        mask = self.vocabulary.mask(self.state)
        if not bool(mask.any()):
            raise ValueError(f"guided decoding: no token of the vocabulary continues this JSON (state {self.state})")
        return mask

    def fork(self) -> "JsonGuide":
        """A guide for another sequence (its own state) over the same vocabulary."""
        return JsonGuide(self.vocabulary)
