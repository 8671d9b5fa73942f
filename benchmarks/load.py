"""Load-test an OpenAI-compatible server with the official `openai` client: Poisson arrivals, streamed chat.

    python benchmarks/load.py                                # starts the lab's server (lib.server), rates 0.5,1,2/s
    python benchmarks/load.py --quick                        # seconds: one rate, 4 short requests
    python benchmarks/load.py --ablation                     # the same load on each server configuration in turn
    python benchmarks/load.py --base-url http://HOST:8000/v1 --model NAME   # any OpenAI-compatible server

For each arrival rate it sends `--requests` chat requests whose arrival times are a Poisson process (exponential
gaps, fixed seed), each streamed, and prints throughput (completion tokens per second of wall time), TTFT (time to
the first streamed token) and TPOT (time per output token after the first) at p50 and p95, and — from the lab
server's `/metrics` — the mean KV-cache utilization sampled while the load ran. Requests are bounded in number and
each run in time (`--max-seconds`); traffic goes only to the server given (loopback by default).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = ("You are the help desk of a small public library. Answer in one or two short sentences, politely and "
          "plainly. The library opens at nine in the morning and closes at six in the evening on weekdays, and "
          "at one on Saturdays; it is closed on Sundays. Members may borrow up to eight books for three weeks.")
QUESTIONS = ["When do you open on Saturday?", "How many books can I borrow?", "Are you open on Sunday?",
             "How long can I keep a book?", "What time do you close on Tuesday?", "Can I borrow ten books?",
             "Is the library open at eight in the morning?", "Who can borrow books?",
             "What are your weekday hours?", "Can I come in on Sunday afternoon?",
             "Do you close early on Saturdays?", "How long is the loan period?"]
# (name, server flags): the ablation turns the engine's techniques on one at a time.
CONFIGS = {
    "one at a time": ["--max-num-seqs", "1"],
    "continuous batching": [],
    "+ prefix caching": ["--prefix-caching"],
    "+ packed fp32 weights": ["--prefix-caching", "--weights", "packed"],
    "+ int8 weights": ["--prefix-caching", "--weights", "int8"],
}


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab_server(flags: list[str], timeout: float = 180.0):
    """`python -m lib.server` on a free loopback port; returns (process, base_url) once /health answers."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lib.server", "--port", str(port), *flags], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s")


def stop_server(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kv_utilization(base_url: str) -> float | None:
    import httpx

    try:
        text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^lab_kv_utilization ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def run_rate(base_url: str, model: str, rate: float, n_requests: int, max_tokens: int, seed: int,
             max_seconds: float) -> dict:
    """Send `n_requests` streamed chat requests with Poisson arrivals at `rate` per second; measure each."""
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
                            "end": stamps[-1] if stamps else t0})

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
            "ttft50": pct([r["ttft"] for r in ok], 0.5), "ttft95": pct([r["ttft"] for r in ok], 0.95),
            "tpot50": pct([r["tpot"] for r in ok if r["tpot"]], 0.5),
            "tpot95": pct([r["tpot"] for r in ok if r["tpot"]], 0.95),
            "kv": statistics.fmean(kv) if kv else None}


def print_table(title: str, rows: list[dict], key: str) -> None:
    print(f"\n{title}")
    print(f"{key:>24} {'ok/sent':>8} {'tok/s':>7} {'TTFT p50':>9} {'p95':>7} {'TPOT p50':>9} {'p95':>7} {'KV util':>8}")
    for r in rows:
        kv = f"{100 * r['kv']:.0f} %" if r["kv"] is not None else "n/a"
        print(f"{str(r[key]):>24} {r['ok']:>4}/{r['sent']:<3} {r['throughput']:>7.1f} {r['ttft50']:>8.2f}s "
              f"{r['ttft95']:>6.2f}s {1e3 * r['tpot50']:>7.0f}ms {1e3 * r['tpot95']:>5.0f}ms {kv:>8}")
        for e in r["errors"]:
            print(f"{'':>24} error: {e}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    rates = [r["rate"] for r in rows]
    a.plot(rates, [r["throughput"] for r in rows], "o-")
    a.set(xlabel="arrival rate (requests/s)", ylabel="completion tokens/s", title="throughput")
    b.plot(rates, [r["ttft50"] for r in rows], "o-", label="TTFT p50")
    b.plot(rates, [r["ttft95"] for r in rows], "o--", label="TTFT p95")
    b.set(xlabel="arrival rate (requests/s)", ylabel="seconds", title="time to first token", yscale="log")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="an OpenAI-compatible server's /v1 URL (default: start the lab's server)")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--rates", default="0.5,1,2", help="arrival rates in requests per second")
    ap.add_argument("--requests", type=int, default=16, help="requests per rate (default 16)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-seconds", type=float, default=300, help="cap on one rate's run (default 300 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, help="save the throughput / TTFT plot here (PNG)")
    ap.add_argument("--ablation", action="store_true", help="the same load on each lab server configuration")
    ap.add_argument("--quick", action="store_true", help="one rate, 4 requests of 8 tokens: a smoke run")
    args = ap.parse_args(argv)
    if args.quick:
        args.rates, args.requests, args.max_tokens, args.max_seconds = "2", 4, 8, 120
    rates = [float(r) for r in args.rates.split(",")]
    print(f"load: {args.requests} streamed chat requests per rate, {args.max_tokens} tokens each, Poisson arrivals "
          f"(seed {args.seed}); load average before: {os.getloadavg()[0]:.1f}")
    if args.ablation:
        rate = rates[len(rates) // 2]
        rows = []
        for name, flags in CONFIGS.items():
            proc, url = start_lab_server(flags)
            try:
                rows.append(run_rate(url, args.model, rate, args.requests, args.max_tokens, args.seed,
                                     args.max_seconds) | {"config": name})
            finally:
                stop_server(proc)
        print_table(f"ablation at {rate:g} requests/s", rows, "config")
        return 0 if all(r["ok"] for r in rows) else 1
    proc = None
    url = args.base_url
    if url is None:
        proc, url = start_lab_server([])
    try:
        rows = [run_rate(url, args.model, r, args.requests, args.max_tokens, args.seed, args.max_seconds)
                for r in rates]
    finally:
        if proc is not None:
            stop_server(proc)
    print_table(f"server {url}", rows, "rate")
    if args.plot:
        plot(rows, args.plot)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
