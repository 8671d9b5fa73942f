"""The drafts of speculative decoding (week 18): cheap models that propose tokens for the target to verify.

Each has a model's call shape, `draft(ids [1, t], cache=...) -> logits [1, t, vocab]`, and
`draft.new_cache(batch, max_len)`, so `lib.spec_decode.speculative.speculative_generate` takes any of them:

- `PromptLookupDraft(vocab_size, ngram)`: no weights; guesses that the text repeats (n-gram match in what it has
  seen). Its "cache" is a `TokenHistory` of token ids, truncated like a KV cache.
- `early_exit_draft(target, n_layers)`: the target's first layers, final norm and LM head (shares every weight).
- `random_draft(config)`: a small random model, the α ≈ 0 baseline.
- `quantized_draft(target)`: the target with int8 per-output-channel weights (`Int8Linear`).
- FR-Spec (Zhao et al. 2025): `token_counts` / `frequency_ranked_ids` rank the vocabulary by frequency in a
  corpus; `fr_spec_draft(draft, keep_ids)` gives a draft whose LM head (`SubsetHead`) scores those ids only.
- A distilled draft: `build_distilled_draft` / `save_distilled_draft` / `load_distilled_draft`, trained by
  `tools/distill_draft.py` (`DISTILL_COMMAND`), saved at `distilled_draft_path`.

Separate from `lib/spec_decode/speculative.py` (verification, the decoding loop, acceptance theory, measurements): a draft
is only a model, and the loop takes any object of that shape. Import these names from here.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- a draft without weights: prompt lookup -----------------------------------------------------------------

class TokenHistory:
    """The 'cache' of a draft without weights: the token ids seen so far, with the same truncate as a KV cache."""

    def __init__(self, max_len: int):
        self.tokens: list[int] = []
        self.max_len = max_len

    @property
    def length(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"truncate({n}): the history holds {len(self.tokens)} tokens")
        del self.tokens[n:]

    crop = truncate


class PromptLookupDraft:
    """Prompt lookup decoding (Saxena 2023): no weights; guess that the text repeats.

    For each position, find the latest earlier occurrence of the last `ngram` tokens (then `ngram - 1`, ...,
    down to 1) and predict the token that followed it. Call shape of a model:
    `draft(ids [1, t], cache=draft.new_cache(1, n)) -> logits [1, t, vocab]`: one-hot logits (0 at the guess,
    -inf elsewhere) where there is a match, so q is a point mass and the target accepts it with probability
    p(guess); with no match, nearly uniform logits whose argmax repeats the last token, so that
    `speculative_generate(..., min_draft_prob=0.5)` stops drafting there."""

    def __init__(self, vocab_size: int, ngram: int = 3, device: torch.device | str = "cpu"):
        if ngram < 1:
            raise ValueError(f"ngram must be >= 1; got {ngram}")
        from lib.modeling.llama import ModelConfig

        self.config = ModelConfig(vocab_size=vocab_size, d_model=1, n_layers=0, n_heads=1, n_kv_heads=1, d_ff=1,
                                  max_seq_len=1 << 30)
        self.ngram = ngram
        self.device = torch.device(device)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> TokenHistory:
        if batch != 1:
            raise ValueError("PromptLookupDraft drafts for one sequence (batch 1)")
        return TokenHistory(max_len or 0)

    def guess(self, tokens: list[int]) -> int | None:
        """The token that followed the latest earlier occurrence of the longest matching suffix of `tokens`
        (None when no suffix of length >= 1 occurred before)."""
        n_tok = len(tokens)
        for n in range(min(self.ngram, n_tok - 1), 0, -1):
            suffix = tokens[n_tok - n:]
            for start in range(n_tok - n - 1, -1, -1):  # latest match first; it must be followed by a token
                if tokens[start:start + n] == suffix:
                    return tokens[start + n]
        return None

    def __call__(self, input_ids: torch.Tensor, cache: TokenHistory | None = None) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, t]; got {tuple(input_ids.shape)}")
        history = cache if cache is not None else TokenHistory(0)
        new = input_ids[0].tolist()
        logits = torch.full((1, len(new), self.config.vocab_size), float("-inf"), device=self.device)
        for i, tok in enumerate(new):
            history.tokens.append(tok)
            guess = self.guess(history.tokens)
            if guess is None:  # no match: uniform, with the last token a hair ahead (greedy repeats it)
                logits[0, i] = 0.0
                logits[0, i, tok] = 1e-3
            else:
                logits[0, i, guess] = 0.0
        return logits  # [1, t, vocab]


def _shell(target, config):
    """A LlamaModel object that shares the target's embedding, norm and head and has no layers yet."""
    from lib.modeling.llama import LlamaModel

    m = LlamaModel.__new__(LlamaModel)
    nn.Module.__init__(m)
    m.config = config
    m.attention_fn = target.attention_fn
    m.embed = target.embed
    m.norm = target.norm
    m.lm_head = target.lm_head
    return m.eval()


def early_exit_draft(target, n_layers: int):
    """The target's first `n_layers` blocks, then its final norm and LM head: a draft that shares every weight
    (no extra memory) and costs about n_layers / target layers of a step, plus the LM head."""
    if not 1 <= n_layers <= target.config.n_layers:
        raise ValueError(f"n_layers must be in 1..{target.config.n_layers}; got {n_layers}")
    m = _shell(target, target.config.replace(n_layers=n_layers))
    m.layers = nn.ModuleList(list(target.layers[:n_layers]))
    return m


def random_draft(config, n_layers: int = 2, d_model: int = 64, seed: int = 0, device=None):
    """A small randomly initialized model with the target's vocabulary: the α ≈ 0 baseline."""
    from lib.modeling.llama import tiny_model

    heads = max(1, d_model // 64)
    cfg = config.replace(n_layers=n_layers, d_model=d_model, n_heads=heads, n_kv_heads=heads, d_ff=2 * d_model)
    return tiny_model(seed=seed, config=cfg).to(device if device is not None else "cpu")


class Int8Linear(nn.Module):
    """A linear layer with int8 weights, one fp32 scale per output channel (symmetric, **weight-only**): the lab's
    one int8 linear (the week-18 quantized draft, and `lib.quantization.quant_linear.quantize_linears(..., "int8")` in week 20).

    w ≈ w_int8 · scale[:, None], scale = max|w_row| / 127; activations are not quantized. On the CPU the product
    runs in torch's `_weight_int8pack_mm` with bf16 activations (the fast path of that kernel; see
    platform-facts); elsewhere the weights are dequantized on the fly (`F.linear`). (`quantized.linear_dynamic`
    was tried too: it also quantizes the activations per tensor, and SmolLM2's activation outliers then cut
    the T = 1 acceptance of this draft to about 0.5.)"""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.register_buffer("scale_bf16", scale.to(torch.bfloat16))
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.use_kernel = hasattr(torch.ops.aten, "_weight_int8pack_mm")

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight `[out, in]` (for inspection and for devices without the int8 kernel)."""
        return self.qweight.float() * self.scale[:, None]

    def dequantized(self) -> torch.Tensor:
        """The weight the product uses, `[out, in]` float32 (`weight`)."""
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel and x.device.type == "cpu":
            x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)  # [tokens, in]
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scale_bf16)  # [tokens, out]
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight.to(x.dtype))


def quantized_draft(target):
    """A copy of the target whose every linear layer (and the LM head) holds int8 per-channel weights.

    Embedding and norms are shared with the target (the embedding lookup reads one row per token); the tied
    LM head becomes its own `Int8Linear`. Same architecture, so α is high; cost ≈ half a target step here."""
    from lib.modeling.llama import Block

    m = _shell(target, target.config.replace(tie_embeddings=False))
    layers = []
    for block in target.layers:
        b = Block.__new__(Block)
        nn.Module.__init__(b)
        b.attn_norm, b.mlp_norm = block.attn_norm, block.mlp_norm
        attn = type(block.attn).__new__(type(block.attn))
        nn.Module.__init__(attn)
        attn.n_heads, attn.n_kv_heads, attn.head_dim = block.attn.n_heads, block.attn.n_kv_heads, block.attn.head_dim
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(attn, name, Int8Linear(getattr(block.attn, name).weight))
        mlp = type(block.mlp).__new__(type(block.mlp))
        nn.Module.__init__(mlp)
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(mlp, name, Int8Linear(getattr(block.mlp, name).weight))
        b.attn, b.mlp = attn, mlp
        layers.append(b)
    m.layers = nn.ModuleList(layers)
    head = target.embed.weight if target.lm_head is None else target.lm_head.weight
    m.lm_head = Int8Linear(head)
    return m.eval()


# --- FR-Spec: a frequency-ranked vocabulary subset for the draft's LM head ------------------------------------

def token_counts(ids, vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in `ids` (a tensor of any shape, or a list of such tensors): `[vocab]` int64."""
    pieces = ids if isinstance(ids, (list, tuple)) else [ids]
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for piece in pieces:
        flat = torch.as_tensor(piece).reshape(-1).to("cpu", torch.int64)
        if flat.numel() and (flat.min() < 0 or flat.max() >= vocab_size):
            raise ValueError(f"token ids must be in [0, {vocab_size}); got {int(flat.min())}..{int(flat.max())}")
        counts += torch.bincount(flat, minlength=vocab_size)
    return counts


def frequency_ranked_ids(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The `n` most frequent token ids, most frequent first (`[n]` int64). Ties, and the tokens a corpus never
    shows, are ranked by id: a BPE tokenizer numbers its tokens in merge order, and early merges are the pairs
    that were frequent in the tokenizer's own training corpus, so a low id is the better guess."""
    if counts.dim() != 1:
        raise ValueError(f"counts must be [vocab]; got {tuple(counts.shape)}")
    if not 1 <= n <= counts.shape[0]:
        raise ValueError(f"n must be in 1..{counts.shape[0]} (the vocabulary); got {n}")
    order = torch.sort(-counts.to(torch.int64), stable=True).indices  # stable: equal counts keep id order
    return order[:n].clone()


class SubsetHead(nn.Module):
    """An LM head restricted to `keep_ids [N]`: computes N logits with `head` (an `nn.Linear` or `Int8Linear` of
    N output rows) and writes them into a `[..., vocab]` tensor of -inf. Softmax then gives q = 0 outside the
    subset, and argmax never leaves it."""

    def __init__(self, head: nn.Module, keep_ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.head = head
        self.register_buffer("keep_ids", keep_ids.to(torch.int64))
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(x)  # [..., N]
        out = y.new_full((*y.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(y.dim() - 1, self.keep_ids, y)  # [..., vocab]


def _head_rows(draft, keep: torch.Tensor) -> nn.Module:
    """The rows `keep` of a draft's LM head, as a module of the same kind (fp32 linear or int8 linear)."""
    head = draft.lm_head
    if head is None:  # tied: the embedding matrix is the head
        head = nn.Linear(draft.config.d_model, len(keep), bias=False)
        head.weight = nn.Parameter(draft.embed.weight.detach()[keep].clone(), requires_grad=False)
        return head.to(draft.embed.weight.device)
    if isinstance(head, Int8Linear):
        rows = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(rows)
        for name in ("qweight", "scale", "scale_bf16"):  # per-row quantization: the kept rows are unchanged
            rows.register_buffer(name, getattr(head, name)[keep].contiguous())
        rows.in_features, rows.out_features, rows.use_kernel = head.in_features, len(keep), head.use_kernel
        return rows
    if isinstance(head, nn.Linear) and head.bias is None:
        rows = nn.Linear(head.in_features, len(keep), bias=False)
        rows.weight = nn.Parameter(head.weight.detach()[keep].clone(), requires_grad=False)
        return rows.to(head.weight.device)
    raise ValueError(f"fr_spec_draft: cannot restrict an LM head of type {type(head).__name__} "
                     "(expected none/tied, nn.Linear without bias, or Int8Linear)")


def fr_spec_draft(draft, keep_ids: torch.Tensor):
    """FR-Spec: the same draft, but its LM head scores only `keep_ids` (e.g. `frequency_ranked_ids(counts, N)`).

    `draft` is a `LlamaModel`-shaped draft (`early_exit_draft`, `quantized_draft`, `load_distilled_draft`, a
    `LlamaModel`); its layers, embedding and norm are shared, the kept head rows are copied (N × d_model).
    Logits outside the subset are -inf: a greedy draft picks its best token inside the subset, a sampling
    draft has q = 0 outside it. Verification is unchanged, so greedy output is still the target's and sampled
    output still has the target's law; a token outside the subset can only be written by the target itself
    (as the correction or bonus token), which costs acceptance, not exactness."""
    from lib.modeling.llama import LlamaModel

    if not all(hasattr(draft, name) for name in ("embed", "layers", "norm", "config")):
        raise ValueError(f"fr_spec_draft needs a LlamaModel-shaped draft (embed, layers, norm, lm_head); got "
                         f"{type(draft).__name__}")
    vocab = draft.config.vocab_size
    keep = torch.as_tensor(keep_ids, dtype=torch.int64).reshape(-1).cpu()
    if keep.numel() == 0 or keep.min() < 0 or keep.max() >= vocab or keep.unique().numel() != keep.numel():
        raise ValueError(f"keep_ids must be distinct token ids in [0, {vocab}), at least one")
    m = LlamaModel.__new__(LlamaModel)
    nn.Module.__init__(m)
    m.config = draft.config.replace(tie_embeddings=False)
    m.attention_fn = draft.attention_fn
    m.embed, m.layers, m.norm = draft.embed, draft.layers, draft.norm
    device = draft.embed.weight.device
    m.lm_head = SubsetHead(_head_rows(draft, keep.to(device)), keep.to(device), vocab)
    return m.eval()


# --- a distilled draft (trained by tools/distill_draft.py) ----------------------------------------------------

DISTILL_COMMAND = "python tools/distill_draft.py --minutes 10"


def distilled_draft_path(n_layers: int = 2):
    """Where `tools/distill_draft.py --layers n_layers` saves its checkpoint (data/cache, never committed)."""
    from lib.bench import paths

    return paths.CACHE_DIR / f"smollm2-distilled-draft-{n_layers}l.pt"


def build_distilled_draft(target, n_layers: int = 2, init_from: list[int] | None = None):
    """A small draft of `n_layers` blocks of the target's shape that **shares the target's embedding, final
    norm and (tied) LM head**, its blocks initialized as copies of the target's blocks `init_from` (default: the
    first `n_layers`). `tools/distill_draft.py` trains the blocks (and only them) on KL to the target."""
    import copy as _copy

    layers = init_from if init_from is not None else list(range(n_layers))
    if len(layers) != n_layers or not all(0 <= i < target.config.n_layers for i in layers):
        raise ValueError(f"init_from must list {n_layers} layer indices in 0..{target.config.n_layers - 1}; "
                         f"got {layers}")
    m = _shell(target, target.config.replace(n_layers=n_layers))
    m.layers = nn.ModuleList([_copy.deepcopy(target.layers[i]) for i in layers])
    return m


def save_distilled_draft(draft, path, **extra) -> None:
    """Save a draft of `build_distilled_draft`'s shape: its blocks only (the rest is the target's), plus `extra`."""
    state = {"n_layers": len(draft.layers),
             "layers": {k: v.detach().cpu().clone() for k, v in draft.layers.state_dict().items()}}
    state.update(extra)
    torch.save(state, path)


def load_distilled_draft(target, n_layers: int = 2, path=None):
    """The draft `tools/distill_draft.py` trained, on the target's device, sharing its embedding and LM head.

    Raises FileNotFoundError naming the command that builds it when there is no checkpoint."""
    from pathlib import Path

    path = Path(path) if path is not None else distilled_draft_path(n_layers)
    if not path.exists():
        raise FileNotFoundError(f"no distilled draft at {path}; build it with `{DISTILL_COMMAND} --layers "
                                f"{n_layers}` (about 10 CPU-minutes; a few minutes gives a weaker draft)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if int(state["n_layers"]) != n_layers:
        raise ValueError(f"{path} holds a {int(state['n_layers'])}-layer draft, not {n_layers}")
    m = build_distilled_draft(target, n_layers)
    m.layers.load_state_dict(state["layers"])
    return m.to(target.device).eval()


# --- distilling a draft on the target's own answers (week 18, section 7) --------------------------------------

@torch.no_grad()
def target_answers(target, prompts: list, n_new: int, top: int = 32) -> dict:
    """The target's greedy answers to `prompts` (each `[1, t]` ids, or a list of ints), decoded side by side one
    position per step — a row reads its own prompt until it ends and its own answer after, so nothing is padded —
    and, at every position, the target's distribution of the next token, kept as its `top` most likely tokens.

    Returns {"tokens": [B, L] ids, "top_p": [B, L, top] probabilities, "top_ids": [B, L, top] int64, "mask": [B, L]
    bool (True where the next token is part of an answer: from each prompt's last token on), "prompt_len": [B]}, on
    the CPU, L = the longest prompt + n_new."""
    rows = [torch.as_tensor(p).reshape(-1).tolist() for p in prompts]
    b, device = len(rows), target.device
    lens = torch.tensor([len(r) for r in rows])
    length = int(lens.max()) + n_new
    tokens = torch.zeros(b, length, dtype=torch.int64)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
    top_p = torch.empty(b, length, top)
    top_ids = torch.empty(b, length, top, dtype=torch.int64)
    cache = target.new_cache(batch=b, max_len=length)
    for j in range(length):
        probs = torch.softmax(target(tokens[:, j:j + 1].to(device), cache=cache)[:, 0].float(), -1)  # [B, vocab]
        p, ids = probs.topk(top, dim=-1)
        top_p[:, j], top_ids[:, j] = p.cpu(), ids.cpu()
        if j + 1 < length:
            answering = lens <= j + 1  # position j + 1 is past the prompt: the target's greedy token goes there
            tokens[answering, j + 1] = ids[:, 0].cpu()[answering]
    pos = torch.arange(length)[None]
    mask = (pos >= lens[:, None] - 1) & (pos < length - 1)
    return {"tokens": tokens, "top_p": top_p, "top_ids": top_ids, "mask": mask, "prompt_len": lens}


def distill_loss(draft, tokens: torch.Tensor, top_p: torch.Tensor, top_ids: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) of the draft's next-token distribution q from the target's p, averaged over the positions of
    `mask` (`tokens [B, L]`; p given by its `top` most likely tokens `top_p, top_ids [B, L, top]`, renormalized over
    them: the rest of p's mass, usually a few percent, is left out). Differentiable in the draft's weights."""
    log_q = torch.log_softmax(draft(tokens.to(draft.device)).float(), -1)  # [B, L, vocab]
    p = top_p.to(log_q.device)
    p = p / p.sum(-1, keepdim=True)
    log_q_top = log_q.gather(-1, top_ids.to(log_q.device))  # [B, L, top]
    kl = (p * (p.clamp(min=1e-12).log() - log_q_top)).sum(-1)  # [B, L]
    m = mask.to(kl.device)
    return (kl * m).sum() / m.sum().clamp(min=1)
