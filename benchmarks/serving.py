"""Serving throughput of lib.batching.engine on SmolLM2-135M: static vs continuous batching vs continuous + prefix
caching on one workload, and decode tokens/s at batch 1 vs batch 8 (plain weights, then packed ones).

    python benchmarks/serving.py [--requests 16] [--slots 4] [--short 8] [--long 32] [--system 64] [--decode-only]

The workload: `--requests` requests queued at once, each a shared system prompt (`--system` tokens) plus a
line of Hamlet, alternating `--short` and `--long` new tokens (the seed's 50/200 shape, scaled down by
default). The step-count model (`lib.batching.engine.simulate_steps`) predicts the continuous/static gain from the
lengths alone; the measured gain is printed beside it. Every figure is measured side by side in one run;
a busy machine lowers all of them, so compare the ratios. On a GPU the engine replays its decode steps as CUDA
graphs (`lib.batching.fast_paged`), and the decode lines are printed again with them off. Not a test: timing never
decides pass or fail.
"""
from __future__ import annotations

import argparse
import time

import torch

from lib.batching.engine import LLMEngine, simulate_steps
from lib.modeling.llama import shared_smollm2
from lib.modeling.text import load_text


def serve(model, prompts, lengths, slots, **kwargs):
    engine = LLMEngine(model, num_blocks=1024, block_size=16, max_num_seqs=slots, max_num_batched_tokens=2048,
                       **kwargs)
    for p, n in zip(prompts, lengths):
        engine.add_request(p, n)
    start, cpu = time.perf_counter(), time.process_time()
    while engine.has_unfinished():
        engine.step()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    prefill = sum(s["num_prefill_tokens"] for s in engine.step_stats)
    return seconds, cpu, len(engine.trace), prefill


def decode_rate(model, prompts, batch, steps, graphs=None):
    engine = LLMEngine(model, num_blocks=16 * batch, block_size=16, max_num_seqs=batch, max_num_batched_tokens=2048,
                       graphs=graphs)
    for p in prompts[:batch]:
        engine.add_request(p, steps + 2)
    engine.step()  # prefill
    engine.step()  # the first decode: on a GPU it captures the replayed step (lib.batching.fast_paged), not timed
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        engine.step()
    return batch * steps / (time.perf_counter() - start), batch * steps / (time.process_time() - cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--long", type=int, default=32)
    ap.add_argument("--system", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--decode-only", action="store_true", help="only the batch-1 vs batch-8 decode lines")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the batch-1 and batch-8 decode, in turn")
    ap.add_argument("--quick", action="store_true", help="a smoke run in seconds: 4 requests, short answers")
    ap.add_argument("--record", action="store_true",
                    help="also keep this run as the machine class's committed record (results/<class>/serving.json) "
                         "— if it was not disturbed")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.short, args.long, args.decode_steps, args.repeats = 4, 2, 4, 2, 1

    from lib.bench.records import Record
    from lib.bench.timing import Conditions, Timed

    torch.manual_seed(0)
    conditions, record, timed = Conditions.now(), Record("serving"), []
    model, tok = shared_smollm2()
    lines = [ln.strip() for ln in load_text("hamlet").splitlines() if len(ln.strip()) > 30]
    system = tok(" ".join(lines[400:600])).input_ids[:args.system]
    questions = [tok(ln).input_ids[:20] for ln in lines[200:200 + args.requests]]
    prompts = [system + q for q in questions]
    lengths = [args.short, args.long] * (args.requests // 2) + [args.short] * (args.requests % 2)
    tokens = sum(lengths)
    print(f"SmolLM2-135M fp32 on {torch.get_num_threads()} threads; {args.requests} requests queued, "
          f"{len(system)}-token shared system prompt, {args.short}/{args.long} new tokens, {args.slots} slots")

    rows = []
    for name, kwargs in [] if args.decode_only else [("static", dict(policy="static")), ("continuous", {}),
                         ("continuous + prefix cache", dict(enable_prefix_caching=True))]:
        seconds, cpu, steps, prefill = serve(model, prompts, lengths, args.slots, **kwargs)
        rows.append((name, seconds, cpu, steps, prefill))
    if rows:
        report_policies(rows, args, tokens, lengths)

    def rates(label, **kwargs):
        """Batch 1 and batch 8 in turn, `args.repeats` rounds: the best of each (tok/s by wall and by CPU time)."""
        wall, cpu = {1: [], 8: []}, {1: [], 8: []}
        for r in range(args.repeats):
            for b in ((1, 8) if r % 2 == 0 else (8, 1)):
                w, c = decode_rate(model, questions, b, args.decode_steps, **kwargs)
                wall[b].append(w)
                cpu[b].append(c)
        for b in (1, 8):
            record.add(f"decode b{b}{label}", wall[b], "tok/s", True)
            timed.append(Timed(f"batch {b}{label}", [1 / w for w in wall[b]]))
        record.add(f"decode b8 / b1{label}", max(wall[8]) / max(wall[1]), "×", True)
        return max(wall[1]), max(cpu[1]), max(wall[8]), max(cpu[8])

    one, one_cpu, eight, eight_cpu = rates("")
    print(f"\ndecode (best of {args.repeats} rounds, in turn): batch 1 {one:.1f} tok/s, batch 8 {eight:.1f} tok/s: "
          f"{eight / one:.2f}x by wall time, {eight_cpu / one_cpu:.2f}x by CPU time")
    if model.device.type == "cuda":  # the rows above replayed CUDA graphs (lib.batching.fast_paged); the same launched eagerly
        (one, _), (eight, _) = (decode_rate(model, questions, b, args.decode_steps, graphs=False) for b in (1, 8))
        print(f"decode, eager (graphs=False): batch 1 {one:.1f} tok/s, batch 8 {eight:.1f} tok/s")
    from lib.modeling.fast_kernels import can_pack, pack_linears
    if can_pack(model.device, model.embed.weight.dtype):
        # The same engine with the model's linear layers multiplying oneDNN-packed weights (lib.modeling.fast_kernels.pack_linears):
        # F.linear reads a plain weight once per row of a small batch on this kind of CPU, packed weights once.
        pack_linears(model)
        one, one_cpu, eight, eight_cpu = rates(", packed weights")
        print(f"decode, packed weights: batch 1 {one:.1f} tok/s, batch 8 {eight:.1f} tok/s: {eight / one:.2f}x by "
              f"wall time, {eight_cpu / one_cpu:.2f}x by CPU time")
    from timing import finish  # benchmarks/timing.py

    finish(conditions, timed, record, as_reference=args.record and not args.quick)


def report_policies(rows, args, tokens, lengths) -> None:
    base, base_cpu = rows[0][1], rows[0][2]
    print(f"\n{'policy':>26} {'steps':>6} {'prefill tok':>11} {'wall s':>7} {'req/s':>6} {'tok/s':>6} {'vs static':>9} "
          f"{'CPU s':>6} {'vs static':>9}")
    for name, seconds, cpu, steps, prefill in rows:
        print(f"{name:>26} {steps:6d} {prefill:11d} {seconds:7.1f} {args.requests / seconds:6.2f} "
              f"{tokens / seconds:6.1f} {base / seconds:8.2f}x {cpu:6.1f} {base_cpu / cpu:8.2f}x")
    predicted = simulate_steps(lengths, args.slots, "static") / simulate_steps(lengths, args.slots, "continuous")
    print(f"step-count model predicts continuous/static = {predicted:.2f}x; measured {rows[0][3] / rows[1][3]:.2f}x "
          f"(steps), {rows[0][1] / rows[1][1]:.2f}x (wall), {rows[0][2] / rows[1][2]:.2f}x (CPU time)")
    print("(CPU time is this process's: on a shared machine it is steadier than wall time; with several torch "
          "threads it adds them up)")


if __name__ == "__main__":
    main()
