"""Distill a small draft for speculative decoding from SmolLM2-135M (week 18, `lib.spec_decode.speculative`).

    python tools/distill_draft.py --minutes 10            # the default draft: 2 layers, about 10 CPU-minutes
    python tools/distill_draft.py --minutes 4 --layers 4  # a shorter run, a deeper draft

The draft has `--layers` blocks of the target's shape (d_model 576, GQA 9:3), initialized as copies of the
target's first blocks, and **shares the target's embedding, final norm and tied LM head, frozen**: only the
blocks train. Loss: KL(p ‖ q) at temperature 1 between the target's next-token distribution p and the draft's q,
on random 128-token windows of text in the repo: the first 80 % of data/text/hamlet.txt (the last 20 % is held
out for evaluation, and the FR-Spec counts of the notebook use the same 80 %) and the repo's Markdown files
(modern technical English; SmolLM2's chat answers are closer to that than to Hamlet).

At the end it prints α (T = 0: argmax agreement; T = 1: Σ min(p, q)) on the held-out Hamlet and on the target's
own greedy answers to chat prompts (teacher forcing), and c (one draft step / one target step after a 128-token
context). The checkpoint (the blocks only, ~28 MB for 2 layers) goes to data/cache (never committed); it is saved
every minute, so an interrupted run leaves a usable draft. Load it with `lib.spec_decode.drafts.load_distilled_draft`.
"""
from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CHAT_PROMPTS = [
    "What are three tips for staying healthy?",
    "Explain what a hash table is to a beginner.",
    "Write a short story about a robot who learns to paint.",
]


def corpus(tok):
    """(train ids [n], held-out Hamlet ids [m]): Hamlet's first 80 % + the repo's Markdown; Hamlet's last 20 %."""
    from lib.modeling.text import load_text

    hamlet = tok(load_text("hamlet"), return_tensors="pt").input_ids[0]
    split = int(0.8 * hamlet.numel())
    docs = [p for p in sorted(glob.glob(str(REPO / "**" / "*.md"), recursive=True)) if "/.venv/" not in p]
    md = tok("\n\n".join(Path(p).read_text(errors="ignore") for p in docs), return_tensors="pt").input_ids[0]
    return torch.cat([hamlet[:split], md]), hamlet[split:]


def chat_answers(model, tok, n_new: int = 32):
    """The target's greedy answers to CHAT_PROMPTS, prompt included: a list of [1, t] ids."""
    from lib.modeling.generate import generate
    from lib.spec_decode.speculative import chat_ids

    out = []
    for text in CHAT_PROMPTS:
        ids = chat_ids(tok, text, model.device)
        out.append((generate(model, ids, n_new), ids.shape[1]))
    return out


@torch.no_grad()
def alphas(target, draft, pieces):
    """(α at T=0, α at T=1) over the scored positions of `pieces` = [(ids [1, t], first scored position)]."""
    from lib.spec_decode.speculative import acceptance_rate

    a0, a1, n = 0.0, 0.0, 0
    for ids, start in pieces:
        lp, lq = target(ids)[0, start - 1:-1], draft(ids)[0, start - 1:-1]  # predictions of tokens start..t-1
        a0 += (lp.argmax(-1) == lq.argmax(-1)).float().sum().item()
        a1 += acceptance_rate(torch.softmax(lp, -1), torch.softmax(lq, -1)).sum().item()
        n += lp.shape[0]
    return a0 / n, a1 / n


@torch.no_grad()
def step_cost(target, draft, ids, context: int = 128, repeats: int = 7) -> float:
    """c: one draft decode step / one target decode step after `context` tokens (median of side-by-side ratios)."""
    def one(m, cache):
        cache.truncate(context)
        t0 = time.perf_counter()
        m(ids[:, context:context + 1], cache=cache)
        return time.perf_counter() - t0

    tc, dc = target.new_cache(max_len=context + 1), draft.new_cache(max_len=context + 1)
    target(ids[:, :context], cache=tc)
    draft(ids[:, :context], cache=dc)
    one(target, tc), one(draft, dc)
    return float(torch.tensor([one(draft, dc) / one(target, tc) for _ in range(repeats)]).median())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2, help="draft blocks (default 2)")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time budget (default 10)")
    parser.add_argument("--seq", type=int, default=128, help="tokens per training window")
    parser.add_argument("--batch", type=int, default=2, help="windows per step")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default=None, help="checkpoint path (default: lib.spec_decode.drafts.distilled_draft_path)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from tqdm.auto import tqdm

    from lib.spec_decode.drafts import build_distilled_draft, distilled_draft_path, save_distilled_draft
    from lib.modeling.llama import load_smollm2

    torch.manual_seed(args.seed)
    target, tok = load_smollm2(device="cpu")
    target.requires_grad_(False)  # the teacher, and the embedding / norm / head the draft shares, stay frozen
    draft = build_distilled_draft(target, args.layers)
    params = [p for p in draft.layers.parameters()]
    for p in params:
        p.requires_grad_(True)
    out = Path(args.out) if args.out else distilled_draft_path(args.layers)
    out.parent.mkdir(parents=True, exist_ok=True)

    train, held_out = corpus(tok)
    print(f"draft: {args.layers} blocks ({sum(p.numel() for p in params) / 1e6:.1f} M trainable parameters), "
          f"shared frozen embedding/norm/LM head; corpus {train.numel()} tokens (Hamlet 80 % + repo Markdown), "
          f"held out {held_out.numel()} Hamlet tokens; {torch.get_num_threads()} threads; budget {args.minutes} min")
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)

    def save(steps, seconds, extra=None):
        save_distilled_draft(draft, out, steps=steps, train_seconds=seconds, seq=args.seq, batch=args.batch,
                                  **(extra or {}))

    budget = 60.0 * args.minutes
    start = last_save = time.perf_counter()
    steps, ema = 0, None
    bar = tqdm(total=int(budget), unit="s", desc="distilling")
    while time.perf_counter() - start < budget:
        starts = torch.randint(0, train.numel() - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([train[s:s + args.seq] for s in starts.tolist()])  # [B, S]
        with torch.no_grad():
            log_p = F.log_softmax(target(x), -1)  # [B, S, vocab], the teacher
        log_q = F.log_softmax(draft(x), -1)
        loss = F.kl_div(log_q.flatten(0, 1), log_p.flatten(0, 1), log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        steps += 1
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        now = time.perf_counter()
        bar.update(int(now - start) - bar.n)
        bar.set_postfix(step=steps, kl=f"{ema:.3f}")
        if now - last_save > 60:
            save(steps, now - start)
            last_save = now
    bar.close()
    seconds = time.perf_counter() - start
    draft.eval()
    for p in params:
        p.requires_grad_(False)

    pieces = [(held_out[None, i:i + 256], 1) for i in range(0, min(held_out.numel(), 512) - 255, 256)]
    chats = chat_answers(target, tok)
    a_in = alphas(target, draft, pieces)
    a_chat = alphas(target, draft, chats)
    c = step_cost(target, draft, held_out[None, :129])
    save(steps, seconds, {"alpha_hamlet": a_in, "alpha_chat": a_chat, "c": c})
    print(f"{steps} steps in {seconds / 60:.1f} min ({steps * args.batch * args.seq} tokens), final KL ≈ {ema:.3f}")
    print(f"α held-out Hamlet: T=0 {a_in[0]:.3f}, T=1 {a_in[1]:.3f}; α chat answers: T=0 {a_chat[0]:.3f}, "
          f"T=1 {a_chat[1]:.3f}; c = {c:.2f} (draft step / target step)")
    print(f"saved {out} ({out.stat().st_size / 1e6:.0f} MB); load with lib.spec_decode.drafts.load_distilled_draft(model, "
          f"{args.layers})")


if __name__ == "__main__":
    main()
