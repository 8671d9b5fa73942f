"""The request side of OpenAI's API, checked field by field for `lib.serve.server`: which fields a request may carry,
its prompt as token ids, the options of its answer, and its sampling fields (`lib.modeling.sampling.SamplingParams`).

Every field is either read or refused with OpenAI's error object (`RequestError`): a field this server does not
implement (`tools`, `suffix`, a `json_schema` keyword its guide cannot follow, ...) is refused by name, and any other
unknown field too — a request is never answered as if a field it sent had been applied.
"""
from __future__ import annotations

from lib.modeling.sampling import SamplingParams


class RequestError(Exception):
    """A request the server refuses: becomes OpenAI's error object with this HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


# Fields read from a request (besides the prompt's): any other field is refused.
FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "logit_bias", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "stream",
          "stream_options", "n", "user", "logprobs", "response_format"}
CHAT_FIELDS = {"messages", "max_completion_tokens", "top_logprobs"}
COMPLETION_FIELDS = {"prompt", "echo", "best_of"}
MAX_N = 16  # choices per request (`n`): each is a request of its own to the engine
# OpenAI's fields this server does not implement: refused by name when set to anything but their default.
UNSUPPORTED = ("suffix", "tools", "functions", "tool_choice",
               "function_call", "parallel_tool_calls", "prediction", "audio", "modalities")


def int_field(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"'{name}' must be an integer, got {v!r}", param=name)
    if not lo <= v <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
    return v


def float_field(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(f"'{name}' must be a number, got {v!r}", param=name)
    if not lo <= v <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
    return float(v)


def check_fields(body: dict, chat: bool, model_name) -> None:
    """The model is one this server serves (`model_name`: its name, or a list of names: the base model's and its LoRA
    adapters'); no field is unsupported or unknown; n is 1."""
    model = body.get("model")
    names = [model_name] if isinstance(model_name, str) else list(model_name)
    if model is None:
        raise RequestError("'model' is required", param="model")
    if model not in names:
        raise RequestError(f"the model '{model}' does not exist; this server serves {', '.join(map(repr, names))}",
                           status=404, param="model", code="model_not_found")
    for k in UNSUPPORTED:
        if body.get(k) not in (None, False, 0, [], {}):
            raise RequestError(f"'{k}' is not supported by this server", param=k)
    known = FIELDS | set(UNSUPPORTED) | (CHAT_FIELDS if chat else COMPLETION_FIELDS)
    unknown = sorted(set(body) - known)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}: this server reads "
                           f"{', '.join(sorted(known - set(UNSUPPORTED)))}", param=unknown[0])
    int_field(body, "n", 1, 1, MAX_N)


def _content(m) -> str | None:
    """A message's text: a string, or a list of text parts ({"type": "text", "text": ...}); None if neither."""
    c = m.get("content") if isinstance(m, dict) else None
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return "".join(p["text"] for p in c)
    return None


def prompt_ids(body: dict, chat: bool, tok) -> list[int]:
    """The prompt as token ids: a chat's messages through the chat template, or a completion's string or ids."""
    if chat:
        msgs = body.get("messages")
        if (not isinstance(msgs, list) or not msgs
                or not all(_content(m) is not None and m.get("role") in ("system", "user", "assistant") for m in msgs)):
            raise RequestError("'messages' must be a non-empty list of {role: system|user|assistant, content: a string "
                               "or a list of text parts}", param="messages")
        text = tok.apply_chat_template([{"role": m["role"], "content": _content(m)} for m in msgs],
                                       tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False).input_ids
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            prompt = tok(p).input_ids
        elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            prompt = list(p)
        else:
            raise RequestError("'prompt' must be a string, a non-empty list of token ids, or a list of those (one "
                               "answer each)", param="prompt")
    if not prompt:
        raise RequestError("the prompt is empty", param="prompt")
    return prompt


def answer_options(body: dict, chat: bool) -> dict:
    """How the answer is sent: streamed or not, its stop strings, usage in the stream."""
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}
                                or not isinstance(options.get("include_usage", False), bool)):
        raise RequestError("'stream_options' is {\"include_usage\": true|false}, with \"stream\": true only",
                           param="stream_options")
    k = logprobs(body, chat)
    n = int_field(body, "n", 1, 1, MAX_N)
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise RequestError("'echo' must be true or false", param="echo")
    best_of = int_field(body, "best_of", n, 1, MAX_N)
    if best_of < n:
        raise RequestError(f"'best_of' ({best_of}) must be at least 'n' ({n})", param="best_of")
    if best_of > n and stream:
        raise RequestError("'best_of' cannot be used with \"stream\": true (the best are known only at the end)",
                           param="best_of")
    return {"stream": stream, "stop": stops, "chat": chat, "usage": bool(options and options.get("include_usage")),
            "n": n, "logprobs": k is not None, "top": k or 0, "echo": echo, "best_of": best_of}


def logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives to report per token, or None for no logprobs: a completion's `logprobs` (0-5), or a
    chat's `logprobs: true` with `top_logprobs` (0-20)."""
    if not chat:
        return None if body.get("logprobs") is None else int_field(body, "logprobs", 0, 0, 5)
    on = body.get("logprobs", False)
    if not isinstance(on, bool):
        raise RequestError("'logprobs' must be true or false", param="logprobs")
    if body.get("top_logprobs") is not None and not on:
        raise RequestError("'top_logprobs' needs \"logprobs\": true", param="top_logprobs")
    return int_field(body, "top_logprobs", 0, 0, 20) if on else None


def json_mode(body: dict):
    """`response_format`: absent or {"type": "text"} (False), {"type": "json_object"} (True: JSON mode),
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}} (the schema, a dict:
    guided decoding to it, `lib.serve.guided_schema`); anything else is refused."""
    fmt = body.get("response_format")
    if fmt is None:
        return False
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return False
    if kind == "json_object":
        return True
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict) or set(spec) - {
                "name", "schema", "strict", "description"} or not isinstance(spec.get("name", ""), str):
            raise RequestError("'response_format' of type 'json_schema' takes {'json_schema': {'name': ..., "
                               "'schema': {...}, 'strict': true|false}}", param="response_format")
        return spec["schema"]
    raise RequestError("'response_format' must be {'type': 'text'}, {'type': 'json_object'} or {'type': "
                       f"'json_schema', 'json_schema': {{...}}}}, got {fmt!r}", param="response_format")


def sampling_params(body: dict, temperature: float, max_tokens: int, vocab: int, eos_token_id: int | None,
                    chat: bool = False, json_guide=None) -> tuple[SamplingParams | None, frozenset]:
    """The sampling fields besides temperature and seed, checked: `(params, stop_token_ids)`, params None when every
    field is at its default (plain sampling). `json_guide(schema=None)`: a new `lib.serve.guided.JsonGuide`, for JSON
    mode (or, given a schema, one that guides to it; it raises RequestError for a schema it cannot follow)."""
    def token_id(t, name):
        if isinstance(t, str) and t.lstrip("-").isdigit():
            t = int(t)
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise RequestError(f"'{name}' holds {t!r}, not a token id (0 to {vocab - 1})", param=name)
        return t

    bias = body.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise RequestError("'logit_bias' must map token ids to numbers from -100 to 100", param="logit_bias")
    logit_bias = {}
    for k, v in bias.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise RequestError(f"'logit_bias' gives token {k} the bias {v!r}; a bias is a number from -100 to 100",
                               param="logit_bias")
        logit_bias[token_id(k, "logit_bias")] = float(v)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list):
        raise RequestError("'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    stop_ids = tuple(token_id(t, "stop_token_ids") for t in stop_ids)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("'ignore_eos' must be true or false", param="ignore_eos")
    guide = None
    mode = json_mode(body)
    if mode is not False:
        if json_guide is None:
            raise RequestError("JSON mode ('response_format': {'type': 'json_object'} or 'json_schema') is not "
                               "available here", param="response_format")
        if ignore_eos:
            raise RequestError("'ignore_eos' cannot be combined with JSON mode: the answer ends when the object is "
                               "complete", param="ignore_eos")
        guide = json_guide() if mode is True else json_guide(mode)
    top_p = float_field(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise RequestError("'top_p' must be greater than 0 (1 keeps every token)", param="top_p")
    params = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=int_field(body, "top_k", 0, -1, vocab),
        min_p=float_field(body, "min_p", 0.0, 0.0, 1.0),
        presence_penalty=float_field(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=float_field(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=float_field(body, "repetition_penalty", 1.0, 0.01, 10.0),
        logit_bias=logit_bias, stop_token_ids=stop_ids, min_tokens=int_field(body, "min_tokens", 0, 0, max_tokens),
        eos_token_id=eos_token_id, ignore_eos=ignore_eos, logprobs=logprobs(body, chat), guide=guide)
    plain = params == SamplingParams(temperature=temperature, eos_token_id=eos_token_id)  # every other field default
    return (None if plain else params), frozenset(stop_ids)
