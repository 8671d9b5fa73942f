"""Batch-1 decode speed of SmolLM2-135M (fp32, CPU or CUDA): the lab's model, transformers, and the roofline.

    python benchmarks/decode.py [--new-tokens 64] [--repeats 3]

Decode is bandwidth-bound: each new token reads every weight once. So the ceiling is
    tok/s <= (memory bandwidth) / (bytes of weights read per token)
with the bandwidth measured here, in this run, by `lib.roofline.measure_bandwidth`: a one-row F.linear
over a 256 MiB fp32 matrix (the same operation decode performs). Every figure below is measured side by side in one run; a
busy machine lowers all of them, so compare the ratios, not the absolute numbers, across runs.
Not a test: timing never decides pass or fail.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_decode(step, prompt_len: int, new_tokens: int, repeats: int) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from lib import paths
    from lib.generate import generate
    from lib.model import default_device, load_smollm2
    from lib.roofline import measure_bandwidth, weight_bytes_per_token

    device = default_device()
    torch.manual_seed(0)
    print(f"device: {device} | torch {torch.__version__} | threads: {torch.get_num_threads()}")
    model, tok = load_smollm2(device=device)
    hf = AutoModelForCausalLM.from_pretrained(str(paths.MODELS_DIR), gguf_file=paths.SMOLLM2_FILE).to(device).eval()
    prompt = tok("The history of the printing press begins", return_tensors="pt").input_ids.to(device)
    n = args.new_tokens

    def lib_step(k):
        generate(model, prompt, k)
        _sync(device)

    @torch.no_grad()
    def hf_step(k):
        hf.generate(prompt, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=tok.eos_token_id)
        _sync(device)

    lib_s = time_decode(lib_step, prompt.shape[1], n, args.repeats)
    hf_s = time_decode(hf_step, prompt.shape[1], n, args.repeats)
    bw = measure_bandwidth(256, repeats=10, device=device)
    per_token = weight_bytes_per_token(model)
    roof_tok_s = bw / per_token

    print(f"\nSmolLM2-135M fp32, batch 1, {n} new tokens after a {prompt.shape[1]}-token prompt, median of {args.repeats}")
    print(f"  weights read per token      {per_token / 1e6:8.1f} MB")
    print(f"  measured bandwidth          {bw / 1e9:8.1f} GB/s  (one-row F.linear over 256 MiB fp32)")
    print(f"  roofline                    {roof_tok_s:8.1f} tok/s  = bandwidth / bytes per token ({1e3 / roof_tok_s:.1f} ms/token)")
    print(f"  lib.generate (KV cache)     {1 / lib_s:8.1f} tok/s  ({lib_s * 1e3:.1f} ms/token, {1 / lib_s / roof_tok_s:5.1%} of roofline)")
    print(f"  transformers generate       {1 / hf_s:8.1f} tok/s  ({hf_s * 1e3:.1f} ms/token, {1 / hf_s / roof_tok_s:5.1%} of roofline)")
    print(f"  lib / transformers          {hf_s / lib_s:8.2f}x")


if __name__ == "__main__":
    main()
