"""lib.serve.server through the official `openai` client, field by field: each sampling field changes what comes out as
its definition says (checked against lib.modeling.llama's own logits or against lib.modeling.generate with the same parameters),
stream usage, content parts, unknown and unsupported fields refused, the model card, /tokenize and /detokenize,
and --api-key. One server (SmolLM2) for the module, as in test_server.py."""
import httpx
import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from lib.modeling.generate import generate  # noqa: E402
from lib.modeling.sampling import SamplingParams  # noqa: E402
from lib.serve.server import ServerThread, make_server  # noqa: E402

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The best thing about the sea is"


@pytest.fixture(scope="module")
def server():
    srv = make_server(num_blocks=64, block_size=16, max_num_seqs=4, max_num_batched_tokens=256)
    running = ServerThread(srv)
    srv.base = running.__enter__().removesuffix("/v1")
    yield srv
    running.__exit__(None, None, None)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def _ids(server, text=PROMPT):
    return server.tok(text).input_ids


def _next_token_probs(server, ids):
    with torch.no_grad():
        model = server.engine.model  # on the GPU where there is one: the ids go where it is
        return torch.softmax(model(torch.tensor([ids], device=model.device))[0, -1].float(), -1).cpu()


def test_top_p_samples_only_from_the_nucleus(server, client):
    p = _next_token_probs(server, _ids(server))
    order = torch.argsort(p, descending=True)
    mass = torch.cumsum(p[order], 0)
    nucleus = {int(t) for t, before in zip(order, mass - p[order]) if before < 0.3}
    texts = {server.tok.decode([t]) for t in nucleus}
    for seed in range(12):
        r = client.completions.create(model=MODEL, prompt=_ids(server), max_tokens=1, temperature=1.0, top_p=0.3,
                                      seed=seed)
        assert r.choices[0].text in texts, (r.choices[0].text, texts)
    # without top_p, at temperature 1.5 the same seeds leave the nucleus (so the check above could fail)
    wide = {client.completions.create(model=MODEL, prompt=_ids(server), max_tokens=1, temperature=1.5,
                                      seed=seed).choices[0].text for seed in range(12)}
    assert wide - texts, wide


def test_top_k_one_is_greedy_and_min_p_one_too(server, client):
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        for seed in (1, 2):
            r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=seed,
                                          extra_body=extra)
            assert r.choices[0].text == greedy, extra


def test_logit_bias_forces_and_forbids(server, client):
    greedy_ids = generate(server.engine.model, torch.tensor([_ids(server)]), 1)[0, -1:].tolist()
    target = server.tok(" whale", add_special_tokens=False).input_ids[0]
    forced = client.completions.create(model=MODEL, prompt=_ids(server), max_tokens=1, temperature=0,
                                       logit_bias={str(target): 100})
    assert forced.choices[0].text == server.tok.decode([target])
    banned = client.completions.create(model=MODEL, prompt=_ids(server), max_tokens=1, temperature=0,
                                       logit_bias={str(greedy_ids[0]): -100})
    assert banned.choices[0].text != server.tok.decode(greedy_ids)


def test_penalties_equal_generate_with_the_same_parameters(server, client):
    ids = _ids(server, "List the numbers: one, two, three,")
    fields = dict(frequency_penalty=1.5, presence_penalty=0.5)
    extra = dict(repetition_penalty=1.3)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0, extra_body=extra, **fields)
    params = SamplingParams(eos_token_id=server.tok.eos_token_id, **fields, **extra)
    want = generate(server.engine.model, torch.tensor([ids]), 16, sampling=params)[0, len(ids):].tolist()
    plain = generate(server.engine.model, torch.tensor([ids]), 16)[0, len(ids):].tolist()
    assert want != plain, "the penalties change nothing here: the test cannot fail"
    assert r.choices[0].text == server.tok.decode(want)


def test_stop_token_ids_min_tokens_and_ignore_eos(server, client):
    ids = _ids(server)
    greedy = generate(server.engine.model, torch.tensor([ids]), 6)[0, len(ids):].tolist()
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0,
                                  extra_body={"stop_token_ids": [greedy[3]]})
    assert r.choices[0].text == server.tok.decode(greedy[:greedy.index(greedy[3])])
    assert r.choices[0].finish_reason == "stop"
    msgs = [{"role": "user", "content": "Reply with the single word: yes"}]
    short = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 40
    longer = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0,
                                            extra_body={"ignore_eos": True})
    assert longer.choices[0].finish_reason == "length" and longer.usage.completion_tokens == 40
    n = short.usage.completion_tokens + 3
    at_least = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0,
                                              extra_body={"min_tokens": n})
    assert at_least.usage.completion_tokens >= n


def test_stream_usage_and_content_parts(server, client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text",
                                                                                              "text": "hello"}]}],
        max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello"}],
                                           max_tokens=8, temperature=0)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


@pytest.mark.parametrize("extra, param", [
    ({"foo": 1}, "foo"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ({"best_of": 1, "n": 2}, "best_of"),
    ({"best_of": 3, "stream": True}, "best_of"),
    ({"suffix": "x"}, "suffix"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"logit_bias": {"99999999": 5}}, "logit_bias"),
    ({"logit_bias": {"5": 500}}, "logit_bias"),
    ({"stop_token_ids": ["x"]}, "stop_token_ids"),
    ({"min_tokens": 100}, "min_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
])
def test_bad_and_unsupported_fields_are_refused(server, client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_model_card_tokenize_detokenize(server, client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    got = httpx.post(server.base + "/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    assert got["tokens"] == _ids(server) and got["count"] == len(_ids(server))
    chat = httpx.post(server.base + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == server.tok(server.tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False).input_ids
    back = httpx.post(server.base + "/detokenize", json={"tokens": got["tokens"]}).json()
    assert back["prompt"] == server.tok.decode(got["tokens"])
    assert httpx.post(server.base + "/detokenize", json={"tokens": [-1]}).status_code == 400


def test_api_key_and_served_model_name(server):
    srv = make_server(server.engine.model, server.tok, num_blocks=16, api_key="sekret", model_name="lab-model")
    with ServerThread(srv) as base_url:
        bad = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=base_url, api_key="sekret", max_retries=0, timeout=60)
        assert [m.id for m in good.models.list().data] == ["lab-model"]
        r = good.completions.create(model="lab-model", prompt="Hi", max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2
        assert httpx.get(base_url.removesuffix("/v1") + "/health").status_code == 200  # not under /v1: no key


def test_vllm_metric_names_and_the_access_log(server, client, caplog):
    import logging
    import re
    import time

    caplog.set_level(logging.INFO, logger="lib.serve.server")
    before = httpx.get(server.base + "/metrics").text
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    deadline = time.monotonic() + 10
    while not any("completion tokens" in m for m in caplog.messages) and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(m for m in caplog.messages if "completion tokens" in m)
    assert f"{len(_ids(server))} prompt + 3 completion tokens" in line and "length" in line, line
    after = httpx.get(server.base + "/metrics").text
    label = f'model_name="{MODEL}"'

    def value(text, name, extra=""):
        m = re.search(rf"^{re.escape(name)}{{{re.escape(label)}{re.escape(extra)}}} (\S+)$", text, re.M)
        assert m, f"{name} missing:\n{text}"
        return float(m[1])

    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        value(after, name)
    assert value(after, "vllm:generation_tokens_total") - value(before, "vllm:generation_tokens_total") == 3
    assert value(after, "vllm:prompt_tokens_total") - value(before, "vllm:prompt_tokens_total") == r.usage.prompt_tokens
    reason = ',finished_reason="length"'
    assert value(after, "vllm:request_success_total", reason) - value(before, "vllm:request_success_total", reason) == 1
    ttft = ',le="+Inf"'
    assert (value(after, "vllm:time_to_first_token_seconds_bucket", ttft)
            - value(before, "vllm:time_to_first_token_seconds_bucket", ttft)) == 1
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in after


def test_n_choices_each_equal_their_own_seeded_run(server, client):
    """... and the prompt is computed once: the samples fork off it in the engine (copy-on-write)."""
    before = server.engine.prompt_tokens
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=5, n=3)
    assert server.engine.prompt_tokens - before == r.usage.prompt_tokens == len(_ids(server))
    assert [c.index for c in r.choices] == [0, 1, 2]
    alone = [client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=5 + k)
             for k in range(3)]
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone]
    assert len({c.text for c in r.choices}) > 1, "three samples all alike: the seeds did not differ"
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=5, n=3,
                                            stream=True))
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == k) for k in range(3)]
    assert streamed == [c.text for c in r.choices]
    assert sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason) == [0, 1, 2]


def test_logprobs_are_log_softmax_of_the_models_logits(server, client):
    ids = _ids(server)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    out = generate(server.engine.model, torch.tensor([ids]), 4)[0, len(ids):].tolist()
    assert lp.tokens == [server.tok.decode([t]) for t in out]
    for i, t in enumerate(out):
        with torch.no_grad():
            model = server.engine.model
            want = torch.log_softmax(model(torch.tensor([ids + out[:i]], device=model.device))[0, -1].double(), -1)
        assert abs(lp.token_logprobs[i] - float(want[t])) < 1e-4, (i, lp.token_logprobs[i], float(want[t]))
        top = torch.topk(want, 2)
        assert {server.tok.decode([int(a)]): float(v) for a, v in zip(top.indices, top.values)}.keys() == \
            lp.top_logprobs[i].keys()
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                          temperature=0.7, seed=1, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.logprob <= 1e-6 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)


def test_echo_with_logprobs_scores_the_prompt_too(server, client):
    """echo + logprobs: the prompt's tokens come first, each with its log-probability given the tokens before it
    (log-softmax of lib.modeling.llama's logits over the prompt, computed here) and its top alternatives; the first token
    has none (None, as vLLM sends); then the answer's, as without echo; offsets run on through the whole text. The
    same entries when streamed (the prompt's with the prompt's chunk)."""
    ids = _ids(server)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, logprobs=2, echo=True)
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, logprobs=2)
    lp, answer = r.choices[0].logprobs, plain.choices[0].logprobs
    with torch.no_grad():
        model = server.engine.model
        want = torch.log_softmax(model(torch.tensor([ids], device=model.device))[0].double(), -1)  # [T, vocab]
    assert lp.tokens == [server.tok.decode([t]) for t in ids] + answer.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert abs(lp.token_logprobs[i] - float(want[i - 1, ids[i]])) < 1e-4, (i, lp.token_logprobs[i])
        top = torch.topk(want[i - 1], 2)
        assert set(lp.top_logprobs[i]) == {server.tok.decode([int(a)]) for a in top.indices}
    assert lp.token_logprobs[len(ids):] == pytest.approx(answer.token_logprobs, abs=1e-5)
    text = r.choices[0].text
    assert all(text[o:].startswith(t) for o, t in zip(lp.text_offset, lp.tokens))
    chunks = list(client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, logprobs=2,
                                            echo=True, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset


def test_streamed_logprobs_add_up_to_the_plain_answers(server, client):
    """Each chunk carries the log-probabilities of the tokens that made its text; together they are the plain
    answer's, token for token, text offsets into the whole text included (completions and chat, seeded)."""
    ids = _ids(server)
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0.8, seed=5, logprobs=2)
    chunks = list(client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0.8, seed=5,
                                            logprobs=2, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert len(parts) > 1  # sent as the text goes, not once at the end
    want = plain.choices[0].logprobs
    assert [t for p in parts for t in p.tokens] == want.tokens
    assert [o for p in parts for o in p.text_offset] == want.text_offset
    assert [x for p in parts for x in p.token_logprobs] == pytest.approx(want.token_logprobs, abs=1e-5)
    assert [d.keys() for p in parts for d in p.top_logprobs] == [d.keys() for d in want.top_logprobs]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    messages = [{"role": "user", "content": "Name a colour."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0.8, seed=2,
                                           logprobs=True, top_logprobs=2)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0.8,
                                                 seed=2, logprobs=True, top_logprobs=2, stream=True))
    got = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    want = plain.choices[0].logprobs.content
    assert [(e.token, e.bytes) for e in got] == [(e.token, e.bytes) for e in want]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-5)


def test_a_list_of_prompts_gets_n_choices_each(server, client):
    prompts = ["The capital of France is", _ids(server, "Once upon a time")]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=1.0, seed=3, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for i, p in enumerate(prompts):
        for k in range(2):
            alone = client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=1.0, seed=3 + k)
            assert r.choices[2 * i + k].text == alone.choices[0].text, (i, k)
    assert r.usage.prompt_tokens == len(_ids(server, prompts[0])) + len(prompts[1])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=["hi"] * 17, max_tokens=1)


def test_json_schema_answers_are_documents_of_the_schema(server, client):
    """response_format json_schema: each choice that stops by itself is a document of the schema (checked with the
    jsonschema package); a schema the guide cannot follow is refused by name, never ignored."""
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"enum": ["France", "Spain"]},
                                               "population": {"type": "integer"}},
              "required": ["city", "country", "population"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a big city in Spain as JSON with its country and "
                                                           "population."}],
        max_tokens=60, temperature=0, response_format=fmt)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                       response_format=bad)
    assert e.value.body["param"] == "response_format" and "anyOf" in e.value.body["message"]


def test_json_mode_answers_are_json_objects(server, client):
    """response_format json_object: each choice's text is a prefix of a JSON object, and parses when it stopped by
    itself (lib.serve.guided's mask; tests/test_guided.py checks the mask against feeding every token)."""
    import json

    from lib.serve.guided import JsonMachine

    stopped = 0
    for temperature, n in [(0.0, 1), (0.8, 3)]:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
            max_tokens=60, temperature=temperature, seed=7, n=n, response_format={"type": "json_object"})
        assert len(r.choices) == n
        for c in r.choices:
            m = JsonMachine()
            state = m.feed_bytes(m.start, c.message.content.encode())
            assert state is not None, c.message.content
            if c.finish_reason == "stop":
                assert isinstance(json.loads(c.message.content), dict), c.message.content
                stopped += 1
    assert stopped, "no choice closed its object within 60 tokens"
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8,
                                           temperature=0.0, response_format={"type": "text"})
    assert plain.choices[0].message.content


def test_echo_puts_the_prompt_before_the_answer(server, client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    ids = client.completions.create(model=MODEL, prompt=_ids(server), max_tokens=6, temperature=0, echo=True)
    assert ids.choices[0].text == server.tok.decode(_ids(server)) + plain.choices[0].text
    chunks = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, echo=True, n=2,
                                       stream=True)
    texts = ["", ""]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
    assert texts == [PROMPT + plain.choices[0].text] * 2
    with pytest.raises(openai.BadRequestError) as e:  # a chat has no echo
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body={"echo": True})
    assert e.value.body["param"] == "echo"


def test_best_of_returns_the_candidates_of_highest_total_logprob(server, client):
    """best_of=4, n=2 at temperature 1.2: the two answers are, of the four seeded candidates (seed + k, each run
    alone here with its token log-probabilities), the two whose tokens' log-probabilities sum highest."""
    seed, best_of = 11, 4
    candidates = []
    for k in range(best_of):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.2, seed=seed + k,
                                      logprobs=0)
        candidates.append((sum(r.choices[0].logprobs.token_logprobs), r.choices[0].text, r.usage.completion_tokens))
    assert len({t for _, t, _ in candidates}) > 1, candidates  # the candidates differ, so the choice is a real one
    want = [t for _, t, _ in sorted(candidates, key=lambda c: -c[0])[:2]]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.2, seed=seed, n=2,
                                  best_of=best_of)
    assert [c.text for c in r.choices] == want, (candidates, [c.text for c in r.choices])
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == sum(n for _, _, n in candidates)  # every candidate counted, as OpenAI bills
