"""Weight-only quantized linears on torch's CPU kernels, for a faster decode (week 20).

    fast = quantize_linears(model, "int4", group_size=32)   # a copy: every linear and the LM head int4
    ids = generate(fast, prompt, 32)                          # lib.modeling.generate works unchanged

- `Int8Linear`: per-output-channel symmetric int8 (`scale = max|w_row| / 127`), `aten._weight_int8pack_mm`.
- `Int4Linear`: per-group asymmetric 4-bit (min/max, the grid of `lib.quantization.quant.rtn_quantize(w, 4, group_size)`),
  packed by `aten._convert_weight_to_int4pack_for_cpu`, multiplied by `aten._weight_int4pack_mm_for_cpu`.

Both kernels want bfloat16 activations (with float32 ones they are 4-15x slower; platform-facts.md): the
module casts `x` to bf16 and the result back to `x`'s dtype. Weights are read as 1 or ~0.5 byte each
instead of 4, which is what a memory-bound decode step is waiting for. CPU only (other devices: use the
float path).

The file's own blocks (lib.gguf.qmatmul), with no requantization: the model is exactly the file's model.

    qmodel = gguf_linears(model)                   # a copy: linears and the tied LM head multiply the GGUF blocks
    qfast = GGUFFastLlama(model)                   # lib.modeling.fast's fused decoder on the same blocks (fastest)
    qmodel = gguf_linears(model, quantize_blocks(model, "Q4_K"))   # any float model, quantized by lib.gguf.qformats

- `GGUFLinear`: holds a weight as GGUF blocks (uint8 `[out, bytes per row]`) and multiplies through
  `lib.gguf.qmatmul.qmatmul` (float32 activations, the weights decoded in registers).
- `GGUFFastLlama`: lib.modeling.fast's fused decoder on the blocks; its one-token steps run every layer in one C++ call.
  Its Q4_1 weights are read as the file lays them out or "wide" (d and m widened to float32,
  `lib.gguf.qmatmul.repack_q4_1`: fewer shuffles per block, 20 % more bytes); `choose_gguf_layout` times both once
  per machine and remembers the faster (`INFERENCE_LAB_GGUF_LAYOUT=file|wide|measure` overrides). Before that,
  `choose_gguf_prefetch` times the loops with and without software prefetch (`lib.gguf.qmatmul.set_prefetch`: on
  an Intel Xeon VM the hardware prefetcher left the decoding loops waiting on memory), the same way
  (`INFERENCE_LAB_GGUF_PREFETCH=on|off|measure`).
- `read_gguf_blocks(path)`: every matmul weight of a llama GGUF file as `(type, blocks)` under the lab's
  parameter names (Q and K rows put in the lab's RoPE order, as `lib.modeling.llama.read_gguf_llama` does; a row of
  blocks moves as a whole, so this reorders bytes and changes no value). The LM head of a tied model is
  `token_embd` (Q8_0 in SmolLM2's file).
"""
from __future__ import annotations

import copy
import os

import numpy as np
import torch
import torch.nn as nn

from lib.bench import paths
from lib.gguf import qmatmul as Q
from lib.modeling.fast import FastLlama, step_timer
from lib.modeling.fast_kernels import choose_measured
from lib.gguf.qmatmul import check_blocks
from lib.bench.roofline import on_huge_pages
from lib.spec_decode.drafts import Int8Linear  # the one int8 weight-only linear (week 18's draft uses it too)
from lib.gguf.qmatmul import dequantize_blocks, qmatmul


class Int4Linear(nn.Module):
    """y = x Wᵀ with W on a 4-bit min/max grid per group of `group_size` inputs, packed for the CPU kernel."""

    def __init__(self, weight: torch.Tensor, group_size: int = 64):
        super().__init__()
        w = weight.detach().float()
        out_f, in_f = w.shape
        if in_f % group_size or group_size not in (32, 64, 128, 256):
            raise ValueError(f"group_size must be 32, 64, 128 or 256 and divide in_features ({in_f}); got {group_size}")
        g = w.reshape(out_f, in_f // group_size, group_size)
        lo = g.amin(-1)
        scale = ((g.amax(-1) - lo) / 15).clamp_min(1e-12)  # [out, groups]
        q = torch.clamp(torch.round((g - lo[..., None]) / scale[..., None]), 0, 15).reshape(out_f, in_f)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 8))
        # the kernel computes (q - 8)·scale + zero, so zero = min + 8·scale; layout [groups, out, 2]
        sz = torch.stack([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous()
        self.register_buffer("scale_and_zero", sz.to(torch.bfloat16))
        self.group_size, self.in_features, self.out_features = group_size, in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scale_and_zero)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def _maker(kind: str, group_size: int):
    if kind == "int8":
        return Int8Linear
    if kind == "int4":
        return lambda w: Int4Linear(w, group_size)
    raise ValueError(f"kind must be 'int8' or 'int4', got {kind!r}")


def quantize_linears(model, kind: str, group_size: int = 32, lm_head: str | None = "same"):
    """A copy of `model` (a lib.modeling.llama.LlamaModel on the CPU) whose linears are `Int8Linear` (kind "int8") or
    `Int4Linear` (kind "int4"); the tied LM head becomes the same kind (`lm_head="same"`), another kind
    ("int8"/"int4"), or stays float (None). Embedding lookups and norms stay float.

    Group 32 with min/max is Q4_1's own grid: on SmolLM2, whose weights are decoded Q4_1, int4 g32 keeps them
    (up to the bf16 rounding of scale and zero)."""
    if model.device.type != "cpu":
        raise ValueError(f"these are CPU kernels; the model is on {model.device}")
    make = _maker(kind, group_size)
    memo = {id(p): p for p in model.parameters()}  # share every float tensor; only the linears are replaced
    other = copy.deepcopy(model, memo)
    for layer in other.layers:
        for parent in (layer.attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, make(child.weight))
    if lm_head is not None:
        head = model.embed.weight if model.lm_head is None else model.lm_head.weight
        other.lm_head = (make if lm_head == "same" else _maker(lm_head, group_size))(head)
    return other.eval()


# --- the GGUF file's own blocks (lib.gguf.qmatmul) ----------------------------------------------------------------

class GGUFLinear(nn.Module):
    """y = x Wᵀ with W kept as GGUF blocks `[out, in / block · bytes]` (uint8) of type `qtype`; x float32."""

    def __init__(self, blocks: torch.Tensor, qtype: str):
        super().__init__()
        self.out_features, self.in_features = check_blocks(blocks, qtype, None)
        self.register_buffer("blocks", blocks)
        self.qtype = qtype
        self._fallback: dict = {}  # the float32 weight, only where the kernel cannot run (GPU, no compiler)

    def dequantized(self) -> torch.Tensor:
        return dequantize_blocks(self.blocks, self.qtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return qmatmul(x, self.blocks, self.qtype, self._fallback)

    def _apply(self, fn, recurse=True):  # .to(device) moves the blocks: a cached float weight is stale
        self._fallback = {}
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype}"


def read_gguf_blocks(path=None) -> dict[str, tuple[str, torch.Tensor]]:
    """Every matmul weight of a llama GGUF file (default: SmolLM2's) as `name -> (type, blocks uint8 [out,
    bytes])`, named as `lib.modeling.llama.LlamaModel`'s parameters (`embed.weight` is the token embedding, which a tied
    model also uses as its LM head). Raises ValueError for a type `lib.gguf.qmatmul` cannot multiply. SmolLM2's blocks
    are kept in data/cache after the first read (the file is checked by `lib.modeling.fetch.check_smollm2` then)."""
    if path is None:  # SmolLM2's file: parsing its metadata takes seconds, so keep the blocks in the cache
        cached = paths.CACHE_DIR / f"smollm2-135m-q4_1-{paths.SMOLLM2_SHA256[:12]}-blocks-v1.pt"
        if cached.is_file():
            return torch.load(cached, weights_only=True)
        from lib.bench.paths import check_smollm2

        out = read_gguf_blocks(check_smollm2())
        paths.CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.part")  # written whole, then renamed
        torch.save(out, tmp)
        tmp.replace(cached)
        return out
    import gguf

    from lib.modeling.llama import GGUF_NAMES, unpermute_rope_rows
    from lib.gguf.qmatmul import QTYPES

    reader = gguf.GGUFReader(path)
    heads = {k: int(reader.fields[f"llama.attention.{k}"].contents()) for k in ("head_count", "head_count_kv")}
    ours = {"token_embd.weight": "embed.weight", "output.weight": "lm_head.weight"}
    out = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        if t.name in ours:
            name = ours[t.name]
        elif parts[0] == "blk" and parts[2] in GGUF_NAMES and "norm" not in parts[2]:
            name = f"layers.{parts[1]}.{GGUF_NAMES[parts[2]]}.weight"
        else:
            continue
        qtype = t.tensor_type.name
        if qtype not in QTYPES:
            raise ValueError(f"{t.name} is {qtype}: lib.gguf.qmatmul multiplies {', '.join(QTYPES)}")
        rows = np.array(t.data, dtype=np.uint8, copy=True)  # [out, bytes per row]
        if parts[-2] == "attn_q":
            rows = unpermute_rope_rows(rows, heads["head_count"])
        elif parts[-2] == "attn_k":
            rows = unpermute_rope_rows(rows, heads["head_count_kv"])
        out[name] = (qtype, torch.from_numpy(np.ascontiguousarray(rows)))
    return out


def quantize_blocks(model, qtype: str | dict[str, str], head_type: str = "Q8_0") -> dict[str, tuple[str, torch.Tensor]]:
    """A float model's linears and LM head quantized by `lib.gguf.qformats.quantize` to GGUF blocks, in
    `read_gguf_blocks`'s form: one `qtype` for all, or a plan `name -> type` (as `lib.quantization.quant.q4_k_m_plan` makes,
    the LM head then `head_type`), each stored as llama.cpp would (`lib.gguf.qformats.storable_type`: a K-quant on rows
    that are not a multiple of 256 falls back to Q5_0 / Q5_1 / Q8_0). This *is* a requantization: use it for a
    model that has no file, not for SmolLM2's file."""
    from lib.gguf.qformats import quantize, storable_type

    head = "embed.weight" if model.lm_head is None else "lm_head.weight"
    if isinstance(qtype, dict):
        plan = {head: head_type} | qtype
    else:
        plan = {f"{n}.weight": qtype for n, m in model.named_modules() if isinstance(m, nn.Linear)} | {head: qtype}
    params = dict(model.named_parameters())
    out = {}
    for name, t in plan.items():
        w = params[name].detach().float().cpu()
        t = storable_type(t, w.shape[1])
        out[name] = (t, torch.from_numpy(quantize(w, t)))
    return out


def _matching(name: str, w: torch.Tensor, qtype: str, blocks: torch.Tensor) -> torch.Tensor:
    """`blocks` on `w`'s device, after checking they hold `w` (first row, exactly): a different model or file
    would otherwise give wrong answers silently."""
    n, k = check_blocks(blocks, qtype, None)
    if (n, k) != tuple(w.shape):
        raise ValueError(f"{name}: the blocks hold a [{n}, {k}] weight, the model's is {list(w.shape)}")
    first = dequantize_blocks(blocks[:1].cpu(), qtype)[0]
    if w.device.type != "meta" and not torch.equal(first, w[0].detach().float().cpu()):
        raise ValueError(f"{name}: the {qtype} blocks do not decode to the model's weights (another model or "
                         f"file?); quantize this model's own weights with quantize_blocks(model, ...)")
    return blocks.to(w.device)


def gguf_linears(model, blocks: dict[str, tuple[str, torch.Tensor]] | None = None):
    """A copy of `model` (a `lib.modeling.llama.LlamaModel`, float32) whose linears and LM head are `GGUFLinear`s on
    `blocks` (default: `read_gguf_blocks()`, SmolLM2's file); embeddings and norms are shared with `model`, which
    is left unchanged. The blocks must decode to the model's weights (checked on each first row)."""
    blocks = read_gguf_blocks() if blocks is None else blocks
    memo = {id(p): p for p in model.parameters()}
    other = copy.deepcopy(model, memo)
    for name, mod in list(other.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nn.Linear):
                key = f"{name}.{child_name}.weight" if name else f"{child_name}.weight"
                qtype, b = blocks[key]
                setattr(mod, child_name, GGUFLinear(_matching(key, child.weight, qtype, b), qtype))
    if model.lm_head is None:  # tied: the output layer multiplies the token embedding's blocks
        qtype, b = blocks["embed.weight"]
        other.lm_head = GGUFLinear(_matching("embed.weight", model.embed.weight, qtype, b), qtype)
    return other.eval()


GGUF_LAYOUTS = ("file", "wide")


def gguf_layouts(blocks: dict[str, tuple[str, torch.Tensor]]) -> list[str]:
    """The layouts GGUFFastLlama can read `blocks` in here: "file" always; "wide" where the C++ kernel is built
    and some weight is Q4_1."""
    wide = Q.kernel() is not None and any(qtype in Q.WIDE for qtype, _ in blocks.values())
    return ["file", "wide"] if wide else ["file"]


def _shapes(blocks: dict[str, tuple[str, torch.Tensor]]) -> tuple[str, int]:
    nbytes = sum(b.numel() for _, b in blocks.values())
    types = sorted({qtype for qtype, _ in blocks.values()})
    return f"GGUF {'+'.join(types)}, {len(blocks)} weights, {nbytes >> 20} MB", nbytes


def choose_gguf_layout(model, blocks: dict[str, tuple[str, torch.Tensor]], cache_file=None,
                       repeats: int = 5, prefetch: str = "on") -> tuple[str, str]:
    """(layout, why): "file" or "wide" for GGUFFastLlama, whichever runs whole steps (1 and 4 new tokens after
    a 32-token cache) faster here, read with `prefetch`; measured once per machine and remembered next to
    lib.modeling.fast's kernel choice (`lib.modeling.fast_kernels.choose_measured`)."""
    shapes, nbytes = _shapes(blocks)
    timer = step_timer(model, torch.float32, repeats,
                       make=lambda name: GGUFFastLlama(model, blocks, layout=name, prefetch=prefetch))
    return choose_measured(GGUF_LAYOUTS, gguf_layouts(blocks), "INFERENCE_LAB_GGUF_LAYOUT",
                           f"{shapes}, prefetch {prefetch}", nbytes, timer, "GGUFFastLlama steps at 1 and 4 rows",
                           cache_file)


GGUF_PREFETCH = ("on", "off")


def choose_gguf_prefetch(model, blocks: dict[str, tuple[str, torch.Tensor]], cache_file=None,
                         repeats: int = 5) -> tuple[str, str]:
    """(prefetch, why): "on" (the Q4_1 and Q8_0 loops ask for blocks `lib.gguf.qmatmul.PREFETCH_BYTES` ahead) or
    "off", whichever runs whole steps of the file's layout faster here; measured once per machine and remembered
    like the layout (`INFERENCE_LAB_GGUF_PREFETCH=on|off|measure` overrides)."""
    shapes, nbytes = _shapes(blocks)
    timer = step_timer(model, torch.float32, repeats,
                       make=lambda name: GGUFFastLlama(model, blocks, layout="file", prefetch=name))
    avail = list(GGUF_PREFETCH) if Q.kernel() is not None else ["off"]
    return choose_measured(GGUF_PREFETCH, avail, "INFERENCE_LAB_GGUF_PREFETCH", f"{shapes}, prefetch", nbytes,
                           timer, "GGUFFastLlama steps at 1 and 4 rows, file layout", cache_file)


class GGUFFastLlama(FastLlama):
    """`lib.modeling.fast.FastLlama` (one QKV and one gate-up matmul per layer, no per-step setup) multiplying GGUF
    blocks: the fused matrices are the blocks' rows stacked (a row of blocks is self-contained), the LM head is
    the token embedding's blocks. Same call contract as the model; float32 activations.

    A step of up to `step_max_rows` rows (batch x new tokens: a decode step, a verify step, a short prefill) on a
    `lib.modeling.kv_cache.KVCache` of plain layers runs all layers in one call of the C++ `decode_steps`
    (lib/gguf/csrc/qmatmul.cpp): the same arithmetic as `_layer_step`, which serves every other call (longer
    prefills, other caches, no compiler). At SmolLM2's size the ~300 small tensor operations
    and the Python between them cost as much per token as the matmuls; in C++ they cost a fraction of that."""

    def __init__(self, model, blocks: dict[str, tuple[str, torch.Tensor]] | None = None, layout: str | None = None,
                 prefetch: str | None = None):
        blocks = read_gguf_blocks() if blocks is None else blocks
        if prefetch is None:
            prefetch, self.prefetch_reason = choose_gguf_prefetch(model, blocks)
        elif prefetch not in GGUF_PREFETCH:
            raise ValueError(f"prefetch must be one of {', '.join(GGUF_PREFETCH)} (or None: chosen by measuring); "
                             f"got {prefetch!r}")
        else:
            self.prefetch_reason = f"{prefetch}: asked for"
        self.prefetch = prefetch
        self._prefetch_bytes = Q.PREFETCH_BYTES if prefetch == "on" else 0
        avail = gguf_layouts(blocks)
        if layout is None:
            layout, self.layout_reason = choose_gguf_layout(model, blocks, prefetch=prefetch)
        elif layout not in avail:
            raise ValueError(f"layout must be one of {', '.join(avail)} here (or None: chosen by measuring); got "
                             f"{layout!r}")
        else:
            self.layout_reason = f"{layout}: asked for"
        self.layout = layout
        super().__init__(model, dtype=torch.float32, packed=False)
        params = dict(model.named_parameters())

        def weight(*names):  # [(type, blocks, fallback cache)]: consecutive parts of one type stacked
            parts: list[tuple[str, torch.Tensor, dict]] = []
            for n in names:
                qtype, b = blocks[n]
                b = _matching(n, params[n], qtype, b)
                if layout == "wide" and qtype in Q.WIDE:
                    qtype, b = Q.WIDE[qtype], Q.repack_q4_1(b)
                if parts and parts[-1][0] == qtype:
                    parts[-1] = (qtype, torch.cat([parts[-1][1], b]), {})
                else:
                    parts.append((qtype, b, {}))
            return parts

        head = "embed.weight" if model.lm_head is None else "lm_head.weight"
        self.lm_head = weight(head)
        for i, lw in enumerate(self.layers):
            p = f"layers.{i}."
            lw.update(wqkv=weight(*(f"{p}attn.{x}_proj.weight" for x in "qkv")), wo=weight(f"{p}attn.o_proj.weight"),
                      w_gate_up=weight(f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"),
                      w_down=weight(f"{p}mlp.down_proj.weight"))
        if Q.kernel() is not None:  # every block on 2 MB pages, one buffer (lib.modeling.fast's item 10): a step reads them all
            slots = [(lw, key) for lw in self.layers for key in ("wqkv", "wo", "w_gate_up", "w_down")]
            lists = [self.lm_head] + [lw[key] for lw, key in slots]
            moved = iter(on_huge_pages([b for parts in lists for _, b, _ in parts]))
            lists = [[(qtype, next(moved), cache) for qtype, _, cache in parts] for parts in lists]
            self.lm_head = lists[0]
            for (lw, key), parts in zip(slots, lists[1:]):
                lw[key] = parts
        self.linear = self._multiply
        self._step = self._decode_step_args()  # lib.modeling.fast's one-call decode step (item 9), on these blocks

    step_max_rows = Q.FUSED_MAX_ROWS  # the fused kernel's rows: the C++ step up to there, as qmatmul

    def forward_hidden(self, input_ids: torch.Tensor, cache=None):
        Q.set_prefetch(self._prefetch_bytes)  # one setting per process: this engine's, for its step
        return super().forward_hidden(input_ids, cache)

    def _step_parts(self, lw: dict, key: str) -> list[tuple[str, torch.Tensor]]:
        return [(qtype, b) for qtype, b, _ in lw[key]]

    @staticmethod
    def _multiply(x: torch.Tensor, parts: list[tuple[str, torch.Tensor, dict]]) -> torch.Tensor:
        ys = [qmatmul(x, b, qtype, cache) for qtype, b, cache in parts]
        return ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
