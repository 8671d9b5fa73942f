"""The computed fields a week's markdown may hold: `{{ expression }}` in a markdown cell of tools/weeks/weekNN/*.py is
replaced, when tools/weeks/build.py builds the notebook, by the expression's value, evaluated with this module's
names. They are the figures the house rule forbids typing into prose (a figure is derived, measured live, or rendered
from a record), so the prose names the record and the build renders it:

    {{ recorded_md("decode", "decode b1: roofline", "amd-epyc-avx512") }}

and the few lists that follow the committed records (a new machine's record adds a line on the next build).
Code cells hold no fields: their figures are computed when the notebook runs.
"""
from __future__ import annotations

from lib.bench.records import committed
from tools.results import recorded_md

__all__ = ["TTFT_MAX_PYTHON_LINES", "lora_figures", "packed_vs_plain", "recorded_everywhere", "recorded_md",
           "serving_records"]


def __getattr__(name: str):
    # A grader constant the prose quotes, imported only by the week that names it (the checks import torch).
    if name == "TTFT_MAX_PYTHON_LINES":
        from grader.checks.week21 import TTFT_MAX_PYTHON_LINES
        return TTFT_MAX_PYTHON_LINES
    raise AttributeError(name)


def recorded_classes(benchmark: str, figure: str) -> list[str]:
    """The machine classes whose committed record of `benchmark` has `figure`."""
    return [cls for cls, recs in sorted(committed().items()) if figure in recs.get(benchmark, {}).get("figures", {})]


def recorded_everywhere(benchmark: str, figure: str) -> str:
    """`figure` as every machine class with a committed record of it recorded it, joined by '; '."""
    return "; ".join(recorded_md(benchmark, figure, cls) for cls in recorded_classes(benchmark, figure))


def serving_records() -> str:
    """Week 19: batch 8 over batch 1 in decode, per machine class that has a committed serving record."""
    lines = []
    for cls in recorded_classes("serving", "decode b8 / b1"):
        line = f"- batch 8 decodes {recorded_md('serving', 'decode b8 / b1', cls)} the tokens per second of batch 1"
        eager = ("decode b1, eager (graphs=False)", "decode b8, eager (graphs=False)")
        if all(f in committed()[cls]["serving"]["figures"] for f in eager):
            line += (f"; launched op by op from Python, without CUDA graphs, batch 1 decodes "
                     f"{recorded_md('serving', eager[0], cls)} and batch 8 {recorded_md('serving', eager[1], cls)}")
        lines.append(line + ".")
    if not [c for c in recorded_classes("serving", "decode b8 / b1") if not c.startswith("nvidia")]:
        lines.append("- no CPU class has a committed serving record yet: `python benchmarks/serving.py --decode-only "
                     "--record` on a quiet machine writes one, and rebuilding this notebook renders it here.")
    return "\n".join(lines)


def packed_vs_plain() -> str:
    """Week 21: each machine class's recorded batch-1 decode with lib.modeling.fast's packed weights and with plain F.linear."""
    out = []
    for cls, recs in sorted(committed().items()):
        figs = recs.get("decode", {}).get("figures", {})
        packed = next((k for k in figs if k.startswith("decode b1 n") and k.endswith("(lib.modeling.fast, packed)")), None)
        plain = next((k for k in figs if k.startswith("decode b1 n") and k.endswith("(lib.modeling.fast, F.linear)")), None)
        if packed and plain:
            out.append(f"packed {recorded_md('decode', packed, cls)} against plain "
                       f"{recorded_md('decode', plain, cls)}")
    return "; ".join(out) if out else "no class has both recorded yet"


def lora_figures() -> str:
    """Week 21: every figure of every committed multi-LoRA record (results/<class>/lora.json), one line each."""
    figures = [f"- {name}: {recorded_md('lora', name, cls)}" for cls, recs in sorted(committed().items())
               if "lora" in recs for name in recs["lora"]["figures"]]
    return "\n".join(figures) if figures else (
        "*No multi-LoRA measurement is committed yet.* The LoRA benchmark writes `results/<class>/lora.json` "
        "(`lib.bench.records`) when run with `--record`; rebuilding this notebook (`python tools/weeks/build.py 21`) then "
        "renders every figure of that record here, and scenario D's model answer cites them.")
