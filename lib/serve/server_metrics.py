"""The server's /metrics in Prometheus' text format: the lab's own names (`lab_*`) and, for the metrics vLLM has,
vLLM's names and labels (`vllm:*{model_name="..."}`), so a dashboard built for a vLLM server reads this one.

Histograms keep cumulative bucket counts, a sum and a count from the server's start, as Prometheus expects (the
`lab_*_seconds` quantiles are over the last 1,000 requests only).
"""
from __future__ import annotations

import bisect

# vLLM's buckets for time to first token and end-to-end latency (seconds), shortened at the top.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0)


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one: above every bucket (+Inf only)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [f"# TYPE {name} histogram"], 0
        for le, c in zip([*map(str, self.buckets), "+Inf"], self.counts):
            total += c
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
        return out + [f"{name}_sum{{{labels}}} {self.sum}", f"{name}_count{{{labels}}} {self.count}"]


def render(stats: dict, gauges: dict, vllm: list, histograms: dict, model_name: str) -> str:
    """`stats`: the lab's counters; `gauges`: the lab's gauges; `vllm`: [(vLLM's name, "counter" or "gauge", value,
    extra labels)]; `histograms`: {vLLM's name: Histogram}."""
    lines = []
    for k, v in stats.items():
        lines += [f"# TYPE lab_{k} counter", f"lab_{k} {v}"]
    for k, v in gauges.items():
        lines.append(f"lab_{k} {v}")
    labels = f'model_name="{model_name}"'
    typed = set()
    for name, kind, value, extra in vllm:
        if name not in typed:
            lines.append(f"# TYPE {name} {kind}")
            typed.add(name)
        lines.append(f"{name}{{{labels}{',' + extra if extra else ''}}} {value}")
    for name, h in histograms.items():
        lines += h.lines(name, labels)
    return "\n".join(lines) + "\n"


def metrics_text(loop) -> str:
    """An `EngineLoop`'s metrics: the lab's names, and vLLM's for the metrics vLLM has."""
    e = loop.engine
    gauges = {"requests_running": len(e.running), "requests_waiting": len(e.waiting),
              "kv_blocks_total": e.num_blocks, "kv_blocks_used": e.blocks.num_in_use,
              "kv_utilization": e.blocks.num_in_use / max(1, e.num_blocks),
              "preemptions_total": e.num_preemptions, "prefix_cache_hit_tokens_total": e.prefix_hit_tokens}
    for name, values in (("ttft_seconds", loop.ttft), ("tpot_seconds", loop.tpot),
                         ("queue_seconds", getattr(loop, "queue_time", []))):
        s = sorted(values)
        for q in (0.5, 0.95):
            gauges[f'{name}{{quantile="{q}"}}'] = s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")
    vllm = [("vllm:num_requests_running", "gauge", len(e.running), ""),
            ("vllm:num_requests_waiting", "gauge", len(e.waiting), ""),
            ("vllm:kv_cache_usage_perc", "gauge", gauges["kv_utilization"], ""),
            ("vllm:prompt_tokens_total", "counter", loop.stats["prompt_tokens_total"], ""),
            ("vllm:generation_tokens_total", "counter", loop.stats["generation_tokens_total"], ""),
            ("vllm:num_preemptions_total", "counter", e.num_preemptions, ""),
            ("vllm:prefix_cache_queries_total", "counter", e.prompt_tokens, ""),
            ("vllm:prefix_cache_hits_total", "counter", e.prefix_hit_tokens, "")]
    vllm += [("vllm:request_success_total", "counter", n, f'finished_reason="{r}"')
             for r, n in loop.finished_by.items()]
    return render(loop.stats, gauges, vllm, loop.histograms, loop.model_name)
