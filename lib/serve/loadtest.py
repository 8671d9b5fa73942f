"""Measure a server under load the way its users meet it: the official `openai` client, streamed chat requests
arriving as a Poisson process, and per request the time to the first token (TTFT) and per output token after
it (TPOT). Used by benchmarks/load.py (the command line) and week 21's notebook.

    from lib.serve.loadtest import run_load_test
    row = run_load_test("http://127.0.0.1:8000/v1", "SmolLM2-135M-Instruct", rate=1.0, n_requests=16, max_tokens=32)
    row["throughput"], row["ttft50"], row["ttft95"], row["tpot50"], row["tpot95"], row["kv"]
    row["requests"]  # each answered request: its ttft, tpot, e2e (submission to last piece, s) and chunks (pieces)

Traffic goes only to the URL given; the number of requests and the run's time are bounded.
"""
from __future__ import annotations

import os
import random
import re
import statistics
import threading
import time

from lib.batching.engine_load import percentile

SYSTEM = ("You are the help desk of a small public library. Answer in one or two short sentences, politely and "
          "plainly. The library opens at nine in the morning and closes at six in the evening on weekdays, and "
          "at one on Saturdays; it is closed on Sundays. Members may borrow up to eight books for three weeks.")
QUESTIONS = ["When do you open on Saturday?", "How many books can I borrow?", "Are you open on Sunday?",
             "How long can I keep a book?", "What time do you close on Tuesday?", "Can I borrow ten books?",
             "Is the library open at eight in the morning?", "Who can borrow books?",
             "What are your weekday hours?", "Can I come in on Sunday afternoon?",
             "Do you close early on Saturdays?", "How long is the loan period?"]


def kv_utilization(base_url: str) -> float | None:
    import httpx

    try:
        text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^lab_kv_utilization ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def run_load_test(base_url: str, model: str, rate: float, n_requests: int, max_tokens: int, seed: int,
                  max_seconds: float, ignore_eos: bool = False) -> dict:
    """Send `n_requests` streamed chat requests with Poisson arrivals at `rate` per second; measure each.
    `ignore_eos`: every answer runs to `max_tokens` (vLLM's extra field, which the lab's server takes too)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0,
                    timeout=max_seconds)
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n_requests):
        arrivals.append(t)
        t += rng.expovariate(rate)
    results: list[dict] = []
    lock = threading.Lock()
    start = time.perf_counter()
    deadline = start + max_seconds

    def one(i: int) -> None:
        delay = start + arrivals[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if time.perf_counter() > deadline:
            return
        t0 = time.perf_counter()
        stamps = []
        try:
            stream = client.chat.completions.create(
                model=model, stream=True, max_tokens=max_tokens, temperature=0, seed=i,
                extra_body={"ignore_eos": True} if ignore_eos else None,
                messages=[{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    stamps.append(time.perf_counter())
                if time.perf_counter() > deadline:
                    stream.close()
                    break
        except Exception as e:  # noqa: BLE001  (a failed request is counted, not fatal)
            with lock:
                results.append({"error": f"{type(e).__name__}: {e}"})
            return
        with lock:
            results.append({"ttft": stamps[0] - t0 if stamps else float("nan"), "chunks": len(stamps),
                            "tpot": (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None,
                            "e2e": stamps[-1] - t0 if stamps else float("nan"), "end": stamps[-1] if stamps else t0})

    kv: list[float] = []
    stop = threading.Event()

    def sample_kv() -> None:
        while not stop.is_set():
            u = kv_utilization(base_url)
            if u is not None:
                kv.append(u)
            stop.wait(0.25)

    sampler = threading.Thread(target=sample_kv, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n_requests)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=max(0.0, deadline - time.perf_counter()) + 5)
    stop.set()
    sampler.join()
    ok = [r for r in results if "error" not in r]
    wall = (max(r["end"] for r in ok) - start) if ok else float("nan")
    tokens = sum(r["chunks"] for r in ok)
    return {"rate": rate, "ok": len(ok), "failed": len(results) - len(ok), "sent": n_requests,
            "errors": sorted({r["error"][:120] for r in results if "error" in r}),
            "throughput": tokens / wall if ok else float("nan"),
            "ttft50": percentile([r["ttft"] for r in ok], 50), "ttft95": percentile([r["ttft"] for r in ok], 95),
            "tpot50": percentile([r["tpot"] for r in ok if r["tpot"]], 50),
            "tpot95": percentile([r["tpot"] for r in ok if r["tpot"]], 95),
            "kv": statistics.fmean(kv) if kv else None,
            "requests": [{k: r[k] for k in ("ttft", "tpot", "e2e", "chunks")} for r in ok]}


