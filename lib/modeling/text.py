"""Text for evaluation, and perplexity (weeks 16 onwards).

    text = load_text("hamlet")                       # data/text/hamlet.txt, Project Gutenberg
    ids = tokenizer(text, return_tensors="pt").input_ids[0, :4096]
    ppl = perplexity(model, ids, window=256, stride=128, progress=True)
    ppl, se = perplexity_se(token_nlls(model, ids), chunk=256)   # with a standard error across chunks

Perplexity is exp(mean negative log-likelihood) of every token after the first, each predicted from
the tokens before it. A model sees at most `window` tokens at once, so long texts are read in windows
that advance by `stride`: every forward scores only the `stride` tokens it has not scored yet, so each
of them has at least `window - stride` tokens of context (the first window excepted).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lib.bench import paths


def text_path(name: str = "hamlet"):
    path = paths.TEXT_DIR / f"{name}.txt"
    if not path.is_file():
        have = sorted(p.stem for p in paths.TEXT_DIR.glob("*.txt"))
        raise FileNotFoundError(f"no text {name!r} in {paths.TEXT_DIR}; available: {have}")
    return path


def load_text(name: str = "hamlet") -> str:
    """A committed public-domain text from data/text/ (e.g. "hamlet", Project Gutenberg)."""
    return text_path(name).read_text(encoding="utf-8")


@torch.no_grad()
def token_nlls(model, ids: torch.Tensor, window: int = 256, stride: int | None = None,
               progress: bool = False, desc: str = "perplexity") -> torch.Tensor:
    """Negative log-likelihood (nats) of tokens 1..n-1 of `ids` (`[n]` or `[1, n]`), each scored once.

    `model(ids [1, T]) -> logits [1, T, vocab]`. `stride` (default `window // 2`) must be < `window`.
    """
    ids = ids.reshape(-1)
    n = ids.numel()
    stride = window // 2 if stride is None else stride
    if n < 2:
        raise ValueError("need at least 2 tokens to score one")
    if not 1 <= stride < window:
        raise ValueError(f"need 1 <= stride < window (each forward predicts at most window - 1 tokens); "
                         f"got window={window}, stride={stride}")
    device = getattr(model, "device", ids.device)
    nll = torch.empty(n - 1)
    starts = range(1, n, stride)  # first token each forward scores
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(starts), desc=desc, leave=True)
    for first in starts:
        end = min(first + stride, n)  # score tokens first..end-1
        begin = max(0, end - window)  # the model sees ids[begin:end]
        logits = model(ids[begin:end].unsqueeze(0).to(device))[0]  # [end - begin, vocab]
        pred = logits[first - 1 - begin:end - 1 - begin].float()  # position p is predicted at p - 1
        nll[first - 1:end - 1] = F.cross_entropy(pred, ids[first:end].to(pred.device), reduction="none").cpu()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return nll


def perplexity(model, ids: torch.Tensor, window: int = 256, stride: int | None = None,
               progress: bool = False, desc: str = "perplexity") -> float:
    """exp(mean NLL) of `ids` under `model`, read in windows (see `token_nlls`)."""
    return math.exp(token_nlls(model, ids, window, stride, progress, desc).mean().item())


def perplexity_se(nll: torch.Tensor, chunk: int = 256, baseline: torch.Tensor | None = None) -> tuple[float, float]:
    """(perplexity, standard error) from token NLLs (`token_nlls`), or with `baseline` (the NLLs of another model
    on the same tokens) (perplexity − baseline's perplexity, its standard error), paired chunk by chunk.

    The tokens are cut into consecutive chunks of `chunk` (a partial last chunk is dropped from the spread
    only); neighbouring tokens are correlated, chunks much less, so the standard error of the mean NLL is
    the spread of the chunk means / sqrt(chunks), and perplexity's is exp(mean)·that (first order)."""
    nll = nll.double().reshape(-1)
    k = nll.numel() // chunk
    if k < 2:
        raise ValueError(f"need at least 2 chunks of {chunk} tokens for a standard error; got {nll.numel()} tokens")
    ppl = math.exp(nll.mean().item())
    if baseline is None:
        means = nll[:k * chunk].reshape(k, chunk).mean(1)
        return ppl, ppl * means.std().item() / math.sqrt(k)
    base = baseline.double().reshape(-1)
    if base.shape != nll.shape:
        raise ValueError(f"baseline has {base.numel()} NLLs, nll has {nll.numel()}: score the same tokens")
    base_ppl = math.exp(base.mean().item())
    # Δppl ≈ ppl·Δ(mean nll) to first order; the chunks' differences carry the paired spread
    diff = (nll[:k * chunk] - base[:k * chunk]).reshape(k, chunk).mean(1)
    return ppl - base_ppl, math.sqrt(ppl * base_ppl) * diff.std().item() / math.sqrt(k)
