# %% [markdown]
# ## 4. K-quants
#
# llama.cpp's K-quants group 8 (or 16) sub-blocks into a **super-block of 256 weights** and quantize the
# sub-blocks' scales themselves, against one float16 scale per super-block. **Q4_K** (144 bytes):
#
# | bytes | what |
# |---|---|
# | 0–1 | `d`, float16: the scale of the sub-block scales |
# | 2–3 | `dmin`, float16: the scale of the sub-block minimums |
# | 4–15 | 8 six-bit scales `sc[j]` and 8 six-bit mins `m[j]`, packed in 12 bytes (below) |
# | 16–143 | 256 four-bit codes: 4 groups of 32 bytes; group `g` holds sub-block `2g` in the low nibbles and `2g+1` in the high nibbles |
#
# Weight `i` of sub-block `j` (32 weights each) is `(d·sc[j]) · q − (dmin·m[j])`. The 12 scale bytes:
#
#     bytes 0-3:  sc[0..3] in the low 6 bits; the top 2 bits of sc[4..7] in bits 6-7
#     bytes 4-7:  m[0..3]  in the low 6 bits; the top 2 bits of m[4..7]  in bits 6-7
#     bytes 8-11: the low 4 bits of sc[4..7] | the low 4 bits of m[4..7] << 4
#
# **Predict from the table, before you write the decoder:** how many bits per weight does Q4_K spend, and how many
# of them on scales and minimums? Set that against Q4_1's (section 2): every 32 weights get their own scale and
# minimum in both. (The count is after the check.)
#
# Bit-exact needs float32, but here not a particular order: a float16 `d` has an 11-bit significand and `sc` 6
# bits, so `d·sc` (17 bits) and then `(d·sc)·q` (21 bits) are exact in float32's 24 whichever way you group them;
# only the final subtraction rounds. Writing the unpacking is the point of this exercise (practice with bit fields).

# %% nbgrader={"grade": false, "grade_id": "dequantize_q4_k", "locked": false, "schema_version": 3, "solution": true, "task": false}
def dequantize_q4_k(data: np.ndarray) -> np.ndarray:
    """uint8 [rows, k * 144] in GGUF's Q4_K layout -> float32 [rows, k * 256]."""
    ### BEGIN SOLUTION
    rows = data.shape[0]
    b = np.ascontiguousarray(data).reshape(-1, 144)
    n = b.shape[0]
    d = np.ascontiguousarray(b[:, 0:2]).view(np.float16).astype(np.float32)  # [n, 1]
    dmin = np.ascontiguousarray(b[:, 2:4]).view(np.float16).astype(np.float32)
    s0, s1, s2 = b[:, 4:8], b[:, 8:12], b[:, 12:16]
    sc = np.concatenate([s0 & 0x3F, (s2 & 0x0F) | ((s0 >> 6) << 4)], axis=1)  # [n, 8]
    mn = np.concatenate([s1 & 0x3F, (s2 >> 4) | ((s1 >> 6) << 4)], axis=1)
    qs = b[:, 16:].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    step = (d * sc.astype(np.float32))[..., None]  # [n, 8, 1]
    offset = (dmin * mn.astype(np.float32))[..., None]
    return (step * q - offset).reshape(rows, -1)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_dequantize_q4_k", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_dequantize_q4_k(dequantize_q4_k)

# %% [markdown]
# **The count, now that your check passes.** (2 + 2 + 12 + 128) bytes · 8 / 256 weights = **4.5 bits per weight**, of
# which (2 + 2 + 12)·8 / 256 = 0.5 go to scales and minimums — Q4_0's price — while, as in Q4_1 at 5.0, every 32
# weights get their own scale *and* minimum: quantizing the scales to 6 bits against one float16 per 256 weights is
# what saves the half bit. (Q6_K: 16 sub-blocks of 16 with int8 scales and 6-bit codes, 210 bytes, 6.5625 bits; there
# `d·sc` with an int8 `sc` and a 6-bit `q` needs 25 bits, so gguf's order — `d·sc` first — matters.)
#
# gguf-py has no K-quant *quantizer*; write one. The obvious one takes each sub-block's min and max:
# `scale = (max − min)/15`. On Gaussian weights it only matches Q4_1 (the table after the check measures it) —
# Q4_K's extra structure buys nothing. llama.cpp does better, and that is your problem: per sub-block, find the scale `s ≥ 0` and the min
# `m ≥ 0` (weights `s·q − m`, `q` integer codes 0…15) that make a *weighted* squared error small,
#
# $$E(s, m) = \sum_i w_i\,(s\,q_i - m - x_i)^2, \qquad w_i = \sqrt{\tfrac{1}{32}\textstyle\sum_k x_k^2} + |x_i|$$
#
# (an error on a large weight counts more, but none counts for nothing; in section 5 the weights will come from
# activations instead). Min/max is rarely the minimizer: the extremes need not be levels. Two observations to build
# on: for fixed codes `q`, `E` is a quadratic in `(s, m)` — its minimum is yours to derive (mind that a negative `m`
# cannot be stored: mins are 6-bit *unsigned*); and for fixed `(s, m)` the best codes are obvious. How you search
# over the codes is your design.
#
# Then the 8 scales and 8 mins of a super-block are stored in 6 bits against float16 super-block scales — the
# format, not a choice: `d = max(s)/63`, `dmin = max(m)/63` (stored as float16; use the float16 values from here
# on), `sc = nearest_int(s/d)`, `mn = nearest_int(m/dmin)`, and the codes are recomputed against the *stored*
# scales: `q = clip(nearest_int((x + dmin·mn)/(d·sc)), 0, 15)`. ggml's K-quants round with `nearest_int`, which
# sends halves to the **even** neighbour (`np.rint`): a third rule beside Q8_0's `roundf` and Q4_1's `trunc(v + 0.5)`.
#
# The check decodes your bytes with gguf-py and wants the weighted error Σ w (x̂ − x)² within 0.5 % of llama.cpp's
# search as `lib.gguf.qformats` runs it (5 % on heavy-tailed rows; a search on the *unweighted* error lowers the plain RMSE
# a little and misses this bound), the plain RMSE within 1 % of it (3 % heavy-tailed), and below 0.95× Q4_1's
# on Gaussian weights. Both comparisons leave out the super-blocks where two candidate fits tie in `E` (a sub-block
# of one outlier and weights that all land on one code is fitted exactly by several; which one a search keeps is
# a rounding detail that moves `d`, and with it the whole super-block). If your search falls short, the failure
# message says what llama.cpp's does.

# %% nbgrader={"grade": false, "grade_id": "quantize_q4_k", "locked": false, "schema_version": 3, "solution": true, "task": false}
def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """x float32 [rows, n], n a multiple of 256 -> uint8 [rows, n // 256 * 144] that gguf-py decodes as Q4_K."""
    ### BEGIN SOLUTION
    rows, n_cols = x.shape
    sub = x.astype(np.float64).reshape(-1, 8, 32)  # [super-blocks, 8 sub-blocks, 32]
    n = sub.shape[0]
    w = np.sqrt((sub ** 2).mean(axis=2, keepdims=True)) + np.abs(sub)
    lo = np.minimum(sub.min(axis=2), 0)
    width = sub.max(axis=2) - lo
    width = np.where(width > 0, width, 1.0)

    def error(s, m, q):
        return (w * (s[..., None] * q - m[..., None] - sub) ** 2).sum(axis=2)

    best_s, best_m = width / 15, -lo
    best_e = error(best_s, best_m, np.clip(np.rint((sub - lo[..., None]) / best_s[..., None]), 0, 15))
    for delta in np.arange(-10, 11) / 10:
        q = np.clip(np.rint((sub - lo[..., None]) * ((15 + delta) / width)[..., None]), 0, 15)
        # dE/ds = 0 and dE/dm = 0:  s·Σwq² − m·Σwq = Σwqx  and  s·Σwq − m·Σw = Σwx
        a, b, c = (w * q * q).sum(2), (w * q).sum(2), w.sum(2)
        u, v = (w * q * sub).sum(2), (w * sub).sum(2)
        det = b * b - a * c
        safe = np.where(det != 0, det, 1.0)
        s = np.where(det != 0, (b * v - c * u) / safe, 0.0)
        m = np.where(det != 0, (a * v - b * u) / safe, 0.0)
        neg = m < 0  # not storable: m = 0, and s alone from dE/ds = 0
        s = np.where(neg, u / np.where(a > 0, a, 1.0), s)
        m = np.where(neg, 0.0, m)
        e = error(s, m, q)
        better = (e < best_e) & (s > 0)
        best_s, best_m, best_e = np.where(better, s, best_s), np.where(better, m, best_m), np.where(better, e, best_e)
    best_s = np.where(sub.max(axis=2) - lo > 0, best_s, 0.0).astype(np.float32)
    best_m = best_m.astype(np.float32)

    d = (best_s.max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16)
    dmin = (best_m.max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16)
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.rint(best_s / d32), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin32 > 0, np.rint(best_m / dmin32), 0).clip(0, 63).astype(np.uint8)
        step = (d32 * sc)[..., None]
        q = np.where(step > 0, np.rint((sub + (dmin32 * mn)[..., None]) / step), 0).clip(0, 15).astype(np.uint8)
    scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)], axis=1)
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    out = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qs], axis=1)
    return out.reshape(rows, n_cols // 256 * 144)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_quantize_q4_k", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_quantize_q4_k(quantize_q4_k)

# %% [markdown]
# **llama.cpp's search, now that yours passes** (`make_qkx2_quants` in ggml-quants.c; compare it with yours):
#
# * Let `lo = min(0, min x)`, `hi = max x`. The **candidates** are the inverse scales `(15 + δ)/(hi − lo)` for
#   δ = −1.0, −0.9, …, +1.0 (21 of them), plus min/max itself (`s = (hi − lo)/15`, `m = −lo`).
# * For a candidate, the **codes** are `q_i = clip(nearest_int((x_i − lo)·iscale), 0, 15)`.
# * With the codes fixed, setting ∂E/∂s = ∂E/∂m = 0 gives two linear equations,
#   `s·Σwq² − m·Σwq = Σwqx` and `s·Σwq − m·Σw = Σwx`: solve them. If `m < 0`, set `m = 0` and take
#   `s = Σwqx / Σwq²` (the minimum over `s` alone).
# * Keep the candidate with the smallest `E` (the min/max one if none is smaller, or if a fit gives `s ≤ 0`).
#
# Stretching or shrinking the grid a little lets the two extremes fall between levels while every other weight gets
# nearer one; the refit then places the levels where the weighted errors balance.
#
# **What the search buys.** RMSE relative to Q4_1's (5.0 bits) on a Gaussian tensor, a Student-t(3) one
# (heavier tails), and SmolLM2's `ffn_down` (rows of 1536 = 6 × 256, the one linear whose rows fit whole
# super-blocks) jittered off its Q4_1 grid by noise of a tenth of the weights' spread (as stored it *is*
# decoded Q4_1, which Q4_1 reproduces exactly: section 3). "min/max" is `qformats.quantize(x, "Q4_K", search=False)`.

# %%
g = np.random.default_rng(1)
down = model.layers[5].mlp.down_proj.weight.detach().cpu().numpy()
tensors = {
    "Gaussian [64, 1024]": g.standard_normal((64, 1024)).astype(np.float32),
    "Student-t(3) [64, 1024]": g.standard_t(3, (64, 1024)).astype(np.float32),
    "SmolLM2 ffn_down, jittered": (down + 0.1 * down.std() * g.standard_normal(down.shape)).astype(np.float32),
}


def roundtrip(x, qtype, **kw):
    return qformats.dequantize(qformats.quantize(x, qtype, **kw), qtype)


print(f"SmolLM2 blk.5 ffn_down as stored: Q4_1 RMSE {rmse(roundtrip(down, 'Q4_1'), down):.2g} (its own grid), "
      f"Q4_K min/max {rmse(roundtrip(down, 'Q4_K', search=False), down):.3g}, search {rmse(roundtrip(down, 'Q4_K'), down):.3g}")
print(f"{'RMSE / Q4_1':>24} {'Q4_1':>6} {'Q4_K min/max':>13} {'Q4_K search':>12} {'yours':>6} {'Q5_K':>6} {'Q6_K':>6}")
for name, x in tensors.items():
    q41 = rmse(roundtrip(x, "Q4_1"), x)
    row = [rmse(roundtrip(x, "Q4_K", search=False), x), rmse(roundtrip(x, "Q4_K"), x),
           rmse(dequantize_q4_k(quantize_q4_k(x)), x), rmse(roundtrip(x, "Q5_K"), x), rmse(roundtrip(x, "Q6_K"), x)]
    print(f"{name:>24} {1:>6.3f} {row[0] / q41:>13.3f} {row[1] / q41:>12.3f} {row[2] / q41:>6.3f} "
          f"{row[3] / q41:>6.3f} {row[4] / q41:>6.3f}")

# %% [markdown]
# Read the ratios: with the search, Q4_K at 4.5 bits has less error than Q4_1 at 5.0 on Gaussian weights and on
# Student-t, where min/max alone only matches Q4_1: the search is what makes K-quants good. On the stored
# SmolLM2 tensor Q4_1 is exact, so every other format can only lose to it; jittered, the search wins again.
# Q5_K and Q6_K follow: each extra bit halves the step, and so roughly the error.
#
# **SmolLM2 has a catch:** `d_model = 576` is not a multiple of 256, so only `ffn_down` (1536 columns) can
# be stored as a K-quant at all. llama.cpp's quantizer (`llama-quant.cpp`) falls back for such rows:
# Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0 (`lib.gguf.qformats.K_FALLBACK`). A "Q4_K" SmolLM2 is mostly Q5_0.

# %% [markdown]
# ## 5. Perplexity versus bits per weight
#
# Now the whole model: quantize every linear of the 30 blocks (the tied embedding / LM head stays as it is
# stored, Q8_0), and measure perplexity on the committed Hamlet text. Bits per weight are averaged over the
# linears *as stored* (with the fallbacks). Besides the GGUF types: a **Q4_K_M-like mix** — Q4_K, except that two
# of the seven per-layer tensor types get Q6_K in some of the layers, as llama.cpp's `_M` mixes do (which
# two, and why, is section 12's question; section 6 measures the answer) — and a 3-bit level (round-to-nearest, min/max per group:
# no GGUF type, the baseline of section 7).

# %%
text_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[0]
EVAL_WINDOWS = 17 if FULL else 2 if QUICK else 4  # windows of 255 scored tokens: 4,335 with FULL, 1,020 in the short run
eval_ids = text_ids[10000:10000 + 255 * EVAL_WINDOWS + 1]  # held out: calibration (below) reads 5000-6023
calibration = [text_ids[s:s + 256].unsqueeze(0) for s in range(5000, 5000 + 1024, 256)]


def ppl(m):  # quick, for the many measurements of sections 6-10: one window (noisy: compare within a section)
    return perplexity(m, text_ids[2000:2256], window=256, stride=255)


def nlls(m):  # every eval token's NLL; perplexity_se turns them into PPL ± a standard error across windows
    return token_nlls(m, eval_ids, window=256, stride=255)


def rtn_fn(bits, group):
    return lambda name, w, qtype: ref.rtn_quantize(w, bits, group)


linears = ref.linear_names(model)
variants = {  # name: (type of each linear, weight_fn replacing the GGUF round trip or None)
    "Q8_0": (ref.uniform_plan(model, "Q8_0"), None),
    "Q6_K": (ref.uniform_plan(model, "Q6_K"), None),
    "Q5_1": (ref.uniform_plan(model, "Q5_1"), None),
    "Q5_0": (ref.uniform_plan(model, "Q5_0"), None),
    "Q4_1": (ref.uniform_plan(model, "Q4_1"), None),
    "Q4_K_M-like": (ref.q4_k_m_plan(model), None),
    "Q4_K": (ref.uniform_plan(model, "Q4_K"), None),
    "Q4_0": (ref.uniform_plan(model, "Q4_0"), None),
    "3-bit g32 (RTN)": ({n: "rtn" for n in linears}, rtn_fn(3, 32)),
    "3-bit g64 (RTN)": ({n: "rtn" for n in linears}, rtn_fn(3, 64)),
}
if not FULL:  # the short run skips the formats that repeat a neighbour's story
    for name in ["Q6_K", "Q5_0", "3-bit g32 (RTN)"] + (["Q5_1", "Q4_1"] if QUICK else []):
        del variants[name]
base_nll = nlls(model)
results = {"F32 (decoded Q4_1)": (32.0, *perplexity_se(base_nll, chunk=255), 0.0, 0.0)}
for name, (plan, fn) in tqdm(variants.items(), desc="formats"):
    if fn is None:
        bpw = ref.plan_bits_per_weight(model, plan)
    else:
        bpw = ref.rtn_bits_per_weight(3, 32 if "g32" in name else 64)
    nll = nlls(ref.quantize_model(model, plan, weight_fn=fn))
    results[name] = (bpw, *perplexity_se(nll, chunk=255), *perplexity_se(nll, chunk=255, baseline=base_nll))
print(f"perplexity on {base_nll.numel()} held-out tokens of Hamlet, {EVAL_WINDOWS} windows of 255 (± one standard "
      f"error across windows; ΔPPL paired window by window)")
print(f"{'format':>20} {'bits/weight':>12} {'PPL':>14} {'ΔPPL':>14}")
for name, (bpw, p, se, d, d_se) in results.items():
    print(f"{name:>20} {bpw:>12.3f} {p:>8.2f} ± {se:<4.2f} {d:>+8.2f} ± {d_se:<4.2f}")

# %% [markdown]
# Seed 004's table for **Llama-3.1-8B-Instruct** (WikiText-2 perplexity, llama.cpp; bits per weight from the
# reported size reductions against F16, so embeddings included) sits next to ours. A point is on the
# **Pareto front** if no other point is both smaller and better.

# %%
seed004 = {"F16": (0.0, 7.32), "Q5_0": (65.19, 7.43), "Q4_K_S": (70.83, 7.62), "Q3_K_S": (77.23, 8.96)}  # (size reduction %, PPL)


def pareto(points):
    pts = {n: v[:2] for n, v in points.items()}
    return {n for n, (b, p) in pts.items() if not any(b2 <= b and p2 <= p and (b2, p2) != (b, p) for b2, p2 in pts.values())}


fig, axes = plt.subplots(1, 2, figsize=(12, 4))
front = pareto(results)
for name, (bpw, p, se, *_) in results.items():
    axes[0].errorbar(min(bpw, 9.5), p, yerr=se, fmt="o", ms=4, color="C2" if name in front else "C0")
    axes[0].annotate(name + (" →32" if bpw > 9.5 else ""), (min(bpw, 9.5), p), fontsize=7)
pts = sorted((min(v[0], 9.5), v[1]) for n, v in results.items() if n in front)
axes[0].plot(*zip(*pts), color="C2", lw=1, label="Pareto front")
axes[0].set_xlabel("bits per weight (linears)"); axes[0].set_ylabel("perplexity"); axes[0].legend()
axes[0].set_yscale("log")  # the 3-bit point would flatten the rest on a linear axis
axes[0].set_title(f"SmolLM2-135M, {base_nll.numel()} tokens of Hamlet (± 1 s.e.)", fontsize=9)
for name, (red, p) in seed004.items():
    bpw = 16 * (1 - red / 100)
    axes[1].scatter(bpw, p, color="C1"); axes[1].annotate(name, (bpw, p), fontsize=8)
axes[1].set_xlabel("bits per weight (whole file)"); axes[1].set_ylabel("WikiText-2 perplexity")
axes[1].set_title("Llama-3.1-8B-Instruct (seed 004, Table 2)", fontsize=9)
plt.tight_layout(); plt.show()
f16 = seed004["F16"][1]
print("seed 004, Llama-3.1-8B: " + ", ".join(f"{n} {p - f16:+.2f} ({100 * (p / f16 - 1):+.1f} %)"
                                            for n, (_, p) in seed004.items() if n != "F16"))

# %% [markdown]
# Read the two panels together. Seed 004's panel is what quantizing an *original* FP16 model looks like:
# flat down to about 5 bits, then bending up (what each format costs it is printed under the plot). Ours is
# not monotone, and section 3 says why — the reference is Q4_1:
#
# * **Q4_1 costs exactly nothing**, and Q8_0 (and Q6_K, stored as Q8_0 on 576-wide rows) add almost nothing:
#   their steps are many times finer than Q4_1's.
# * **Q5_0 and Q5_1 are not free**, although they have twice Q4_1's levels: their grids do not contain
#   Q4_1's, so every weight is rounded a second time, by up to half a Q5 step. And Q5_1 does worse than that
#   suggests, for a reason of its own (next cell): it keeps each block's min and max, which *are* Q4_1's
#   levels 0 and 15, and divides their distance into 31 steps instead of 15 — so Q4_1's level i lands at
#   31/15·i = 2.067·i Q5_1 steps, and rounding moves it by −0.067·i steps (mod 1): an error that grows with
#   the weight's position in its block, a *gain* error, where Q5_0's grid (centred on zero, its step from
#   the abs-max) re-rounds each level by an amount unrelated to its value. Measuring a quantizer on
#   already-quantized weights measures the *interaction* of two grids.
# * **Below 4 bits both models fall off a cliff**, and the 135M model far harder: plain 3-bit rounding
#   multiplies its perplexity several times, where Q3_K_S costs the 8B model far less. A small model has little
#   redundancy to absorb the noise — and 3-bit round-to-nearest is cruder than llama.cpp's Q3_K.
#
# The Q4_K_M-like mix buys back part of Q4_K's loss for 0.3 bits: where the extra bits go matters. Section 6
# asks that question directly; sections 7 and 8 spend the same bits more cleverly.
#
# The gain error, measured: the slope of the re-rounding error against the weight (least squares,
# error ≈ slope·w, per tensor of a few layers). A slope `s` makes every weight `1 + s` times too large.

# %%
for qtype in ["Q5_0", "Q5_1"]:
    slopes = []
    for layer in [0, 15, 29]:
        w = model.layers[layer].mlp.down_proj.weight.detach().cpu().numpy()
        err = qformats.dequantize(qformats.quantize(w, qtype), qtype) - w
        slopes.append(float((err * w).sum() / (w * w).sum()))
    print(f"{qtype}: error-on-weight slope (ffn_down of layers 0, 15, 29): " + ", ".join(f"{v:+.4f}" for v in slopes))

# %% [markdown]
# ### The importance matrix
#
# The search of section 4 weighted each weight's error by the size of the weights around it. What the model
# cares about is the *output* of each linear: a row computes Σ_i w_i x_i, so rounding changes its output by
#
# $$e = \textstyle\sum_i \Delta w_i\, x_i .$$
#
# The search can minimize any per-column weighted error Σ_i c_i Δw_i², one vector c per tensor (shared by its
# rows), and the inputs the model really sees can be measured: hook a linear and record what it is given while
# the model reads calibration text. llama.cpp does exactly this (`llama-imatrix` writes the vectors,
# `llama-quantize --imatrix` hands them to the search; every modern low-bit GGUF is made that way).
#
# **Exercise 7 (derivation).** Which c makes Σ_i c_i Δw_i² the expected squared output error E[e²] over the
# calibration tokens? Expand E[e²] yourself; in the cell after the check, say which terms you had to drop for it to
# take that form, and for which inputs dropping them costs the most. Then write `column_importance(x)`: from the
# inputs one linear saw, `x [..., in]` (every dim but the last counts tokens; any float dtype — half-precision
# activations included), the weights `c [in]`, float32. Any positive multiple of c gives the same search, and the
# check accepts any.

# %% nbgrader={"grade": false, "grade_id": "column_importance", "locked": false, "schema_version": 3, "solution": true, "task": false}
def column_importance(x: torch.Tensor) -> torch.Tensor:
    """x [..., in]: the inputs one linear saw (all dims but the last are tokens) -> [in] float32, the per-column
    weights c that make Σ_i c_i Δw_i² the expected squared output error over those tokens."""
    ### BEGIN SOLUTION
    flat = x.reshape(-1, x.shape[-1]).float()  # float16 squares pass 65,504 from |x| > 256
    return (flat * flat).mean(0)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_column_importance", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_column_importance(column_importance)

# %% [markdown] nbgrader={"grade": true, "grade_id": "column_importance_why", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# **Model answer.** E[e²] = Σ_i Σ_j Δw_i Δw_j E[x_i x_j] = Σ_i Δw_i² E[x_i²] + Σ_{i≠j} Δw_i Δw_j E[x_i x_j], so
# c_i = E[x_i²], the mean squared activation of column i (not its variance: the error sees x, mean included;
# not E|x|). The cross terms are dropped: exact when the columns are uncorrelated (or the rounding errors of a
# row are independent with mean zero, so the cross terms average out); they cost the most when inputs are
# strongly correlated — then errors in correlated columns add up or cancel, which only the whole matrix
# E[x xᵀ] sees. GPTQ (section 7) keeps it: its Hessian 2XᵀX/n is that matrix, and c is its diagonal.
#
# **Mark scheme (1 point).** The cross terms Σ_{i≠j} Δw_i Δw_j E[x_i x_j] named as what is dropped, and
# correlated inputs as when it matters most.

# %% [markdown]
# The derivation, for after your answer: E[e²] = Σ_i Δw_i² E[x_i²] + Σ_{i≠j} Δw_i Δw_j E[x_i x_j]; the diagonal
# terms are the form the search minimizes, so c_i = E[x_i²] — the **importance matrix** (a vector per tensor,
# despite the name). GPTQ in section 7 keeps the cross terms too: its Hessian is the whole matrix E[x xᵀ].
#
# Your `column_importance` now builds it: `ref.input_column_means` hooks every linear in `some` and averages
# what your function returns over the 1,024 calibration tokens of Hamlet (which the evaluation never reads);
# the cell compares the result with `ref.collect_imatrix`. `quantize_model(..., importance=imatrix)` hands each
# tensor its vector to the search (the legacy fallbacks search too, as llama.cpp's do with an imatrix). At 3
# bits, `ref.search_quantize` is the same search on 3-bit groups of 32 with a float16 scale and min (RTN's
# format: 4.0 bits per weight).
#
# The short run quantizes the linears of `IMATRIX_LAYERS` only (the search over all 30 layers takes minutes);
# `FULL` does all of them.

# %%
IMATRIX_LAYERS = list(range(cfg.n_layers)) if FULL else [15] if QUICK else [0, 15, 29]
some = [n for n in linears if int(n.split(".")[1]) in IMATRIX_LAYERS]
imatrix = ref.input_column_means(model, calibration, some,  # {name: your c per input column}
                                 lambda x: column_importance(x).expand_as(x))
lib_imatrix = ref.collect_imatrix(model, calibration, some)
rel = max(float(((imatrix[n] / imatrix[n].mean()) - (lib_imatrix[n] / lib_imatrix[n].mean())).abs().max()) for n in some)
print(f"{len(some)} linears; your importance vs lib's (each scaled to mean 1): largest difference {rel:.2g}")
im_rows = {
    "Q4_K": ref.quantize_model(model, {n: "Q4_K" for n in some}),
    "Q4_K + imatrix": ref.quantize_model(model, {n: "Q4_K" for n in some}, importance=imatrix),
    "3-bit g32 RTN": ref.quantize_model(model, {n: 3 for n in some},
                                        weight_fn=lambda n, w, b: ref.rtn_quantize(w, 3, 32)),
    "3-bit g32 search": ref.quantize_model(model, {n: 3 for n in some},
                                           weight_fn=lambda n, w, b: ref.search_quantize(w, 3, 32)),
    "3-bit g32 search + imatrix": ref.quantize_model(model, {n: 3 for n in some},
                                                     weight_fn=lambda n, w, b: ref.search_quantize(w, 3, 32, imatrix[n])),
}
im_nll = {name: nlls(m) for name, m in tqdm(im_rows.items(), desc="imatrix")}
del im_rows
print(f"layers {IMATRIX_LAYERS}; {base_nll.numel()} held-out tokens; ΔPPL paired window by window (± 1 s.e.)")
for name, nll in im_nll.items():
    p, se = perplexity_se(nll, chunk=255)
    d, d_se = perplexity_se(nll, chunk=255, baseline=base_nll)
    print(f"{name:>28}: PPL {p:7.2f} ± {se:.2f}   vs unquantized {d:+6.2f} ± {d_se:.2f}")
for a, b in [("Q4_K + imatrix", "Q4_K"), ("3-bit g32 search", "3-bit g32 RTN"),
             ("3-bit g32 search + imatrix", "3-bit g32 search")]:
    d, d_se = perplexity_se(im_nll[a], chunk=255, baseline=im_nll[b])
    print(f"{a} vs {b}: {d:+.2f} ± {d_se:.2f}")

# %% [markdown]
# ## 6. Per-layer sensitivity
#
# Not every tensor suffers equally from rounding. Measure it: quantize **one tensor type** (in all 30 layers),
# or **one layer** (all 7 of its linears), to a low format — 3-bit round-to-nearest in groups of 64, 3.5 bits
# per weight — leave everything else as it is, and see how much perplexity rises (`FULL`: every layer).

# %%
LOW_BITS, HIGH_BITS, GROUP = 3, 4, 64
low_bpw, high_bpw = ref.rtn_bits_per_weight(LOW_BITS, GROUP), ref.rtn_bits_per_weight(HIGH_BITS, GROUP)
def rtn_model(bits_of):  # {parameter name: bits}; other tensors untouched
    return ref.quantize_model(model, bits_of, weight_fn=lambda name, w, bits: ref.rtn_quantize(w, bits, GROUP))


params = dict(model.named_parameters())
kinds = ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
probe_layers = list(range(cfg.n_layers)) if FULL else [0, 29] if QUICK else [0, 11, 18, 29]
base_quick = ppl(model)
kind_delta, layer_delta = {}, {}
for kind in tqdm(kinds, desc="one tensor type at a time"):
    kind_delta[kind] = ppl(rtn_model({n: LOW_BITS for n in linears if kind in n})) - base_quick
for layer in tqdm(probe_layers, desc="one layer at a time"):
    layer_delta[layer] = ppl(rtn_model({n: LOW_BITS for n in linears if n.startswith(f"layers.{layer}.")})) - base_quick
kind_size = {k: sum(params[n].numel() for n in linears if k in n) for k in kinds}

fig, axes = plt.subplots(1, 2, figsize=(12, 3.3))
axes[0].bar([k.split(".")[1] for k in kinds], [kind_delta[k] for k in kinds])
axes[0].set_ylabel("ΔPPL"); axes[0].set_title(f"one type, all layers, at {LOW_BITS} bits (base {base_quick:.1f})", fontsize=9)
ax2 = axes[0].twinx()
ax2.plot([k.split(".")[1] for k in kinds], [1e6 * kind_delta[k] / kind_size[k] for k in kinds], "o-", color="C3")
ax2.set_ylabel("ΔPPL per million weights", color="C3")
axes[1].bar([str(l) for l in probe_layers], [layer_delta[l] for l in probe_layers], color="C1")
axes[1].set_xlabel("layer"); axes[1].set_title("one layer, all types", fontsize=9)
plt.tight_layout(); plt.show()
print("ΔPPL at 3 bits: " + ", ".join(f"{k.split('.')[1]} {kind_delta[k]:+.2f} ({1e6 * kind_delta[k] / kind_size[k]:.2f} "
                                     f"per million weights)" for k in kinds))

# %% [markdown]
# Read the two panels. Which tensor type costs the most in total, and which the most *per weight* — where
# would an extra bit buy the most? (Section 12's `answer_q9` reads the quiz's answer off this measurement,
# `kind_delta`, and compares it with the types llama.cpp's `_M` mixes give Q6_K.) llama.cpp's choice of *layers* for the extra bits (the first and last
# eighth, every third between: `lib.quantization.quant.use_more_bits`) is a rule of thumb; look at the right panel for
# whether the first and last layers are really the sensitive ones here — measure, don't assume.
#
# Now turn the measurements into an allocation. Two formats, low (3-bit, 3.5 bits per weight) and high (4-bit,
# 4.5), and a budget of 4.0 bits per weight on average. Which units (here: tensor types) should get the high format?
# Every unit starts low; raising unit `u` costs (high − low) bits for each of its weights and saves `delta_ppl[u]`
# (what rounding it low cost in your measurement). Find a set that saves as much perplexity as you can while the
# average stays within the budget — how to choose is yours (the check compares the perplexity your choice saves
# with what a good allocation saves, on budgets and measurements you have not seen). A measured ΔPPL can
# be zero or negative (noise on a short text, or rounding that happened to help): bits spent there buy nothing.

# %% nbgrader={"grade": false, "grade_id": "allocate_bits", "locked": false, "schema_version": 3, "solution": true, "task": false}
def allocate_bits(delta_ppl: dict, n_weights: dict, budget_bpw: float, low_bpw: float, high_bpw: float) -> set:
    """Names of the units that get the high format: as much of delta_ppl saved as you can while the average
    bits per weight stays within budget_bpw (every unit starts low; delta_ppl[u] is what raising u saves)."""
    ### BEGIN SOLUTION
    spare = (budget_bpw - low_bpw) * sum(n_weights.values())  # extra bits we may spend
    chosen = set()
    for unit in sorted(delta_ppl, key=lambda u: delta_ppl[u] / n_weights[u], reverse=True):
        cost = n_weights[unit] * (high_bpw - low_bpw)
        if delta_ppl[unit] > 0 and cost <= spare + 1e-9:
            chosen.add(unit)
            spare -= cost
    return chosen
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_allocate_bits", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_allocate_bits(allocate_bits)

# %% [markdown]
# **The rule, now that your check passes.** This is a knapsack: each unit has a value (the ΔPPL raising it saves) and
# a weight (its extra bits), and the budget is the sack. The check asks for at least what the greedy rule saves: take
# units in order of ΔPPL *per weight* (the perplexity one extra bit buys there), highest first, each one that still
# fits, skipping those with ΔPPL ≤ 0. Greedy is not always optimal (a big unit that just misses can leave room
# unused that two small ones would have filled), but it falls short of the optimum by at most the value of the
# first unit that did not fit, nothing when the units are small next to the budget; a dynamic program over the budget finds the optimum, and passes too. By
# *total* ΔPPL instead of per weight, the big tensors win every time even where the same bits spread over small,
# sensitive ones would buy more.

# %% [markdown]
# **Milestone: beats uniform allocation at the same size.** The uniform model at 4.0 bits per weight is 3-bit
# in groups of 32 (the scales take the extra half bit) for every tensor.

# %%
BUDGET = 4.0
high_kinds = allocate_bits(kind_delta, kind_size, BUDGET, low_bpw, high_bpw)
mixed_bits = {n: HIGH_BITS if any(k in n for k in high_kinds) else LOW_BITS for n in linears}
mixed_bpw = sum(params[n].numel() * ref.rtn_bits_per_weight(b, GROUP) for n, b in mixed_bits.items()) / sum(params[n].numel() for n in linears)
mixed_ppl = ppl(rtn_model(mixed_bits))
uniform_ppl = ppl(ref.quantize_model(model, {n: 3 for n in linears}, weight_fn=lambda n, w, b: ref.rtn_quantize(w, 3, 32)))
low_ppl = ppl(rtn_model({n: LOW_BITS for n in linears}))
print(f"high format for: {sorted(k.split('.')[1] for k in high_kinds)}")
print(f"{'allocation':>34} {'bits/weight':>12} {'PPL':>8}")
print(f"{'all 3-bit g64':>34} {low_bpw:>12.3f} {low_ppl:>8.2f}")
print(f"{'uniform: all 3-bit g32':>34} {ref.rtn_bits_per_weight(3, 32):>12.3f} {uniform_ppl:>8.2f}")
print(f"{'by sensitivity: 4-bit / 3-bit g64':>34} {mixed_bpw:>12.3f} {mixed_ppl:>8.2f}")
print(f"(reference, unquantized: {base_quick:.2f}; one window) -> sensitivity-guided "
      f"{'beats' if mixed_ppl < uniform_ppl else 'does NOT beat'} uniform at the same size")
