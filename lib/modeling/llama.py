"""A Llama-family decoder in plain PyTorch: RMSNorm, RoPE, grouped-query attention, SwiGLU, tied embeddings.

    model, tokenizer = load_smollm2()          # SmolLM2-135M-Instruct from its GGUF file, fp32
    logits = model(input_ids)                  # [batch, seq, vocab], float32
    model = tiny_model(seed=0, n_kv_heads=1)   # same class, random weights, for fast tests

Read top to bottom: config, the four building blocks, the model, then loading from GGUF.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.bench import paths
from lib.attn.attention import AttentionFn, gqa_attention
from lib.modeling.kv_cache import KVCache, LayerKVCache
from lib.bench.paths import check_smollm2


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = True

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


# SmolLM2-135M, as its GGUF metadata states it (checked against the file in tests/test_model.py).
SMOLLM2_135M = ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, d_ff=1536,
                           rope_theta=100000.0, norm_eps=1e-5, max_seq_len=8192, tie_embeddings=True)


# --- building blocks -------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[T, head_dim]` for rotary embeddings at the given absolute positions."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim / 2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, head_dim]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of `x [B, H, T, d]` by position-dependent angles (the "rotate half" layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, cache: LayerKVCache | None, attention_fn: AttentionFn):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, T, d]
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, d]
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, d]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None and hasattr(cache, "attend"):  # a paged cache (lib.batching.paged) writes its blocks and attends
            out = cache.attend(q, k, v, attention_fn)  # [B, H, T, d]
        else:
            if cache is not None:
                k, v = cache.append(k, v)  # [B, Hkv, cached + T, d]
            out = attention_fn(q, k, v, causal=True)  # [B, H, T, d]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, attention_fn):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, attention_fn)
        return x + self.mlp(self.mlp_norm(x))


# --- the model -------------------------------------------------------------------------------------

class LlamaModel(nn.Module):
    """`model(input_ids [B, T], cache=None)` -> logits `[B, T, vocab]` (float32).

    With a `KVCache`, the new tokens sit at positions `cache.length ... cache.length + T - 1` and their
    keys and values are appended to it. With a `lib.batching.paged.PagedKVCache`, `input_ids` is `[1, N]`: the
    tokens of several sequences, flattened, with the positions and blocks set by `cache.prepare(...)`.
    `attention_fn` picks the attention backend (see lib.attn.attention).
    """

    def __init__(self, cfg: ModelConfig, attention_fn: AttentionFn = gqa_attention):
        super().__init__()
        self.config = cfg
        self.attention_fn = attention_fn
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def with_attention(self, attention_fn: AttentionFn) -> "LlamaModel":
        """A shallow copy that shares every weight but runs `attention_fn`; this model is left unchanged."""
        other = copy.copy(self)  # a new module object; parameters and submodules are shared, not copied
        other.attention_fn = attention_fn
        return other

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        return KVCache.for_model(self.config, batch, max_len, dtype=self.embed.weight.dtype, device=self.device)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        positions = getattr(cache, "positions", None)  # a PagedKVCache (lib.batching.paged) gives each token its position
        if positions is None:
            start = cache.length if cache is not None else 0
            end = start + t
            positions = torch.arange(start, start + t, device=input_ids.device)
        else:
            end = int(positions.max()) + 1 if t else 0
        if end > self.config.max_seq_len:
            raise ValueError(f"sequence of {end} positions is longer than the model's "
                             f"max_seq_len={self.config.max_seq_len}")
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        x = self.embed(input_ids)  # [B, T, d_model]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache[i] if cache is not None else None, self.attention_fn)
        x = self.norm(x)
        rows = getattr(cache, "logits_rows", None)  # a PagedKVCache (lib.batching.engine) asks for some positions' logits only
        if rows is not None:
            x = x[:, rows]
        # the LM head as a module call when there is one, so a quantized head (lib.quantization.quant_linear) can replace it
        logits = F.linear(x, self.embed.weight) if self.lm_head is None else self.lm_head(x)
        return logits.float()  # [B, T, vocab]


def tiny_config(**overrides) -> ModelConfig:
    """A small configuration of the same architecture (2 layers, GQA 4:2), for fast tests."""
    base = dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                rope_theta=10000.0, norm_eps=1e-5, max_seq_len=256, tie_embeddings=True)
    base.update(overrides)
    return ModelConfig(**base)


def tiny_model(seed: int = 0, config: ModelConfig | None = None, **overrides) -> LlamaModel:
    """A `LlamaModel` with seeded random weights (std 0.02 linears, random norm gains) in eval mode."""
    cfg = config if config is not None else tiny_config(**overrides)
    gen = torch.Generator().manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen) * (5.0 if "embed" in name else 1.0))
    return model.eval()


# --- loading from GGUF -----------------------------------------------------------------------------

GGUF_NAMES = {  # GGUF tensor name -> our parameter name, per layer
    "attn_norm": "attn_norm", "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
    "attn_output": "attn.o_proj", "ffn_norm": "mlp_norm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores each head's Q/K rows interleaved (pairs 2i, 2i+1) for its RoPE; undo that.

    GGUF head rows are ordered [d/2 pairs][2]; the "rotate half" layout wants [2][d/2].
    """
    rows = w.shape[0] // n_heads
    return w.reshape(n_heads, rows // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf_llama(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a llama-architecture GGUF file: its config from the metadata, its weights dequantized to fp32."""
    import gguf
    from gguf.quants import dequantize

    path = Path(path)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # gguf raises ValueError/struct errors/IndexError on bad bytes
        raise ValueError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}). "
                         f"If it is the lab's model, delete it and run `{paths.FETCH_COMMAND}`.") from e

    def meta(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    arch = meta("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'llama'")
    n_heads = int(meta("llama.attention.head_count"))
    tensors = {t.name: t for t in reader.tensors}
    vocab = int(meta("llama.vocab_size", tensors["token_embd.weight"].shape[-1]))
    cfg = ModelConfig(
        vocab_size=vocab, d_model=int(meta("llama.embedding_length")), n_layers=int(meta("llama.block_count")),
        n_heads=n_heads, n_kv_heads=int(meta("llama.attention.head_count_kv", n_heads)),
        d_ff=int(meta("llama.feed_forward_length")), rope_theta=float(meta("llama.rope.freq_base", 10000.0)),
        # stored as float32: 7 significant digits give back the decimal the model was made with (1e-5)
        norm_eps=float(f'{meta("llama.attention.layer_norm_rms_epsilon", 1e-5):.7g}'),
        max_seq_len=int(meta("llama.context_length", 2048)), tie_embeddings="output.weight" not in tensors,
    )

    def load(name: str) -> np.ndarray:
        t = tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)

    state: dict[str, torch.Tensor] = {"embed.weight": load("token_embd.weight"), "norm.weight": load("output_norm.weight")}
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = load("output.weight")
    for i in range(cfg.n_layers):
        for g, ours in GGUF_NAMES.items():
            w = load(f"blk.{i}.{g}.weight")
            if g == "attn_q":
                w = unpermute_rope_rows(w, cfg.n_heads)
            elif g == "attn_k":
                w = unpermute_rope_rows(w, cfg.n_kv_heads)
            state[f"layers.{i}.{ours}.weight"] = w
    expected_shapes = {k: tuple(v.shape) for k, v in LlamaModel(cfg.replace(n_layers=1)).state_dict().items()}
    for k, v in state.items():
        short = k.replace(k.split(".")[1], "0", 1) if k.startswith("layers.") else k
        if short in expected_shapes and tuple(v.shape) != expected_shapes[short]:
            raise ValueError(f"{path}: tensor for {k} has shape {tuple(v.shape)}, expected {expected_shapes[short]}")
    return cfg, {k: torch.from_numpy(np.array(v, dtype=np.float32, order="C", copy=True)) for k, v in state.items()}


# Bump when read_gguf_llama's output changes, so that caches built by older code are not reused.
CACHE_FORMAT = 1


def _cache_paths() -> tuple[Path, Path]:
    tag = f"smollm2-135m-q4_1-{paths.SMOLLM2_SHA256[:12]}-v{CACHE_FORMAT}"
    return paths.CACHE_DIR / f"{tag}-fp32.pt", paths.CACHE_DIR / f"{tag}-tokenizer"


def load_tokenizer_from_gguf(path: str | Path):
    from transformers import AutoTokenizer

    path = Path(path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def build_smollm2_cache() -> None:
    """Derive fp32 weights and the tokenizer from the GGUF file once, so later loads take a second, not 15."""
    gguf_path = check_smollm2()
    weights_path, tok_dir = _cache_paths()
    paths.CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Write under a private name, then rename: two processes building at once never see half a file.
    if not weights_path.is_file():
        cfg, state = read_gguf_llama(gguf_path)
        tmp = weights_path.with_name(f"{weights_path.name}.{os.getpid()}.part")
        torch.save({"config": dataclasses.asdict(cfg), "state_dict": state}, tmp)
        tmp.replace(weights_path)
    if not (tok_dir / "tokenizer.json").is_file():
        tmp_dir = tok_dir.with_name(f"{tok_dir.name}.{os.getpid()}.part")
        load_tokenizer_from_gguf(gguf_path).save_pretrained(str(tmp_dir))
        shutil.rmtree(tok_dir, ignore_errors=True)
        tmp_dir.replace(tok_dir)
    print(f"Fast-load cache ready in {paths.CACHE_DIR}")


def default_device() -> torch.device:
    """CUDA when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_smollm2(device: str | torch.device | None = None, use_cache: bool = True):
    """SmolLM2-135M-Instruct from the GGUF file (dequantized to fp32) and its tokenizer, ready for eval.

    Returns `(model, tokenizer)`. With `use_cache`, weights and tokenizer come from the cache that
    `python -m lib.modeling.fetch` derives from the GGUF file (built here if missing); `use_cache=False` reads
    the GGUF file itself with gguf and transformers every time.
    """
    gguf_path = check_smollm2()  # raises ModelFileError with the fixing command
    device = torch.device(device) if device is not None else default_device()
    weights_path, tok_dir = _cache_paths()
    if use_cache:
        if not weights_path.is_file() or not (tok_dir / "tokenizer.json").is_file():
            build_smollm2_cache()
        blob = torch.load(weights_path, map_location="cpu", weights_only=True)
        cfg, state = ModelConfig(**blob["config"]), blob["state_dict"]
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    else:
        cfg, state = read_gguf_llama(gguf_path)
        tokenizer = load_tokenizer_from_gguf(gguf_path)
    model = LlamaModel(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).eval(), tokenizer


@functools.lru_cache(maxsize=2)
def shared_smollm2(device: str | None = None):
    """One loaded copy per process, for checks and notebooks that ask for the model many times. Do not mutate."""
    return load_smollm2(device=device)
