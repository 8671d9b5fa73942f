"""Train an EAGLE-style draft head (`lib.spec_decode.draft_head.DraftHead`) for SmolLM2-135M at scale, with a held-out split by
template and topic, a learning curve and a final evaluation — the pipeline behind issue 60's α ≥ 0.6.

    python tools/train_eagle.py                 # the full run: writes data/draft_head/eagle.pt (+ .sha256, .json)
    python tools/train_eagle.py --quick         # the whole pipeline on tiny settings, in about a minute

1. **Prompts** (`tools/eagle_prompts.py`): several thousand chat prompts composed offline from templates x topics
   x styles; held-out prompts share neither template nor topic with training ones and include the benchmark's
   chat style (never its three prompts).
2. **Data** (`tools/eagle_data.py`): SmolLM2's greedy answers through the lab's batched engine (`lib.batching.engine`), then
   its final-normed hidden states by one teacher-forced forward (fp16), cached in data/cache keyed by the options;
   a time estimate after the first wave, then a progress bar.
3. **FR-Spec subset** chosen by measured coverage: the smallest of 1k..32k most frequent training answer tokens
   covering `--coverage` of the held-out answer tokens, or the whole vocabulary when its measured draft cost c is
   at most `--max-c` (c is measured for both and reported).
4. **Training**: EAGLE's recipe (`lib.spec_decode.draft_head.head_loss`: feature regression + cross-entropy, plus the self-fed
   pass that drafting tokens 2..K sees), `--epochs` over the data (capped by `--minutes`), AdamW with warm-up and
   cosine decay; every `--eval-every` steps the **learning curve**: held-out top-1 (teacher forced) and α per
   drafted token free-running at K = 1..4 on held-out prompts.
5. **Save** int8 per row with its sha256 beside it (`<out>.sha256`; `load_draft_head` refuses a mismatch).
6. **Evaluation** of the saved head: α per drafted token (top-1, T = 0) and tokens per round for linear K = 1..4,
   a static tree (4, 2, 1) and an EAGLE-2 dynamic tree (`lib.spec_decode.tree_speculative`), on held-out prompts and the
   benchmark's chat prompts, every output asserted identical to greedy. All of it goes to a result record
   (`lib.bench.records`: machine class, date, load; `--record` also writes results/<class>/draft-head-training.json)
   and beside the weights (`<out>.json`).

Uses CUDA when present; on the CPU torch's threads are the process's share (`lib.bench.threads`, applied on import).
The committed week-18 head (data/draft_head/head.pt) is not touched: `--out` defaults to data/draft_head/eagle.pt.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

QUICK = dict(train_prompts=16, held_prompts=4, max_new=16, gen_batch=16, epochs=1, batch=8, eval_every=100,
             eval_prompts=1, eval_tokens=8, final_prompts=1, final_tokens=8, minutes=1.0, cost_repeats=1)
SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-prompts", type=int, default=4000)
    p.add_argument("--held-prompts", type=int, default=96, help="held-out prompts (teacher-forced top-1)")
    p.add_argument("--max-new", type=int, default=192, help="answer tokens at most (EOS ends one earlier)")
    p.add_argument("--gen-batch", type=int, default=32, help="sequences answered at once")
    p.add_argument("--answers", choices=("auto", "engine", "side-by-side"), default="auto",
                   help="who answers: lib.batching.engine's LLMEngine, or FastLlama side by side (auto: the engine on a GPU, "
                        "side by side on the CPU, where it measured faster; the answers are the same greedy ones)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--minutes", type=float, default=30.0, help="cap on the training time (data apart)")
    p.add_argument("--batch", type=int, default=16, help="sequences per training step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--self-fed", type=float, default=0.5, help="weight of head_loss's self-fed pass")
    p.add_argument("--eval-every", type=int, default=400, help="steps between learning-curve points")
    p.add_argument("--eval-prompts", type=int, default=6, help="held-out prompts for α at K = 1..4 on the curve")
    p.add_argument("--eval-tokens", type=int, default=48)
    p.add_argument("--final-prompts", type=int, default=16, help="held-out prompts in the final evaluation")
    p.add_argument("--final-tokens", type=int, default=64)
    p.add_argument("--coverage", type=float, default=0.97, help="FR-Spec: held-out coverage the subset must reach")
    p.add_argument("--max-c", type=float, default=0.05, help="FR-Spec: take the whole vocabulary if its c is below")
    p.add_argument("--keep", type=int, default=0, help="FR-Spec subset size (0: chosen by coverage and c)")
    p.add_argument("--cost-repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--out", default=None, help="default data/draft_head/eagle.pt (--quick: data/cache/eagle-quick.pt)")
    p.add_argument("--record", action="store_true", help="also write results/<class>/draft-head-training.json")
    p.add_argument("--quick", action="store_true", help="tiny settings: the whole pipeline in about a minute")
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    return args


@torch.no_grad()
def heldout_top1(head, data, device, batch: int = 16) -> float:
    """Teacher-forced top-1 agreement with the target's next token over every held-out answer position (entry j
    reads h_j and x_{j+1}, predicts x_{j+2}); a token outside the FR-Spec subset counts as a miss (head_loss's own
    top-1 leaves those out)."""
    from tools.eagle_data import batch_of

    hits = total = 0
    for s in range(0, len(data["prompt_len"]), batch):
        seqs = list(range(s, min(s + batch, len(data["prompt_len"]))))
        tokens, hidden, labels, mask = batch_of(data, seqs, device)
        logits, _ = head(tokens[:, 1:], hidden[:, :-1])
        m = mask[:, 1:]
        hits += int((head.keep_ids[logits.argmax(-1)][m] == labels[:, 1:][m]).sum())
        total += int(m.sum())
    return hits / max(total, 1)


@torch.no_grad()
def spec_eval(target, head, prompt_ids, refs, n_new: int, runs) -> dict:
    """{name: (α per drafted token, tokens per round, identical)} for each (name, fn(stats, ids) -> ids) in runs."""
    from lib.spec_decode.speculative import SpecStats

    out = {}
    for name, fn in runs:
        st, same = SpecStats(), True
        for ids, ref in zip(prompt_ids, refs):
            same &= torch.equal(fn(st, ids).cpu(), ref.cpu())
        rounds = max(st.rounds, 1)
        out[name] = (st.accepted / max(st.drafted, 1), 1 + st.accepted / rounds, bool(same))
    return out


def linear_runs(target, head, n_new, ks=(1, 2, 3, 4)):
    from lib.spec_decode.draft_head import head_speculative_generate

    return [(f"K={k}", lambda st, ids, k=k: head_speculative_generate(target, head, ids, n_new, k=k, stats=st))
            for k in ks]


def tree_runs(target, head, n_new):
    from lib.spec_decode.tree_speculative import DynamicTree, StaticTree, tree_speculative_generate

    return [(name, lambda st, ids, t=t: tree_speculative_generate(target, head, ids, n_new, tree=t, stats=st))
            for name, t in (("static tree 4-2-1", StaticTree((4, 2, 1))),
                            ("dynamic tree d5 k4 w4 b16", DynamicTree(depth=5, top_k=4, width=4, budget=16)))]


def choose_subset(args, model, target, train, held, device, text_ids):
    """(keep_ids, report): the FR-Spec subset by measured coverage and c (see the module's text)."""
    from lib.spec_decode import draft_head as dh
    from lib.spec_decode import speculative as spec
    from lib.spec_decode.drafts import frequency_ranked_ids, token_counts

    vocab = model.config.vocab_size

    def answer_ids(data):
        off, plen = data["offsets"], data["prompt_len"]
        return torch.cat([data["tokens"][int(off[s] + plen[s]):int(off[s + 1])] for s in range(len(plen))]).long()

    counts = token_counts(answer_ids(train), vocab)
    held_ids = answer_ids(held)
    cover = {n: float(torch.isin(held_ids, frequency_ranked_ids(counts, n)).float().mean()) for n in SIZES}
    cover[vocab] = 1.0
    pick = args.keep or next((n for n in SIZES if cover[n] >= args.coverage), SIZES[-1])

    def cost(n):
        keep = frequency_ranked_ids(counts, n) if n < vocab else torch.arange(vocab)
        h = dh.DraftHead(model.config, model.embed.weight, keep, d_ff=args.d_ff).eval().requires_grad_(False)
        return spec.relative_cost(dh.head_step(h, target, text_ids), target, text_ids, repeats=args.cost_repeats)

    c_sub, c_full = cost(pick), cost(vocab)
    full = not args.keep and c_full <= args.max_c
    size = vocab if full else pick
    keep = torch.arange(vocab) if full else frequency_ranked_ids(counts, pick)
    print("FR-Spec coverage of held-out answer tokens: " + ", ".join(f"{n}: {c:.4f}" for n, c in cover.items()))
    print(f"draft cost c (one head step / one target step; untrained heads, {device}): subset {pick}: {c_sub:.3f}, "
          f"full vocabulary {vocab}: {c_full:.3f} -> output layer of {size} tokens "
          f"({'c of the full vocabulary is within --max-c' if full else 'subset'})")
    return keep, {"coverage": {str(n): round(c, 5) for n, c in cover.items()}, "subset": pick, "c_subset": c_sub,
                  "c_full": c_full, "chosen": size}


def main(argv=None) -> None:
    args = parse(argv)
    from lib.spec_decode import draft_head as dh
    from lib.bench import paths
    from lib.spec_decode import speculative as spec
    from lib.modeling.fast import FastLlama
    from lib.modeling.generate import generate
    from lib.modeling.llama import load_smollm2
    from lib.bench.records import Record
    from lib.modeling.text import load_text
    from tools.eagle_data import answer_tokens, batch_of, build_data
    from tools.eagle_prompts import BENCHMARK_CHAT, split_prompts

    t_start = time.perf_counter()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    torch.manual_seed(args.seed)
    record = Record("draft-head-training")
    model, tok = load_smollm2(device=str(device))
    model.requires_grad_(False)
    target = FastLlama(model)
    print(f"torch {torch.__version__} on {device}, {torch.get_num_threads()} CPU threads; seed {args.seed}; "
          f"{'quick mode' if args.quick else 'full run'}")

    # 1-2. prompts and data
    how = args.answers if args.answers != "auto" else ("engine" if device.type == "cuda" else "side-by-side")
    train_p, held_p = split_prompts(args.train_prompts, args.held_prompts, args.seed)
    print(f"prompts: {len(train_p)} training, {len(held_p)} held out (disjoint by template and topic)")
    data = {}
    for name, prompts in (("train", train_p), ("held", held_p)):
        data[name] = build_data(model, target, tok, prompts, args.max_new, args.gen_batch, paths.CACHE_DIR,
                                paths.SMOLLM2_SHA256, tag=f"[{name}] ", how=how)
    train, held = data["train"], data["held"]
    print(f"data: {answer_tokens(train)} training answer tokens, {answer_tokens(held)} held out (answers: {how})")

    # 3. FR-Spec subset
    text_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[:, :160].to(device)
    keep, fr = choose_subset(args, model, target, train, held, device, text_ids)

    # 4. train, with the learning curve
    head = dh.DraftHead(model.config, model.embed.weight, keep, d_ff=args.d_ff)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    n_train = len(train["prompt_len"])
    per_epoch = math.ceil(n_train / args.batch)
    planned = max(1, round(args.epochs * per_epoch))
    warm = min(100, max(1, planned // 10))
    gen = torch.Generator().manual_seed(args.seed)
    held_eval_ids = [torch.tensor([held["tokens"][int(held["offsets"][s]):int(held["offsets"][s]
                                                                               + held["prompt_len"][s])].tolist()])
                     for s in range(min(args.eval_prompts, len(held_p)))]
    held_eval_refs = [generate(target, ids.to(device), args.eval_tokens) for ids in held_eval_ids]
    curve, step, seen, t_train, ema = [], 0, 0, time.perf_counter(), None
    step_cpu = step_wall = 0.0  # the training steps' own time (evaluations apart), for the estimate

    def evaluate(final=False):
        head.eval()
        point = {"step": step, "epoch": round(step / per_epoch, 3), "answer_tokens_seen": seen,
                 "seconds": round(time.perf_counter() - t_train, 1), "train_loss_ema": ema and round(ema, 4),
                 "heldout_top1": round(heldout_top1(head, held, device), 4)}
        res = spec_eval(target, head, [i.to(device) for i in held_eval_ids], held_eval_refs, args.eval_tokens,
                        linear_runs(target, head, args.eval_tokens))
        point.update({f"alpha {k}": round(a, 4) for k, (a, _, _) in res.items()})
        assert all(same for _, _, same in res.values()), "speculative output differs from greedy"
        curve.append(point)
        bar.write(f"  step {step} (epoch {point['epoch']:.2f}, {point['seconds']:.0f} s): held-out top-1 "
                  f"{point['heldout_top1']:.3f}; α free-running " + ", ".join(f"{k} {a:.3f}" for k, (a, _, _) in
                                                                              res.items()), file=sys.stdout)
        head.train()

    from tqdm import tqdm

    bar = tqdm(total=planned, desc="training", unit="step", dynamic_ncols=True, mininterval=2.0)
    cap = 60.0 * args.minutes
    order = torch.randperm(n_train, generator=gen)
    evaluate()
    while step < planned and time.perf_counter() - t_train < cap:
        if step and step % per_epoch == 0:
            order = torch.randperm(n_train, generator=gen)
        i = (step % per_epoch) * args.batch
        seqs = order[i:i + args.batch].tolist()
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / planned))
        w0, c0 = time.perf_counter(), time.process_time()
        tokens, hidden, labels, mask = batch_of(train, seqs, device)
        loss, _ = dh.head_loss(head, tokens, hidden, labels, mask, self_fed=args.self_fed)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        step_wall, step_cpu = step_wall + time.perf_counter() - w0, step_cpu + time.process_time() - c0
        seen += int(mask.sum())
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.update(1)
        if step == 10:
            per = step_wall / 10
            bar.write(f"  estimated training time: {per * planned / 60:.1f} min for {planned} steps ({args.epochs} "
                  f"epochs of {per_epoch}), from the first 10 steps ({per:.2f} s/step, {step_cpu / 10:.2f} CPU s/step; "
                  f"evaluations apart); cap {args.minutes} min", file=sys.stdout)
        if step % args.eval_every == 0 and step < planned:
            evaluate()
    bar.close()
    stopped = "" if step >= planned else f"stopped by --minutes {args.minutes} at step {step} of {planned}"
    if stopped:
        print("  " + stopped)
    evaluate(final=True)
    train_seconds = time.perf_counter() - t_train
    head.eval().requires_grad_(False)

    # 5. save with its checksum, reload through the checking loader
    out = Path(args.out) if args.out else (paths.CACHE_DIR / "eagle-quick.pt" if args.quick else
                                           dh.EAGLE_PATH)
    meta = dict(command=" ".join(["python", "tools/train_eagle.py"] + (sys.argv[1:] if argv is None else argv)),
                seed=args.seed, steps=step, planned_steps=planned, epochs=args.epochs, train_seconds=round(train_seconds),
                train_prompts=len(train_p), answer_tokens=answer_tokens(train), max_new=args.max_new,
                batch=args.batch, lr=args.lr, torch=str(torch.__version__), threads=torch.get_num_threads(),
                device=str(device))
    dh.save_draft_head(head, out, **meta)
    saved = dh.load_draft_head(model, out)  # verifies the checksum just written
    print(f"saved {out} ({out.stat().st_size / 1e6:.1f} MB), sha256 {saved.sha256} (in {dh.checksum_path(out).name})")

    # 6. the final evaluation of the saved head
    results = {}
    for wname, texts in (("held-out", held_p[:args.final_prompts]), ("benchmark chat", list(BENCHMARK_CHAT))):
        ids = [spec.chat_ids(tok, t, device) for t in texts]
        refs = [generate(target, i, args.final_tokens) for i in ids]
        res = spec_eval(target, saved, ids, refs, args.final_tokens,
                        linear_runs(target, saved, args.final_tokens) + tree_runs(target, saved, args.final_tokens))
        assert all(same for _, _, same in res.values()), f"{wname}: speculative output differs from greedy"
        results[wname] = res
        print(f"\n[{wname}: {len(texts)} prompts, {args.final_tokens} new tokens, T = 0, saved int8 head]")
        print("| drafting | α per drafted token | tokens per round | identical to greedy |\n|---|---|---|---|")
        for name, (a, tpr, same) in res.items():
            print(f"| {name} | {a:.3f} | {tpr:.2f} | {same} |")
            record.add(f"{wname}: {name}: α per drafted token (T=0)", a, "", True)
            record.add(f"{wname}: {name}: tokens per round", tpr, "tokens", True)
    record.add("held-out top-1 (teacher forced)", curve[-1]["heldout_top1"], "", True)
    record.add("FR-Spec: c of the chosen output layer", fr["c_subset"] if fr["chosen"] != model.config.vocab_size
               else fr["c_full"], "steps", False)
    record.add("training seconds", train_seconds, "s", False)
    for k, v in dict(options=vars(args), learning_curve=curve, fr_spec=fr, stopped=stopped or None,
                     data={n: {"prompts": len(d["prompt_len"]), "answer_tokens": answer_tokens(d),
                               "argmax_agrees": round(d["agree"], 5), "answer_seconds": round(d["answer_seconds"], 1),
                               "hidden_seconds": round(d["hidden_seconds"], 1),
                               "answer_cpu_seconds": round(d.get("answer_cpu_seconds", 0), 1),
                               "hidden_cpu_seconds": round(d.get("hidden_cpu_seconds", 0), 1)}
                           for n, d in data.items()},
                     steps={"wall_seconds": round(step_wall, 1), "cpu_seconds": round(step_cpu, 1), "steps": step,
                            "answer_tokens_seen": seen},
                     weights={"path": str(out), "sha256": saved.sha256, "bytes": out.stat().st_size},
                     total_minutes=round((time.perf_counter() - t_start) / 60, 2)).items():
        record.note(k, v)
    paths_written = record.write(commit_as_reference=args.record and not args.quick)
    out.with_suffix(".json").write_text(paths_written[0].read_text())
    print(f"total {(time.perf_counter() - t_start) / 60:.1f} min; learning curve and results in {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
