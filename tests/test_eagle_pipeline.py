"""The EAGLE-style draft head's training pipeline (tools/train_eagle.py): the prompt generator and its held-out split,
the data cache's key and batches, and the checksum `lib.spec_decode.draft_head.load_draft_head` verifies. The pipeline run as a
user types it (`--quick`) is tests/test_commands.py's."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from lib.spec_decode.draft_head import (HEAD_PATH, DraftHead, DraftHeadChecksumError, checksum_path, load_draft_head,
                            save_draft_head)
from lib.modeling.llama import tiny_model
from lib.bench.paths import sha256_of
from tools import eagle_prompts as ep
from tools.eagle_data import batch_of, cache_key

REPO = Path(__file__).resolve().parent.parent


def _benchmark_chat() -> list[str]:
    """benchmarks/speculative.py's CHAT, read from that file (not from the generator's copy)."""
    tree = ast.parse((REPO / "benchmarks" / "speculative.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "CHAT")
    return ast.literal_eval(node.value)


def _origin(prompt: str) -> tuple[str, str]:
    """The (template, topic) a prompt was made from: the longest formatted pair found in it."""
    found = [(t, x) for kind, ts in ep.TEMPLATES.items() for t in ts for x in ep.TOPICS[kind]
             if t.format(x).lower() in prompt.lower()]
    assert found, f"no template-topic pair in {prompt!r}"
    return max(found, key=lambda tx: len(tx[0].format(tx[1])))


def test_prompts_are_thousands_distinct_and_never_the_benchmarks():
    train, held = ep.split_prompts(6000, 120, seed=0)
    assert len(train) == len(set(train)) == 6000 and len(held) == len(set(held)) == 120
    assert not set(train) & set(held)
    chat = _benchmark_chat()
    assert len(chat) == 3 and not (set(chat) & (set(train) | set(held)))
    assert set(ep.split_prompts(50, 10, seed=0)[0]) == set(ep.split_prompts(50, 10, seed=0)[0])  # seeded
    assert ep.split_prompts(50, 10, seed=1)[0] != ep.split_prompts(50, 10, seed=0)[0]


def test_held_out_split_is_disjoint_by_template_and_topic_and_has_the_benchmark_style():
    train, held = ep.split_prompts(3000, 150, seed=3)
    train_origin = [_origin(p) for p in train[:1500]]
    held_origin = [_origin(p) for p in held]
    assert not {t for t, _ in train_origin} & {t for t, _ in held_origin}
    assert not {x for _, x in train_origin} & {x for _, x in held_origin}
    for x in ("staying healthy", "a hash table", "a robot who learns to paint"):  # the benchmark's topics
        assert all(x not in p for p in train + held)
    # the benchmark's three styles are among the held-out prompts (with other topics)
    for start in ("What are three tips for ", "Explain what ", "Write a short story about "):
        assert any(p.startswith(start) for p in held), start


def test_too_many_held_out_prompts_is_refused():
    _, held_pool = ep.pools()
    with pytest.raises(ValueError, match="distinct prompts"):
        ep.split_prompts(10, len(held_pool) + 1)


def test_data_cache_key_changes_with_every_option():
    base = cache_key(["a", "b"], 64, "f" * 64)
    assert base == cache_key(["a", "b"], 64, "f" * 64)
    others = {cache_key(["b", "a"], 64, "f" * 64), cache_key(["a", "b", "c"], 64, "f" * 64),
              cache_key(["a", "b"], 65, "f" * 64), cache_key(["a", "b"], 64, "e" * 64),
              cache_key(["a", "b"], 64, "f" * 64, dtype="bfloat16"),
              cache_key(["a", "b"], 64, "f" * 64, how="side-by-side")}
    assert base not in others and len(others) == 6


def test_batch_of_pads_and_masks_the_answers():
    # two sequences: [10, 11, 12 | 13, 14] (prompt 3, answer 2) and [20, 21 | 22] (prompt 2, answer 1)
    data = {"tokens": torch.tensor([10, 11, 12, 13, 14, 20, 21, 22], dtype=torch.int32),
            "hidden": torch.arange(16, dtype=torch.float16).reshape(8, 2),
            "offsets": torch.tensor([0, 5, 8]), "prompt_len": torch.tensor([3, 2])}
    tokens, hidden, labels, mask = batch_of(data, [1, 0])
    assert tokens.tolist() == [[20, 21, 22, 0, 0], [10, 11, 12, 13, 14]]
    assert labels[0, :2].tolist() == [21, 22] and labels[1, :4].tolist() == [11, 12, 13, 14]
    # position j counts when the token after it is an answer token
    assert mask.tolist() == [[False, True, False, False, False], [False, False, True, True, False]]
    assert hidden.dtype == torch.float32 and hidden[0, 2].tolist() == [14.0, 15.0] and hidden[0, 3].abs().sum() == 0


def _tiny_head(tmp_path):
    target = tiny_model(seed=2)
    torch.manual_seed(0)
    head = DraftHead(target.config, target.embed.weight, torch.tensor([5, 3, 9]), d_ff=48).eval()
    path = tmp_path / "h.pt"
    save_draft_head(head, path, steps=3)
    return target, path


def test_saved_head_records_its_sha256_and_loads(tmp_path):
    target, path = _tiny_head(tmp_path)
    assert checksum_path(path).read_text().split() == [sha256_of(path), "h.pt"]
    assert load_draft_head(target, path).sha256 == sha256_of(path)


def test_a_corrupt_head_is_refused_with_how_to_rebuild(tmp_path):
    target, path = _tiny_head(tmp_path)
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(DraftHeadChecksumError, match=r"(?s)corrupt or was replaced.*tools/train_eagle\.py"):
        load_draft_head(target, path)


def test_a_head_without_its_checksum_is_refused(tmp_path):
    target, path = _tiny_head(tmp_path)
    checksum_path(path).unlink()
    with pytest.raises(DraftHeadChecksumError, match="no checksum recorded"):
        load_draft_head(target, path)


def test_the_committed_head_matches_its_recorded_checksum():
    assert checksum_path(HEAD_PATH).read_text().split()[0] == sha256_of(HEAD_PATH)


def test_heldout_top1_counts_tokens_outside_the_subset_as_misses():
    from tools.train_eagle import heldout_top1

    target = tiny_model(seed=4)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    keep = torch.arange(0, 128, 2)  # even tokens only
    head = DraftHead(target.config, target.embed.weight, keep, d_ff=48).eval()
    tokens = torch.randint(0, 64, (8,), generator=g) * 2
    hidden = torch.randn(8, 64, generator=g)
    with torch.no_grad():  # one sequence (prompt 3, answer 5) whose every answer token is the head's own top-1
        for j in range(6):  # entry j reads token j + 1 and h_j and predicts token j + 2 (causal: later ones unchanged)
            logits, _ = head(tokens[None, 1:j + 2], hidden[None, :j + 1])
            tokens[j + 2] = keep[logits[0, -1].argmax()]
    data = {"tokens": tokens.to(torch.int32), "hidden": hidden.half(), "offsets": torch.tensor([0, 8]),
            "prompt_len": torch.tensor([3])}
    assert heldout_top1(head, data, "cpu") == pytest.approx(1.0, abs=0.21)  # fp16 states may flip a near-tie
    data["tokens"][7] = int(tokens[7]) + 1  # the last answer token: odd, outside the subset, a miss
    right = heldout_top1(head, data, "cpu")
    data["tokens"][7] = int(tokens[7])
    assert right == pytest.approx(heldout_top1(head, data, "cpu") - 0.2)
