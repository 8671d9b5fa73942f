"""How `lib.modeling.fast` multiplies, and which way it is chosen (items 7 and 9 of `lib.modeling.fast`'s docstring).

Three kernels multiply a decode step's weights: "plain" `F.linear`; "packed", the weights reordered once into
oneDNN's blocked layout (`pack_weight`, `packed_linear`; `PackedLinear` and `pack_linears` give the readable
`lib.modeling.llama` the same, in place); and "cpp", `lib/gguf/csrc/qmatmul.cpp`'s loops on plain float32 weights (`cpp_linear`).
`kernels_for` says which run here; `choose_kernel` (and `choose_measured`, which the GGUF kernel's layout uses too)
picks the fastest by timing, once per machine, and remembers it in `data/cache/fast_kernels.json`.
"""
from __future__ import annotations

import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.gguf import qmatmul as Q
from lib.bench.roofline import best_time


def can_pack(device, dtype: torch.dtype) -> bool:
    """Whether `pack_weight` applies: float32 on a CPU whose PyTorch build has oneDNN (item 7 above)."""
    return (torch.device(device).type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_weight(w: torch.Tensor, rows_hint: int = 4) -> torch.Tensor:
    """`w [out, in]` reordered once into oneDNN's blocked layout; use it only through `packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(w, rows_hint)


def packed_linear(x: torch.Tensor, w_packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, w, bias)` for a weight from `pack_weight`: x [..., in] -> [..., out]."""
    return torch.ops.mkldnn._linear_pointwise(x, w_packed, bias, "none", [], "")


_CAN_PACK_CPU = can_pack("cpu", torch.float32)  # checked once: PackedLinear.forward runs 210 times per token


def cpp_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Item 9's matmul on a plain float32 weight: up to `lib.gguf.qmatmul.F32_MAX_ROWS` rows of x by the C++ loops
    (decode, verify, small batches), more (a prefill) by oneDNN on the same plain weight where torch has it —
    torch's own `F.linear` took 117 ms where oneDNN took 88 for 256 rows through SmolLM2's output layer on the
    lab's EPYC — else by `F.linear`."""
    return Q.linear_f32(x, w, large=packed_linear if _CAN_PACK_CPU else F.linear)


class PackedLinear(nn.Linear):
    """A bias-free or biased `nn.Linear` that multiplies with a packed copy of its weight (item 7), for the
    readable `lib.modeling.llama` (see `pack_linears`). `.weight` stays the same Parameter, so code that reads weights
    still works; if the weight is replaced or changed in place, the packed copy is rebuilt before the next
    multiply, so it can never be stale. A subclass of `nn.Linear`, so code that looks for linear layers finds
    it. With autograd recording and a weight that needs a gradient, it falls back to `F.linear` (the packed op
    has no backward)."""

    def __init__(self, weight: nn.Parameter | torch.Tensor, bias: torch.Tensor | None = None):
        nn.Module.__init__(self)  # not nn.Linear.__init__: that would allocate a fresh weight
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = bias
        self._packed, self._packed_from, self._packed_key = None, None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.dtype != torch.float32 or w.dtype != torch.float32 or x.device.type != "cpu" or w.device.type != "cpu"
                or not _CAN_PACK_CPU or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return F.linear(x, w, self.bias)
        key = (w._version, w.data_ptr())  # bumped by in-place writes; moved by `.data = ...`
        if self._packed_from is not w or self._packed_key != key:  # `is`: a new Parameter may reuse an old id
            with torch.no_grad():
                self._packed = pack_weight(w.detach().contiguous())
            object.__setattr__(self, "_packed_from", w)  # a plain reference, not a second registered Parameter
            self._packed_key = key
        return packed_linear(x, self._packed, self.bias)

    def __getstate__(self):  # copy/deepcopy/pickle: drop the packed copy (an opaque oneDNN tensor); rebuilt on use
        state = dict(self.__dict__)
        state.update(_packed=None, _packed_from=None, _packed_key=None)
        return state

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed"


def pack_linears(model):
    """`model` (a `lib.modeling.llama.LlamaModel`, or any module) with every `nn.Linear` replaced, in place, by a
    `PackedLinear` sharing its weight. Same outputs up to fp32 summation order (≤ ~1e-4 on SmolLM2's logits),
    faster matmuls on CPU: the readable model keeps its code, only the multiply changes. The state dict keeps its
    keys, so copies made from it (`pool_kv_heads`, `load_state_dict`) still work. A tied LM head (`lm_head is None`:
    `F.linear(x, embed.weight)` in `LlamaModel.forward`) stays as it is — for one row it gains nothing (measured
    15.0 ms plain, 15.6 packed on SmolLM2's 49152 × 576) and packing it would add a state-dict key. A no-op where
    packing does not apply (GPU, bf16)."""
    dev, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    if not can_pack(dev, dtype):
        return model
    for mod in list(model.modules()):
        for child_name, child in list(mod.named_children()):
            if type(child) is nn.Linear:
                setattr(mod, child_name, PackedLinear(child.weight, child.bias))
    return model


MEASURE_MIN_BYTES = 64 << 20  # below this much weight a model sits in the CPU's caches: no layout is measured


def _machine() -> str:
    """The CPU's model name (the cache key's first part: a layout's speed is a property of the CPU class)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


KERNELS = ("cpp", "packed", "plain")  # item 9: how one decode step multiplies, chosen by measuring


def kernels_for(weights: list[torch.Tensor]) -> list[str]:
    """The kernels that can multiply by `weights` here: "cpp" (lib/gguf/csrc/qmatmul.cpp built, every weight's input
    width a multiple of 16), "packed" (oneDNN), "plain" (always)."""
    if not weights or not all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights):
        return ["plain"]
    out = ["cpp"] if all(w.shape[1] % Q.F32_BLOCK == 0 for w in weights) and Q.kernel() is not None else []
    return out + (["packed"] if can_pack("cpu", torch.float32) else []) + ["plain"]


def choose_kernel(weights: list[torch.Tensor], cache_file=None, repeats: int = 5, timer=None) -> tuple[str, str]:
    """(kernel, why): which of `kernels_for(weights)` runs one decode step's weights (`weights`, each [out, in]
    fp32) fastest on this CPU, at 1 row (a decode step) and 4 rows (a verify or a small batch), summed:
    `timer(kernel, rows)` gives a step's seconds (FastLlama passes whole steps of the model, so the C++ step's
    saving outside the matmuls counts), else the weights' matmuls alone are timed. Measured once per machine,
    model shapes and thread count, and remembered in `cache_file` (`data/cache/fast_kernels.json`);
    `INFERENCE_LAB_FAST_KERNEL=cpp|packed|plain|measure` overrides."""
    avail = kernels_for(weights)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    shapes = sorted({tuple(w.shape) for w in weights})
    return choose_measured(
        KERNELS, avail, "INFERENCE_LAB_FAST_KERNEL", f"{len(weights)} x {shapes}", nbytes,
        timer or _matmul_timer(weights, repeats),
        "a step at 1 and 4 rows" if timer is not None else "one step's matmuls at 1 and 4 rows", cache_file)


def choose_measured(names: tuple[str, ...], avail: list[str], env: str, shapes: str, nbytes: int, timer, what: str,
                    cache_file=None) -> tuple[str, str]:
    """(choice, why): the fastest of `avail` (a subset of `names`, the first the default) by `timer(name, rows)`
    summed over 1 and 4 rows, measured once per machine (CPU model, torch, threads, `avail`, `shapes`) and
    remembered in `cache_file` (default `data/cache/fast_kernels.json`). `$env` set to a name forces it, to
    "measure" measures again. Not measured (the default) when the weights fit the caches (`nbytes` below
    MEASURE_MIN_BYTES) or the machine is busy. Used for lib.modeling.fast's kernel and for the GGUF kernel's layout
    (lib.quantization.quant_linear.choose_gguf_layout)."""
    forced = os.environ.get(env, "")
    if forced in names:
        if forced not in avail:
            raise ValueError(f"{env}={forced}, but that cannot run here (available: {', '.join(avail)}); unset it, "
                             f"or set it to one of those")
        return forced, f"{env}={forced}"
    if forced not in ("", "measure"):
        raise ValueError(f"{env}={forced!r}: use one of {', '.join(names)} or measure")
    default = avail[0]
    if nbytes < MEASURE_MIN_BYTES:
        return default, (f"{default} (the default): {nbytes >> 20} MB of weights sit in the CPU's caches, too "
                         f"small to measure")
    if len(avail) == 1:
        return default, f"{default}: the only one that runs here"
    key = (f"{_machine()} | torch {torch.__version__} | {torch.get_num_threads()} threads | {','.join(avail)} | "
           f"{shapes}")
    if cache_file is None:
        from lib.bench import paths

        cache_file = paths.CACHE_DIR / "fast_kernels.json"
    try:
        known = json.loads(open(cache_file).read())
    except (OSError, ValueError):
        known = {}
    got = known.get(key)
    if forced != "measure" and isinstance(got, dict) and got.get("kernel") in avail and isinstance(got.get("ms"), dict):
        at = f" at load {got['load']:.1f}" if isinstance(got.get("load"), (int, float)) else ""
        return got["kernel"], (f"{got['kernel']}: measured on this machine {got.get('when', '')}{at}: "
                               + _times(got["ms"]) + f" ({got.get('what', what)}; `make machine` measures again)")
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except (OSError, AttributeError):  # no load average (Windows): measure
        load, cores = 0.0, os.cpu_count() or 1
    if forced != "measure" and load > max(0.5, cores - torch.get_num_threads() + 0.5):
        return default, (f"{default} (the default), not measured: load average {load:.1f} on {cores} cores; the "
                         f"choices are timed, and remembered, when the machine is quieter")
    ms = {name: 1e3 * (timer(name, 1) + timer(name, 4)) for name in avail}
    choice = min(ms, key=ms.get)
    known[key] = {"kernel": choice, "ms": ms, "what": what, "when": time.strftime("%Y-%m-%d"), "load": round(load, 2)}
    try:
        os.makedirs(os.path.dirname(str(cache_file)), exist_ok=True)
        tmp = f"{cache_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(known, f, indent=1, sort_keys=True)
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only data folder: measured again next time
    return choice, f"{choice}: measured now, at load {load:.1f}: " + _times(ms) + f" ({what})"


def _matmul_timer(weights: list[torch.Tensor], repeats: int):
    """timer(kernel, rows): seconds of `rows` rows through every weight's matmul in that kernel, best of
    `repeats` (the packed copies made once per kernel)."""
    xs = {(rows, w.shape[1]): torch.randn(rows, w.shape[1]) for rows in (1, 4) for w in weights}
    laid = {}

    def timer(name, rows):
        if name not in laid:
            laid.clear()  # one layout's copy at a time
            laid[name] = [pack_weight(w) for w in weights] if name == "packed" else weights
        mul = {"cpp": cpp_linear, "packed": packed_linear, "plain": F.linear}[name]

        def step():
            with torch.inference_mode():
                for w, wk in zip(weights, laid[name]):
                    mul(xs[(rows, w.shape[1])], wk)

        return best_time(step, repeats)

    return timer


def _times(ms: dict) -> str:
    return ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items())

