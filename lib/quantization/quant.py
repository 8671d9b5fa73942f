"""Quantizing a whole model (week 20): which GGUF type each tensor gets, fake-quantized copies, the importance
matrix, round-to-nearest, writing a GGUF file, llama.cpp, and bits allocated under a size budget.

    plan = q4_k_m_plan(model)                        # {parameter name: "Q4_K" | "Q6_K"}, llama.cpp's Q4_K_M mix
    plan_bits_per_weight(model, plan)                # as stored (576-wide rows fall back: `storable_type`)
    qmodel = quantize_model(model, plan, importance=collect_imatrix(model, windows))
    write_gguf("smollm2-q4km.gguf", plan, file_type="MOSTLY_Q4_K_M")   # llama.cpp and lib.modeling.llama load it

The GGUF block formats themselves (`quantize`, `dequantize`, `fake_quantize`, `bits_per_weight`, the K-quants'
scale search, `storable_type`) are in `lib/gguf/qformats.py`, one tensor at a time (import them from there); this
module builds on them. `minmax_grid` / `snap` /
`rtn_quantize` are the uniform grid GPTQ (`lib.quantization.gptq`) and AWQ (`lib.quantization.awq`) improve on.
"""
from __future__ import annotations

import numpy as np

from lib.gguf.qformats import (as_numpy, bits_per_weight, default_weights, fake_quantize, nearest_int, quantize,
                          search_affine, storable_type, sub_weights)

# --- whole models: which type each tensor gets, fake-quantized copies, size ----------------------------------

def linear_names(model) -> list[str]:
    """The parameter names of the 7 linear weights of every block (q, k, v, o, gate, up, down), in order."""
    return [n for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2]


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of layers that get more bits in its _M mixes: the first and last eighth, and every
    third layer in between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def q4_k_m_plan(model) -> dict[str, str]:
    """A Q4_K_M-like mix (llama.cpp's rule for the linears): attn_v and ffn_down of `use_more_bits` layers get
    Q6_K, every other linear Q4_K — each stored as `storable_type` allows."""
    plan = {}
    n_layers = model.config.n_layers
    for name in linear_names(model):
        layer = int(name.split(".")[1])
        more = ("attn.v_proj" in name or "mlp.down_proj" in name) and use_more_bits(layer, n_layers)
        plan[name] = "Q6_K" if more else "Q4_K"
    return plan


def uniform_plan(model, qtype: str) -> dict[str, str]:
    return {name: qtype for name in linear_names(model)}


def resolve_plan(model, plan: dict[str, str]) -> dict[str, str]:
    """Each tensor's type as it would be stored (K-quants on 576-wide rows fall back, see `storable_type`)."""
    params = dict(model.named_parameters())
    return {name: storable_type(t, params[name].shape[-1]) for name, t in plan.items()}


def plan_bits_per_weight(model, plan: dict[str, str]) -> float:
    """Average bits per weight over the tensors of `plan`, as stored."""
    params = dict(model.named_parameters())
    stored = resolve_plan(model, plan)
    bits = sum(params[n].numel() * bits_per_weight(t) for n, t in stored.items())
    return bits / sum(params[n].numel() for n in stored)


def quantize_model(model, plan: dict[str, str], weight_fn=None, importance: dict | None = None):
    """A copy of `model` whose tensors named in `plan` hold `fake_quantize(w, type)` (as stored: see
    `resolve_plan`); every other tensor is shared with `model`, which is left unchanged. `weight_fn(name, w,
    qtype) -> w'` replaces the GGUF round trip (e.g. a 3-bit round-to-nearest). `importance` ({name: [in]},
    e.g. `collect_imatrix`'s) weights each tensor's scale search."""
    import copy

    import torch

    stored = resolve_plan(model, plan) if weight_fn is None else dict(plan)
    importance = importance or {}
    memo = {id(p): p for p in model.parameters()}  # deepcopy shares what the memo names ...
    for name, qtype in stored.items():  # ... and puts the quantized weights in place of the originals
        w = model.get_parameter(name).detach()
        new_w = fake_quantize(w, qtype, importance.get(name)) if weight_fn is None else weight_fn(name, w, qtype)
        memo[id(model.get_parameter(name))] = torch.nn.Parameter(new_w.to(w.device, w.dtype), requires_grad=False)
    return copy.deepcopy(model, memo)


def input_column_means(model, windows, names: list[str], of) -> dict:
    """For each linear weight in `names`, the mean over the tokens of `windows` (token ids `[1, T]` or `[T]`, one
    forward each) of `of(x)` per input column, `[in]` float32 on the model's device (kept as running sums, so all 210
    linears of SmolLM2 fit in a few MB)."""
    import torch

    sums: dict[str, torch.Tensor] = {}
    count = 0
    hooks = []
    for name in names:
        module = model.get_submodule(name.rsplit(".", 1)[0])

        def hook(mod, args, out, name=name):
            x = of(args[0].detach().float().reshape(-1, args[0].shape[-1])).sum(0)
            sums[name] = sums[name] + x if name in sums else x

        hooks.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for ids in windows:
                ids = ids.reshape(1, -1)
                model(ids.to(getattr(model, "device", ids.device)))
                count += ids.shape[-1]
    finally:
        for h in hooks:
            h.remove()
    if count == 0:
        raise ValueError("need at least one window of calibration tokens")
    return {name: s / count for name, s in sums.items()}


def collect_imatrix(model, windows, names: list[str] | None = None) -> dict:
    """The importance matrix (llama.cpp's `imatrix`): for each linear weight in `names` (default: every linear
    of the blocks), each input column's mean squared activation over the calibration `windows`, `[in]`.

    Why that: an error Δw_i in column i changes the row's output by Δw_i·x_i, so the expected squared output
    error of a row is Σ_i Δw_i² E[x_i²] (cross terms left out) — the weights of the scale search."""
    import torch

    return input_column_means(model, windows, linear_names(model) if names is None else names, torch.square)


def minmax_grid(w, bits: int):
    """Asymmetric min/max grid of `w [..., group]` along its last dim: `(scale, lo)`, each `[..., 1]`; the
    levels are lo + scale·q for q = 0 … 2^bits − 1 (a group of equal values gets a tiny scale, never 0)."""
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    return ((hi - lo) / (2**bits - 1)).clamp_min(1e-12), lo


def snap(w, scale, lo, bits: int):
    """Round `w` to the nearest level of the grid (scale, lo), clamped to the 2^bits levels; dequantized."""
    import torch

    return torch.clamp(torch.round((w - lo) / scale), 0, 2**bits - 1) * scale + lo


def rtn_quantize(w, bits: int, group_size: int = 64):
    """Round-to-nearest, asymmetric min/max per group of `group_size` along each row: the baseline that GPTQ
    and AWQ improve on. `w [rows, cols]` torch, returns the dequantized tensor (same shape, dtype, device).
    (SmolLM2's 576-wide rows take groups of 32, 64 or 192, not 128.)"""
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"cols ({cols}) must be a multiple of group_size ({group_size})")
    g = w.float().reshape(rows, cols // group_size, group_size)
    scale, lo = minmax_grid(g, bits)
    return snap(g, scale, lo, bits).reshape(rows, cols).to(w.dtype)


def search_quantize(w, bits: int, group_size: int = 32, importance=None):
    """Like `rtn_quantize` (asymmetric `bits`-bit codes per group of `group_size` along each row, float16 scale
    and minimum per group), but each group's scale and minimum found by the K-quants' weighted search
    (`search_affine`), weighted by `importance [cols]` (e.g. `collect_imatrix`'s) or `default_weights`.
    `w [rows, cols]` torch; returns the dequantized tensor (same shape, dtype, device)."""
    import torch

    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"cols ({cols}) must be a multiple of group_size ({group_size})")
    x = as_numpy(w, np.float32).reshape(rows, cols // group_size, group_size)
    if importance is None:
        weights = default_weights(x)
    else:
        imp = as_numpy(importance, np.float32).reshape(1, cols // group_size, group_size)
        weights = np.broadcast_to(sub_weights(imp, imp), x.shape)
    scale, mins = search_affine(x, weights, 2**bits - 1)
    d = scale.astype(np.float16).astype(np.float32)[..., None]
    m = mins.astype(np.float16).astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, nearest_int((x + m) / d), 0).clip(0, 2**bits - 1)
    out = (d * q - m).reshape(rows, cols)
    return torch.from_numpy(out).to(device=w.device, dtype=w.dtype)


def rtn_bits_per_weight(bits: int, group_size: int) -> float:
    """`bits` per weight plus a float16 scale and a float16 minimum per group."""
    return bits + 32 / group_size


# --- writing a GGUF file with chosen per-tensor types ----------------------------------------------------------

def gguf_tensor_name(param_name: str) -> str:
    """Our parameter name -> the GGUF tensor name: "layers.3.mlp.down_proj.weight" -> "blk.3.ffn_down.weight"."""
    from lib.modeling.llama import GGUF_NAMES

    if param_name == "embed.weight":
        return "token_embd.weight"
    if param_name == "norm.weight":
        return "output_norm.weight"
    parts = param_name.split(".")
    ours = ".".join(parts[2:-1])
    for g, name in GGUF_NAMES.items():
        if name == ours and parts[0] == "layers":
            return f"blk.{parts[1]}.{g}.weight"
    raise ValueError(f"{param_name!r} has no GGUF tensor name")


def write_gguf(path, plan: dict[str, str], source=None, file_type: str | None = None):
    """Write a copy of the GGUF file `source` (default: the lab's SmolLM2) to `path`, with every tensor named in
    `plan` (our parameter names, or GGUF tensor names) re-quantized to its type as stored (`storable_type`):
    metadata, tokenizer and every other tensor are copied byte for byte. The weights are taken from the source
    file itself (dequantized, in its own row order), so llama.cpp's Q/K row permutation is kept as it was.
    `general.file_type` says what the file is: `file_type` (a `gguf.LlamaFileType` name, e.g. "MOSTLY_Q4_K_M" for
    that mix), by default the type that holds the most rewritten weights ("MOSTLY_Q4_K_S" for Q4_K, whose
    uniform variant that is). Returns the path. `lib.modeling.llama.read_gguf_llama(path)` and transformers load it."""
    from pathlib import Path

    import gguf

    from lib.bench import paths

    source = Path(source) if source is not None else paths.smollm2_path()
    reader = gguf.GGUFReader(source)
    wanted = {(n if n.startswith(("blk.", "token_embd", "output")) else gguf_tensor_name(n)): t for n, t in plan.items()}
    names = {t.name for t in reader.tensors}
    unknown = sorted(set(wanted) - names)
    if unknown:
        raise ValueError(f"{source.name} has no tensors {unknown[:5]}")
    writer = gguf.GGUFWriter(path, reader.fields["general.architecture"].contents())
    stored_types = {t.name: storable_type(getattr(wanted[t.name], "name", wanted[t.name]), int(t.shape[0]))
                    for t in reader.tensors if t.name in wanted}  # GGUF shapes list the row length first
    if file_type is None:
        weight = {}
        for t in reader.tensors:
            if t.name in stored_types:
                weight[stored_types[t.name]] = weight.get(stored_types[t.name], 0) + int(t.n_elements)
        top = max(weight, key=weight.get)
        file_type = "MOSTLY_" + {"Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S"}.get(top, top)
    if file_type not in gguf.LlamaFileType.__members__:
        raise ValueError(f"unknown file_type {file_type!r}: a gguf.LlamaFileType name such as 'MOSTLY_Q4_K_M'")
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        if field.name == "general.file_type":
            writer.add_file_type(int(gguf.LlamaFileType[file_type]))
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name in wanted:
            w = gguf.quants.dequantize(data, t.tensor_type).astype(np.float32)  # [rows, cols]
            qtype = storable_type(getattr(wanted[t.name], "name", wanted[t.name]), w.shape[-1])
            writer.add_tensor(t.name, quantize(w, qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
        elif t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(t.name, data)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def llama_cpp_model(path, n_ctx: int = 512, **kwargs):
    """llama.cpp (the optional `llama-cpp-python`, `pip install -e '.[llamacpp]'`) on the GGUF file `path`, as a
    `llama_cpp.Llama`; raises ImportError when it is not installed. On CPUs with AMX, llama.cpp's extra buffer
    types crash at the first decode (llama.cpp issue #20824, notes in platform-facts.md): they are turned off."""
    import llama_cpp
    import torch

    low = llama_cpp.llama_cpp
    defaults = low.llama_model_default_params

    def without_extra_bufts():
        params = defaults()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = without_extra_bufts  # Llama() reads its defaults from here
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=torch.get_num_threads(), verbose=False,
                               **kwargs)
    finally:
        low.llama_model_default_params = defaults


def allocate_bits(delta_ppl: dict[str, float], n_weights: dict[str, int], budget_bpw: float, low_bpw: float,
                  high_bpw: float) -> set[str]:
    """Which units get the high-bit format under a size budget: greedy by perplexity saved per extra bit.

    Every unit starts at `low_bpw`; raising unit u to `high_bpw` costs `n_weights[u]·(high − low)` bits and
    saves `delta_ppl[u]` (its perplexity increase when it alone is quantized low: sensitivities are assumed
    to add up). Units are taken in order of `delta_ppl / n_weights` while they fit in the budget
    `budget_bpw · Σ n_weights`."""
    if not low_bpw <= budget_bpw <= high_bpw:
        raise ValueError(f"the budget ({budget_bpw} bits/weight) must lie between low ({low_bpw}) and high ({high_bpw})")
    spare = (budget_bpw - low_bpw) * sum(n_weights.values())
    chosen = set()
    for unit in sorted(delta_ppl, key=lambda u: delta_ppl[u] / n_weights[u], reverse=True):
        cost = n_weights[unit] * (high_bpw - low_bpw)
        if delta_ppl[unit] > 0 and cost <= spare + 1e-9:
            chosen.add(unit)
            spare -= cost
    return chosen
