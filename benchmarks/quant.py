"""Batch-1 decode speed of SmolLM2-135M with quantized weights: the lab's F32 path vs its int8 and int4
weight-only paths (torch's CPU kernels, lib.quant_linear), against the roofline for each; llama.cpp on the same
GGUF file when the optional peer `llama-cpp-python` is installed.

    python benchmarks/quant.py [--new-tokens 32] [--repeats 3]

Every figure comes from this run, side by side; a busy machine lowers all of them, so compare the ratios.
Not a test: timing never decides pass or fail. The goal (issue: week 20) is quantized decode >= 2.5x the F32
decode, and >= llama.cpp's Q4_1 decode on this CPU.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import time_decode  # noqa: E402  (benchmarks/decode.py: median seconds per decoded token)


def llama_cpp_tok_s(path: str, prompt: str, n: int) -> float | None:
    """llama.cpp's decode tok/s on the GGUF file, or None when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    low = llama_cpp.llama_cpp  # Llama() takes its defaults from here
    default_params = low.llama_model_default_params

    def without_extra_bufts():  # the AMX workaround (platform-facts.md): no extra buffer types
        p = default_params()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = without_extra_bufts
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=torch.get_num_threads(), verbose=False)
    llm(prompt, max_tokens=4)
    t0 = time.perf_counter()
    out = llm(prompt, max_tokens=n, temperature=0.0)
    dt = time.perf_counter() - t0
    return out["usage"]["completion_tokens"] / dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run in seconds: 4 new tokens, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.new_tokens, args.repeats = 4, 1

    from lib import paths
    from lib.generate import generate
    from lib.model import load_smollm2
    from lib.quant_linear import quantize_linears
    from lib.roofline import matmul_params, measure_bandwidth

    torch.manual_seed(0)
    print(f"torch {torch.__version__} | threads: {torch.get_num_threads()} (CPU kernels)")
    model, tok = load_smollm2(device="cpu")
    text = "The history of the printing press begins"
    prompt = tok(text, return_tensors="pt").input_ids
    n_w = matmul_params(model)
    variants = {  # name: (model, bits per weight read)
        "F32": (model, 32.0),
        "int8 (per channel)": (quantize_linears(model, "int8"), 8.0 + 16 / 576),
        "int4 g32, int8 head": (quantize_linears(model, "int4", 32, lm_head="int8"), None),
        "int4 g32": (quantize_linears(model, "int4", 32), 4.0 + 32 / 32),
    }
    head = model.embed.weight.numel()
    variants["int4 g32, int8 head"] = (variants["int4 g32, int8 head"][0], ((n_w - head) * 5.0 + head * 8.03) / n_w)
    bw = measure_bandwidth(256, repeats=5)
    ref_ids = generate(model, prompt, args.new_tokens)
    rows = []
    for name, (m, bpw) in variants.items():
        s = time_decode(lambda k, m=m: generate(m, prompt, k), args.new_tokens, args.repeats)
        ids = generate(m, prompt, args.new_tokens)
        agree = int((ids[0, prompt.shape[1]:] == ref_ids[0, prompt.shape[1]:]).int().cumprod(0).sum())
        rows.append((name, 1 / s, bw / (n_w * bpw / 8), agree))
    f32 = rows[0][1]
    print(f"\nSmolLM2-135M, batch 1, {args.new_tokens} new tokens, median of {args.repeats}; bandwidth {bw / 1e9:.1f} GB/s")
    print(f"{'path':>22} {'tok/s':>8} {'vs F32':>7} {'roofline tok/s':>15} {'greedy tokens = F32':>20}")
    for name, tok_s, roof, agree in rows:
        print(f"{name:>22} {tok_s:>8.1f} {tok_s / f32:>6.2f}x {roof:>15.0f} {agree:>14}/{args.new_tokens}")
    peer = llama_cpp_tok_s(str(paths.smollm2_path()), text, args.new_tokens)
    if peer is None:
        print("llama.cpp: not installed (optional: pip install llama-cpp-python; see platform-facts.md)")
    else:
        print(f"{'llama.cpp Q4_1':>22} {peer:>8.1f} {peer / f32:>6.2f}x")


if __name__ == "__main__":
    main()
