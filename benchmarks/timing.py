"""Timing helpers the benchmark scripts share (benchmarks/decode.py, benchmarks/quant.py): the lowest benchmarks
module, importing no other. Each script puts its own folder on sys.path and imports `from timing import ...`."""
from __future__ import annotations

import statistics
import time

import torch


def sync(device: torch.device) -> None:
    """Wait for queued GPU work before reading a clock (CUDA runs asynchronously; a CPU needs nothing)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_decode(step, new_tokens: int, repeats: int) -> float:
    """Median seconds per decoded token: time(prefill + 1 + n) - time(prefill + 1), over n."""
    step(1)  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(1)
        t1 = time.perf_counter()
        step(1 + new_tokens)
        t2 = time.perf_counter()
        samples.append(((t2 - t1) - (t1 - t0)) / new_tokens)
    return statistics.median(samples)


def time_call(fn, repeats: int, device) -> float:
    """Median seconds of `fn()` over `repeats` calls after one warm-up, the device synchronized after each."""
    fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)
