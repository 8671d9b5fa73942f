"""lib.spec_decode.speculative_batch (the ragged batch's machinery, week 18 section 8) and lib.spec_decode.drafts' distillation helpers
(section 7), on a tiny model: each row of a ragged forward gets the logits the model gives that row alone, per-row
rollback leaves the other rows alone, the padded layout computes pads and says so; the target's answers are its greedy
continuations, and the distillation loss of the target against itself is what the top-k truncation leaves."""
import pytest
import torch

from lib.spec_decode import drafts
from lib.modeling.generate import generate
from lib.modeling.llama import tiny_model
from lib.spec_decode.speculative_batch import RaggedTarget


def _alone(model, tokens: list) -> torch.Tensor:
    """The model's logits over `tokens` run as one sequence from an empty cache: [len, vocab]."""
    return model(torch.tensor([tokens]))[0]


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_each_row_gets_its_own_logits_through_rounds_and_rollbacks(layout):
    model = tiny_model(3)
    target = RaggedTarget(model, layout)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 2, 7, 3)]
    cache = target.new_cache(4, 64)
    fed = [[] for _ in seqs]
    rounds = [{0: seqs[0], 1: seqs[1], 2: seqs[2], 3: seqs[3]},  # a ragged prefill
              {0: [9, 8, 7], 2: [4]},                           # rows 1 and 3 not run
              {1: [1, 2, 3, 4], 3: [5], 0: [6, 6]}]
    for r, feeds in enumerate(rounds):
        out = target(feeds, cache=cache)
        assert sorted(out) == sorted(feeds)
        for row, toks in feeds.items():
            fed[row] += toks
            want = _alone(model, fed[row])[-len(toks):]
            assert out[row].shape == (len(toks), 128)
            assert torch.allclose(out[row], want, atol=1e-4), (layout, r, row)
        assert cache.lengths == tuple(len(f) for f in fed)
        if r == 1:  # roll row 0 back by two and row 2 by one; rows 1 and 3 keep theirs
            cache.truncate(0, len(fed[0]) - 2)
            cache.truncate(2, len(fed[2]) - 1)
            fed[0], fed[2] = fed[0][:-2], fed[2][:-1]
            assert cache.lengths == tuple(len(f) for f in fed)


def test_the_padded_layout_counts_its_pads_and_packed_none():
    model = tiny_model(4)
    packed, padded = RaggedTarget(model, "packed"), RaggedTarget(model, "padded")
    feeds = [{0: [1, 2, 3, 4], 1: [5], 2: [6, 7]}, {0: [8], 2: [9, 10, 11]}]
    for target in (packed, padded):
        cache = target.new_cache(3, 32)
        for f in feeds:
            target(f, cache=cache)
        assert cache.lengths == (5, 1, 5)  # pads never count as a row's positions
    needed = 4 + 1 + 2 + 1 + 3
    assert (packed.stats.forwards, packed.stats.computed, packed.stats.needed) == (2, needed, needed)
    assert packed.stats.pad_fraction == 0
    # the rectangle: every row of the cache fed the longest feed's count (4, then 3), finished or not
    assert (padded.stats.computed, padded.stats.needed) == (3 * 4 + 3 * 3, needed)
    assert padded.stats.pad_fraction == pytest.approx(1 - needed / 21)


def test_bad_feeds_and_rollbacks_are_refused():
    target = RaggedTarget(tiny_model(5))
    cache = target.new_cache(2, 8)
    target({0: [1, 2, 3]}, cache=cache)
    for bad in (lambda: cache.truncate(0, 4), lambda: cache.truncate(2, 0), lambda: cache.truncate(0, -1),
                lambda: target({}, cache=cache), lambda: target({1: []}, cache=cache),
                lambda: target({0: list(range(6))}, cache=cache), lambda: target({3: [1]}, cache=cache)):
        with pytest.raises(ValueError):
            bad()
    cache.truncate(0, 1)
    assert cache.lengths == (1, 0)


def test_target_answers_are_its_greedy_continuations():
    model = tiny_model(6)
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    got = drafts.target_answers(model, prompts, n_new=6, top=8)
    length = 5 + 6
    assert got["tokens"].shape == (3, length) and got["top_p"].shape == (3, length, 8)
    for i, p in enumerate(prompts):
        want = generate(model, torch.tensor([p]), length - len(p))[0]
        assert torch.equal(got["tokens"][i], want), i
        # the next token is part of the answer from the prompt's last token on, up to the last position but one
        assert got["mask"][i].tolist() == [len(p) - 1 <= j < length - 1 for j in range(length)]
    assert torch.equal(got["top_ids"][..., 0], got["tokens"].new_tensor(
        [[int(_alone(model, got["tokens"][i].tolist())[j].argmax()) for j in range(length)] for i in range(3)]))


def test_distilling_the_target_into_itself_leaves_only_the_truncation():
    """KL(p̃ ‖ p) with p̃ = p renormalized over its top k is −log(the top k's mass): the loss of the target against
    itself, averaged over the answer positions (0 when k is the whole vocabulary, where another draft's KL is > 0);
    and the loss has a gradient in the draft's blocks."""
    model = tiny_model(7)
    data = drafts.target_answers(model, [[1, 2, 3], [4, 5, 6, 7]], n_new=4, top=16)
    with torch.no_grad():
        loss = drafts.distill_loss(model, data["tokens"], data["top_p"], data["top_ids"], data["mask"])
    mass = data["top_p"].sum(-1)[data["mask"]]
    assert float(loss) == pytest.approx(float((-mass.log()).mean()), rel=1e-4, abs=1e-6)
    full = drafts.target_answers(model, [[1, 2, 3], [4, 5, 6, 7]], n_new=4, top=128)
    student = drafts.build_distilled_draft(model, 1)
    for w in student.layers.parameters():
        w.requires_grad_(True)
    args = (full["tokens"], full["top_p"], full["top_ids"], full["mask"])
    with torch.no_grad():
        assert abs(float(drafts.distill_loss(model, *args))) < 1e-5
    other = drafts.distill_loss(student, *args)
    assert other.item() > 1e-3
    other.backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in student.layers.parameters())
