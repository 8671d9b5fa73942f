"""Decode speed of SmolLM2-135M with quantized weights, every path side by side in one run: the lab's F32 model
(the fp32-from-Q4_1 reference), lib.modeling.fast, transformers, torch's int8/int4 kernels (lib.quantization.quant_linear), the GGUF
file's own blocks (lib.gguf.qmatmul: the readable model and the fused decoder), and llama.cpp on the same file when
the optional peer `llama-cpp-python` is installed.

    python benchmarks/quant.py                 # batch 1 and batch 8, 32 new tokens, best of 5 (~4 min quiet)
    python benchmarks/quant.py --quick         # fewer paths, tokens and repeats (~30 s): a smoke run
    python benchmarks/quant.py --matmul        # also the kernel vs float32 matmuls for 1..64 rows of x
    python benchmarks/quant.py --threads 1     # one thread (on a shared, busy machine the fairer comparison)

For each path: tok/s; its roofline (the measured bandwidth over the bytes of weights it reads per token) and the
share of it reached; the ratio to the lab's F32 model and to llama.cpp; greedy agreement with the F32 model
(tokens equal before the first difference, summed over the prompts); perplexity with its standard error on 4,335
held-out tokens of Hamlet (lib.modeling.text; the week-20 notebook's evaluation span), and its paired difference to F32.
llama.cpp takes its turn among the paths (interleaved), so a load that comes and goes hits it alike. Every
figure comes from this run; a busy machine lowers all of them, so compare the ratios, and read the load
average printed with them. Not a test: timing never decides pass or fail (tests/test_qmatmul.py proves
the kernel exact). Goal (issue 22): the Q4_1 path >= llama.cpp on the same file, and a quantized batch-8 decode
faster than the float32 one.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import Conditions, finish, time_call, time_decodes  # benchmarks/timing.py

PROMPTS = ["The history of the printing press begins",
           "def fibonacci(n):",
           "Photosynthesis is the process by which"]
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def llama_cpp_model(path: str, n_ctx: int = 512):
    """llama.cpp (llama-cpp-python) on the GGUF file with torch's thread count, or None when not installed.
    `n_ctx`: the prompt and every token it will be asked for must fit (it stops early, not with an error)."""
    from lib.quantization.quant import llama_cpp_model as load

    threads = torch.get_num_threads()
    try:
        return load(path, n_ctx=n_ctx, n_threads_batch=threads)
    except ImportError:
        return None


def llama_cpp_step(llm, prompt: str):
    """`step(k)`: llama.cpp generates k greedy tokens after `prompt` (it keeps the prompt's KV between calls,
    as the lab's paths re-prefill theirs: the difference time(1 + n) - time(1) is n decode steps either way)."""
    def step(k: int) -> None:
        out = llm(prompt, max_tokens=k, temperature=0.0, top_k=1)
        if out["usage"]["completion_tokens"] != k:
            raise RuntimeError(f"llama.cpp stopped after {out['usage']['completion_tokens']} of {k} tokens")
    return step


def cpu_flags() -> str:
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    have = set(line.split(":", 1)[1].split())
    return " ".join(f for f in CPU_FLAGS if f in have) or "none of " + " ".join(CPU_FLAGS)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def matmul_table(blocks, repeats: int) -> None:
    """The kernel against float32 matmuls (plain and oneDNN-packed) on SmolLM2's gate-up and output shapes."""
    from lib.gguf import qmatmul as Q
    from lib.modeling.fast_kernels import pack_weight, packed_linear

    print("\n--- matmul: ms per call, by rows of x (the kernel is fused up to FUSED_MAX_ROWS "
          f"= {Q.FUSED_MAX_ROWS}, then decodes the weight once and calls torch) ---")
    shapes = {"gate+up (Q4_1) 3072x576": ("Q4_1", torch.cat([blocks["layers.0.mlp.gate_proj.weight"][1],
                                                              blocks["layers.0.mlp.up_proj.weight"][1]])),
              "LM head (Q8_0) 49152x576": blocks["embed.weight"]}
    for name, (qtype, b) in shapes.items():
        w = Q.dequantize_blocks(b, qtype)
        wp = pack_weight(w)
        print(f"{name}:  rows | F.linear fp32 | packed fp32 | fused kernel | decode + F.linear")
        for rows in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(rows, w.shape[1])
            lin = time_call(lambda: torch.nn.functional.linear(x, w), repeats, x.device)
            pk = time_call(lambda: packed_linear(x, wp), repeats, x.device)
            lib = Q._load()
            fused = float("nan")
            if lib is not None:
                y = torch.empty(rows, w.shape[0])
                fused = time_call(lambda: lib.qmatmul_f32(Q._CODES[qtype], b.data_ptr(), w.shape[0], w.shape[1],
                                                          x.data_ptr(), rows, w.shape[1], y.data_ptr(),
                                                          torch.get_num_threads()), repeats, x.device)
            deq = time_call(lambda: torch.nn.functional.linear(x, Q.dequantize_blocks(b, qtype)), repeats, x.device)
            print(f"{'':>26}{rows:>4} | {lin * 1e3:>13.2f} | {pk * 1e3:>11.2f} | {fused * 1e3:>12.2f} | "
                  f"{deq * 1e3:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=None, help="default 32 (8 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (1 with --quick)")
    parser.add_argument("--ppl-windows", type=int, default=None,
                        help="held-out windows of 255 scored tokens for perplexity: default 17 = 4,335 tokens "
                             "(2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="F32 (lab, lib.modeling.fast) and the GGUF paths only, few tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch's (and the kernel's) threads")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--matmul", action="store_true", help="also the kernel vs float32 matmuls, 1..64 rows")
    parser.add_argument("--record", action="store_true",
                        help="also keep this run as the machine class's committed record (results/<class>/quant.json) — "
                             "if it was not disturbed")
    args = parser.parse_args()
    new = args.new_tokens or (8 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 5)
    ppl_windows = args.ppl_windows or (2 if args.quick else 17)
    if ppl_windows < 2:
        parser.error("--ppl-windows must be >= 2 (a standard error needs two windows)")

    from lib.bench import paths
    from lib.gguf import qmatmul as Q
    from lib.modeling.fast import FastLlama
    from lib.modeling.generate import generate
    from lib.modeling.llama import load_smollm2
    from lib.quantization.quant_linear import GGUFFastLlama, gguf_layouts, gguf_linears, quantize_linears, read_gguf_blocks
    from lib.bench.roofline import matmul_params, measure_bandwidth
    from lib.bench.records import Record
    from lib.modeling.text import load_text, perplexity_se, token_nlls

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    conditions = Conditions.now()
    record = Record("quant")  # every run is recorded; only a full, undisturbed one with --record becomes the reference
    t0 = time.perf_counter()
    backend = Q.backend()  # builds the kernel on first use
    built = time.perf_counter() - t0
    print(f"torch {torch.__version__} | threads {torch.get_num_threads()} | qmatmul: {backend} "
          f"(ready in {built:.1f} s: a first build compiles, later runs load the cached library)")
    print(f"CPU flags: {cpu_flags()} | load average at start: {load_average()}")
    model, tok = load_smollm2(device="cpu")
    blocks = read_gguf_blocks()
    prompts = [tok(p, return_tensors="pt").input_ids for p in PROMPTS[:1 if args.quick else None]]
    n_w = matmul_params(model)
    gguf_bytes = sum(b.numel() for _, b in blocks.values())  # every matmul weight, the tied head included
    types = sorted({f"{t}" for t, _ in blocks.values()})

    paths_ = {"lab F32 (lib.modeling.llama)": (model, n_w * 4), "lib.modeling.fast F32": (FastLlama(model), n_w * 4)}
    if not args.quick:
        paths_["int8 per channel (torch)"] = (quantize_linears(model, "int8"), n_w * (1 + 2 / 576))
        paths_["int4 g32 (torch, bf16 act.)"] = (quantize_linears(model, "int4", 32), n_w * 5 / 8)
    paths_["GGUF blocks, lib.modeling.llama"] = (gguf_linears(model, blocks), gguf_bytes)
    fused = GGUFFastLlama(model, blocks)  # its Q4_1 layout chosen by timing whole steps (once per machine)
    print(f"GGUF software prefetch here: {fused.prefetch_reason}\nGGUF layout here: {fused.layout_reason}")
    fused_name = f"GGUF blocks, fused ({fused.layout})"
    wide_bytes = sum(b.numel() * 6 // 5 if t in Q.WIDE else b.numel() for t, b in blocks.values())  # 24 B, not 20
    paths_[fused_name] = (fused, wide_bytes if fused.layout == "wide" else gguf_bytes)
    if not args.quick and len(gguf_layouts(blocks)) > 1:  # the other layout, side by side
        other = "file" if fused.layout == "wide" else "wide"
        paths_[f"GGUF blocks, fused ({other})"] = (GGUFFastLlama(model, blocks, layout=other),
                                                   wide_bytes if other == "wide" else gguf_bytes)
    if not args.quick and Q.kernel() is not None:  # the chosen layout with the other prefetch setting
        flip = "off" if fused.prefetch == "on" else "on"
        paths_[f"GGUF blocks, fused ({fused.layout}, prefetch {flip})"] = (
            GGUFFastLlama(model, blocks, layout=fused.layout, prefetch=flip), paths_[fused_name][1])

    hf = None
    if not (args.quick or args.skip_transformers):
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(str(paths.MODELS_DIR), gguf_file=paths.SMOLLM2_FILE).eval()
    llm = llama_cpp_model(str(paths.smollm2_path()))

    bw = measure_bandwidth(256, repeats=5)
    record.add("streaming bandwidth", bw / 1e9, "GB/s", True)
    record.note("GGUF prefetch", fused.prefetch_reason)
    record.note("GGUF layout", fused.layout_reason)
    refs = [generate(model, p, new) for p in prompts]
    steps = {name: (lambda k, m=m: generate(m, prompts[0], k)) for name, (m, _) in paths_.items()}
    if hf is not None:
        steps["transformers fp32 generate"] = lambda k: hf.generate(
            prompts[0], max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=tok.eos_token_id)
    if llm is not None:
        steps["llama.cpp, same Q4_1 file"] = llama_cpp_step(llm, PROMPTS[0])
    print(f"timing {len(steps)} paths in turn, best of {repeats} ...", flush=True)
    timed = time_decodes(steps, new, repeats)
    seconds = {name: t.best for name, t in timed.items()}

    # perplexity on held-out Hamlet (the week-20 notebook's evaluation span: calibration reads 5000-6023)
    text_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[0]
    eval_ids = text_ids[10000:10000 + 255 * ppl_windows + 1]
    base_nll = None
    rows = []
    for name, (m, nbytes) in paths_.items():
        agree = 0
        for p, ref in zip(prompts, refs):
            same = generate(m, p, new)[0, p.shape[1]:] == ref[0, p.shape[1]:]
            agree += int(same.int().cumprod(0).sum())
        nll = token_nlls(m, eval_ids, window=256, stride=255)
        base_nll = nll if base_nll is None else base_nll
        ppl, se = perplexity_se(nll, chunk=255)
        d, d_se = perplexity_se(nll, chunk=255, baseline=base_nll)
        rows.append((name, 1 / seconds[name], bw / nbytes, nbytes, f"{agree}/{new * len(prompts)}",
                     f"{ppl:.3f} ± {se:.3f}", f"{d:+.3f} ± {d_se:.3f}"))
    if hf is not None:
        rows.append(("transformers fp32 generate", 1 / seconds["transformers fp32 generate"], bw / (n_w * 4),
                     n_w * 4, "-", "-", "-"))
    peer = None
    if llm is not None:
        peer = 1 / seconds["llama.cpp, same Q4_1 file"]
        rows.append(("llama.cpp, same Q4_1 file", peer, bw / gguf_bytes, gguf_bytes, "-", "-", "-"))

    f32 = rows[0][1]
    print(f"\nSmolLM2-135M, batch 1, {new} new tokens, best of {repeats} (paths in turn); bandwidth {bw / 1e9:.1f} GB/s "
          f"(streaming sum over 256 MiB, best of 5); GGUF blocks: {'+'.join(types)}, {gguf_bytes / 1e6:.1f} MB per token; "
          f"greedy: tokens equal to the lab F32 model's before the first difference, {len(prompts)} prompts; "
          f"perplexity ± 1 s.e. (across windows) on {eval_ids.numel() - 1} held-out tokens of Hamlet, "
          f"ΔPPL against lab F32 paired window by window")
    print(f"{'path':>40} {'tok/s':>7} {'MB/tok':>7} {'roofline':>9} {'share':>6} {'vs F32':>7} {'vs llama.cpp':>12} "
          f"{'greedy = F32':>12} {'perplexity':>17} {'ΔPPL':>17}")
    for name, tok_s, roof, nbytes, agree, ppl, dppl in rows:
        vs_peer = f"{tok_s / peer:.2f}x" if peer else "-"
        if record is not None:
            record.add(f"decode b1 n{new}: {name}", [1 / x for x in timed[name].samples], "tok/s", True)
            record.note(f"greedy = F32: {name}", agree)
            record.note(f"perplexity: {name}", ppl)
        print(f"{name:>40} {tok_s:>7.1f} {nbytes / 1e6:>7.1f} {roof:>9.0f} {tok_s / roof:>6.0%} {tok_s / f32:>6.2f}x "
              f"{vs_peer:>12} {agree:>12} {ppl:>17} {dppl:>17}")
    if peer is None:
        print("llama.cpp: not installed (optional: pip install -e '.[llamacpp]', several minutes; platform-facts.md)")

    print(f"\nBatch 8 (one prompt 8 times), {new} new tokens, best of {repeats}: decoded tokens per second, all rows")
    batch = prompts[0].repeat(8, 1)
    f32_name = f"lib.modeling.fast F32 ({paths_['lib.modeling.fast F32'][0].kernel})"
    b8 = {f32_name: paths_["lib.modeling.fast F32"][0], fused_name: fused}
    b8_timed = time_decodes({n: (lambda k, m=m: generate(m, batch, k)) for n, m in b8.items()}, new, repeats)
    b8_rows = {name: 8 / t.best for name, t in b8_timed.items()}
    base = b8_rows[f32_name]
    for name, tok_s in b8_rows.items():
        print(f"{name:>40} {tok_s:>7.1f} tok/s  {tok_s / base:.2f}x  spread {b8_timed[name].spread:.2f}")
        if record is not None:
            record.add(f"decode b8 n{new}: {name}", [8 / x for x in b8_timed[name].samples], "tok/s", True)
    if args.matmul:
        matmul_table(blocks, max(repeats, 5))
    finish(conditions, list(timed.values()) + list(b8_timed.values()), record, as_reference=args.record and not args.quick)


if __name__ == "__main__":
    main()
