"""Multi-LoRA serving throughput on SmolLM2-135M: N requests spread over K LoRA adapters, served by one engine that
applies each request's adapter to its own rows inside every batch (lib.modeling.lora, the S-LoRA / Punica idea), against each
adapter served as a separate model (its weights merged, W + (α/r)·B·A), one model after another.

    python benchmarks/lora.py [--requests 16] [--adapters 4] [--rank 8] [--new-tokens 32] [--repeats 3]
    python benchmarks/lora.py --quick      # a smoke run in seconds: 4 requests over 2 adapters, 4 new tokens
    python benchmarks/lora.py --record     # also keep the run as results/<class>/lora.json (if undisturbed)

The workload: `--requests` requests queued at once, each a line of Hamlet (up to 24 tokens), `--new-tokens` greedy
tokens each; request i uses adapter i mod K (random rank-`--rank` adapters on all seven linears of every layer, the
heaviest case). Three set-ups are timed in turn, round by round (lib.bench.timing.interleaved):

- **multi-LoRA**: one engine on the base model, every request with its adapter: each step multiplies the whole batch
  by the shared weights once, and each adapter group adds its low-rank product;
- **separate models**: K engines, one per merged model, each serving its N/K requests, one after another (K servers
  taking turns on one machine; K copies of the weights in memory);
- **base model**: the same requests on the base model, no adapter: what the low-rank products cost.

Greedy tokens of multi-LoRA and of the merged models are compared (they should be identical). tok/s counts generated
tokens over the wall time of the whole run, prefill included. On a GPU every engine runs eagerly (`graphs=False`):
a step with adapters in it is not replayed as a CUDA graph. Timing, not a test: run it on quiet cores.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def serve(model, prompts, adapters, new_tokens: int, slots: int) -> list[list[int]]:
    """Every prompt (with its adapter, or None) through one engine, all queued at once; the new tokens of each."""
    from lib.batching.engine import LLMEngine
    from lib.modeling.sampling import SamplingParams

    engine = LLMEngine(model, num_blocks=max(64, slots * 8), block_size=16, max_num_seqs=slots,
                       max_num_batched_tokens=2048, graphs=False)
    ids = [engine.add_request(p, new_tokens, params=None if a is None else SamplingParams(lora=a))
           for p, a in zip(prompts, adapters)]
    while engine.has_unfinished():
        engine.step()
    done = engine.finished_outputs()
    return [done[i] for i in ids]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4, help="K adapters; request i uses adapter i mod K")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=None, help="max_num_seqs of each engine (default: --requests)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the three set-ups, in turn")
    ap.add_argument("--quick", action="store_true", help="a smoke run in seconds: 4 requests over 2 adapters")
    ap.add_argument("--record", action="store_true",
                    help="also keep this run as the machine class's committed record (results/<class>/lora.json) "
                         "— if it was not disturbed")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.adapters, args.new_tokens, args.repeats = 4, 2, 4, 1
    if not 1 <= args.adapters <= args.requests:
        ap.error(f"need 1 <= --adapters <= --requests; got {args.adapters} adapters for {args.requests} requests")
    slots = args.slots or args.requests
    import torch

    from lib.modeling.lora import LoRAAdapter, merge
    from lib.modeling.llama import shared_smollm2
    from lib.bench.records import Record
    from lib.modeling.text import load_text
    from lib.bench.timing import Conditions, interleaved

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from timing import finish  # benchmarks/timing.py

    torch.manual_seed(0)
    conditions, record = Conditions.now(), Record("lora")
    model, tok = shared_smollm2()
    dtype = model.embed.weight.dtype
    lines = [ln.strip() for ln in load_text("hamlet").splitlines() if len(ln.strip()) > 30]
    prompts = [tok(ln).input_ids[:24] for ln in lines[200:200 + args.requests]]
    adapters = [LoRAAdapter.random(model.config, rank=args.rank, seed=k + 1, name=f"adapter-{k}").to(model.device, dtype)
                for k in range(args.adapters)]
    which = [i % args.adapters for i in range(args.requests)]
    merged = [merge(model, a) for a in adapters]
    tokens = args.requests * args.new_tokens
    print(f"SmolLM2-135M {str(dtype).removeprefix('torch.')} on {model.device} ({torch.get_num_threads()} threads); "
          f"{args.requests} requests over {args.adapters} rank-{args.rank} adapters (all 7 linears of every layer), "
          f"{args.new_tokens} new tokens each, {slots} slots per engine")

    outputs = {}

    def multi():
        outputs["multi"] = serve(model, prompts, [adapters[k] for k in which], args.new_tokens, slots)

    def separate():
        out = [None] * args.requests
        for k, m in enumerate(merged):  # one model after another, each with its own requests
            mine = [i for i in range(args.requests) if which[i] == k]
            for i, o in zip(mine, serve(m, [prompts[i] for i in mine], [None] * len(mine), args.new_tokens, slots)):
                out[i] = o
        outputs["separate"] = out

    def base():
        serve(model, prompts, [None] * args.requests, args.new_tokens, slots)

    names = {"multi-LoRA, one engine": multi, f"separate merged models ({args.adapters}, in turn)": separate,
             "base model, no adapter": base}
    timed = interleaved(names, repeats=args.repeats, warmup=0 if args.quick else 1, device=model.device)
    (t_multi, t_sep, t_base) = (timed[n] for n in names)
    same = sum(a == b for a, b in zip(outputs["multi"], outputs["separate"]))
    print(f"\n{'set-up':>40} {'best tok/s':>11} {'median':>8} {'worst':>8}")
    for name, t in timed.items():
        print(f"{name:>40} {tokens / t.best:11.1f} {tokens / t.median:8.1f} {tokens / t.worst:8.1f}")
        record.add(f"{name.split(',')[0].split(' (')[0]} tok/s", [tokens / s for s in t.samples], "tok/s", True)
    speedup = [s / m for s, m in zip(t_sep.samples, t_multi.samples)]  # round by round
    overhead = [m / b for m, b in zip(t_multi.samples, t_base.samples)]
    record.add("multi-LoRA / separate models", speedup, "×", True)
    record.add("multi-LoRA time / base model time", overhead, "×", False)
    print(f"multi-LoRA over separate models: {max(speedup):.2f}× (best round; rounds {', '.join(f'{x:.2f}' for x in speedup)})"
          f"; multi-LoRA takes {min(overhead):.2f}× the base model's time")
    print(f"greedy tokens identical to the merged models': {same} of {args.requests} requests")
    record.note("workload", f"{args.requests} requests over {args.adapters} rank-{args.rank} adapters on all 7 linears, "
                            f"{args.new_tokens} new tokens each, prompts up to 24 tokens, {slots} slots, eager steps")
    record.note("tokens identical to merged models", f"{same} of {args.requests}")
    finish(conditions, list(timed.values()), record, as_reference=args.record and not args.quick)


if __name__ == "__main__":
    main()
