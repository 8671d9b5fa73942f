"""grader.reads: the visits and terminal reads of an argument, followed through what the call made of it."""
import pytest
import torch

from grader.observe import from_wire, observe, to_wire


def _stats(fn, x, chunk=8):
    _, obs = observe(fn, x, chunk, _observe_light=True, _observe_reads=((0, 1),))
    obs = from_wire(to_wire(obs))  # what crosses from the child
    slices = obs.visits_of(0)
    return max(s[0] for s in slices), min(s[1] for s in slices), max(s[2] for s in slices)


def one_pass(x, c):
    m = torch.full(x.shape[:-1], float("-inf"))
    l = torch.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], c):
        m_new = torch.maximum(m, x[..., s:s + c].amax(-1))
        l = l * torch.exp(m - m_new) + torch.exp(x[..., s:s + c] - m_new[..., None]).sum(-1)
        m = m_new
    return torch.exp(x - m[..., None]) / l[..., None]


def two_pass(x, c):
    m = torch.full(x.shape[:-1], float("-inf"))
    for s in range(0, x.shape[-1], c):
        m = torch.maximum(m, x[..., s:s + c].amax(-1))
    l = sum(torch.exp(x[..., s:s + c] - m[..., None]).sum(-1) for s in range(0, x.shape[-1], c))
    return torch.exp(x - m[..., None]) / l[..., None]


def test_one_pass_visits_each_element_once():
    assert _stats(one_pass, torch.randn(4, 64)) == (1, 1, 2)  # amax and the sum: two reads, one visit


def _spare_zeroed(x, dtype):
    """A copy of x with one spare element after it, whose bytes are zeroed through a view of `dtype`."""
    buf = torch.cat([x.reshape(-1), x.new_zeros(1)])
    buf.view(dtype)[-(4 // torch.empty((), dtype=dtype).element_size()):].zero_()
    return buf[:-1].view(x.shape)


@pytest.mark.parametrize("disguise", [
    lambda x: x,  # the argument itself
    lambda x: x.clone(), lambda x: x.double().float(), lambda x: x.t().contiguous().t(), lambda x: x * 1.0,
    lambda x: torch.cat([x[:, :32], x[:, 32:]], 1), lambda x: x[:, torch.arange(64)],  # copies, by any op
    lambda x: x.unsqueeze(-1).sum(-1), lambda x: torch.stack([x, torch.zeros_like(x)]).sum(0),  # one-element groups
    lambda x: x.flip(-1).flip(-1),  # through permutations
    lambda x: x.clone().resize_(x.shape),  # a resize keeps the elements in place (red team 13's #4, #5)
    lambda x: x.clone().resize_(x.shape[0] * 2, x.shape[1])[:x.shape[0]],  # ... and moves them when it grows
    lambda x: _spare_zeroed(x, torch.uint8), lambda x: _spare_zeroed(x, torch.int16),  # a write through a view of
    lambda x: _spare_zeroed(x, torch.float16),  # another element size keeps the rest (red team 13b's #1, #2)
])
def test_a_second_pass_is_a_second_visit_whatever_copy_it_reads(disguise):
    most, fewest, _ = _stats(lambda x, c: two_pass(disguise(x), c), torch.randn(4, 64))
    assert most == fewest == 2


def _as_complex_pairs(x, first):
    """Each element beside a zero, the pairs viewed as complex and copied, the element taken back (red team 14b's #1)."""
    pairs = torch.stack([torch.zeros_like(x), x] if not first else [x, torch.zeros_like(x)], -1)
    return torch.view_as_real(torch.view_as_complex(pairs).clone())[..., 0 if first else 1]


def _overlapping_copy(x):
    """x written by index_put_ into a buffer whose two rows are one (red team 14b's #3)."""
    buf = torch.empty_like(x)
    rows = buf.as_strided((2, *x.shape), (0, *buf.stride()))
    rows.index_put_((torch.arange(2),), x.expand(2, *x.shape).clone())
    return buf


@pytest.mark.parametrize("disguise", [lambda x: _as_complex_pairs(x, False), lambda x: _as_complex_pairs(x, True),
                                      lambda x: x.view(torch.float64).clone().view(torch.float32),  # pairs of elements
                                      _overlapping_copy])
def test_a_copy_through_wider_elements_or_an_overlapping_write_keeps_the_reads(disguise):
    """A first pass over such a copy is counted: its elements carry the argument's addresses (one of a pair's, the
    copy itself a read of both), so that two passes visit each element more than one pass does."""
    x = torch.randn(4, 64)
    two, _, _ = _stats(lambda x, c: two_pass(disguise(x), c), x)
    one, _, _ = _stats(lambda x, c: one_pass(disguise(x), c), x)
    assert two >= 2 and two > one, (two, one)


def test_an_elementwise_op_reads_what_it_combines_at_other_places():
    """A decoy of the same elements at other places (a row and its rotation hold the same set: red team 13's #3) is a
    read of its own: here one before the first pass, so all but the first chunk's elements are visited 3 times."""
    most, fewest, _ = _stats(lambda x, c: two_pass(x.flip(-1).flip(-1) + 0 * x.roll(3, -1), c), torch.randn(4, 64))
    assert (most, fewest) == (3, 2)


def test_reading_everything_between_passes_is_counted_in_reads():
    def joined(x, c):
        m = torch.full(x.shape[:-1], float("-inf"))
        for s in range(0, x.shape[-1], c):
            m = torch.maximum(m, x[..., s:s + c].amax(-1))
            x.view(4, -1, c).amax(-1)  # every element, each step
        l = sum(torch.exp(x[..., s:s + c] - m[..., None]).sum(-1) + 0 * x.view(4, -1, c).amax(-1).sum(-1)
                for s in range(0, x.shape[-1], c))
        return torch.exp(x - m[..., None]) / l[..., None]
    _, _, reads = _stats(joined, torch.randn(4, 64))
    assert reads >= 8  # as many as chunks


def test_work_out_of_torchs_sight_reads_nothing():
    def in_numpy(x, c):
        a = x.numpy()
        return torch.from_numpy(a / a.sum())
    assert _stats(in_numpy, torch.rand(4, 64))[1] == 0


def test_a_decoy_block_does_not_hide_a_read():
    """Each chunk combined with a decoy chunk of as many elements: whichever addresses the result carries, the
    chunk is read."""
    def hidden(x, c):
        decoy = x[:, :8]
        for s in range(8, 64, c):
            (decoy * 0 + x[:, s:s + c]).amax(-1)
            (x[:, s:s + c] + decoy * 0).amax(-1)
        return x
    _, fewest, _ = _stats(hidden, torch.randn(4, 64))
    assert fewest >= 1


def test_what_reads_only_a_shape_is_no_read():
    def shapes(x, c):
        return torch.empty_like(x), torch.zeros_like(x), x.new_full((3,), 1.0)
    assert _stats(shapes, torch.randn(4, 64))[0] == 0
