"""Week 20's checks of the methods that spend the error where it costs least, on calibration data: the importance
matrix (`check_column_importance`, exercise 7), bits per layer from a sensitivity measurement
(`check_allocate_bits`, 8), GPTQ (`check_gptq_quantize`, 9) and AWQ (`check_awq_quantize`, 10), registered by
`checks/week20.py`, which imports this module; with the inputs they are judged on (activations, calibration and
held-out inputs with outlier channels) and what they share (a uniform grid, the output error, a pure call).
"""
from __future__ import annotations

import torch

from grader.checks import call_many, check_on_meta, generator, seed_note
from grader.checks.week20_oracle import run
from grader.wire import StudentTimeout
from lib.quantization import quant as ref


# --- 7: the importance matrix ---------------------------------------------------------------------------------

def _activations(offset):
    """Calibration-like activations: [(description, x)], columns of very different sizes (log-normal scales) and
    non-zero means, so that E[x²], E|x|, Var x, (E x)² and RMS are not proportional to each other; one 3-D batch;
    one float16 batch with outlier columns whose squares pass float16's 65,504."""
    g = generator(offset)

    def columns(tokens, cols):
        scale = torch.exp(torch.randn(cols, generator=g))
        mean = scale * (torch.rand(cols, generator=g) * 4 - 2)
        return torch.randn(tokens, cols, generator=g) * scale + mean

    x2 = columns(2 * 150, 40).reshape(2, 150, 40)
    x2[..., 7] = 0.0  # a column that is never active: weight 0
    half = columns(200, 32) * 4
    half[:, :3] = half[:, :3].sign() * (200 + 150 * torch.rand(200, 3, generator=g))  # "massive activations"
    # many tokens, and columns active in only some of them: a function that reads only the first tokens (a prefix
    # up to 3,072) or every second or fourth one gets 0 for some columns
    long = columns(4096, 16)
    long[:3072, :4] = 0.0  # columns 0-3: only in the last quarter of the tokens
    long[torch.arange(4096) % 4 != 3, 4:8] = 0.0  # columns 4-7: only at every fourth token, starting at token 3
    return [("activations [300, 48] float32", columns(300, 48)),
            ("activations [2, 150, 40] float32 (batch, tokens, columns; column 7 never active)", x2),
            ("activations [200, 32] float16 with 3 outlier columns of |x| 200-350", half.half()),
            ("activations [4096, 16] float32 (columns 0-3 active only in the last 1,024 tokens, 4-7 only at every "
             "fourth token: average over every token)", long)]


def _proportional(got, want):
    """The positive factor k with got ≈ k·want column by column (None when there is none)."""
    got, want = got.double(), want.double()
    k = float((got * want).sum() / (want * want).sum())
    ok = k > 0 and bool(((got - k * want).abs() <= 1e-4 * k * want + 1e-7 * k * want.max()).all())
    return k if ok else None


def check_column_importance(column_importance) -> None:
    """The per-column weights are proportional to each column's mean squared activation over every token (all
    dims but the last), any positive multiple; float32 whatever the input's dtype (float16 squares overflow);
    the input unchanged; made on the input's device (a meta run)."""
    for desc, x in _activations(750):
        what = f"column_importance({desc})"
        got = run(column_importance, x.clone(), what=what)
        cols = x.shape[-1]
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (cols,), (
            f"{what}: returned {type(got).__name__} {tuple(getattr(got, 'shape', ()))}; expected one weight per "
            f"input column, shape ({cols},): average over every token, i.e. all dims but the last")
        assert got.dtype == torch.float32, (
            f"{what}: returned {got.dtype}; return float32 whatever the input's dtype (the search runs in float32, and "
            f"float16 squares overflow past 65,504)")
        assert torch.isfinite(got).all(), (
            f"{what}: returned inf or NaN in columns {torch.nonzero(~torch.isfinite(got)).flatten().tolist()[:5]}: "
            f"squares of float16 activations above 256 overflow; convert to float32 first {seed_note()}")
        flat = x.double().reshape(-1, cols)
        if _proportional(got, (flat * flat).mean(0)) is not None:
            continue
        wrong = {"E|x| (AWQ's statistic: it sizes a column's scaling, not its error's weight)": flat.abs().mean(0),
                 "the variance: you subtracted each column's mean, but the output error Σ Δw_i x_i sees x, not x "
                 "minus its mean": flat.var(0, unbiased=False),
                 "the root mean square: the error is squared, its weight is not a square root": flat.pow(2).mean(0).sqrt(),
                 "the squared mean (E x)²": flat.mean(0) ** 2}
        named = [name for name, stat in wrong.items() if _proportional(got, stat) is not None]
        raise AssertionError(
            f"{what}: your weights are not proportional to the per-column statistic that makes Σ_i c_i Δw_i² the "
            f"expected squared output error" + (f"; they are proportional to {named[0]}" if named else "") +
            f". Expand E[(Σ_i Δw_i x_i)²] over the calibration tokens and keep the terms with one column {seed_note()}")
    x = _activations(750)[0][1]
    _pure(column_importance, (x,), "column_importance(activations [300, 48])")
    check_on_meta(column_importance, (x,), "column_importance(activations [300, 48])")


# --- 8: sensitivity -> bits -----------------------------------------------------------------------------------

def _saved(chosen, delta):
    return sum(delta[u] for u in chosen)


def check_allocate_bits(allocate_bits) -> None:
    """Within the budget, and saving at least the perplexity that the greedy-by-ratio allocation saves."""
    g = generator(800)
    cases = [  # a big unit that is sensitive in total but cheap per bit loses to two small ones
        ({"big": 10.0, "a": 6.0, "b": 6.0, "c": 0.5}, {"big": 1000, "a": 300, "b": 300, "c": 400}, 4.0, 3.5, 4.5),
        # low 2.5, not the 3.5 of every other case: the spare bits are (3.5 − 2.5) × 2000 and buy a, b and c; a
        # function that assumes low = 3.5 sees no spare bits at all
        ({"big": 10.0, "a": 6.0, "b": 6.0, "c": 0.5}, {"big": 1000, "a": 300, "b": 300, "c": 400}, 3.5, 2.5, 4.5)]
    for case in range(8):
        n = int(torch.randint(5, 14, (1,), generator=g))
        names = [f"blk.{i}.{k}" for i, k in enumerate(torch.randint(0, 7, (n,), generator=g).tolist())]
        delta = {u: float(v) for u, v in zip(names, torch.rand(n, generator=g).pow(3) * 20)}
        if case >= 6:  # measured noise: some units' ΔPPL is negative (quantizing them low *helped*)
            for u in names[::3]:
                delta[u] = -float(torch.rand(1, generator=g)) * 2
        sizes = {u: int(v) for u, v in zip(names, torch.randint(1, 9, (n,), generator=g) * 110_592)}
        low, high = 3.5, [4.5, 5.0, 8.5][int(torch.randint(3, (1,), generator=g))]
        budget = low + float(torch.rand(1, generator=g) if case < 6 else 0.9 + 0.1 * torch.rand(1, generator=g)) * (high - low)
        cases.append((delta, sizes, budget, low, high))
    # a real model's units, 7 kinds × 30 layers: a search over every subset (2^n), fine on the cases above, never
    # returns here (red team 11b)
    names = [f"blk.{layer}.{kind}" for layer in range(30) for kind in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                       "ffn_gate", "ffn_up", "ffn_down")]
    delta = {u: float(v) for u, v in zip(names, torch.rand(len(names), generator=g).pow(3) * 20)}
    sizes = {u: int(v) for u, v in zip(names, torch.randint(1, 9, (len(names),), generator=g) * 110_592)}
    cases.append((delta, sizes, 3.5 + float(torch.rand(1, generator=g)), 3.5, 4.5))
    for delta, sizes, budget, low, high in cases:
        what = f"allocate_bits(budget {budget:.3f} bits/weight, low {low}, high {high}, {len(delta)} units)"
        try:
            got = run(allocate_bits, dict(delta), dict(sizes), budget, low, high, what=what)
        except StudentTimeout as e:
            raise AssertionError(
                f"{what} did not return ({e}): {len(delta)} units are a real model's (7 kinds x 30 layers), and a "
                f"search over every subset takes 2^{len(delta)} steps. Design a choice whose work grows with the "
                f"number of units, not exponentially {seed_note()}") from None
        assert isinstance(got, (set, frozenset, list, tuple)), f"{what}: returned {type(got).__name__}; expected a set of names"
        got = set(got)
        assert got <= set(delta), f"{what}: returned names that are not units: {sorted(got - set(delta))}"
        bits = sum(sizes[u] * (high if u in got else low) for u in delta)
        assert bits <= budget * sum(sizes.values()) + 1e-6, (
            f"{what}: your choice {sorted(got)} needs {bits / sum(sizes.values()):.4f} bits/weight, over the budget")
        want = ref.allocate_bits(delta, sizes, budget, low, high)
        assert _saved(got, delta) >= _saved(want, delta) - 1e-9, (
            f"{what}: your choice {sorted(got)} saves ΔPPL {_saved(got, delta):.3f}; taking units in order of ΔPPL per "
            f"weight (the perplexity an extra bit buys) while they fit saves {_saved(want, delta):.3f} (the spare bits are "
            f"(budget − low) × all weights, a unit costs (high − low) × its weights, with the low and high given) "
            f"{seed_note()}")


# --- 9-10: GPTQ and AWQ --------------------------------------------------------------------------------------

def _calibration(rows, cols, n, offset):
    """Weights `[rows, cols]`, correlated inputs `[n, cols]` with a few outlier channels (like LLM activations),
    and held-out inputs `[n, cols]` from the same distribution (the error is judged there, not on the data
    the method fitted)."""
    g = generator(offset)
    w = 0.05 * torch.randn(rows, cols, generator=g)
    mix = torch.randn(cols, cols, generator=g) / cols**0.5
    outliers = torch.randperm(cols, generator=g)[:4]
    xs = []
    for _ in range(2):
        x = torch.randn(n, cols, generator=g) @ mix
        x[:, outliers] *= 20
        xs.append(x)
    return w, xs[0], xs[1]


def _calibration_quiet_outliers(rows, cols, n, offset):
    """Like `_calibration`, but the 8 outlier input channels (30x) meet weights 20x smaller than the rest and the
    inputs are uncorrelated: scaling those columns up costs the groups' steps little, so the best α is near 1
    (0.9-0.95 on a grid of 20, 0.875 on one of 8), where `_calibration`'s is 0.25-0.5. No single α came within
    1.001x of the best on all three cases (the closest was 1.7x off, over 40 seeds, on grids of 20): a fixed α,
    searching nothing, fails one whatever the seed."""
    g = generator(offset)
    w = 0.05 * torch.randn(rows, cols, generator=g)
    outliers = torch.randperm(cols, generator=g)[:8]
    w[:, outliers] *= 0.05
    xs = []
    for _ in range(2):
        x = torch.randn(n, cols, generator=g)
        x[:, outliers] *= 30
        xs.append(x)
    return w, xs[0], xs[1]


def _calibration_sequences(rows, cols, n, offset):
    """Inputs as LLM activations are: strongly correlated channels (rank 4 plus 10 % noise) and 4 outlier channels
    (20x) that fire in the last two thirds of the tokens only (the batch is three sequences, not alike). On these a
    search that scores each α by a diagonal of XᵀX (no cross terms) picks the α the output error picks in about
    one case in ten, and one that scores on the first 128 tokens (no outliers there) in one in thirty; four such
    cases, n_grid = 80, rejected both in 200 of 200 seeds (the solution: 200 of 200 pass)."""
    g = generator(offset)
    w = 0.05 * torch.randn(rows, cols, generator=g)
    basis = torch.randn(4, cols, generator=g)
    outliers = torch.randperm(cols, generator=g)[:4]
    xs = []
    for _ in range(2):
        x = torch.randn(n, 4, generator=g) @ basis + 0.1 * torch.randn(n, cols, generator=g)
        x[n // 3:, outliers] *= 20
        xs.append(x)
    return w, xs[0], xs[1]


def _uniform_grid(w_q, bits, group_size, what, col_scale=None):
    """Every (row, group) of `w_q` (times `col_scale` per input channel) lies on a uniform grid lo + step·k,
    k integer in 0 … 2^bits − 1 (within 1e-3 of a step: float rounding of a rescaled grid). A codebook of
    2^bits arbitrary values (k-means) is not one."""
    v = w_q.double() * (col_scale.double() if col_scale is not None else 1.0)
    rows, cols = v.shape
    g = v.reshape(rows, cols // group_size, group_size)
    lo = g.amin(-1, keepdim=True)
    span = g.amax(-1, keepdim=True) - lo
    levels = 2**bits - 1
    ok = span[..., 0] <= 1e-12 * g.abs().amax(-1).clamp_min(1e-30)
    for k in range(1, levels + 1):  # the top level used is k steps above the lowest
        r = (g - lo) / (span / k).clamp_min(1e-300)
        ok |= (r - r.round()).abs().amax(-1) <= 1e-3
    bad = (~ok).nonzero()
    assert len(bad) == 0, (
        f"{what}: row {int(bad[0, 0])}, group {int(bad[0, 1])} is not on a uniform {bits}-bit grid (lo + step·k, k an "
        f"integer 0…{levels}): {len(bad)} groups are not. Quantize to integer codes and return scale·q + lo "
        f"{seed_note()}")


def _mse(w, w_q, x):
    return float(((x.double() @ (w.double() - w_q.double()).T) ** 2).mean())


def _pure(fn, args, what):
    """Two calls with the very same argument objects (in the student's process too) give the same result, and
    (here) leave the arguments unchanged: a function that overwrites its input fails."""
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    first, second = call_many(fn, [(args, {}), (args, {})])
    for a, b in zip(args, before):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f"{what}: changed its input tensor in place; work on a copy (.clone())"
    r1 = first[0] if isinstance(first, tuple) else first
    r2 = second[0] if isinstance(second, tuple) else second
    assert isinstance(r1, torch.Tensor) and isinstance(r2, torch.Tensor) and torch.equal(r1, r2), (
        f"{what}: a second call with the same arguments returned something else — the first call changed its "
        f"inputs in place; work on a copy (.clone())")


def _dead_inputs(got, cut, bits, group, what) -> None:
    """The dead-input rule, every run: an input that is always 0 has its weight set to 0 before its group's grid is
    made, so 0 lies on or between that grid's ends and each dead weight comes out as the grid point nearest 0 — within
    half a step of 0 (the step read from `got`'s own group, its coarsest grid). Weights kept instead are off by about one standard
    deviation, in every row."""
    if not len(cut):
        return
    rows = got.shape[0]
    g = got.detach().double().reshape(rows, -1, group)
    lo, span = g.amin(-1), g.amax(-1) - g.amin(-1)
    # the coarsest uniform grid the group's values lie on (the fewest steps k from its lowest to its highest value):
    # never finer than the grid that made them (whose codes need not reach 0 and the top), so the bound is by
    # construction for a grid whose ends hold 0
    step = span.clone()
    found = span <= 0
    for k in range(1, 2**bits):
        r = (g - lo[..., None]) / (span[..., None] / k).clamp_min(1e-300)
        fits = ((r - r.round()).abs().amax(-1) <= 1e-3) & ~found
        step = torch.where(fits, span / k, step)
        found |= fits
    for j in sorted(int(c) for c in cut):
        bound = step[:, j // group] * (0.5 + 1e-6) + 1e-9
        far = (got.detach().double()[:, j].abs() > bound).nonzero().flatten()
        assert not len(far), (
            f"{what}: input {j} is always 0, yet row {int(far[0])}'s weight there is {float(got[far[0], j]):.4g}, more "
            f"than half a grid step ({float(step[far[0], j // group]):.4g} / 2) from 0 ({len(far)} of {rows} rows): the dead-input "
            f"rule — H_jj = 0: set H_jj = 1 and that weight to 0 before its group's grid is made, so it quantizes to the "
            f"grid point nearest 0 {seed_note()}")


# GPTQ is deterministic: a correct implementation (same grid, damping, order and lazy-batch arithmetic up to float
# rounding) reproduces lib.quantization.gptq's weights nearly everywhere; an error fed back differently drifts column by column.
GPTQ_SAME_CODES = 0.9


def check_gptq_quantize(gptq_quantize) -> None:
    """On a uniform grid; lib.quantization.gptq's weights (≥ 90 %), inputs narrower and wider than a lazy batch of 128, two dead,
    damped 1 % and 10 %; held-out error within 5 % of lib.quantization.gptq's; inputs unchanged; tensors on the inputs' device."""
    from lib.quantization.gptq import gptq_quantize as ref_gptq

    # case 3 is wider than one lazy batch (128 columns): an error that never leaves its batch (no W[:, b1:] -= E·U[b0:b1,
    # b1:]) matches GPTQ in the first 128 columns only (~40 % of the weights); damped 10 %: ignoring `damp` keeps ~10 %
    for i, (bits, group, cols, damp) in enumerate([(4, 64, 128, 0.01), (3, 32, 96, 0.01), (4, 32, 320, 0.1)]):
        w, x, x_test = _calibration(24, cols, 384, 900 + i)
        cut = torch.randperm(cols, generator=generator(950))[:2 if i == 1 else 0]  # inputs always 0: the dead-input rule
        x[:, cut], x_test[:, cut] = 0.0, 0.0
        dead = f", inputs {sorted(cut.tolist())} always 0" if len(cut) else ""
        what = f"gptq_quantize(w {tuple(w.shape)}, x {tuple(x.shape)}{dead}, bits={bits}, group_size={group}, damp={damp})"
        got = run(gptq_quantize, w.clone(), x.clone(), bits, group, damp, what=what)
        assert isinstance(got, torch.Tensor) and got.shape == w.shape and got.dtype == w.dtype, (
            f"{what}: returned {type(got).__name__} {tuple(getattr(got, 'shape', ()))} {getattr(got, 'dtype', '')}; "
            f"expected a {w.dtype} tensor {tuple(w.shape)}")
        _uniform_grid(got, bits, group, what)
        _dead_inputs(got, cut, bits, group, what)
        want_w = ref_gptq(w, x, bits, group, damp)
        step = (want_w.reshape(24, -1, group).amax(-1) - want_w.reshape(24, -1, group).amin(-1)) / (2**bits - 1)
        err, want = _mse(w, got, x_test), _mse(w, want_w, x_test)
        rtn = _mse(w, ref.rtn_quantize(w, bits, group), x_test)
        close = ((got - want_w).abs().reshape(24, -1, group) <= 1e-3 * step[..., None] + 1e-12).reshape(24, cols)
        live = torch.ones(cols, dtype=torch.bool)
        live[cut] = False
        same = float(close[:, live].double().mean())  # the dead columns are judged by their rule above
        first = float(close[:, :128].double().mean())
        batches = (f" Your weights are GPTQ's in the first 128 columns ({first:.0%}) and only {float(close[:, 128:].double().mean()):.0%} "
                   f"after: each column's error must reach every later column, past its lazy batch of 128 too "
                   f"(W[:, b1:] −= E·U[b0:b1, b1:] once per batch)" if cols > 128 and first >= 0.99 else "")
        assert same >= GPTQ_SAME_CODES and err <= 1.05 * want, (
            f"{what}: {same:.0%} of your weights are GPTQ's, output error {err:.4g} on held-out inputs; GPTQ gets "
            f"{want:.4g} (round-to-nearest {rtn:.4g}).{batches} Go column by column: the group's min/max grid from the "
            f"weights as updated when the group starts, round, and spread the error over the later columns with row j "
            f"of the Cholesky factor of H⁻¹ (H = 2XᵀX/n, plus damp = {damp} times its mean diagonal: the argument, "
            f"not a constant) {seed_note()}")
        if i < 2:
            _pure(gptq_quantize, (w, x, bits, group, damp), what)
            check_on_meta(gptq_quantize, (w, x, bits, group, damp), what)


def check_awq_quantize(awq_quantize) -> None:
    """The α found is as good as lib.quantization.awq's grid search on the calibration and on held-out inputs, on inputs whose
    best α differs (0.25-0.5 and 0.9-0.95: a fixed α fails one), with n_grid 20, 8 and 80, and on correlated inputs
    whose statistics change along the batch (`_calibration_sequences`: the α must minimize the whole output error,
    on every token); the weights are on a uniform grid after W·diag(s); inputs unchanged."""
    from lib.quantization.awq import awq_quantize as ref_awq
    from lib.quantization.awq import awq_scales

    # the third case searches n_grid=8 (α = 0, 0.125, … 0.875): a search that ignores n_grid (always 20) finds
    # 0.9 or 0.95 there, off that grid
    cases = [(3, 64, 192, 20, _calibration), (4, 32, 128, 20, _calibration), (4, 32, 128, 8, _calibration_quiet_outliers),
             *[(bits, group, 128, 80, _calibration_sequences) for bits in (4, 3) for group in (32, 16)]]
    notes = {_calibration_quiet_outliers: " (8 input channels 30x larger, their weights 20x smaller)",
             _calibration_sequences: " (correlated channels; 4 outlier channels in the last two thirds of the tokens)"}
    for i, (bits, group, cols, n_grid, inputs) in enumerate(cases):
        w, x, x_test = inputs(24, cols, 384, 1000 + i)
        what = (f"awq_quantize(w {tuple(w.shape)}, x {tuple(x.shape)}, bits={bits}, group_size={group}, n_grid={n_grid})"
                + notes.get(inputs, ""))
        got = run(awq_quantize, w.clone(), x.clone(), bits, group, n_grid, what=what)
        assert isinstance(got, tuple) and len(got) == 2, f"{what}: return (w_eff, alpha), a pair"
        w_eff, alpha = got
        assert isinstance(w_eff, torch.Tensor) and w_eff.shape == w.shape, f"{what}: w_eff must be a tensor {tuple(w.shape)}"
        alpha = float(alpha)
        assert any(abs(alpha - k / n_grid) < 1e-9 for k in range(n_grid)), (
            f"{what}: α = {alpha} is not on the grid 0, 1/{n_grid}, … {n_grid - 1}/{n_grid}: search the n_grid values "
            f"the argument asks for, not a fixed number")
        _uniform_grid(w_eff, bits, group, what + " (times s)", awq_scales(x.abs().mean(0), alpha))
        want_w, want_alpha = ref_awq(w, x, bits, group, n_grid)
        assert _mse(w, w_eff, x) <= 1.001 * _mse(w, want_w, x), (
            f"{what}: output error {_mse(w, w_eff, x):.4g} at α = {alpha} on the calibration inputs; the grid search "
            f"finds {_mse(w, want_w, x):.4g} at α = {want_alpha}. Try every α, scale the columns by s = (E|x|)^α, round "
            f"to nearest on the min/max grid, scale back, and keep the α with the smallest output error on x: "
            f"mean((x·(W − Ŵ)ᵀ)²) over every token of x, cross terms between channels included (the best α depends "
            f"on the inputs: no fixed one fits them all) {seed_note()}")
        err, want = _mse(w, w_eff, x_test), _mse(w, want_w, x_test)
        assert err <= 1.02 * want, (
            f"{what}: output error {err:.4g} on held-out inputs; AWQ's α = {want_alpha} gets {want:.4g} {seed_note()}")
        if i < 2:
            _pure(awq_quantize, (w, x, bits, group, n_grid), what)

