"""Training data for the EAGLE-style draft head (tools/train_eagle.py): SmolLM2's own greedy answers and its
final-normed hidden states, cached in data/cache keyed by the options.

    data = build_data(model, tok, prompts, max_new=192, device=..., batch=32)   # cached; a second call loads it

Two passes, because the lab's batched engine (`lib.batching.engine.LLMEngine`, the one the server drives) hands back token
ids, not hidden states: its model runner puts the LM head on each sequence's last row and returns logits only, and
changing that shared path for training data is not worth its risk. So:

1. **Answers**: all prompts go through `LLMEngine` (continuous batching over the paged KV cache, chunked prefill,
   a request leaves at EOS or `max_new`, CUDA graphs on a GPU) at temperature 0: each answer is exactly
   `lib.modeling.generate.generate`'s greedy answer to that prompt alone.
2. **Hidden states**: each finished sequence (prompt + answer) is read once more by `lib.modeling.fast.FastLlama.
   forward_hidden` (teacher forced, sequences of similar length side by side, right-padded: causal attention
   never lets a position see the padding after it). That is a prefill, far cheaper per token than decoding, and
   gives every position's final-normed hidden state (kept fp16: half the bytes) and the target's argmax there; the
   argmax agrees with the engine's next token at nearly every answer position (printed as a check; rounding
   differs between a decode step and a prefill).

The result is ragged (no padding stored): `tokens [N] int32`, `hidden [N, D] fp16`, `offsets [S + 1]` (sequence s is
`offsets[s]:offsets[s + 1]`), `prompt_len [S]`, plus `prompts` and `agree` (the argmax check). `batch_of` turns a
list of sequences into the padded `(tokens, hidden, labels, mask)` that `lib.spec_decode.draft_head.head_loss` reads.
"""
from __future__ import annotations

import hashlib
import json
import time

import torch

FORMAT = 1  # bump when the stored layout changes (part of the cache key)


def cache_key(prompts: list[str], max_new: int, model_sha256: str, dtype: str = "float32",
              how: str = "engine") -> str:
    """A short key over everything the data depends on: the prompts (in order), the answer length, the model file,
    the dtype of the forward that made it, who answered (a near-tie may go the other way between two forwards) and
    the layout."""
    blob = json.dumps({"prompts": prompts, "max_new": max_new, "model": model_sha256, "dtype": dtype, "how": how,
                       "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _progress(total: int, desc: str, unit: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=2.0)


@torch.no_grad()
def answers(model, prompt_ids: list[list[int]], max_new: int, eos: int, batch: int, tag: str = "") -> list[list[int]]:
    """Greedy answers of `model` (a `lib.modeling.llama.LlamaModel`) to every prompt, through `lib.batching.engine.LLMEngine` with
    `batch` sequences at a time. Prints a time estimate after the first `batch` answers, then a progress bar."""
    from lib.batching.engine import LLMEngine

    longest = max(len(p) for p in prompt_ids) + max_new
    block = 16
    engine = LLMEngine(model, num_blocks=batch * (-(-longest // block)) + 8, block_size=block, max_num_seqs=batch,
                       max_num_batched_tokens=max(512, batch), eos_token_id=eos)
    out: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    first = min(batch, len(prompt_ids))
    for i in range(first):  # a first wave, timed: the estimate for the rest
        engine.add_request(prompt_ids[i], max_new, request_id=i)
    while engine.has_unfinished():
        engine.step()
    out.update(engine.finished_outputs())
    per = (time.perf_counter() - t0) / first
    rest = len(prompt_ids) - first
    print(f"  {tag}answers: first {first} in {per * first:.0f} s; estimated {per * rest / 60:.1f} min more for "
          f"the other {rest}", flush=True)
    bar = _progress(len(prompt_ids), f"{tag}answers", "prompt")
    bar.update(first)
    for i in range(first, len(prompt_ids)):
        engine.add_request(prompt_ids[i], max_new, request_id=i)
    done = set(out)
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.finished:
                bar.update(1)
    for rid, toks in engine.finished_outputs().items():
        if rid not in done:
            out[rid] = toks
    bar.close()
    return [list(out[i]) for i in range(len(prompt_ids))]


@torch.no_grad()
def answers_side_by_side(target, prompt_ids: list[list[int]], max_new: int, eos: int, batch: int,
                         tag: str = "") -> list[list[int]]:
    """The same greedy answers by `lib.modeling.fast.FastLlama` decoding `batch` sequences side by side, one position per
    step (each reads its own prompt until it ends, then its own answer; no padding), until every one has ended."""
    out: list[list[int]] = []
    bar = _progress(len(prompt_ids), f"{tag}answers (side by side)", "prompt")
    t0 = time.perf_counter()
    for s in range(0, len(prompt_ids), batch):
        group = prompt_ids[s:s + batch]
        lens = [len(p) for p in group]
        length = max(lens) + max_new
        tokens = torch.zeros(len(group), length, dtype=torch.int64)
        for r, p in enumerate(group):
            tokens[r, :len(p)] = torch.tensor(p)
        ans: list[list[int]] = [[] for _ in group]
        done = [False] * len(group)
        cache = target.new_cache(len(group), length)
        for j in range(length - 1):
            logits, _ = target.forward_hidden(tokens[:, j:j + 1].to(target.device), cache)
            nxt = logits[:, 0].argmax(-1).cpu()
            for r in range(len(group)):
                if j + 1 >= lens[r] and not done[r]:  # position j + 1 is past the prompt: the target's token
                    tokens[r, j + 1] = nxt[r]
                    ans[r].append(int(nxt[r]))
                    done[r] = int(nxt[r]) == eos or len(ans[r]) >= max_new
            if all(done):
                break
        out += ans
        bar.update(len(group))
        if s == 0:
            per = (time.perf_counter() - t0) / len(group)
            bar.write(f"  {tag}answers: first {len(group)} in {per * len(group):.0f} s; estimated "
                      f"{per * (len(prompt_ids) - len(group)) / 60:.1f} min more")
    bar.close()
    return out


@torch.no_grad()
def hidden_states(target, seqs: list[list[int]], tokens_per_batch: int = 2048, tag: str = ""):
    """`(hidden [N, D] fp16, argmax [N] int64)` of `target` (a `lib.modeling.fast.FastLlama`) on every sequence, concatenated
    in order: one teacher-forced forward per group of similar length (about `tokens_per_batch` tokens)."""
    order = sorted(range(len(seqs)), key=lambda s: len(seqs[s]))
    hid: list[torch.Tensor | None] = [None] * len(seqs)
    arg: list[torch.Tensor | None] = [None] * len(seqs)
    bar = _progress(sum(len(s) for s in seqs), f"{tag}hidden states", "tok")
    i = 0
    while i < len(order):
        longest = len(seqs[order[i]])
        group = [order[i]]
        while i + len(group) < len(order) and (len(group) + 1) * len(seqs[order[i + len(group)]]) <= tokens_per_batch:
            group.append(order[i + len(group)])
        longest = max(len(seqs[s]) for s in group)
        ids = torch.zeros(len(group), longest, dtype=torch.int64)
        for r, s in enumerate(group):
            ids[r, :len(seqs[s])] = torch.tensor(seqs[s])
        logits, h = target.forward_hidden(ids.to(target.device))
        for r, s in enumerate(group):
            n = len(seqs[s])
            hid[s] = h[r, :n].to("cpu", torch.float16)
            arg[s] = logits[r, :n].argmax(-1).cpu()
        bar.update(sum(len(seqs[s]) for s in group))
        i += len(group)
    bar.close()
    return torch.cat(hid), torch.cat(arg)


def build_data(model, target, tok, prompts: list[str], max_new: int, batch: int, cache_dir, model_sha256: str,
               tag: str = "", how: str = "engine") -> dict:
    """The data for `prompts` (see the module's text), from the cache when it is there."""
    from lib.spec_decode.speculative import chat_ids

    key = cache_key(prompts, max_new, model_sha256, str(target.dtype).replace("torch.", ""), how)
    path = cache_dir / f"eagle-data-{key}.pt"
    if path.exists():
        data = torch.load(path, weights_only=True)
        print(f"  {tag}data reused from {path}")
        data["path"] = str(path)
        return data
    t0, c0 = time.perf_counter(), time.process_time()
    pids = [chat_ids(tok, p)[0].tolist() for p in prompts]
    if how == "engine":
        ans = answers(model, pids, max_new, tok.eos_token_id, batch, tag)
    else:
        ans = answers_side_by_side(target, pids, max_new, tok.eos_token_id, batch, tag)
    t1, c1 = time.perf_counter(), time.process_time()
    seqs = [p + a for p, a in zip(pids, ans)]
    hidden, argmax = hidden_states(target, seqs, tag=tag)
    lens = torch.tensor([len(s) for s in seqs])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    tokens = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    plen = torch.tensor([len(p) for p in pids])
    # the check: the teacher-forced argmax at each answer position's predecessor is the engine's next token
    hits = total = 0
    for s in range(len(seqs)):
        a, b = int(offsets[s] + plen[s]), int(offsets[s + 1])
        hits += int((argmax[a - 1:b - 1] == tokens[a:b].long()).sum())
        total += b - a
    data = {"tokens": tokens, "hidden": hidden, "offsets": offsets, "prompt_len": plen, "prompts": list(prompts),
            "agree": hits / max(total, 1), "answer_seconds": t1 - t0, "hidden_seconds": time.perf_counter() - t1,
            "answer_cpu_seconds": c1 - c0, "hidden_cpu_seconds": time.process_time() - c1}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    print(f"  {tag}{len(seqs)} answers, {total} answer tokens ({total / len(seqs):.0f} per answer), "
          f"{hidden.numel() * 2 / 1e6:.0f} MB of fp16 states; teacher-forced argmax = the answer's token at "
          f"{data['agree']:.4f} of answer positions; {t1 - t0:.0f} s + {data['hidden_seconds']:.0f} s (CPU time of "
          f"this process {c1 - c0:.0f} s + {data['hidden_cpu_seconds']:.0f} s); cached in "
          f"{path}", flush=True)
    data["path"] = str(path)
    return data


def answer_tokens(data: dict) -> int:
    return int((data["offsets"][1:] - data["offsets"][:-1] - data["prompt_len"]).sum())


def batch_of(data: dict, seqs: list[int], device=None):
    """`(tokens [B, L], hidden [B, L, D] fp32, labels [B, L], mask [B, L])` of sequences `seqs`, right-padded to the
    longest: `labels[:, j]` is the token after position j, `mask[:, j]` whether that token is part of the answer."""
    off, plen = data["offsets"], data["prompt_len"]
    lens = [int(off[s + 1] - off[s]) for s in seqs]
    length = max(lens)
    d = data["hidden"].shape[1]
    tokens = torch.zeros(len(seqs), length, dtype=torch.int64)
    hidden = torch.zeros(len(seqs), length, d, dtype=torch.float16)
    mask = torch.zeros(len(seqs), length, dtype=torch.bool)
    for r, (s, n) in enumerate(zip(seqs, lens)):
        a = int(off[s])
        tokens[r, :n] = data["tokens"][a:a + n].long()
        hidden[r, :n] = data["hidden"][a:a + n]
        mask[r, int(plen[s]) - 1:n - 1] = True
    labels = torch.cat([tokens[:, 1:], torch.zeros(len(seqs), 1, dtype=torch.int64)], dim=1)
    return (tokens.to(device), hidden.to(device, torch.float32), labels.to(device), mask.to(device))
