"""Load-test an OpenAI-compatible server with the official `openai` client: Poisson arrivals, streamed chat.

    python benchmarks/load.py                                # starts the lab's server (lib.serve.server), rates 0.5,1,2/s
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
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.serve.loadtest import run_load_test  # noqa: E402
from lib.serve.server import free_port  # noqa: E402

# (name, server flags): the ablation turns the engine's techniques on one at a time.
CONFIGS = {
    "one at a time": ["--max-num-seqs", "1"],
    "continuous batching": [],
    "+ prefix caching": ["--prefix-caching"],
    "+ packed fp32 weights": ["--prefix-caching", "--weights", "packed"],
    "+ int8 weights": ["--prefix-caching", "--weights", "int8"],
}


def start_lab_server(flags: list[str], timeout: float = 180.0):
    """`python -m lib.serve.server` on a free loopback port; returns (process, base_url) once /health answers."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lib.serve.server", "--port", str(port), *flags], cwd=ROOT,
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
                rows.append(run_load_test(url, args.model, rate, args.requests, args.max_tokens, args.seed,
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
        rows = [run_load_test(url, args.model, r, args.requests, args.max_tokens, args.seed, args.max_seconds)
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
