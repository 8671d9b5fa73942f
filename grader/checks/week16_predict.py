"""Week 16's predict-then-measure exercise, `decode_time`, graded on the student's model (below
`grader.checks.week16`, which registers it): the seconds of one cached decode step at batch B, predicted from the
model's configuration, the cache length and the machine's FLOP/s and bandwidth, on configurations drawn per run.

The model it is judged against is the roofline of the step (§7): its FLOPs are §1's count of a cached step whose pass
covers cache_len + 1 positions, for each of the B sequences; its bytes are every weight once (one read serves the
whole batch) and each sequence's cached K and V at every layer and KV head. The cache may be counted with the
positions held, with the new one the step appends and reads, or with its write too (FLOPs over cache_len or
cache_len + 1 positions): up to two positions more, a difference far below any natural mistake here. Half of the
drawn configurations are memory bound and half compute bound (the other side 1.5-4x faster), every one is GQA or MQA
with a batch of 2 or more and 10-80 % of its bytes in the cache, so each natural mistake misses it: the cache left
out, query heads counted for the cache, the weights read once per sequence, K without V, one sequence's cache for
the batch, elements instead of bytes, one side of the roofline only, their sum, the FLOPs of one sequence,
milliseconds.
"""
from __future__ import annotations

import torch

from grader.checks import generator, seed_note


def smollm2_config(n_params: int = 134_479_872) -> dict:
    """SmolLM2-135M in fp32, as the notebook describes it (n_params: the matmul weights, the tied LM head included)."""
    return dict(n_params=n_params, n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, bytes_per_element=4)


# (what, config, cache_len, batch, flops_per_s, bytes_per_s): the configurations the notebook asks about, then
# published ones (n_params: the weights of the matmuls, the LM head included; the published peak rates).
LLAMA2_7B = dict(n_params=6_607_343_616, n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32, head_dim=128,
                 bytes_per_element=2)
LLAMA2_70B = dict(n_params=68_714_504_192, n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128,
                  bytes_per_element=2)
FIXED = [
    ("SmolLM2-135M, fp32, 64 positions, 100 GFLOP/s, 20 GB/s", smollm2_config(), 64, 1, 100e9, 20e9),
    ("SmolLM2-135M, fp32, 256 positions, 100 GFLOP/s, 20 GB/s", smollm2_config(), 256, 1, 100e9, 20e9),
    ("SmolLM2-135M, fp32, batch 64 of 256 positions, 100 GFLOP/s, 20 GB/s", smollm2_config(), 256, 64, 100e9, 20e9),
    ("Llama-2-7B, fp16, 4096 positions, an A100 (312 TFLOP/s, 2.0 TB/s)", LLAMA2_7B, 4096, 1, 312e12, 2.0e12),
    ("Llama-2-70B (8 KV heads), fp16, batch 16 of 4096 positions, an H100 (989 TFLOP/s, 3.35 TB/s)", LLAMA2_70B,
     4096, 16, 989e12, 3.35e12),
]


def step_flops(c: dict, positions: int, batch: int, one_row=False) -> float:
    """§1's count of a cached step whose pass covers `positions`, for each sequence of the batch."""
    per_row = 2 * c["n_params"] + 4 * c["n_layers"] * c["d_model"] * positions
    return per_row * (1 if one_row else batch)


def step_bytes(c: dict, positions: int, batch: int, query_heads=False, weights_per_row=False, k_only=False,
               one_row=False, elements=False) -> float:
    """Bytes a decode step moves with `positions` of K and V per sequence; the keywords are the natural mistakes."""
    e = 1 if elements else c["bytes_per_element"]
    weights = c["n_params"] * e * (batch if weights_per_row else 1)
    heads = c["n_heads"] if query_heads else c["n_kv_heads"]
    kv = (1 if k_only else 2) * c["n_layers"] * heads * c["head_dim"] * positions * (1 if one_row else batch) * e
    return weights + kv


def cases(offset: int) -> list[tuple]:
    """FIXED, then eight configurations drawn from this run's seed (see the module's text)."""
    g = generator(offset)
    out = list(FIXED)
    for i in range(8):
        u = [float(x) for x in torch.rand(10, generator=g, dtype=torch.float64)]
        n_layers, n_kv_heads, group = 2 + int(78 * u[0]), 1 + int(8 * u[1]), 2 + int(7 * u[2])
        head_dim = (64, 80, 96, 128, 256)[int(5 * u[3])]
        c = dict(n_params=int(10 ** (7.5 + 3.5 * u[4])), n_layers=n_layers, d_model=n_kv_heads * group * head_dim,
                 n_heads=n_kv_heads * group, n_kv_heads=n_kv_heads, head_dim=head_dim,
                 bytes_per_element=(1, 2, 4)[int(3 * u[5])])
        batch = 2 + int(63 * u[6])
        share = 0.1 + 0.7 * u[7]  # of the step's bytes, in the cache
        per_position = 2 * n_layers * n_kv_heads * head_dim * batch * c["bytes_per_element"]
        cache_len = max(64, round(share / (1 - share) * c["n_params"] * c["bytes_per_element"] / per_position))
        bytes_per_s = 10 ** (9.5 + 3 * u[8])
        compute_over_memory = 1.5 + 2.5 * u[9] if i % 2 else 0.25 + 0.42 * u[9]
        memory = step_bytes(c, cache_len + 1, batch) / bytes_per_s
        flops_per_s = step_flops(c, cache_len + 1, batch) / (compute_over_memory * memory)
        side = "compute" if i % 2 else "memory"
        out.append((f"drawn configuration {i + 1} ({side} bound)", c, cache_len, batch, flops_per_s, bytes_per_s))
    return out


def _hint(got: float, c: dict, cache_len: int, batch: int, fs: float, bw: float) -> str:
    """What a wrong prediction most likely left out (the model in full where no single mistake fits)."""
    n = cache_len + 1
    flops, nbytes = step_flops(c, n, batch), step_bytes(c, n, batch)
    mistakes = [
        ("it leaves out the KV cache: a step reads every cached key and value (each layer, each KV head, each "
         "position held)", max(flops / fs, c["n_params"] * c["bytes_per_element"] / bw)),
        ("it counts the query heads' keys and values: the cache holds n_kv_heads heads, which the query heads of "
         "a group share", max(flops / fs, step_bytes(c, n, batch, query_heads=True) / bw)),
        ("it reads the weights once per sequence: one read of each weight serves the whole batch (that is why "
         "batching pays)", max(flops / fs, step_bytes(c, n, batch, weights_per_row=True) / bw)),
        ("it reads the keys but not the values (the cache holds both)",
         max(flops / fs, step_bytes(c, n, batch, k_only=True) / bw)),
        ("it reads one sequence's cache: each of the batch's sequences has its own",
         max(flops / fs, step_bytes(c, n, batch, one_row=True) / bw)),
        ("it counts elements, not bytes (bytes_per_element)", max(flops / fs, step_bytes(c, n, batch, elements=True) / bw)),
        ("it leaves out the arithmetic, or counts the FLOPs of one sequence: at this batch and FLOP/s the FLOPs of "
         "all the batch's sequences take longer than the step's bytes", nbytes / bw),
        ("it leaves out the memory traffic: here the bytes take longer than the FLOPs", flops / fs),
        ("it adds the two times: compute and memory traffic overlap", flops / fs + nbytes / bw),
        ("it counts the FLOPs of one sequence: each of the batch's sequences runs through the weights",
         max(step_flops(c, n, batch, one_row=True) / fs, nbytes / bw)),
        ("it is in milliseconds; return seconds", 1e3 * max(flops / fs, nbytes / bw)),
    ]
    for why, value in mistakes:
        if value > 0 and abs(got - value) <= 2e-3 * value:
            return why
    return ("a decode step moves every weight once (for the whole batch) and, for each sequence, the K and V of every "
            "layer, KV head and position in its cache; it does §1's FLOPs for each sequence; compute and memory "
            "traffic overlap, so the slower of the two sets its time")


def judge(decode_time, run) -> None:
    """`run(fn, *args)` calls the student's function, observed and its route judged; returns what it returned."""
    for what, c, cache_len, batch, fs, bw in cases(150):
        got = run(decode_time, dict(c), cache_len, batch, fs, bw)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise AssertionError(f"decode_time returned {type(got).__name__}; expected a number of seconds") from None
        lo = max(step_flops(c, cache_len, batch) / fs, step_bytes(c, cache_len, batch) / bw)  # the positions held
        hi = max(step_flops(c, cache_len + 1, batch) / fs, step_bytes(c, cache_len + 2, batch) / bw)  # the new one too
        assert lo * (1 - 1e-6) <= got <= hi * (1 + 1e-6), (
            f"decode_time({c}, cache_len={cache_len:,}, batch={batch}, flops_per_s={fs:.4g}, bytes_per_s={bw:.4g}) "
            f"[{what}] = {got:.4g} s, expected {lo:.4g} s: {_hint(got, c, cache_len, batch, fs, bw)} {seed_note()}")
