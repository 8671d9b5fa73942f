"""A draft head that reads the target's hidden state (EAGLE-style, with an FR-Spec output layer) — week 18.

    head = load_draft_head(model)                              # the committed head (data/draft_head/)
    stats = SpecStats()
    ids = head_speculative_generate(FastLlama(model), head, prompt_ids, 64, k=4, stats=stats)
    # temperature 0: exactly lib.modeling.generate.generate(target, prompt_ids, 64); stats.acceptance_rate is α

A separate small draft model has to rebuild, from the tokens alone, what the target already knows. EAGLE (Li et
al. 2024) lets the draft read it instead: the target's **last hidden state** h_t (the final-normed vector its LM
head reads at position t) together with the embedding of the token x_{t+1} that followed goes through one small
layer, which predicts h_{t+1}; the target's own LM head rows turn that prediction into logits for x_{t+2}. Here:

- input  `fc([embed(x_{t+1}) ; h_t])`  (2 d_model -> d_model), then **one** Llama block (its own RoPE and KV cache),
  whose output ĥ_{t+1} is trained to be h_{t+1};
- output FR-Spec (Zhao et al. 2025): only the `keep_ids` rows of the target's (tied) LM head, the most frequent
  tokens of the target's own answers: N × d_model instead of 49,152 × d_model. Tokens outside the subset are
  never drafted (q = 0 there); the target still verifies over the whole vocabulary, so the output stays exact.
- drafting K tokens: the first draft token comes from the target's true hidden state; the next K - 1 feed the
  head its own predicted ĥ (the target has not run on those tokens yet). After verification the head's cache is
  rolled back to the true-feature positions and the accepted tokens are fed with the target's true hidden
  states, which the verify forward has just computed (no extra target work).

Training (self-distillation on the target's own greedy chat answers) is `tools/train_draft_head.py`; the
weights it writes (the fc and block only, int8 per row; the embedding and head rows are the target's) are
`data/draft_head/head.pt`, a few MB.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.modeling.kv_cache import KVCache
from lib.attn.masks import causal_mask
from lib.modeling.llama import Block, rope_cos_sin
from lib.spec_decode.speculative import SpecStats, sample_from, decode_args, verify

HEAD_PATH = Path(__file__).resolve().parents[2] / "data" / "draft_head" / "head.pt"
TRAIN_COMMAND = "python tools/train_draft_head.py --minutes 8 --seed 0 --prompts 384"
EAGLE_PATH = HEAD_PATH.with_name("eagle.pt")  # where that pipeline writes its head (with .sha256 and .json)
EAGLE_COMMAND = "python tools/train_eagle.py"  # the EAGLE-style pipeline (data at scale, epochs, learning curve)


class DraftHeadChecksumError(RuntimeError):
    """The weights file does not match the sha256 recorded beside it (`<file>.sha256`)."""


def checksum_path(path) -> Path:
    """Where the sha256 of a saved head is recorded: `head.pt` -> `head.pt.sha256` (a line `<hex>  head.pt`)."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def target_forward(target, input_ids: torch.Tensor, cache=None):
    """`(logits [B, T, vocab], hidden [B, T, d_model])` of the target: `target.forward_hidden` when it has one
    (`lib.modeling.fast.FastLlama`), else a `lib.modeling.llama.LlamaModel`'s final norm output, caught with a forward hook."""
    fh = getattr(target, "forward_hidden", None)
    if fh is not None:
        return fh(input_ids, cache)
    seen = []
    handle = target.norm.register_forward_hook(lambda mod, args, out: seen.append(out))
    try:
        logits = target(input_ids, cache=cache)
    finally:
        handle.remove()
    return logits, seen[-1]


class DraftHead(nn.Module):
    """`head(tokens [B, t], hidden [B, t, D], cache=None) -> (logits [B, t, N], predicted hidden [B, t, D])`.

    Entry i reads token `tokens[:, i]` (= x_{j+1}) and the target's (or the head's own predicted) hidden state
    `hidden[:, i]` (= h_j) at cache position j, and predicts h_{j+1} and the logits of x_{j+2} over `keep_ids`
    (`[N]`, the FR-Spec subset: column n of the logits is token `keep_ids[n]`). The token embedding and the
    output rows are the target's, frozen and shared (not saved); `fc` and `block` are the trained part."""

    def __init__(self, target_config, embed_weight: torch.Tensor, keep_ids: torch.Tensor, d_ff: int = 1024):
        super().__init__()
        d = target_config.d_model
        self.config = target_config.replace(n_layers=1, d_ff=d_ff)
        keep = torch.as_tensor(keep_ids, dtype=torch.int64).reshape(-1)
        vocab = target_config.vocab_size
        if keep.numel() == 0 or keep.min() < 0 or keep.max() >= vocab or keep.unique().numel() != keep.numel():
            raise ValueError(f"keep_ids must be distinct token ids in [0, {vocab}), at least one")
        if tuple(embed_weight.shape) != (vocab, d):
            raise ValueError(f"embed_weight must be the target's [vocab, d_model] = [{vocab}, {d}]; got "
                             f"{tuple(embed_weight.shape)}")
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.block = Block(self.config)
        self.register_buffer("keep_ids", keep.to(embed_weight.device), persistent=False)
        # the target's embedding (looked up by row) and its tied head rows for the kept tokens: frozen, not saved
        object.__setattr__(self, "embed_weight", embed_weight.detach())
        self.register_buffer("out_weight", embed_weight.detach()[keep.to(embed_weight.device)].clone(),
                             persistent=False)  # [N, D]
        self.to(embed_weight.device)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        return KVCache.for_model(self.config, batch, max_len, dtype=self.fc.weight.dtype, device=self.device)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache | None = None,
                positions: list[int] | None = None, mask: torch.Tensor | None = None):
        """`positions` and `mask` (bool `[t, cached + t]`, True where attention is allowed) place entries in a draft
        tree (lib.spec_decode.tree_speculative); by default the entries follow the cache's, causally."""
        b, t = tokens.shape
        if hidden.shape != (b, t, self.config.d_model):
            raise ValueError(f"hidden must be [B, t, d_model] = [{b}, {t}, {self.config.d_model}]; got "
                             f"{tuple(hidden.shape)}")
        start = cache.length if cache is not None else 0
        positions = torch.arange(start, start + t, device=tokens.device) if positions is None else \
            torch.tensor(positions, device=tokens.device)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        x = self.fc(torch.cat([self.embed_weight[tokens], hidden.to(self.fc.weight.dtype)], dim=-1))  # [B, t, D]
        attention = _attention if mask is None else \
            (lambda q, k, v, causal=True: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
        x = self.block(x, cos, sin, cache[0] if cache is not None else None, attention)
        return F.linear(x, self.out_weight), x  # [B, t, N], [B, t, D]


def _attention(q, k, v, causal=True):
    """Bottom-right causal SDPA with GQA (the head's block attends over its own cache)."""
    t, s = q.shape[-2], k.shape[-2]
    if t == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if t == s:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t, s, device=q.device), enable_gqa=True)


# --- training (self-distillation; tools/train_draft_head.py runs it on SmolLM2's own chat answers) ---------------

def head_loss(head: DraftHead, tokens: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor,
              mask: torch.Tensor, ce_weight: float = 0.1, self_fed: float = 0.5):
    """`(loss, top-1 agreement)` of the head on sequences the target has read.

    `tokens [B, L]`; `hidden [B, L, D]` the target's final-normed hidden states on them; `labels [B, L]` the
    target's greedy token after each position; `mask [B, L]` (bool) the positions whose next token counts (the
    answers). Entry j reads (h_j, x_{j+1}) and is scored on ĥ_{j+1} against h_{j+1} (smooth L1, as in EAGLE) and
    on its logits against the target's greedy token after position j + 1 (cross-entropy over the kept tokens;
    a label outside them is left out of the CE). With `self_fed > 0` a second pass feeds every entry the
    head's own prediction ĥ_j from the first pass instead of h_j — what drafting token 2..K does — and adds
    that pass's loss with this weight. Top-1 agreement is the first pass's, over masked positions whose
    label is kept."""
    index = torch.full((head.config.vocab_size,), -100, dtype=torch.int64, device=tokens.device)
    index[head.keep_ids] = torch.arange(head.keep_ids.numel(), device=tokens.device)
    x_next, h_in, h_out = tokens[:, 1:], hidden[:, :-1], hidden[:, 1:]
    lab = index[labels[:, 1:]]  # [B, L-1]: subset index of the target's next token, -100 outside the subset
    m = mask[:, 1:]
    lab = torch.where(m, lab, torch.full_like(lab, -100))

    def one(h):
        logits, feat = head(x_next, h)
        reg = F.smooth_l1_loss(feat[m], h_out[m])
        ce = F.cross_entropy(logits.flatten(0, 1), lab.flatten(), ignore_index=-100)
        return reg + ce_weight * ce, logits, feat

    loss, logits, feat = one(h_in)
    ok = lab != -100
    top1 = (logits.argmax(-1)[ok] == lab[ok]).float().mean()
    if self_fed > 0:
        own = torch.cat([h_in[:, :1], feat[:, :-1]], dim=1)  # entry j reads ĥ_j, predicted by entry j - 1
        loss = loss + self_fed * one(own)[0]
    return loss, top1


# --- saving and loading (int8 per output row: the committed file stays small) ---------------------------------

def _quantize_rows(w: torch.Tensor):
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127.0  # [out, 1]
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale.float()


def save_draft_head(head: DraftHead, path, **meta) -> None:
    """The trained part (fc, block) with each matrix stored int8 per output row (norm gains fp32), plus
    `keep_ids`, `d_ff` and `meta` (how it was trained). Load with `load_draft_head`."""
    state = {}
    for name, tensor in {"fc.weight": head.fc.weight, **{f"block.{k}": v for k, v in head.block.state_dict().items()}}.items():
        t = tensor.detach().float().cpu()
        state[name] = _quantize_rows(t) if t.dim() == 2 else t.clone()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state": state, "keep_ids": head.keep_ids.cpu().to(torch.int32), "d_ff": head.config.d_ff,
                "meta": meta}, path)
    from lib.bench.paths import sha256_of

    checksum_path(path).write_text(f"{sha256_of(Path(path))}  {Path(path).name}\n")


def verify_checksum(path) -> str:
    """The sha256 of the head at `path`, checked against `<path>.sha256`; a `DraftHeadChecksumError` saying what is
    wrong and how to rebuild when the record is missing or differs."""
    from lib.bench.paths import sha256_of

    path, record = Path(path), checksum_path(path)
    fix = (f"restore the committed file (`git checkout -- {path.name}` in its folder) or rebuild it: `{EAGLE_COMMAND}`"
           f" (the EAGLE-style head) or `{TRAIN_COMMAND}` (the week-18 head); both write the checksum beside it")
    if not record.exists():
        raise DraftHeadChecksumError(f"no checksum recorded for the draft head {path} (expected {record}); {fix}")
    want = record.read_text().split()[0].lower() if record.read_text().split() else ""
    got = sha256_of(path)
    if got != want:
        raise DraftHeadChecksumError(f"the draft head {path} is corrupt or was replaced: its sha256 is {got}, but "
                                     f"{record.name} records {want or '(nothing)'}; {fix}")
    return got


def load_draft_head(model, path=None) -> DraftHead:
    """The head saved at `path` (default: the committed `data/draft_head/head.pt`) for `model` (a
    `lib.modeling.llama.LlamaModel`; its embedding is shared), on the model's device, in eval mode, weights dequantized. The
    file's sha256 must match the one recorded beside it (`<path>.sha256`, written by `save_draft_head`), else a
    `DraftHeadChecksumError` says what differs and how to rebuild.
    On the CPU its linears multiply with packed weights (`lib.modeling.fast_kernels.pack_linears`)."""
    path = Path(path) if path is not None else HEAD_PATH
    if not path.exists():
        raise FileNotFoundError(f"no draft head at {path}; train one with `{TRAIN_COMMAND}` or `{EAGLE_COMMAND}`")
    sha = verify_checksum(path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    head = DraftHead(model.config, model.embed.weight, blob["keep_ids"].to(torch.int64), d_ff=int(blob["d_ff"]))
    state = {name: (v[0].float() * v[1] if isinstance(v, (tuple, list)) else v) for name, v in blob["state"].items()}
    head.fc.weight.data.copy_(state.pop("fc.weight"))
    head.block.load_state_dict({k[len("block."):]: v for k, v in state.items()})
    head.meta = blob.get("meta", {})
    head.sha256 = sha
    head.requires_grad_(False)
    from lib.modeling.fast_kernels import pack_linears

    return pack_linears(head.eval())


def head_step(head: DraftHead, target, ids: torch.Tensor, context: int = 128):
    """A `lib.spec_decode.speculative.relative_cost` step for the head: one draft entry after `context` cached ones (the
    head's input hidden states are the target's on `ids [1, > context]`)."""
    with torch.no_grad():
        _, hidden = target_forward(target, ids[:, :context + 1])  # [1, context + 1, D]
        cache = head.new_cache(1, context + 1)
        head(ids[:, 1:context + 1], hidden[:, :context], cache=cache)
    tok, h = ids[:, context + 1:context + 2], hidden[:, context:context + 1]

    def step():
        cache.truncate(context)
        with torch.no_grad():
            head(tok, h, cache=cache)

    return step


# --- generation ---------------------------------------------------------------------------------------------

@torch.no_grad()
def head_speculative_generate(target, head: DraftHead, input_ids: torch.Tensor, max_new_tokens: int, k: int = 4,
                              temperature: float = 0.0, generator: torch.Generator | None = None,
                              stats: SpecStats | None = None) -> torch.Tensor:
    """`[1, T + max_new_tokens]` ids decoded speculatively with a draft head that reads the target's hidden state.

    The target prefills the prompt (1 call, 1 token); then each round the head drafts up to `k` tokens and the
    target verifies them in one forward, as `lib.spec_decode.speculative.speculative_generate` does. Temperature 0 gives the
    ids of `lib.modeling.generate.generate(target, ...)`; temperature > 0 samples the target's law (`verify`). `stats`
    counts drafted / accepted tokens (α = accepted / drafted), rounds, target and head calls and new tokens
    (tokens = 1 + accepted + rounds)."""
    if head.config.vocab_size != target.config.vocab_size or head.config.d_model != target.config.d_model:
        raise ValueError("the draft head was built for another target (vocabulary or d_model differ)")
    ids, max_len = decode_args("head_speculative_generate", target, input_ids, max_new_tokens, k, temperature)
    device = target.device
    t0 = ids.shape[1]
    if max_new_tokens == 0:
        return ids.clone()
    stats = stats if stats is not None else SpecStats()
    greedy = temperature == 0.0
    keep = head.keep_ids.tolist()
    vocab = target.config.vocab_size

    def pick(logits):  # [V] target logits -> next token
        if greedy:
            return int(logits.argmax())
        return sample_from(torch.softmax(logits.float() / temperature, -1), generator)

    tcache, hcache = target.new_cache(1, max_len), head.new_cache(1, max_len)
    logits, hidden = target_forward(target, ids, tcache)  # [1, T, V], [1, T, D]
    stats.target_calls += 1
    out = ids[0].tolist() + [pick(logits[0, -1])]
    stats.tokens += 1
    # the head's entries so far: (h_j, x_{j+1}) for j = 0 .. T-1, all with the target's true hidden states
    feed_tokens, feed_hidden = torch.tensor([out[1:]], device=device), hidden
    while len(out) - t0 < max_new_tokens:
        kk = min(k, max_new_tokens - (len(out) - t0) - 1)  # leave room for the token verify adds
        drafted, q_rows = [], []
        if kk > 0:
            hl, feat = head(feed_tokens, feed_hidden, cache=hcache)  # true features up to the newest token
            stats.draft_calls += 1
            for i in range(kk):
                row = hl[0, -1].float()  # [N]
                if greedy:
                    tok = keep[int(row.argmax())]
                else:
                    q = row.new_zeros(vocab).index_copy_(0, head.keep_ids, torch.softmax(row / temperature, -1))
                    tok = sample_from(q, generator)
                    q_rows.append(q)
                drafted.append(tok)
                if i + 1 < kk:  # the head reads its own predicted hidden state for the next draft token
                    hl, feat = head(torch.tensor([[tok]], device=device), feat[:, -1:], cache=hcache)
                    stats.draft_calls += 1
        true_len = len(out) - 1  # head entries that read true hidden states
        # the target scores the newest token and the drafts in one forward: [1, kk + 1, V] and its hidden states
        logits, hidden = target_forward(target, torch.tensor([out[-1:] + drafted], device=device), tcache)
        stats.target_calls += 1
        if greedy:
            best = logits[0].argmax(-1).tolist()
            n = 0
            while n < kk and drafted[n] == best[n]:
                n += 1
            nxt = best[n]
        else:
            p = torch.softmax(logits[0].float() / temperature, -1)
            q = torch.stack(q_rows) if q_rows else p.new_zeros(0, vocab)
            n, nxt = verify(p, q, torch.tensor(drafted, dtype=torch.int64, device=device), generator)
        out += drafted[:n] + [nxt]
        stats.rounds += 1
        stats.drafted += kk
        stats.accepted += n
        stats.tokens += n + 1
        # roll back: the target keeps the kept tokens (the newest is unseen); the head keeps its true-feature
        # entries, and next round reads the accepted ones with the target's true hidden states
        tcache.truncate(len(out) - 1)
        if kk == 0:  # the last token came from the target alone: nothing left to draft
            break
        hcache.truncate(true_len)
        feed_tokens = torch.tensor([out[true_len + 1:]], device=device)  # [1, n + 1]: x_{j+1}
        feed_hidden = hidden[:, :n + 1]  # [1, n + 1, D]: h_j, j = true_len .. true_len + n
    return torch.tensor([out], dtype=input_ids.dtype, device=device)
