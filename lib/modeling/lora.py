"""LoRA adapters, and serving many of them in one batch (week 21, scenario D: the S-LoRA / Punica idea).

    adapter = LoRAAdapter.random(model.config, rank=8, seed=1)     # or train(model, ids), or load_adapter(path, model)
    save_adapter(adapter, "poet.lora")                             # the file format: see save_adapter
    merged = merge(model, adapter)                                 # the reference: a copy with W + (α/r)·B·A
    with applied(model, [(adapter, None)]):                        # every token row through the adapter
        logits = model(input_ids)
    engine.add_request(prompt, 32, params=SamplingParams(lora=adapter))   # per request, inside a shared batch

    python -m lib.modeling.lora train --out data/cache/lora/hamlet.lora   # a real one: 30 Adam steps on Hamlet (~1 CPU-min)
    python -m lib.serve.server --lora-modules hamlet=data/cache/lora/hamlet.lora   # then: model="hamlet" in a request

An adapter holds, for some of a model's linears y = x·Wᵀ (SmolLM2's q/k/v/o_proj and gate/up/down_proj, per layer),
two small matrices A [r, in] and B [out, r]; with it the linear computes x·Wᵀ + (α/r)·(x·Aᵀ)·Bᵀ, which is what the
merged weight W + (α/r)·B·A gives, up to fp32 rounding. Merging makes a model per adapter. Serving many adapters
from one model keeps W shared: each step multiplies every token row of the batch by W once, then each *adapter
group* (the rows of the requests that use one adapter) adds its own low-rank product: gather the group's rows, two
thin matmuls, scatter-add back (Punica's SGMV, here one plain-torch matmul pair per group and linear). A row of a
request without an adapter gets W's product alone, and a step with no adapter in it runs exactly as without LoRA.

`applied` adds the products through forward hooks on the target linears, registered for one forward and removed
after it. A hook acts only in the thread that registered it, so another thread running the same model meanwhile
(the server's echo logprobs) sees the base model. The hooks work on any module at those paths (lib.modeling.fast's packed
linears, lib.quantization.quant_linear's quantized ones): the adapter adds to whatever the base linear computes.

`train` fits a small adapter to a text (LoRA's initialization, B = 0, so it starts as the base model); its command
above, rank 8 on q_proj and v_proj, batch 4 × 64 tokens, took SmolLM2's perplexity on Hamlet's held-out last tenth
(1,024 tokens) from 47.5 to 38.8 in 30 steps (55 CPU-seconds on the Intel Xeon class, a busy 2-core VM).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# The linears an adapter may target, as paths inside a layer of lib.modeling.llama.LlamaModel.
TARGETS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
           "mlp.down_proj")
FORMAT, VERSION = "inference-lab-lora", 1
_PATH = re.compile(r"layers\.(\d+)\.(" + "|".join(re.escape(t) for t in TARGETS) + r")$")


def target_shapes(config) -> dict[str, tuple[int, int]]:
    """(out, in) of each target linear of one layer, from a `lib.modeling.llama.ModelConfig`."""
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    d, ff = config.d_model, config.d_ff
    return {"attn.q_proj": (q, d), "attn.k_proj": (kv, d), "attn.v_proj": (kv, d), "attn.o_proj": (d, q),
            "mlp.gate_proj": (ff, d), "mlp.up_proj": (ff, d), "mlp.down_proj": (d, ff)}


@dataclass(eq=False)  # compared by identity: two adapters are the same adapter only if they are one object
class LoRAAdapter:
    """`weights`: {"layers.{i}.{target}": (A [rank, in], B [out, rank])}; scale α/r. Do not change the tensors
    after it is used: its checksum (and so the prefix cache's key) is taken once."""
    rank: int
    alpha: float
    weights: dict
    name: str = ""

    def __post_init__(self):
        if not (isinstance(self.rank, int) and self.rank >= 1) or not self.alpha > 0:
            raise ValueError(f"a LoRA adapter needs rank >= 1 and alpha > 0; got rank={self.rank!r}, "
                             f"alpha={self.alpha!r}")
        if not self.weights:
            raise ValueError("a LoRA adapter needs at least one target linear")
        for path, ab in self.weights.items():
            if not _PATH.match(path):
                raise ValueError(f"LoRA target {path!r} is not 'layers.<i>.<{' | '.join(TARGETS)}>'")
            a, b = ab
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != self.rank or b.shape[1] != self.rank:
                raise ValueError(f"LoRA target {path}: A must be [rank, in] and B [out, rank] with rank {self.rank}; "
                                 f"got A {tuple(a.shape)}, B {tuple(b.shape)}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @functools.cached_property
    def checksum(self) -> str:
        """sha256 (hex) over rank, alpha and every tensor's name, dtype, shape and bytes, in name order."""
        h = hashlib.sha256(repr((FORMAT, self.rank, float(self.alpha))).encode())
        for name, t in sorted(_tensors(self).items()):
            t = t.detach().cpu().contiguous()
            h.update(repr((name, str(t.dtype), tuple(t.shape))).encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    @property
    def salt(self) -> int:
        """What sets this adapter's KV blocks apart in the prefix cache (lib.batching.blocks): keys computed with an adapter
        are not the base model's, nor another adapter's."""
        return int(self.checksum[:16], 16)

    def check(self, config, device=None, dtype=None) -> None:
        """ValueError naming the first target whose shapes do not fit a model of `config` (a `ModelConfig`), or
        whose tensors are not on `device` / in `dtype` (when given)."""
        shapes = target_shapes(config)
        for path, (a, b) in self.weights.items():
            layer, target = _PATH.match(path).groups()
            if int(layer) >= config.n_layers:
                raise ValueError(f"LoRA adapter {self.name!r} targets {path}; the model has {config.n_layers} layers")
            out, inp = shapes[target]
            if a.shape[1] != inp or b.shape[0] != out:
                raise ValueError(f"LoRA adapter {self.name!r} does not fit this model: {path} is {inp} -> {out}, the "
                                 f"adapter's A is {tuple(a.shape)} and B {tuple(b.shape)} (A [rank, {inp}], B "
                                 f"[{out}, rank] expected): it was made for another model")
            for t in (a, b):
                if (device is not None and t.device != torch.device(device)) or (dtype is not None and t.dtype != dtype):
                    raise ValueError(f"LoRA adapter {self.name!r}: {path} is on {t.device} in {t.dtype}; the model is "
                                     f"on {device} in {dtype} (adapter.to(device, dtype) moves it)")

    def to(self, device=None, dtype=None) -> "LoRAAdapter":
        """The same adapter with its tensors on `device` / in `dtype` (self when nothing changes)."""
        moved = {p: (a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype))
                 for p, (a, b) in self.weights.items()}
        if all(x is y for p in moved for x, y in zip(moved[p], self.weights[p])):
            return self
        return LoRAAdapter(self.rank, self.alpha, moved, self.name)

    @classmethod
    def random(cls, config, rank: int = 8, alpha: float = 16.0, seed: int = 0, targets: Sequence[str] = TARGETS,
               layers: Sequence[int] | None = None, std: float = 0.02, name: str = "") -> "LoRAAdapter":
        """Seeded random A (std 1/√in) and B (std `std`) on `targets` of `layers` (all): an adapter that changes the
        model's output, for tests and throughput (a trained one starts with B = 0: `train`)."""
        gen = torch.Generator().manual_seed(seed)
        shapes = target_shapes(config)
        weights = {}
        for i in range(config.n_layers) if layers is None else layers:
            for t in targets:
                out, inp = shapes[t]
                weights[f"layers.{i}.{t}"] = (torch.randn(rank, inp, generator=gen) / math.sqrt(inp),
                                              std * torch.randn(out, rank, generator=gen))
        return cls(rank, float(alpha), weights, name or f"random-r{rank}-seed{seed}")


def _tensors(adapter: LoRAAdapter) -> dict[str, torch.Tensor]:
    out = {}
    for path, (a, b) in adapter.weights.items():
        out[f"{path}.lora_A"], out[f"{path}.lora_B"] = a, b
    return out


# --- the file ----------------------------------------------------------------------------------------------------

def save_adapter(adapter: LoRAAdapter, path) -> Path:
    """Write `adapter` to `path`: a `torch.save` of one dict (read back with weights_only=True: no code runs)

        {"format": "inference-lab-lora", "version": 1, "name": str, "rank": int, "alpha": float,
         "tensors": {"layers.<i>.<target>.lora_A": A [rank, in], "layers.<i>.<target>.lora_B": B [out, rank]},
         "sha256": the adapter's checksum (hex: rank, alpha, each tensor's name, dtype, shape and bytes)}

    with <target> one of `TARGETS` (PEFT's names, lora_A / lora_B, on lib.modeling.llama's module paths); tensors on the CPU."""
    path = Path(path)
    blob = {"format": FORMAT, "version": VERSION, "name": adapter.name, "rank": adapter.rank,
            "alpha": float(adapter.alpha), "tensors": {k: v.detach().cpu().contiguous()
                                                       for k, v in _tensors(adapter).items()},
            "sha256": adapter.checksum}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    torch.save(blob, tmp)
    tmp.replace(path)
    return path


def load_adapter(path, model=None, name: str | None = None) -> LoRAAdapter:
    """Read an adapter `save_adapter` wrote, checking its checksum; with `model`, checked against it (shapes) and
    moved to its device and dtype. FileNotFoundError / ValueError say what is wrong with the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LoRA adapter file {path} does not exist")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (a truncated or foreign file: pickle, zip and torch errors alike)
        raise ValueError(f"{path} is not a LoRA adapter file ({type(e).__name__}: {e})") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(f"{path} is not a LoRA adapter file (no format {FORMAT!r}; lib.modeling.lora.save_adapter writes them)")
    if blob.get("version") != VERSION:
        raise ValueError(f"{path}: adapter file version {blob.get('version')!r}; this code reads version {VERSION}")
    tensors = blob["tensors"]
    paths = sorted({k.rsplit(".", 1)[0] for k in tensors})
    missing = [p for p in paths if f"{p}.lora_A" not in tensors or f"{p}.lora_B" not in tensors]
    if missing or any(not k.endswith((".lora_A", ".lora_B")) for k in tensors):
        raise ValueError(f"{path}: every target needs a lora_A and a lora_B tensor (and nothing else); "
                         f"{missing[:3] or sorted(tensors)[:3]}")
    adapter = LoRAAdapter(int(blob["rank"]), float(blob["alpha"]),
                          {p: (tensors[f"{p}.lora_A"], tensors[f"{p}.lora_B"]) for p in paths},
                          name if name is not None else blob.get("name", ""))
    if adapter.checksum != blob.get("sha256"):
        raise ValueError(f"{path}: the checksum does not match its tensors (a damaged or edited file)")
    if model is not None:
        adapter.check(model.config)
        adapter = adapter.to(model.device, model.embed.weight.dtype)
    return adapter


# --- merging: the reference ---------------------------------------------------------------------------------------

@torch.no_grad()
def merge(model, adapter: LoRAAdapter):
    """A copy of `model` (a `lib.modeling.llama.LlamaModel` with plain `nn.Linear`s) whose target weights are
    W + (α/r)·B·A: one model per adapter, the way to serve an adapter without multi-LoRA. `model` is unchanged."""
    adapter.check(model.config)
    merged = copy.deepcopy(model)
    for path, (a, b) in adapter.weights.items():
        w = merged.get_submodule(path).weight
        w += adapter.scale * (b.to(w) @ a.to(w))
    return merged


# --- applying adapters per row of a batch ---------------------------------------------------------------------------

def row_groups(per_request: Sequence[tuple[LoRAAdapter | None, int]], device=None) -> list:
    """The adapter groups of a packed batch: `per_request` is (adapter or None, its number of token rows) for each
    request in the order its rows follow one another; returns [(adapter, row indices [n_g])], one per distinct
    adapter ([] when no request has one)."""
    rows: dict[int, tuple[LoRAAdapter, list[int]]] = {}
    at = 0
    for adapter, n in per_request:
        if adapter is not None:
            rows.setdefault(id(adapter), (adapter, []))[1].extend(range(at, at + n))
        at += n
    return [(a, torch.tensor(r, dtype=torch.int64, device=device)) for a, r in rows.values()]


def _hook(items, owner: int):
    def add_low_rank(module, inputs, out):
        if threading.get_ident() != owner:  # another thread's forward through the same modules: the base model
            return None
        x = inputs[0].reshape(-1, inputs[0].shape[-1])  # [rows, in]
        y = out.reshape(-1, out.shape[-1])  # [rows, out]
        for (a, b), scale, rows in items:
            if rows is None:
                y = y + scale * ((x @ a.t()) @ b.t())
            else:  # gather the group's rows, the low-rank product, scatter-add back
                y = y.index_add(0, rows, (x[rows] @ a.t()) @ b.t(), alpha=scale)
        return y.view(out.shape)
    return add_low_rank


@contextlib.contextmanager
def applied(model, groups: Sequence[tuple[LoRAAdapter, torch.Tensor | None]]):
    """For forwards of `model` in this thread inside the block: each target linear adds, for each (adapter, rows)
    group, the adapter's low-rank product to those rows of its output (rows index the token rows flattened,
    `[batch * seq]`; None: every row). No groups: nothing is registered."""
    items: dict[str, list] = {}
    for adapter, rows in groups:
        for path, ab in adapter.weights.items():
            items.setdefault(path, []).append((ab, adapter.scale, rows))
    owner = threading.get_ident()
    handles = [model.get_submodule(path).register_forward_hook(_hook(its, owner)) for path, its in items.items()]
    try:
        yield model
    finally:
        for h in handles:
            h.remove()


def with_adapter(model, adapter: LoRAAdapter | None):
    """`applied` with one adapter on every row (None: the base model)."""
    return applied(model, [] if adapter is None else [(adapter, None)])


# --- a small real adapter --------------------------------------------------------------------------------------------

def train(model, ids: torch.Tensor, rank: int = 8, alpha: float = 16.0, steps: int = 30, seq_len: int = 64,
          batch: int = 4, lr: float = 2e-3, seed: int = 0, targets: Sequence[str] = ("attn.q_proj", "attn.v_proj"),
          name: str = "", log=None) -> LoRAAdapter:
    """An adapter fitted to the text `ids` ([n] token ids) by next-token cross-entropy on random windows (Adam; the
    model's weights frozen). A starts random, B at zero, so step 0 is the base model (LoRA's initialization).
    `log(step, loss)` is called each step."""
    import torch.nn.functional as F

    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    shapes = target_shapes(cfg)
    weights = {}
    for i in range(cfg.n_layers):
        for t in targets:
            out, inp = shapes[t]
            a = (torch.randn(rank, inp, generator=gen) / math.sqrt(inp)).to(model.device).requires_grad_()
            weights[f"layers.{i}.{t}"] = (a, torch.zeros(out, rank, device=model.device, requires_grad=True))
    params = [t for ab in weights.values() for t in ab]
    opt = torch.optim.Adam(params, lr=lr)
    adapter = LoRAAdapter(rank, float(alpha), weights, name)
    ids = ids.reshape(-1)
    if len(ids) <= seq_len + 1:
        raise ValueError(f"the text has {len(ids)} tokens; training windows need more than seq_len + 1 = {seq_len + 1}")
    with torch.enable_grad():
        for step in range(steps):
            starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=gen)
            window = torch.stack([ids[s:s + seq_len + 1] for s in starts.tolist()]).to(model.device)  # [batch, T + 1]
            with with_adapter(model, adapter):
                logits = model(window[:, :-1])  # [batch, T, vocab]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
            opt.zero_grad()
            for p, g in zip(params, torch.autograd.grad(loss, params)):  # the adapter's gradients only
                p.grad = g
            opt.step()
            if log is not None:
                log(step, float(loss.detach()))
    return LoRAAdapter(rank, float(alpha), {p: (a.detach(), b.detach()) for p, (a, b) in weights.items()}, name)


# --- the server's --lora-modules --------------------------------------------------------------------------------------

def parse_modules(specs: Sequence[str], base_name: str) -> dict[str, str]:
    """vLLM's `--lora-modules name=path ...` -> {name: path}; ValueError for a spec without '=', a repeated name, the
    base model's name, or a path with no file (said before the model is loaded)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules takes name=path, got {spec!r}")
        if name in out or name == base_name:
            raise ValueError(f"--lora-modules: the name {name!r} is used twice (or is the base model's)")
        if not Path(path).is_file():
            raise ValueError(f"--lora-modules {name}: LoRA adapter file {path} does not exist")
        out[name] = path
    return out


def load_modules(modules: dict, model) -> dict[str, LoRAAdapter]:
    """{name: path or LoRAAdapter} -> {name: adapter}, each loaded, checked against `model` and on its device."""
    out = {}
    for name, src in modules.items():
        adapter = src if isinstance(src, LoRAAdapter) else load_adapter(src, model, name=name)
        adapter.check(model.config)
        out[name] = adapter.to(model.device, model.embed.weight.dtype)
    return out


def main(argv=None) -> None:
    """`python -m lib.modeling.lora train --out data/cache/lora/hamlet.lora`: a small adapter fitted to a text of data/text."""
    import argparse
    import time

    ap = argparse.ArgumentParser(description=main.__doc__.split(":")[0])
    ap.add_argument("command", choices=["train"])
    ap.add_argument("--text", default="hamlet", help="a text of data/text (default hamlet)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args(argv)
    from lib.modeling.llama import load_smollm2
    from lib.modeling.text import load_text, perplexity

    model, tok = load_smollm2(device="cpu")
    ids = torch.tensor(tok(load_text(args.text)).input_ids)
    cut = int(len(ids) * 0.9)  # the last tenth is held out
    start = time.perf_counter()
    adapter = train(model, ids[:cut], rank=args.rank, steps=args.steps, seq_len=args.seq_len, batch=args.batch,
                    name=f"{args.text}-r{args.rank}", log=lambda s, loss: print(f"step {s}: loss {loss:.3f}", flush=True))
    print(f"trained in {time.perf_counter() - start:.0f} s")
    held = ids[cut:cut + 1024]
    with torch.no_grad():
        base = perplexity(model, held, window=256, stride=128)
        with with_adapter(model, adapter):
            tuned = perplexity(model, held, window=256, stride=128)
    print(f"held-out {args.text} perplexity: base {base:.2f}, with the adapter {tuned:.2f}")
    print(f"saved {save_adapter(adapter, args.out)}")


if __name__ == "__main__":
    main()
