"""This machine's whole table: what the CPU is, and how every decode path of the lab fares on it, in one run.

    python benchmarks/machine.py            # the facts, then benchmarks/decode.py and benchmarks/quant.py in full
    python benchmarks/machine.py --quick    # the facts and the kernels chosen only (seconds; `make bench ARGS=--quick`
                                            # and `make bench-20 ARGS=--quick` are the benchmarks' smoke runs)
    python benchmarks/machine.py --record   # also the engine's batch decode and chat speculation, each run kept as
                                            # this machine class's record (results/<class>/) where undisturbed

First the facts a speed choice depends on: the CPU's model name, vendor and the instruction sets the kernels use
(AVX2, FMA, AVX-512 and its VNNI / BF16 extensions, AMX tiles), cores, torch's threads, memory, the load average,
the streaming bandwidth (`lib.bench.roofline.measure_bandwidth`), and the kernels the lab chose here: `lib.modeling.fast`'s matmul
kernel (`lib.modeling.fast_kernels.choose_kernel`: C++ step, oneDNN-packed or plain, measured once per machine and remembered), the GGUF
kernel's build, whether its loops prefetch (`lib.quantization.quant_linear.choose_gguf_prefetch`) and its Q4_1 layout
(`lib.quantization.quant_linear.choose_gguf_layout`: as in the file, or d and m widened), each measured once and remembered. Then the
two speed tables, each as its own benchmark prints it: fp32 decode (`lib.modeling.llama`, `lib.modeling.fast`, transformers, the
roofline) and quantized decode (the GGUF file's blocks, torch's int8/int4, llama.cpp when installed).
The README keeps one such table per machine class measured. Timing, not a test: run it on quiet cores.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
         "amx_bf16", "amx_int8"]


def cpu_facts() -> dict:
    """Model name, vendor and the flags of FLAGS this CPU has (from /proc/cpuinfo; the platform's words elsewhere)."""
    facts = {"model": platform.processor() or platform.machine(), "vendor": "", "flags": []}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name":
                    facts["model"] = value
                elif key == "vendor_id":
                    facts["vendor"] = value
                elif key == "flags":
                    have = set(value.split())
                    facts["flags"] = [f for f in FLAGS if f in have]
                    break
    except OSError:
        pass
    return facts


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            return int(f.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the facts and the kernels chosen, no benchmarks")
    ap.add_argument("--record", action="store_true",
                    help="keep each benchmark's run as this machine class's committed record (results/<class>/), "
                         "where it was not disturbed; then `make results` renders README.md and docs/performance.md")
    args = ap.parse_args(argv)
    if not args.quick:  # the kernel and layout choices are measured again now, not taken from an earlier busy moment
        for env in ("INFERENCE_LAB_FAST_KERNEL", "INFERENCE_LAB_GGUF_PREFETCH", "INFERENCE_LAB_GGUF_LAYOUT"):
            os.environ.setdefault(env, "measure")
    import torch

    from lib.modeling.fast import FastLlama
    from lib.modeling.llama import load_smollm2
    from lib.bench.roofline import measure_bandwidth

    facts = cpu_facts()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    mem = memory_gib()
    print(f"CPU: {facts['model']} ({facts['vendor'] or 'vendor unknown'}), {os.cpu_count()} logical cores, "
          f"torch threads {torch.get_num_threads()}" + (f", {mem:.0f} GiB memory" if mem else ""))
    print(f"instruction sets the kernels use: {', '.join(facts['flags']) or 'none of ' + ', '.join(FLAGS)}")
    print(f"AMX tiles usable by torch: {'yes' if getattr(torch.cpu, '_is_amx_tile_supported', lambda: False)() else 'no'}"
          f"; torch {torch.__version__}, Python {platform.python_version()}, {platform.system()} {platform.release()}")
    print(f"load average {load:.2f} (quiet cores read well below {os.cpu_count()})")
    bandwidth = measure_bandwidth()  # bytes/s
    print(f"streaming read bandwidth: {bandwidth / 1e9:.1f} GB/s (lib.bench.roofline.measure_bandwidth)")
    model, _ = load_smollm2()
    print(f"lib.modeling.fast's kernel here: {FastLlama(model).kernel_reason}")  # measured on whole steps once, then remembered
    try:
        from lib.gguf.qmatmul import backend

        from lib.quantization.quant_linear import choose_gguf_layout, choose_gguf_prefetch, read_gguf_blocks

        blocks = read_gguf_blocks()
        prefetch, why = choose_gguf_prefetch(model, blocks)
        print(f"GGUF kernel (lib.gguf.qmatmul, built for this CPU on first use): {backend()}; software prefetch: {why}; "
              f"Q4_1 layout: {choose_gguf_layout(model, blocks, prefetch=prefetch)[1]}")
    except Exception as e:  # noqa: BLE001  (the facts are printed whatever the kernel's state)
        print(f"GGUF kernel: not available ({type(e).__name__}: {e})")
    sys.stdout.flush()
    if args.quick:
        return 0
    runs = [["decode.py"], ["quant.py"]]
    if args.record:  # the other figures the README renders: the engine's batch-8 decode, chat speculation
        runs += [["serving.py", "--decode-only"],
                 ["speculative.py", "--workloads", "chat", "--drafts", "prompt lookup,draft head", "--ks", "2,4"]]
    for script, *rest in runs:
        print(f"\n=== benchmarks/{script} {' '.join(rest)}", flush=True)
        code = subprocess.call([sys.executable, str(ROOT / "benchmarks" / script), *rest,
                                *(["--record"] if args.record else [])], cwd=ROOT)
        if code:
            print(f"benchmarks/{script} exited with {code}")
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
