"""Results as data: every benchmark writes a record of what it measured, where and when, and the lab's prose about
speed is rendered from committed records (`tools/results.py`, `make results`), never typed by hand.

A record (JSON) holds the benchmark and its command, the commit (and whether the tree was dirty), the date, the
machine (its class, CPU model and the instruction sets the kernels use, cores, memory, GPU and driver), the versions
of torch / triton / transformers / llama.cpp, the load average before and after, torch's threads, and each figure
with its unit and every repeat (min / median / max derived from them).

Where records go:
- every run: `data/cache/results/<class>/<benchmark>-<UTC time>.json` (not committed; `latest()` finds them);
- `--record` (or `make machine ARGS=--record`): also `results/<class>/<benchmark>.json`, the committed record of
  the reference machine of that class, which `make results` renders into README.md, docs/performance.md and the
  notebooks' "recorded" figures. Commit one only from a quiet run (the record keeps the load to show it).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lib.bench.paths import CACHE_DIR, REPO_ROOT

RESULTS = REPO_ROOT / "results"  # committed: results/<class>/<benchmark>.json
RUNS = CACHE_DIR / "results"  # every run, not committed
# The instruction sets a speed choice depends on (lib.modeling.fast, lib.gguf.qmatmul, oneDNN): kept in a record's machine.
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
         "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
# A class's readable name, for tables: the reference machines the lab has been measured on.
CLASS_NAMES = {"amd-epyc-avx512": "AMD EPYC, AVX-512, no AMX (2 cores)",
               "intel-xeon-amx": "Intel Xeon, AVX-512 + AMX (2 cores, a VM)",
               "nvidia-h200": "NVIDIA H200 (one GPU, 16 cores)", "nvidia-h100-80gb-hbm3": "NVIDIA H100 (one GPU)"}


def _cpuinfo() -> dict:
    out = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = (x.strip() for x in line.split(":", 1))
                out.setdefault(k, v)
    except OSError:
        pass
    return out


def machine() -> dict:
    """This machine as a record keeps it (see the module's text); `class` names its class."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem = None
    gpu = driver = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
            driver = torch.version.cuda
    except ImportError:
        pass
    m = {"cpu": info.get("model name", platform.processor() or platform.machine()), "vendor": info.get("vendor_id"),
         "family": info.get("cpu family"), "model": info.get("model"), "flags": [f for f in FLAGS if f in flags],
         "cores": cores, "memory_gib": round(mem, 1) if mem else None, "gpu": gpu, "cuda": driver,
         "arch": platform.machine()}
    m["class"] = machine_class(m)
    return m


def machine_class(m: dict) -> str:
    """A short, stable name for the machine's class: `nvidia-<gpu>` with a GPU, else vendor-line-feature
    (`intel-xeon-amx`, `amd-epyc-avx512`, `intel-core-avx2`, ...)."""
    if m.get("gpu"):
        return "nvidia-" + re.sub(r"[^a-z0-9]+", "-", m["gpu"].lower().replace("nvidia", "")).strip("-")
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(m.get("vendor") or "", m.get("arch") or "cpu")
    words = (m.get("cpu") or "").lower()
    line = next((w for w in ("xeon", "epyc", "core", "ryzen", "threadripper", "atom") if w in words), "cpu")
    flags = set(m.get("flags") or ())
    feature = "amx" if "amx_tile" in flags else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else \
        "base"
    return f"{vendor}-{line}-{feature}"


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("torch", "triton", "transformers", "llama_cpp_python", "gguf"):
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "--short=12", "HEAD").strip() or None
    dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip()) if commit else None
    return {"commit": commit, "dirty": dirty}


@dataclass
class Record:
    """What one benchmark run measured. `add(name, samples, unit)`: one figure with every repeat; `note(k, v)`:
    a fact of the run that is not a figure (the kernel chosen, tokens identical, ...)."""
    benchmark: str
    command: str = field(default_factory=lambda: " ".join([Path(sys.argv[0]).name if sys.argv else "", *sys.argv[1:]]))
    figures: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    load_before: float = field(default_factory=lambda: _load())

    def add(self, name: str, samples, unit: str, higher_is_better: bool | None = None) -> None:
        samples = [float(x) for x in (samples if isinstance(samples, (list, tuple)) else [samples])]
        self.figures[name] = {"unit": unit, "samples": samples, "min": min(samples),
                              "median": statistics.median(samples), "max": max(samples),
                              "higher_is_better": higher_is_better}

    def note(self, key: str, value) -> None:
        self.notes[key] = value

    def data(self) -> dict:
        import torch

        return {"benchmark": self.benchmark, "command": self.command,
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                **git_state(), "machine": machine(), "versions": versions(),
                "load": {"before": round(self.load_before, 2), "after": round(_load(), 2)},
                "threads": torch.get_num_threads(), "figures": self.figures, "notes": self.notes}

    def write(self, commit_as_reference: bool = False) -> list[Path]:
        """Write the run's record (and, `commit_as_reference`, the class's committed record); return the paths."""
        data = self.data()
        cls = data["machine"]["class"]
        stamp = data["date"].replace(":", "").replace("-", "")
        paths = [RUNS / cls / f"{self.benchmark}-{stamp}.json"]
        if commit_as_reference:
            paths.append(RESULTS / cls / f"{self.benchmark}.json")
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"record: {', '.join(os.path.relpath(p, REPO_ROOT) for p in paths)} (machine class {cls})")
        return paths


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def load(benchmark: str, cls: str) -> dict | None:
    """The committed record of `benchmark` on machine class `cls`, or None."""
    path = RESULTS / cls / f"{benchmark}.json"
    return json.loads(path.read_text()) if path.exists() else None


def committed() -> dict[str, dict[str, dict]]:
    """Every committed record: {class: {benchmark: record}}."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(RESULTS.glob("*/*.json")):
        out.setdefault(path.parent.name, {})[path.stem] = json.loads(path.read_text())
    return out


def latest(benchmark: str, cls: str | None = None) -> dict | None:
    """This machine's (or class `cls`'s) most recent run of `benchmark`, committed or not."""
    cls = cls or machine()["class"]
    runs = sorted((RUNS / cls).glob(f"{benchmark}-*.json"))
    return json.loads(runs[-1].read_text()) if runs else load(benchmark, cls)


def best_bandwidth(cls: str | None = None, measured_now: float | None = None) -> tuple[float | None, str]:
    """The streaming bandwidth a roofline should use on machine class `cls` (bytes/s): the best any record of the class
    measured (committed, or this machine's runs), or `measured_now` if higher — never one run's alone, since a shared
    machine's probe swings from run to run (one run once put lib.modeling.fast at 103 % of "the roofline"). With a phrase
    saying where it came from."""
    cls = cls or machine()["class"]
    found = []
    for path in [RESULTS / cls] + [RUNS / cls]:
        for rec_path in sorted(path.glob("*.json")) if path.is_dir() else []:
            try:
                fig = json.loads(rec_path.read_text())["figures"].get("streaming bandwidth")
            except (OSError, ValueError, KeyError):
                continue
            if fig:
                found.append((fig["max"] * 1e9, rec_path.name))
    best = max(found, default=(None, ""))
    if measured_now is not None and (best[0] is None or measured_now >= best[0]):
        return measured_now, "measured in this run (the best for this machine class so far)"
    return best[0], (f"the best of {len(found)} recorded runs of this machine class ({best[1]}), above this run's "
                     f"{measured_now / 1e9:.1f} GB/s" if measured_now else f"recorded ({best[1]})")
