"""lib.serve.server: the OpenAI-compatible server on the lab's engine, hit with the official `openai` client and raw HTTP.

One server runs in this process on a free loopback port for the whole module (SmolLM2, a small KV pool so that a
request can be too big for it); every test leaves it serving, and the last test checks nothing is left listening.
"""
import concurrent.futures
import json
import socket
import threading
import time

import httpx
import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from lib.modeling.generate import generate  # noqa: E402
from lib.serve.engine_thread import Submission  # noqa: E402
from lib.serve.openai_api import RequestError  # noqa: E402
from lib.serve.server import ServerThread, free_port, make_server  # noqa: E402

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are"]


@pytest.fixture(scope="module")
def server():
    srv = make_server(num_blocks=48, block_size=16, max_num_seqs=4, max_num_batched_tokens=256)
    running = ServerThread(srv)
    srv.base = running.__enter__().removesuffix("/v1")
    yield srv
    running.__exit__(None, None, None)
    assert not running._thread.is_alive(), "the server did not shut down"
    assert not srv.loop.alive, "the engine thread outlived the server"
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(1)
        s.connect(("127.0.0.1", running.port))  # nothing left listening


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def greedy_text(server, ids: list[int], n: int) -> tuple[str, str]:
    """What lib.modeling.generate gives for `ids` alone: the text up to (not including) eos, and the finish reason."""
    out = generate(server.engine.model, torch.tensor([ids]), n)[0, len(ids):].tolist()
    eos = server.tok.eos_token_id
    reason = "length"
    if eos in out:
        out, reason = out[:out.index(eos)], "stop"
    return server.tok.decode(out, skip_special_tokens=True, clean_up_tokenization_spaces=False), reason


def test_concurrent_streamed_completions_equal_greedy_generate(server, client):
    results = {}

    def one(p):
        stream = client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0, stream=True)
        chunks = list(stream)
        results[p] = ("".join(c.choices[0].text for c in chunks if c.choices),
                      [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason])

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for p in PROMPTS:
        want, reason = greedy_text(server, server.tok(p).input_ids, 12)
        assert results[p][0] == want, f"{p!r}: streamed {results[p][0]!r}, generate gives {want!r}"
        assert results[p][1] == [reason]
    assert server.loop.stats["steps_total"] > 0


def test_streamed_chunks_reassemble_to_the_plain_answer(server, client):
    msgs = [{"role": "user", "content": "Name two planets."}]
    plain = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0,
                                                 stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = server.tok(server.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False).input_ids
    want, reason = greedy_text(server, ids, 24)
    assert plain.choices[0].message.content == want
    assert plain.choices[0].finish_reason == reason
    assert plain.usage.prompt_tokens == len(ids)


def test_sampling_is_seeded(server, client):
    a, b, c = (client.completions.create(model=MODEL, prompt="Roses are", max_tokens=10, temperature=1.0, seed=s)
               .choices[0].text for s in (7, 7, 8))
    assert a == b, "the same seed gave two different samples"
    assert a != c or len(a) == 0


def test_stop_string_ends_the_answer(server, client):
    full, _ = greedy_text(server, server.tok("Once upon a time").input_ids, 16)
    cut = full.find(" ", 3)
    assert cut > 0, full
    stop = full[cut:cut + 3]
    finished, aborted = server.loop.stats["requests_finished"], server.loop.stats["requests_aborted"]
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0, stop=stop)
    assert r.choices[0].text == full[:full.find(stop)] and r.choices[0].finish_reason == "stop"
    deadline = time.monotonic() + 10  # the engine's request is aborted after the answer is sent: counted then
    while server.loop.stats["requests_finished"] == finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (server.loop.stats["requests_finished"], server.loop.stats["requests_aborted"]) == (finished + 1, aborted), (
        "a request ended by its stop string is a finished request, not an aborted one (vLLM counts it finished)")


@pytest.mark.parametrize("body, status, param", [
    ("{not json", 400, None),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ({"prompt": "hi"}, 400, "model"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ({"model": MODEL, "prompt": "hi", "n": 17}, 400, "n"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 9}, 400, "logprobs"),
    ({"model": MODEL, "prompt": "hi", "echo": "yes"}, 400, "echo"),  # echo with logprobs is served (issue 35)
    ({"model": MODEL, "prompt": 42}, 400, "prompt"),
    ({"model": MODEL, "prompt": [1, 2, 10**9]}, 400, "prompt"),
    ({"model": MODEL, "prompt": "word " * 9000}, 400, "prompt"),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, 400, "stream"),
    ({"model": MODEL, "messages": "hello"}, 400, "messages"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, body, status, param):
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    data = body if isinstance(body, str) else json.dumps(body)
    t0 = time.perf_counter()
    r = httpx.post(server.base + path, content=data, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["param"] == param
    assert time.perf_counter() - t0 < 10, "a refused request should be refused at once"
    assert httpx.get(server.base + "/health", timeout=10).json() == {"status": "ok"}


def test_a_request_that_can_never_fit_the_pool_is_refused_at_once(server, client):
    # 48 blocks of 16 = 768 slots: a 700-token prompt + 200 new tokens can never fit, though the model's 8192 could.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=list(range(1000, 1700)), max_tokens=200)
    assert "KV blocks" in str(e.value) and e.value.code == "context_length_exceeded"


def test_unknown_route_and_the_info_endpoints(server, client):
    assert httpx.get(server.base + "/v2/nothing", timeout=10).json()["error"]["code"] == "not_found"
    assert [m.id for m in client.models.list().data] == [MODEL]
    metrics = httpx.get(server.base + "/metrics", timeout=10).text
    for name in ("lab_requests_total", "lab_kv_utilization", "lab_generation_tokens_total", "lab_ttft_seconds"):
        assert name in metrics


def test_client_disconnect_mid_stream_aborts_the_request(server):
    before = server.loop.stats["requests_aborted"]
    body = {"model": MODEL, "prompt": "Count from one to a hundred:", "max_tokens": 200, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk read, then hang up
    deadline = time.monotonic() + 30
    while server.loop.stats["requests_aborted"] == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.loop.stats["requests_aborted"] == before + 1, "the disconnected request was not aborted"
    while server.engine.blocks.num_in_use and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.engine.blocks.num_in_use == 0, "the aborted request kept its KV blocks"
    assert not server.engine.has_unfinished()


def test_an_engine_failure_fails_its_requests_and_the_server_goes_on(server, client, monkeypatch):
    real = server.engine.step
    calls = {"n": 0}

    def broken_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return real()

    monkeypatch.setattr(server.engine, "step", broken_once)
    with pytest.raises(openai.InternalServerError, match="simulated kernel failure"):
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    assert r.choices[0].text == greedy_text(server, server.tok("Hello").input_ids, 4)[0]


def test_request_error_body_is_openais_shape():
    e = RequestError("too long", param="prompt", code="context_length_exceeded")
    assert e.body() == {"error": {"message": "too long", "type": "invalid_request_error", "param": "prompt",
                                  "code": "context_length_exceeded"}}
    assert Submission([1], 1).request_id == -1


def test_make_serve_as_typed_then_nothing_left_listening():
    """`make serve PORT=... ARGS=--max-num-seqs=16` as the README says: the option reaches the server, which says
    how many requests decode at once and how many threads torch uses, answers /health and a completion, and stops
    on SIGTERM."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    port = free_port()
    proc = subprocess.Popen(["make", "serve", f"PORT={port}", "ARGS=--max-num-seqs=16"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"make serve exited: {proc.stdout.read()[-2000:]}"
            assert time.monotonic() < deadline, "make serve did not answer /health in 180 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    printed = proc.stdout.read()
    assert "16 requests decoding at once" in printed and "torch threads: " in printed, printed[-2000:]
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(1)
        s.connect(("127.0.0.1", port))


def test_load_benchmark_quick_as_typed():
    """`make bench-load ARGS=--quick` (the Makefile passes ARGS on to `python benchmarks/load.py`): starts its own
    server, 4 streamed requests, prints the table — not the full benchmark."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run("make bench-load ARGS=--quick", shell=True, cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "benchmarks/load.py --quick" in out.stdout, out.stdout[:2000]
    assert "TTFT p50" in out.stdout and " 4/4 " in out.stdout, out.stdout


def test_the_wait_in_the_queue_is_measured_and_shown(server, client):
    """More requests than run at once (the fixture's max_num_seqs=4): the ones that wait show it, per request, in
    /metrics (vLLM's vllm:request_queue_time_seconds and lab_queue_seconds) and in the log."""
    before = server.loop.histograms["vllm:request_queue_time_seconds"].count
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0),
                      PROMPTS * 2))
    waits = server.loop.queue_time[-8:]
    assert server.loop.histograms["vllm:request_queue_time_seconds"].count == before + 8
    assert max(waits) > 5 * min(waits) + 0.01, waits  # four waited for the first four to finish
    metrics = httpx.get(server.base + "/metrics", timeout=10).text
    assert 'vllm:request_queue_time_seconds_count{model_name="SmolLM2-135M-Instruct"}' in metrics
    assert 'lab_queue_seconds{quantile="0.95"}' in metrics


def test_the_default_concurrency_follows_the_kv_pool():
    from lib.serve.server import default_max_num_seqs

    assert default_max_num_seqs(512, 16) == 32  # the default pool: 8,192 tokens at 256 each
    assert default_max_num_seqs(48, 16) == 8 and default_max_num_seqs(100_000, 16) == 64
