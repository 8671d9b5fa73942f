"""Train the week-18 draft head (`lib.spec_decode.draft_head`) on SmolLM2-135M's own chat answers (self-distillation).

    python tools/train_draft_head.py --minutes 8 --seed 0 --prompts 384    # writes data/draft_head/head.pt (~3 MB)

1. **Data** (no downloads): chat prompts made here from templates × topics (`prompts()`; the benchmark's three
   chat prompts are not among them), answered greedily by the target itself — all prompts in a batch decode
   side by side, one position per step, each sequence reading its own prompt until it ends and its own answer
   after, so no padding is needed. Every step's final-normed hidden state and greedy token are kept: those are
   the head's inputs and labels. The answers (and states) are cached in data/cache (gitignored), keyed by the
   options, so a second run trains at once.
2. **FR-Spec subset**: the `--keep` most frequent tokens of the training answers (coverage printed on the
   held-out answers).
3. **Training**: AdamW on `lib.spec_decode.draft_head.head_loss` (feature regression + cross-entropy on the target's greedy
   token, plus a pass that feeds the head its own predicted features) for `--minutes` of wall-clock time.
4. **Evaluation**: top-1 agreement (α at T = 0, teacher forced) on held-out prompts, then the saved (int8)
   head drafting for the benchmark's chat prompts: α, tokens per call, identical to greedy.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

TEMPLATES = [
    "What are three tips for {}?", "Explain {} to a beginner.", "Write a short story about {}.",
    "What is the history of {}?", "Give me a list of five facts about {}.", "How do I get started with {}?",
    "Write a short poem about {}.", "What are the pros and cons of {}?", "Summarize the main ideas of {}.",
    "Why is {} important?", "Describe {} in simple words.", "Write an email to a friend about {}.",
    "What are common mistakes people make with {}?", "Compare {} with something similar.",
    "Teach me one interesting thing about {}.", "Write a product description for a book about {}.",
]
TOPICS = [
    "learning a new language", "gardening", "saving money", "the solar system", "machine learning", "cooking pasta",
    "climate change", "sleeping well", "the French revolution", "writing clean code", "running a marathon",
    "photography", "volcanoes", "public speaking", "the human heart", "chess", "recycling", "electric cars",
    "the ocean", "time management", "ancient Rome", "baking bread", "friendship", "bees",
]


def prompts() -> list[str]:
    """The training prompts: every template with every topic (384), none of benchmarks/speculative.py's CHAT."""
    return [t.format(topic) for t in TEMPLATES for topic in TOPICS]


@torch.no_grad()
def answer(target, prompt_ids: list[torch.Tensor], length: int, eos: int):
    """Greedy-decode all prompts side by side to `length` positions. Returns `(tokens [B, L], hidden [B, L, D],
    labels [B, L], mask [B, L])`: the ids, the target's final-normed hidden state and greedy next token at every
    position, and which positions' next token is part of an answer (from the prompt's last token up to EOS)."""
    b = len(prompt_ids)
    lens = torch.tensor([p.numel() for p in prompt_ids])
    tokens = torch.zeros(b, length, dtype=torch.int64)
    for i, p in enumerate(prompt_ids):
        tokens[i, :p.numel()] = p
    hidden = torch.empty(b, length, target.config.d_model)
    labels = torch.empty(b, length, dtype=torch.int64)
    cache = target.new_cache(b, length)
    for j in range(length):
        logits, h = target.forward_hidden(tokens[:, j:j + 1], cache)  # [B, 1, V], [B, 1, D]
        hidden[:, j], labels[:, j] = h[:, 0], logits[:, 0].argmax(-1)
        if j + 1 < length:
            answering = lens <= j + 1  # position j + 1 is past the prompt: the target's own token goes there
            tokens[answering, j + 1] = labels[answering, j]
    pos = torch.arange(length)[None]
    ended = torch.cumsum((tokens == eos) & (pos >= lens[:, None]), dim=1)  # answer tokens up to EOS count
    mask = (pos >= lens[:, None] - 1) & (pos < length - 1) & (ended == 0)
    return tokens, hidden, labels, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=8.0, help="training wall-clock budget (data generation apart)")
    parser.add_argument("--prompts", type=int, default=384, help="prompts answered (the last 16 are held out)")
    parser.add_argument("--length", type=int, default=160, help="positions per sequence (prompt + answer)")
    parser.add_argument("--gen-batch", type=int, default=32)
    parser.add_argument("--keep", type=int, default=4096, help="FR-Spec subset size")
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8, help="sequences per training step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-tokens", type=int, default=64, help="new tokens per chat prompt in the final check")
    parser.add_argument("--out", default=None, help="default: lib.spec_decode.draft_head.HEAD_PATH (data/draft_head/head.pt)")
    args = parser.parse_args()

    from lib.spec_decode import draft_head as dh
    from lib.bench import paths
    from lib.spec_decode.drafts import frequency_ranked_ids, token_counts
    from lib.spec_decode import speculative as spec
    from lib.modeling.fast import FastLlama
    from lib.modeling.generate import generate
    from lib.modeling.llama import load_smollm2

    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    model, tok = load_smollm2(device="cpu")
    model.requires_grad_(False)
    target = FastLlama(model)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; seed {args.seed}")

    # 1. data: the target's own answers, cached
    order = torch.randperm(len(prompts()), generator=torch.Generator().manual_seed(args.seed))
    chosen = [prompts()[i] for i in order[:args.prompts].tolist()]
    key = hashlib.sha256(repr((chosen, args.length, paths.SMOLLM2_SHA256)).encode()).hexdigest()[:12]
    data_path = paths.CACHE_DIR / f"draft-head-data-{key}.pt"
    t0 = time.perf_counter()
    if data_path.exists():
        data = torch.load(data_path, weights_only=True)
        print(f"answers reused from {data_path}")
    else:
        ids = [spec.chat_ids(tok, p)[0] for p in chosen]
        longest = max(i.numel() for i in ids)
        if longest >= args.length:
            parser.error(f"--length {args.length} leaves no room to answer: the longest chosen prompt is {longest} "
                         f"tokens (give --length more than {longest})")
        parts = []
        for s in range(0, len(ids), args.gen_batch):
            parts.append(answer(target, ids[s:s + args.gen_batch], args.length, tok.eos_token_id))
            print(f"  answered {min(s + args.gen_batch, len(ids))}/{len(ids)} prompts "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        data = dict(zip(("tokens", "hidden", "labels", "mask"), (torch.cat(x) for x in zip(*parts))))
        data_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, data_path)
    gen_seconds = time.perf_counter() - t0
    tokens, hidden, labels, mask = data["tokens"], data["hidden"], data["labels"], data["mask"]
    n_train = tokens.shape[0] - 16
    print(f"data: {tokens.shape[0]} answers x {args.length} positions, {int(mask[:n_train].sum())} training "
          f"answer tokens, {int(mask[n_train:].sum())} held out; {gen_seconds:.0f} s")

    # 2. FR-Spec subset from the training answers
    counts = token_counts(tokens[:n_train][mask[:n_train].roll(1, dims=1)], model.config.vocab_size)
    keep = frequency_ranked_ids(counts, args.keep)
    held = labels[n_train:][mask[n_train:]]
    covered = torch.isin(held, keep).float().mean().item()
    print(f"FR-Spec: {args.keep} most frequent answer tokens cover {covered:.3f} of the held-out answer tokens")

    # 3. train
    head = dh.DraftHead(model.config, model.embed.weight, keep, d_ff=args.d_ff)
    params = [p for p in head.parameters() if p.requires_grad]
    print(f"head: {sum(p.numel() for p in params) / 1e6:.2f} M trainable parameters (fc + 1 block, d_ff "
          f"{args.d_ff}); output layer {args.keep} x {model.config.d_model} rows of the target's head")
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    budget = 60.0 * args.minutes
    start, last, steps, ema = time.perf_counter(), 0.0, 0, None
    while (elapsed := time.perf_counter() - start) < budget:
        for group in opt.param_groups:  # linear warm-up (50 steps), then cosine decay over the time budget
            group["lr"] = args.lr * min(1.0, (steps + 1) / 50) * 0.5 * (1 + torch.cos(torch.tensor(elapsed / budget * torch.pi)).item())
        idx = torch.randint(0, n_train, (args.batch,), generator=gen)
        loss, top1 = dh.head_loss(head, tokens[idx], hidden[idx], labels[idx], mask[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        steps += 1
        ema = (loss.item(), top1.item()) if ema is None else (0.95 * ema[0] + 0.05 * loss.item(),
                                                            0.95 * ema[1] + 0.05 * top1.item())
        if elapsed - last > 30:
            print(f"  {elapsed / 60:4.1f} min, step {steps}: loss {ema[0]:.3f}, top-1 {ema[1]:.3f}", flush=True)
            last = elapsed
    train_seconds = time.perf_counter() - start
    head.eval().requires_grad_(False)

    # 4. save (int8), reload what was saved, evaluate it
    out = Path(args.out) if args.out else dh.HEAD_PATH
    with torch.no_grad():
        _, top1_fp32 = dh.head_loss(head, tokens[n_train:], hidden[n_train:], labels[n_train:], mask[n_train:],
                                    self_fed=0.0)
    meta = dict(command=" ".join(["python", "tools/train_draft_head.py"] + sys.argv[1:]), seed=args.seed,
                steps=steps, train_seconds=round(train_seconds), data_seconds=round(gen_seconds),
                answers=n_train, answer_tokens=int(mask[:n_train].sum()), length=args.length, batch=args.batch,
                lr=args.lr, torch=str(torch.__version__), threads=torch.get_num_threads())
    dh.save_draft_head(head, out, **meta)
    saved = dh.load_draft_head(model, out)
    with torch.no_grad():
        _, top1 = dh.head_loss(saved, tokens[n_train:], hidden[n_train:], labels[n_train:], mask[n_train:],
                               self_fed=0.0)
    print(f"{steps} steps in {train_seconds / 60:.1f} min; held-out top-1 (α at T=0, one token ahead, teacher "
          f"forced): fp32 {top1_fp32:.3f}, saved int8 {top1:.3f}")
    chat = ["What are three tips for staying healthy?", "Explain what a hash table is to a beginner.",
            "Write a short story about a robot who learns to paint."]  # benchmarks/speculative.py's CHAT
    chat_ids = [spec.chat_ids(tok, text) for text in chat]
    greedy = [generate(target, ids, args.eval_tokens) for ids in chat_ids]  # once, for every K
    for k in (2, 3, 4):
        st, same = spec.SpecStats(), True
        for ids, want in zip(chat_ids, greedy):
            same &= torch.equal(dh.head_speculative_generate(target, saved, ids, args.eval_tokens, k=k, stats=st),
                                want)
        print(f"benchmark chat prompts, K={k}: α {st.acceptance_rate:.3f}, tokens per target call "
              f"{st.tokens_per_call:.2f}, identical to greedy: {same}")
    print(f"saved {out} ({out.stat().st_size / 1e6:.1f} MB); total {(time.perf_counter() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
