"""Speed of SmolLM2-135M on this machine: the lab's model, its fast path, transformers, and the roofline.

    python benchmarks/decode.py                      # decode (64 and 512 new tokens) and a 256-token prefill
    python benchmarks/decode.py --quick              # the same in seconds (8 new tokens, 32-token prefill): it runs
    python benchmarks/decode.py --compile            # also FastLlama under torch.compile (compile time printed)
    python benchmarks/decode.py --batch 1 8          # batch-1 and batch-8 decode (tok/s summed over the batch)
    python benchmarks/decode.py --profile            # where one decode step's time goes, per op, lib vs fast
    python benchmarks/decode.py --matmul             # small-batch matmuls in each kernel lib.modeling.fast can choose,
                                                     # and the verify curve (m new tokens after a cache)

Decode is bandwidth-bound: each new token reads every weight once. So the ceiling is
    tok/s <= (memory bandwidth) / (bytes of weights read per token)
with the bandwidth measured here, in this run, by `lib.bench.roofline.measure_bandwidth`: a streaming sum over a
256 MiB fp32 matrix (the fastest read torch makes; a one-row F.linear, the operation decode performs, reads
about half as fast on the lab's 2-core EPYC, and `--matmul` prints both). Every figure below is measured side by side in
one run; a busy machine lowers all of them, so compare the ratios, not the absolute numbers, across runs.
On a GPU the fast path replays each decode step as a CUDA graph (lib.modeling.fast, item 8); the same path without graphs
(`graphs=False`) is timed beside it, and the first call's capture is timed on its own.
Not a test: timing never decides pass or fail (tests/test_fast.py proves the fast path exact).
"""
from __future__ import annotations

import argparse
import time

import torch

from timing import Conditions, finish, interleaved, sync, time_call, time_decodes  # benchmarks/timing.py


def profile_step(name: str, model, prompt, steps: int = 8) -> None:
    """Per-op table of `steps` one-token decode steps after the prompt, and the matmul / other split."""
    from torch.profiler import ProfilerActivity, profile
    cache = model.new_cache(1, prompt.shape[1] + steps + 1)
    with torch.no_grad():
        model(prompt, cache=cache)
        x = prompt[:, -1:]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                model(x, cache=cache)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    weights = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"))
    attn = sum(e.self_cpu_time_total for e in events if e.key in ("aten::bmm", "aten::_softmax"))
    calls = sum(e.count for e in events if e.key.startswith("aten::"))
    print(f"\n--- profile: {name}, {steps} decode steps ---")
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))
    print(f"{name}: {total / steps / 1e3:.1f} ms/step = weight matmuls {weights / total:.0%}, attention "
          f"{attn / total:.0%}, everything else (overhead: views, copies, small ops) {1 - (weights + attn) / total:.0%}; "
          f"{calls / steps:.0f} aten calls per step")


def matmul_sweep(model, repeats: int, rows: list[int] | None = None) -> None:
    """Weight matmuls with 1..16 rows of input (decode = 1, verifying K draft tokens = K + 1, a batch = B), on
    SmolLM2's own weight shapes, in each kernel lib.modeling.fast can choose (plain `F.linear`, oneDNN-packed weights,
    the C++ float32 loops of lib/gguf/csrc/qmatmul.cpp); then the verify curve of whole forwards: m new tokens after a
    128-token cache, in units of one decode step."""
    import torch.nn.functional as F

    from lib.gguf import qmatmul as Q
    from lib.modeling.fast import FastLlama
    from lib.modeling.fast_kernels import kernels_for, pack_weight, packed_linear
    weights = [w for blk in model.layers for w in (blk.attn.q_proj.weight, blk.attn.k_proj.weight,
               blk.attn.v_proj.weight, blk.attn.o_proj.weight, blk.mlp.gate_proj.weight, blk.mlp.up_proj.weight,
               blk.mlp.down_proj.weight)] + [model.embed.weight]
    weights = [w.detach() for w in weights]
    kernels = kernels_for(weights)
    if kernels == ["plain"]:
        print("lib.modeling.fast's kernels need fp32 weights on a CPU; only F.linear runs here, nothing to compare")
        return
    ws = {"plain": weights, "packed": [pack_weight(w) for w in weights] if "packed" in kernels else None,
          "cpp": weights}
    mul = {"plain": F.linear, "packed": packed_linear, "cpp": lambda x, w: Q.linear_f32(x, w, max_rows=64)}
    names = {"plain": "F.linear", "packed": "packed", "cpp": "C++"}
    mb = sum(w.numel() * w.element_size() for w in weights) / 1e6
    reps = max(repeats, 5) if rows is None else repeats
    rows = rows or [1, 2, 3, 4, 5, 8, 12, 16]
    print(f"\nall {len(weights)} weight matmuls of one token ({mb:.0f} MB), median ms of {reps} "
          f"(ratio to 1 row in brackets); the C++ loops pass over a weight once per 8 rows")
    print(f"  {'rows':>5s}" + "".join(f"{names[k]:>18s}" for k in kernels) + f"{'fastest':>10s}")
    one_row = {}  # kernel -> seconds with 1 row: the unit of the ratios
    with torch.inference_mode():
        for m in rows:
            xs = {w.shape[1]: torch.randn(m, w.shape[1]) for w in weights}
            t = {k: time_call(lambda k=k: [mul[k](xs[w.shape[1]], wk) for w, wk in zip(weights, ws[k])], reps,
                              torch.device("cpu")) for k in kernels}
            one_row = one_row or t
            print(f"  {m:5d}" + "".join(f"{t[k] * 1e3:10.1f} ({t[k] / one_row[k]:4.2f})" for k in kernels)
                  + f"{names[min(t, key=t.get)]:>10s}")
    one_row = list(one_row.values())
    from lib.bench.roofline import measure_bandwidth
    bw, mv = measure_bandwidth(256, repeats=10), measure_bandwidth(256, repeats=10, how="matvec")
    best = min(one_row)
    print(f"  the weight matmuls alone, 1 row, best layout: {best * 1e3:.1f} ms = {mb / 1e3 / best:.1f} GB/s, "
          f"{mb / 1e3 / best / (mv / 1e9):.0%} of the {mv / 1e9:.1f} GB/s a 256 MiB one-row F.linear reads at: with "
          f"these kernels no decode step can beat {1 / best:.1f} tok/s, {mb / 1e3 / best / (bw / 1e9):.0%} of the "
          f"roofline ({bw / 1e9:.1f} GB/s streaming)")
    ids = torch.randint(0, model.config.vocab_size, (1, 128 + 16), generator=torch.Generator().manual_seed(0))
    print("\nverify curve: time of a forward over m new tokens after a 128-token cache, in one-token steps")
    print(f"  {'engine':28s}" + "".join(f"{f'm={m}':>8s}" for m in rows) + f"{'1 step ms':>11s}")
    for name, eng in {"lib.modeling.llama": model, **{f"lib.modeling.fast ({names[k]})": FastLlama(model, kernel=k)
                                             for k in kernels}}.items():
        cache = eng.new_cache(1, 128 + 16)
        with torch.inference_mode():
            eng(ids[:, :128], cache=cache)

            def fwd(m, eng=eng, cache=cache):
                cache.truncate(128)
                eng(ids[:, 128:128 + m], cache=cache)
            secs = [time_call(lambda m=m: fwd(m), reps, torch.device("cpu")) for m in rows]
        print(f"  {name:28s}" + "".join(f"{s / secs[0]:8.2f}" for s in secs) + f"{secs[0] * 1e3:11.1f}")


def decode_table(engines: dict, model, hf, tok, prompt, args, device, per_token: int, bw: float, roof: float,
                 record=None) -> dict:
    """Print and return {engine: [Timed seconds per decode step, one per --new-tokens]} for `prompt` [B, T]: the
    engines (and transformers) timed in turn, round by round (benchmarks/timing.py: time_decodes)."""
    from lib.modeling.generate import generate
    batch = prompt.shape[0]
    check = min(64, max(args.new_tokens))
    want = generate(model, prompt, check)
    same = {name: torch.equal(generate(m, prompt, check), want) for name, m in engines.items() if m is not model}
    print(f"\nfp32 batch-{batch} decode after a {prompt.shape[1]}-token prompt, best of {args.repeats} rounds, engines "
          f"in turn (weights read per step {per_token / 1e6:.1f} MB; bandwidth {bw / 1e9:.1f} GB/s measured by a "
          f"streaming sum over 256 MiB; tok/s summed over the batch; spread = worst / best round)")
    print(f"greedy tokens identical to lib.modeling.llama's ({check} tokens): "
          + ", ".join(f"{name.split('(')[-1].rstrip(')')}: {ok}" for name, ok in same.items()))
    steps = {name: (lambda k, m=m: generate(m, prompt, k)) for name, m in engines.items()}
    if hf is not None:
        @torch.no_grad()
        def hf_step(k):
            hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=k, min_new_tokens=k,
                        do_sample=False, pad_token_id=tok.eos_token_id)
        steps["transformers generate"] = hf_step
    rows = {name: [] for name in steps}
    for n in args.new_tokens:
        for name, t in time_decodes(steps, n, args.repeats, device).items():
            rows[name].append(t)
    print(f"  {'engine':40s}" + "".join(f"{f'{n} new tok/s':>16s}{'% roof':>8s}{'spread':>8s}" for n in args.new_tokens))
    over = []
    for name, times in rows.items():  # a step decodes `batch` tokens and reads the weights once
        print(f"  {name:40s}" + "".join(f"{batch / t.best:16.1f}{1 / t.best / roof:8.0%}{t.spread:8.2f}" for t in times))
        over += [name for t in times if 1 / t.best / roof > 1.0 and "transformers" not in name]
        if record is not None:
            for n, t in zip(args.new_tokens, times):
                record.add(f"decode b{batch} n{n}: {name}", [batch / x for x in t.samples], "tok/s", True)
    print(f"  {'roofline (bandwidth / bytes per step)':40s}"
          + "".join(f"{batch * roof:16.1f}{'100%':>8s}{'':8s}" for _ in args.new_tokens))
    if over:
        print(f"  measurement problem: {', '.join(sorted(set(over)))} above 100 % of the roofline — no engine reads "
              f"the weights faster than memory delivers them, so the bandwidth probe read low (rerun when quiet)")
    if record is not None:
        record.add(f"decode b{batch}: roofline", batch * roof, "tok/s", True)
        record.note("roofline above 100 %", sorted(set(over)) or None)
    if hf is not None:
        for name in engines:
            ratios = ", ".join(f"{rows['transformers generate'][i].best / rows[name][i].best:.2f}x at {n}"
                               for i, n in enumerate(args.new_tokens))
            print(f"  {name} / transformers: {ratios}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[1],
                        help="decode batch sizes (the prompt repeated; tok/s summed over the batch)")
    parser.add_argument("--compile", action="store_true", help="also time FastLlama(compile=True)")
    parser.add_argument("--profile", action="store_true", help="per-op profile of a decode step, then exit")
    parser.add_argument("--matmul", action="store_true",
                        help="rows-per-matmul sweep (each kernel lib.modeling.fast can choose) and the verify curve, then exit")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--record", action="store_true",
                        help="also keep this run as the machine class's committed record (results/<class>/decode.json, "
                             "rendered by `make results`) — if it was not disturbed")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds (8 new tokens, a 32-token prefill, 1 repeat; --matmul: 1, 2, 4 "
                             "rows): noisy figures")
    args = parser.parse_args()
    if args.quick:
        args.new_tokens, args.prefill, args.repeats = [8], 32, 1

    from lib.bench import paths
    from lib.modeling.fast import FastLlama
    from lib.modeling.fast_graphs import GRAPH_BUCKET
    from lib.modeling.generate import generate
    from lib.modeling.llama import default_device, load_smollm2
    from lib.bench.roofline import measure_bandwidth, weight_bytes_per_token

    from lib.bench.records import Record

    device = default_device()
    torch.manual_seed(0)
    conditions = Conditions.now()
    record = Record("decode")  # every run is recorded; only a full, undisturbed one with --record becomes the reference
    load, cores = conditions.load_before, conditions.cores
    print(f"device: {device} | torch {torch.__version__} | threads: {torch.get_num_threads()} | "
          f"cores: {cores} | load average (1 min): {load:.2f}")
    model, tok = load_smollm2(device=device)
    fast = FastLlama(model)
    print(f"lib.modeling.fast's kernel: {fast.kernel_reason}")
    prompt = tok("The history of the printing press begins", return_tensors="pt").input_ids.to(device)

    if args.profile:
        profile_step("lib.modeling.llama", model, prompt)
        profile_step("lib.modeling.fast", fast, prompt)
        return
    if args.matmul:
        matmul_sweep(model, args.repeats, rows=[1, 2, 4] if args.quick else None)
        return

    from lib.bench.records import best_bandwidth

    bw_now = measure_bandwidth(256, repeats=10, device=device)
    bw, where = best_bandwidth(measured_now=bw_now)  # the roofline: the class's best bandwidth, not one run's
    print(f"bandwidth for the roofline: {bw / 1e9:.1f} GB/s, {where}")
    per_token = weight_bytes_per_token(model)
    roof = bw / per_token
    if record is not None:
        record.add("streaming bandwidth", bw_now / 1e9, "GB/s", True)
        record.note("kernel", fast.kernel_reason)
    hf = None
    if not args.skip_transformers:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(str(paths.MODELS_DIR), gguf_file=paths.SMOLLM2_FILE).to(device).eval()

    names = {"plain": "F.linear", "packed": "packed", "cpp": "C++ step"}
    fast_name = "CUDA graphs" if fast.graphs is not None else names[fast.kernel]
    engines = {"lib.modeling.generate (lib.modeling.llama)": model, f"lib.modeling.generate (lib.modeling.fast, {fast_name})": fast}
    record.note("lib.modeling.fast engine", f"lib.modeling.generate (lib.modeling.fast, {fast_name})")
    if fast.graphs is not None:  # what the graphs buy: the same fast path, each kernel launched from Python
        engines["lib.modeling.generate (lib.modeling.fast, eager)"] = FastLlama(model, graphs=False)
        t0 = time.perf_counter()
        generate(fast, prompt, 2)  # the first decode step on a new cache shape captures its graph
        sync(device)
        print(f"CUDA graph capture (with its warm-up) and a 1-token prefill: {(time.perf_counter() - t0) * 1e3:.0f} "
              f"ms once per cache shape and window of {GRAPH_BUCKET} positions; "
              f"{fast.graphs.captures} graph(s) captured")
    elif device.type == "cpu":  # the same fast path with the kernels it did not choose: what the choice buys
        from lib.modeling.fast_kernels import kernels_for
        for k in kernels_for([model.embed.weight.detach()]):
            if k != fast.kernel:
                engines[f"lib.modeling.generate (lib.modeling.fast, {names[k]})"] = FastLlama(model, kernel=k)
    if args.compile:
        t0 = time.perf_counter()
        compiled = FastLlama(model, compile=True)
        generate(compiled, prompt, 3)  # compiles prefill and decode shapes
        engines["lib.modeling.generate (lib.modeling.fast, compiled)"] = compiled
        print(f"torch.compile of FastLlama: {time.perf_counter() - t0:.1f} s before the first token")

    timed = []
    for batch in args.batch:
        rows = decode_table(engines, model, hf, tok, prompt.repeat(batch, 1), args, device, per_token, bw, roof, record)
        timed += [t for times in rows.values() for t in times]
    if device.type == "cpu" and args.batch == [1]:  # the optional peer: pip install -e '.[llamacpp]' (minutes)
        from quant import llama_cpp_model, llama_cpp_step  # benchmarks/quant.py
        llm = llama_cpp_model(str(paths.MODELS_DIR / paths.SMOLLM2_FILE), n_ctx=max(args.new_tokens) + 64)
        if llm is None:
            print(f"  {'llama.cpp (Q4_1 file)':40s}  not installed: pip install -e '.[llamacpp]' adds this row")
        else:  # it reads the Q4_1 weights (~4.5x fewer bytes than fp32), so its roofline is higher than ours
            step = llama_cpp_step(llm, "The history of the printing press begins")
            cpp = [time_decodes({"llama.cpp": step}, n, args.repeats)["llama.cpp"] for n in args.new_tokens]
            print(f"  {'llama.cpp (Q4_1 weights, not fp32)':40s}" + "".join(f"{1 / t.best:16.1f}{'':8s}{t.spread:8.2f}"
                                                                           for t in cpp))
            if record is not None:
                for n, t in zip(args.new_tokens, cpp):
                    record.add(f"decode b1 n{n}: llama.cpp (Q4_1)", [1 / x for x in t.samples], "tok/s", True)

    # Prefill: one forward over a long prompt (compute-bound: the matrix units matter here).
    ids = torch.randint(0, model.config.vocab_size, (1, args.prefill), generator=torch.Generator().manual_seed(0)).to(device)
    fast_bf16 = FastLlama(model, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(ids)
        err = (fast_bf16(ids) - ref).abs().max().item()
        agree = (fast_bf16(ids).argmax(-1) == ref.argmax(-1)).float().mean().item()
        fns = {"lib.modeling.llama fp32": lambda: model(ids), "lib.modeling.fast fp32": lambda: fast(ids),
               "lib.modeling.fast bf16": lambda: fast_bf16(ids)}
        if hf is not None:
            fns["transformers fp32"] = lambda: hf(ids)
        pre_t = interleaved(fns, args.repeats, warmup=1, device=device)
    timed += list(pre_t.values())
    pre = {name: t.best for name, t in pre_t.items()}
    print(f"\n{args.prefill}-token prefill (one forward), best of {args.repeats} rounds, in turn")
    for name, s in pre.items():
        extra = f"   vs transformers {pre['transformers fp32'] / s:.2f}x" if hf is not None else ""
        print(f"  {name:22s} {s * 1e3:8.0f} ms  {args.prefill / s:8.0f} tok/s  spread {pre_t[name].spread:.2f}{extra}")
        if record is not None:
            record.add(f"prefill {args.prefill}: {name}", [x * 1e3 for x in pre_t[name].samples], "ms", False)
    # Which is faster is read off the two timings above, not guessed from the CPU's features: without AMX tiles
    # oneDNN still has AVX-512 BF16 (or AVX2 conversion) kernels, and how they compare with fp32 depends on the chip.
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    ratio = pre["lib.modeling.fast fp32"] / pre["lib.modeling.fast bf16"]
    print(f"  bf16 vs fp32 logits: max |diff| {err:.3f}, argmax agreement {agree:.1%}; bf16 prefill "
          + (f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower") + " than fp32 in this run "
          f"(AMX tiles: {'yes' if amx else 'no'})")

    # Threads: with another busy process, torch's default thread count can slow small ops several-fold.
    if device.type == "cpu" and torch.get_num_threads() > 1:
        n_default = torch.get_num_threads()
        step = lambda k: generate(fast, prompt, k)  # noqa: E731
        s_default = time_decodes({"fast": step}, 32, args.repeats)["fast"].best
        torch.set_num_threads(1)
        s_one = time_decodes({"fast": step}, 32, args.repeats)["fast"].best
        torch.set_num_threads(n_default)
        print(f"\nthreads: lib.modeling.fast decode {1 / s_default:.1f} tok/s with {n_default} threads, {1 / s_one:.1f} "
              f"with 1 (load average {load:.2f} on {cores} cores)")
        if s_one < 0.9 * s_default:  # more than noise: the cores are shared with another busy process
            print("  -> fewer threads are clearly faster now, so the cores are busy with something else. Use "
                  "torch.set_num_threads(1) (or OMP_NUM_THREADS=1) while it runs, or stop the other process.")
    finish(conditions, timed, record, as_reference=args.record and not args.quick)


if __name__ == "__main__":
    main()
