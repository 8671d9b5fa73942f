"""A short request sent while a long prompt is being prefilled: how long it waits for its first token, with and
without a cap on the prompt tokens one request gets per step (`--long-prefill-token-threshold`, vLLM's name).

    python benchmarks/long_prefill.py            # a 2,000-token prompt; thresholds 0 (no cap), 256 (the default), 128
    python benchmarks/long_prefill.py --quick    # seconds: a 600-token prompt, thresholds 0 and 256

For each threshold it starts the lab's server (lib.serve.server, in this process, SmolLM2 fp32, token budget 512 per
step), warms it up, sends the long prompt (token ids, max_tokens 1, streamed) and, `--delay` seconds later, a
short one (2 tokens, max_tokens 1), and prints both times to the first token, with the short request alone on an
idle server for comparison. Timing, not a test: run it on quiet cores (the load average is printed).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def first_token_seconds(client, model: str, prompt: list[int]) -> float:
    """Seconds from sending `prompt` (token ids) until the first streamed chunk with text or a finish reason."""
    start = time.perf_counter()
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0.0, stream=True):
        if chunk.choices and (chunk.choices[0].text or chunk.choices[0].finish_reason):
            return time.perf_counter() - start
    return time.perf_counter() - start


def measure(model, tokenizer, threshold: int, long_prompt: list[int], short_prompt: list[int], delay: float) -> dict:
    from openai import OpenAI

    from lib.serve.server import ServerThread, make_server

    server = make_server(model, tokenizer, long_prefill_token_threshold=threshold)
    with ServerThread(server) as base_url:
        client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
        name = server.model_name
        first_token_seconds(client, name, short_prompt)  # warm-up: the first request pays one-time costs
        alone = min(first_token_seconds(client, name, short_prompt) for _ in range(3))
        result = {}

        def long_one():
            result["long"] = first_token_seconds(client, name, long_prompt)

        thread = threading.Thread(target=long_one)
        thread.start()
        time.sleep(delay)
        result["short"] = first_token_seconds(client, name, short_prompt)
        thread.join()
        result["alone"] = alone
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 600-token prompt, thresholds 0 and 256")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="the long prompt's length (default 2000)")
    ap.add_argument("--thresholds", type=int, nargs="+", default=None, help="caps to compare (0: none)")
    ap.add_argument("--delay", type=float, default=0.3, help="seconds between the long and the short request")
    args = ap.parse_args(argv)
    n = args.prompt_tokens or (600 if args.quick else 2000)
    thresholds = args.thresholds or ([0, 256] if args.quick else [0, 256, 128])
    import torch

    from lib.modeling.llama import load_smollm2
    from lib.modeling.text import load_text

    torch.manual_seed(0)
    model, tok = load_smollm2()
    text_ids = tok(load_text("hamlet"), add_special_tokens=False).input_ids
    if len(text_ids) < n:
        raise SystemExit(f"--prompt-tokens {n}: Hamlet has only {len(text_ids)} tokens")
    long_prompt, short_prompt = text_ids[:n], text_ids[n:n + 2]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs, load average {load:.2f}; torch threads {torch.get_num_threads()}; token budget 512 "
          f"per step; a {n}-token prompt, then {args.delay} s later a 2-token one (max_tokens 1, streamed)")
    print(f"{'threshold':>10} {'long TTFT s':>12} {'short TTFT s':>13} {'short alone s':>14}")
    for t in thresholds:
        r = measure(model, tok, t, long_prompt, short_prompt, args.delay)
        print(f"{(t or 'none'):>10} {r['long']:12.2f} {r['short']:13.2f} {r['alone']:14.3f}", flush=True)


if __name__ == "__main__":
    main()
