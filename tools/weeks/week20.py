"""Build solutions/20/week20_quantization.ipynb: `python tools/weeks/week20.py` (from the repo root)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.nbbuild import Notebook  # noqa: E402
from tools.results import recorded_md  # noqa: E402

nb = Notebook()

nb.md(r"""
# Week 20 — Quantized inference: GGUF formats, K-quants, GPTQ and AWQ

Decoding one token at batch 1 reads every weight once, so the step time is mostly *bytes of weights ÷
memory bandwidth*. Store the weights in fewer bits and the step gets faster — if the model survives it.
The lab already stands on a quantized file: `SmolLM2-135M-Instruct.Q4_1.gguf`. This week opens it.
You will write the llama.cpp block formats **byte for byte** (checked against gguf-py, the reference
port of ggml's C code), find out what the model we have been calling "F32" really is, decode the
K-quants with their packed 6-bit scales, and measure what each format costs in perplexity per bit.

**You will write** the Q8_0, Q4_1 and Q5_0 quantizers byte for byte (ggml's formats are a specification: the
typing and its rounding rules are the point), a model that predicts the error each format makes before you
measure it, the Q4_K dequantizer, and then problems whose method is yours to work out: a Q4_K quantizer as good
as llama.cpp's search, the importance matrix, a bit allocation from your own sensitivity measurement, GPTQ's
update, AWQ's scale search, a GGUF file's container, and a quiz answer read off your measurement. Each is checked
by the cell right after it and by `pytest weeks/20 -k exNN` (for example `pytest weeks/20 -k ex03`); `pytest
weeks/20` checks everything. Where a method is yours to find, its derivation comes after the check that passes it.

Set `FULL = True` in the next cell for the long measurements (4,335 held-out tokens for the perplexity
table instead of 1,020, every tensor and layer instead of a sample). The default run is sized to finish within
3 minutes on 2 quiet cores; `FULL = True` takes far longer (every layer, 4,335 tokens).
""")

nb.setup(r"""
import gguf  # its constants (gguf.GGMLQuantizationType); its quantizers and writer are what the checks compare with
import numpy as np
import torch

from grader.checks.week20 import (check_quantize_q8_0, check_quantize_q4_1, check_quantize_q5_0, check_predict_rmse,
                                  check_dequantize_q4_k, check_quantize_q4_k, check_allocate_bits, check_gptq_quantize,
                                  check_awq_quantize, check_gguf_bytes, check_answer_q9, check_column_importance)
""")

nb.code(r"""
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from lib.bench import paths, records, roofline
from lib.quantization import awq as ref_awq, gptq as ref_gptq, quant as ref  # the lab's reference: compare after writing your own
from lib.gguf import qformats
from lib.modeling.llama import shared_smollm2
from lib.modeling.text import load_text, perplexity, perplexity_se, token_nlls
from lib.bench.timing import Conditions, interleaved, report, warning

FULL = False  # True: perplexity on 4,335 tokens instead of 1,020, every tensor instead of a sample (many minutes)

model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32, dequantized from the Q4_1 GGUF file; do not modify it
cfg = model.config
dev = model.device  # CUDA when there is one; numpy (the quantizers of sections 2-4 and 11) needs .cpu() first
print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {dev}, {torch.get_num_threads()} CPU threads")
""")

# --- 1 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 1. Why quantize

At batch 1 a decode step multiplies one token's vector by every weight matrix: each weight is read once
and used for one multiply-add. The arithmetic is trivial; the time goes into moving the bytes. So the
roofline for a decode step is simply

$$t_\text{token} \approx \frac{\text{weight bytes}}{\text{memory bandwidth}}, \qquad
\text{weight bytes} = n_\text{weights}\cdot\frac{\text{bits per weight}}{8}.$$

Seed 002's Q1: a 13B-parameter model in FP16 needs 13·10⁹ × 2 B = **26 GB** for its weights alone — more
than a 24 GB GPU holds. In a 4.5-bit format it needs 7.3 GB. Below: the same arithmetic for SmolLM2 on
this machine, with the bandwidth measured by reading a large matrix once, as fast as torch can (a sum over
it: every core streams its share). Week 16 measured a one-row matrix product instead, the operation of a
decode step; it is printed beside it (compare the two: on a CPU that kernel tends to read below what the memory
delivers, so it is not the ceiling). A probe on a shared machine reads differently from minute to minute, so the
rooflines use the best streaming bandwidth measured on this class of machine (`lib.bench.records.best_bandwidth`:
the committed records, this machine's earlier runs, and this run), never one run's reading alone.
""")

nb.code(r"""
n_weights = roofline.matmul_params(model)  # the linears of 30 blocks + the tied LM head: read once per token
# on the model's device (the memory its decode steps read): how="stream" is the ceiling, "matvec" week 16's probe
conditions = Conditions.now()
bandwidth = roofline.measure_bandwidth(mib=256 if FULL else 128, repeats=3, device=dev)
matvec = roofline.measure_bandwidth(mib=256 if FULL else 128, repeats=3, device=dev, how="matvec")
conditions.done()
# a shared machine's probe moves from minute to minute: the rooflines use the best this machine class has shown
roof_bandwidth, roof_from = records.best_bandwidth(measured_now=bandwidth)
print(f"bandwidth on {dev}, now: {bandwidth / 1e9:.1f} GB/s streaming (a one-row F.linear over the same bytes: "
      f"{matvec / 1e9:.1f} GB/s); {conditions.line()}")
print(f"the rooflines use {roof_bandwidth / 1e9:.1f} GB/s: {roof_from}")
if conditions.busy:
    print(warning([], conditions))
print(f"{n_weights:,} weights read per token; 13B parameters in FP16: {13e9 * 16 / 8 / 1e9:.0f} GB, in a 4.5-bit "
      f"format: {13e9 * 4.5 / 8 / 1e9:.1f} GB")
formats = {"F32": 32.0, "F16": 16.0, "Q8_0": 8.5, "Q4_1": 5.0, "Q4_0": 4.5}
print(f"{'format':>12} {'MB / token':>11} {'roofline tok/s':>15}")
for name, bpw in formats.items():
    nbytes = n_weights * bpw / 8
    print(f"{name:>12} {nbytes / 1e6:>11.0f} {roof_bandwidth / nbytes:>15.0f}")
""")

nb.md(r"""
Four times fewer bytes is four times the ceiling. (The ceiling is not the speed: at 135M parameters the
per-layer overheads of an eager PyTorch model dominate long before bandwidth does — the decode benchmark
measures how close we get.) The rest of this week is about the price of those bits.
""")

# --- 2 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 2. Q8_0, Q4_0 and Q4_1, byte for byte

GGUF stores a quantized tensor row by row, each row cut into **blocks of 32 weights**. A block is a few
bytes of scale (a float16) followed by the packed integers. No per-tensor header, no padding: a row of
`n` weights is `n / 32` blocks back to back, so the file is `uint8 [rows, n / 32 · bytes per block]`.

**Q8_0** (34 bytes): a float16 scale `d`, then 32 int8 codes `q`; weight `i` is `d · q[i]`. The scale is
the one that puts the block's largest *magnitude* exactly on the edge of the symmetric code range
±127 — derive it from that. ggml works in float32: it computes `d`, then its reciprocal **once** (0 for an
all-zero block), multiplies every value by that reciprocal (a multiply, not a divide: they round
differently), rounds, and only then stores `d` as float16 — the codes are computed with the float32 `d`,
not the stored one.

**Rounding is where ports go wrong.** ggml rounds Q8_0's codes with C's `roundf`: `roundf(2.5)` is 3 and
`roundf(-2.5)` is −3. numpy has no such function — `np.round` and `torch.round` send halves to the even
neighbour (2.5 → 2) — so build it, and make sure it is exact: a value a hair below a half
(0.49999997) must round *down*, which some "obvious" float32 formulas get wrong. Ties are not rare: real
weights are themselves quantized (section 3), so the scaled value often lands on exactly `k + 0.5`.
gguf-py (and the checks) compare every byte, subnormal float16 scales included.
""")

nb.exercise("quantize_q8_0", r'''
def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """x float32 [rows, n], n a multiple of 32 -> uint8 [rows, n // 32 * 34] in GGUF's Q8_0 layout."""
    ### BEGIN SOLUTION
    rows, n = x.shape
    blocks = x.astype(np.float32).reshape(-1, 32)  # [rows * n / 32, 32]
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    v = (blocks * inv).astype(np.float64)  # exact: the rounding below must see the float32 product
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)  # roundf: halves away from zero
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)  # [blocks, 34]
    return out.reshape(rows, n // 32 * 34)
    ### END SOLUTION
''')
nb.test("test_quantize_q8_0", "check_quantize_q8_0(quantize_q8_0)", points=2)

nb.md(r"""
Dequantizing is the definition read backwards, so it is given, not an exercise: the one choice that matters is
the precision of the arithmetic (a product taken in float16 rounds; gguf-py's is float32, bit for bit).
""")

nb.code(r'''
def dequantize_q8_0(data: np.ndarray) -> np.ndarray:
    """uint8 [rows, k * 34] in GGUF's Q8_0 layout -> float32 [rows, k * 32]."""
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(-1, 34)
    d = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(np.float32)  # [blocks, 1]
    q = blocks[:, 2:].view(np.int8).astype(np.float32)  # [blocks, 32]
    return (d * q).reshape(rows, -1)
''')

nb.md(r"""
**Q4_1** (20 bytes) is *affine*: a scale `d` and an offset `m` (both float16), then 32 four-bit codes; weight
`i` is `d · q[i] + m`, so a block whose weights are all positive loses no codes to the sign. `m` is the
block's minimum, and `d` spreads the block's range over the 16 codes so that the maximum lands on the top
one — derive `d` from that. As in Q8_0, ggml takes the reciprocal of the float32 `d` once (0 if `d` is 0)
and multiplies by it, and stores `d` and `m` as float16 afterwards.

Two things differ from Q8_0. **The rounding:** not `roundf`, but "add 0.5 in float32, then truncate"
(and clamp at 15). The addition is itself rounded to float32, so a value a hair below a half can go *up*
— bit-exact means reproducing that, not rounding correctly. **The packing:** the 16 code bytes do not hold
neighbours; byte `j` holds code `j` in its low nibble and code `j + 16` in its high nibble.
(Dequantizing, given below the check: a multiply, then an add, in float32.)

(**Q4_0**, 18 bytes, is the symmetric sibling: `d = x_max / -8` where `x_max` is the value of largest
magnitude *with its sign*, and `q = min(15, trunc(x * id + 8.5))`, value `d · (q − 8)`. Using the signed
maximum puts it exactly on the code −8 … so the asymmetric range [−8, 7] loses nothing on the big side.
Q5_0 and Q5_1 add a 32-bit word holding the fifth bit of each code. `lib/gguf/qformats.py` has all five.)
""")

nb.exercise("quantize_q4_1", r'''
def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """x float32 [rows, n], n a multiple of 32 -> uint8 [rows, n // 32 * 20] in GGUF's Q4_1 layout."""
    ### BEGIN SOLUTION
    rows, n = x.shape
    blocks = x.astype(np.float32).reshape(-1, 32)
    lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.trunc((blocks - lo) * inv + np.float32(0.5)).astype(np.uint8).clip(0, 15)
    packed = q[:, :16] | (q[:, 16:] << 4)  # [blocks, 16]
    out = np.concatenate([d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8), packed], axis=1)
    return out.reshape(rows, n // 32 * 20)
    ### END SOLUTION
''')
nb.test("test_quantize_q4_1", "check_quantize_q4_1(quantize_q4_1)", points=2)

nb.code(r'''
def dequantize_q4_1(data: np.ndarray) -> np.ndarray:  # given: a multiply, then an add, in float32
    """uint8 [rows, k * 20] in GGUF's Q4_1 layout -> float32 [rows, k * 32]."""
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(-1, 20)
    d = np.ascontiguousarray(blocks[:, 0:2]).view(np.float16).astype(np.float32)
    m = np.ascontiguousarray(blocks[:, 2:4]).view(np.float16).astype(np.float32)
    packed = blocks[:, 4:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)  # [blocks, 32]
    return (d * q + m).reshape(rows, -1)
''')

nb.md(r"""
**Q5_0: the fifth bit.** Q5_0 stores 32 codes of 5 bits in 22 bytes: `d` (float16), then **4 bytes `qh`**,
then 16 bytes of nibbles in Q4_1's order. A byte holds two nibbles but not two 5-bit codes, so each code is
split: its low 4 bits go to the nibbles, its fifth bit (bit 4) to `qh`, which is a little-endian `uint32`
whose **bit i is the fifth bit of code i**. The codes are symmetric like Q4_0's: `d = v/−16` where `v` is
the block's value of largest magnitude *with its sign* (the first one if two tie), and
`q = trunc(x·(1/d) + 16.5)` in float32 (clipped to 0…31), so a weight is `d·(q − 16)`. Write the
quantizer; how to gather 32 bits into 4 bytes is the part to work out (numpy's shifts and a `"<u4"` view
help). The check compares bytes with gguf-py on random, real and near-tie blocks (subnormal `d` included).
""")

nb.exercise("quantize_q5_0", r'''
def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """x float32 [rows, n], n a multiple of 32 -> uint8 [rows, n // 32 * 22]: GGUF's Q5_0 blocks."""
    ### BEGIN SOLUTION
    rows = x.shape[0]
    b = x.astype(np.float32).reshape(-1, 32)
    peak = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)  # signed abs-max, first on a tie
    d = peak / np.float32(-16)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d)).astype(np.float32)
    q = np.trunc(b * inv + np.float32(16.5)).clip(0, 31).astype(np.uint32)  # [blocks, 32]
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)  # bit i: the fifth bit of q[i]
    low = (q & 0x0F).astype(np.uint8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), qh.astype("<u4")[:, None].view(np.uint8),
                          low[:, :16] | (low[:, 16:] << 4)], axis=1)
    return out.reshape(rows, -1)
    ### END SOLUTION
''')
nb.test("test_quantize_q5_0", "check_quantize_q5_0(quantize_q5_0)", points=2)

nb.md(r"""
### Predict, then measure: what a format costs

Every format so far rounds each weight of a block to the nearest of a few levels, evenly spaced, the grid set by
the block's extremes. Before measuring anything, you can say what that costs from the extremes alone. Take the
tensor of the next cell, whose weights sit around an offset (like a norm's gains, or any tensor whose blocks do
not straddle zero): **which has the smaller RMS error there, Q4_0 at 4.5 bits per weight or Q4_1 at 5.0, and by
what factor?** Write your guess in the cell, before the model and the measurement below answer it.

Then turn the reasoning into a model: `predict_rmse(lo, hi, qtype)` gets each block's smallest and largest
weight (not the weights themselves) and returns the RMS error, over all the weights, that you expect `qtype` to
make: Q8_0, Q4_0, Q4_1, Q5_0 (section 2's formats), or **Q5_1** — Q4_1's layout with 5-bit codes and the fifth
bits stored as in Q5_0 (24 bytes per block). What is each block's step, what error does rounding to the nearest
level leave on average, and how do blocks of different sizes combine? The check draws tensors you have not seen
(other distributions, blocks of very different scales, every format) and measures them with gguf-py; a model
within 0.8–1.25× of the measurement passes. Why the model works, and where it stops working, comes after the check.
""")

nb.code(r"""
g2 = np.random.default_rng(2)
offset_weights = (0.02 * (1 + 0.3 * g2.standard_normal((64, 1024)))).astype(np.float32)  # around +0.02, spread 0.006
my_guess = None  # your guess before reading on: Q4_0's RMS error divided by Q4_1's on offset_weights
""")

nb.exercise("predict_rmse", r'''
def predict_rmse(lo: np.ndarray, hi: np.ndarray, qtype: str) -> float:
    """lo, hi float32 [blocks]: each block of 32 weights' smallest and largest value -> the RMS error (over every
    weight) you predict `qtype` ("Q8_0", "Q4_0", "Q4_1", "Q5_0" or "Q5_1") makes on those blocks."""
    ### BEGIN SOLUTION
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    amax = np.maximum(-lo, hi)  # the symmetric formats' step comes from the largest magnitude
    step = {"Q8_0": amax / 127, "Q4_0": amax / 8, "Q5_0": amax / 16,  # the affine ones' from the range
            "Q4_1": (hi - lo) / 15, "Q5_1": (hi - lo) / 31}[qtype]
    exact = 1 if qtype in ("Q8_0", "Q4_0", "Q5_0") else 2  # the weights that set the grid sit on it
    return float(np.sqrt(np.mean(step ** 2 / 12) * (32 - exact) / 32))
    ### END SOLUTION
''')
nb.test("test_predict_rmse", "check_predict_rmse(predict_rmse)", points=2)

nb.md(r"""
**Why it works, now that your check passes.** A weight is rounded to the nearest level, so its error lies in
[−Δ/2, Δ/2], Δ its block's step. When a block's weights spread over many levels, where a weight falls inside its
step is as good as uniform, and a uniform error on [−Δ/2, Δ/2] has mean square Δ²/12. The step: the symmetric
formats put the largest magnitude on their end code (Q8_0: Δ = max|x|/127; Q4_0: max|x|/8; Q5_0: max|x|/16),
the affine ones spread the range over their codes (Q4_1: (max − min)/15; Q5_1: (max − min)/31). The weights that
set the grid sit exactly on it (one per block for the symmetric formats, two for the affine ones), so

$$\text{RMSE} \approx \sqrt{\frac{32 - k}{32}\cdot\operatorname{mean}_\text{blocks}\frac{\Delta_b^2}{12}},$$

averaged in squares: a few large blocks carry most of a tensor's error. One bit more halves Δ and the error.
On the offset tensor Q4_0's step is set by |x| ≈ 0.02 + its spread over 8 codes, Q4_1's by the spread alone over
15: the sign bit and the missing offset cost Q4_0 far more than the half bit it saves. Where the model stops:
when one outlier sets a block's step and the other weights crowd within half a step of the level at 0 (their
error is the weight itself, less than Δ/√12: heavy tails), and when the weights already sit on a grid (section 3).
(Q4_0's opposite extreme clips at code 15 = 7 steps: a block whose two extremes are about equal loses a little
more than the model says.)

Now measure, with your own quantizers where you wrote them (gguf-py's Q4_0 and Q5_1), beside your model, against
bits per weight:
""")

nb.code(r"""
from gguf.quants import quantize as gguf_quantize, dequantize as gguf_dequantize
Q = gguf.GGMLQuantizationType


def rmse(x, y):
    return float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2)))


round_trips = {  # (bits per weight, x -> the weights the format stores, whose code)
    "Q8_0": (8.5, lambda x: dequantize_q8_0(quantize_q8_0(x)), "yours"),
    "Q4_0": (4.5, lambda x: gguf_dequantize(gguf_quantize(x, Q.Q4_0), Q.Q4_0), "gguf-py"),
    "Q4_1": (5.0, lambda x: dequantize_q4_1(quantize_q4_1(x)), "yours"),
    "Q5_0": (5.5, lambda x: gguf_dequantize(quantize_q5_0(x), Q.Q5_0), "yours"),
    "Q5_1": (6.0, lambda x: gguf_dequantize(gguf_quantize(x, Q.Q5_1), Q.Q5_1), "gguf-py"),
}
shown = {
    "Gaussian": (0.02 * g2.standard_normal((64, 1024))).astype(np.float32),
    "offset (the guess)": offset_weights,
    "Student-t(3): heavy tails": (0.02 * g2.standard_t(3, (64, 1024))).astype(np.float32),
    "SmolLM2 blk.7 ffn_up": model.layers[7].mlp.up_proj.weight.detach().cpu().numpy(),
}
fig, ax = plt.subplots(figsize=(7, 3.5))
print(f"{'tensor':>26} " + " ".join(f"{q + ' (' + who + ')':>16}" for q, (_, _, who) in round_trips.items())
      + "   (measured RMSE / your prediction)")
ratio_of = {}
for i, (name, x) in enumerate(shown.items()):
    blocks = x.reshape(-1, 32)
    lo, hi = blocks.min(axis=1), blocks.max(axis=1)
    bits, predicted, measured = [], [], []
    for qtype, (bpw, trip, _) in round_trips.items():
        bits.append(bpw); predicted.append(predict_rmse(lo, hi, qtype)); measured.append(rmse(trip(x), x))
    ratio_of[name] = dict(zip(round_trips, measured))
    print(f"{name:>26} " + " ".join(f"{m / p:>16.3f}" for m, p in zip(measured, predicted)))
    order = np.argsort(bits)
    ax.plot(np.array(bits)[order], np.array(predicted)[order], "-", color=f"C{i}", lw=1)
    ax.plot(bits, np.maximum(measured, 1e-7), "o", color=f"C{i}", label=name)
ax.set_yscale("log"); ax.set_xlabel("bits per weight"); ax.set_ylabel("RMS error (measured: dots; yours: lines)")
ax.set_title("Your error model against the measurement (a measured 0 is drawn at 1e-7)", fontsize=9)
ax.legend(fontsize=7); plt.show()
off, b = ratio_of["offset (the guess)"], offset_weights.reshape(-1, 32)
model_ratio = predict_rmse(b.min(1), b.max(1), "Q4_0") / predict_rmse(b.min(1), b.max(1), "Q4_1")
print(f"offset tensor, Q4_0 / Q4_1: measured {off['Q4_0'] / off['Q4_1']:.2f}x, your model {model_ratio:.2f}x, "
      f"your guess before the model {my_guess}")
""")

nb.md(r"""
**Milestone: bit-exact with gguf-py.** Random, heavy-tailed (a log-normal scale mixture with outliers)
and real SmolLM2 tensors, and blocks built so that every value is a tie. The tie rows also show what
`np.round` would have written.
""")

nb.code(r"""
rng = np.random.default_rng(0)
ties = rng.integers(-126, 126, (8, 256)).astype(np.float32) + np.float32(0.5)
ties[:, ::32] = 127.0  # d = 127 / 127 = 1, so x * id = x: every other value is an exact half
tests = {
    "random normal": rng.standard_normal((64, 1024)).astype(np.float32),
    "heavy-tailed": (0.02 * rng.standard_normal((64, 1024)) * np.exp(1.5 * rng.standard_normal((64, 1024)))).astype(np.float32),
    "SmolLM2 blk.7 ffn_up": model.layers[7].mlp.up_proj.weight.detach().cpu().numpy(),
    "SmolLM2 token_embd (4096 rows)": model.embed.weight.detach()[:4096].cpu().numpy(),
    "ties": ties,
}
for name, x in tests.items():
    q8, q41 = quantize_q8_0(x), quantize_q4_1(x)
    same = [np.array_equal(q8, gguf_quantize(x, Q.Q8_0)), np.array_equal(q41, gguf_quantize(x, Q.Q4_1)),
            np.array_equal(dequantize_q8_0(q8).view(np.uint32), gguf_dequantize(q8, Q.Q8_0).view(np.uint32)),
            np.array_equal(dequantize_q4_1(q41).view(np.uint32), gguf_dequantize(q41, Q.Q4_1).view(np.uint32))]
    print(f"{name:>32}: Q8_0 bytes {same[0]}, Q4_1 bytes {same[1]}, dequantized bits {same[2] and same[3]}")
x = ties[:1, :32]
print("ties, roundf:  ", quantize_q8_0(x)[0, 2:10].view(np.int8))
print("ties, np.round:", np.round(x[0, :8]).astype(np.int8), "<- differs wherever k is even")
""")

# --- 3 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 3. Our weights are already Q4_1

Every week so far called the model "fp32". It is fp32 *arithmetic* on weights that were decoded from a
Q4_1 file (its embedding from Q8_0). What happens if we quantize those decoded weights to Q4_1 again?
Each block's minimum and maximum are exactly `m` and `m + 15·d` again (or one of them: the extreme codes
might not be used in a block), so we should get the same bytes back. Compare with the raw bytes in the file:
""")

nb.code(r"""
reader = gguf.GGUFReader(paths.smollm2_path())
q4_1_tensors = [t for t in reader.tensors if t.tensor_type == Q.Q4_1]
sample = q4_1_tensors if FULL else q4_1_tensors[::15]
same_bytes = total_bytes = same_weights = total_weights = 0
for t in tqdm(sample, desc="re-quantizing"):
    raw = np.asarray(t.data)  # uint8 [rows, cols / 32 * 20], as stored
    w = qformats.dequantize(raw, "Q4_1")  # the weights our "fp32" model uses
    again = qformats.quantize(w, "Q4_1")
    same_bytes += int((again == raw).sum()); total_bytes += raw.size
    same_weights += int((qformats.dequantize(again, "Q4_1") == w).sum()); total_weights += w.size
print(f"{len(sample)} of {len(q4_1_tensors)} Q4_1 tensors: {same_bytes / total_bytes:.4%} of bytes identical, "
      f"{same_weights / total_weights:.4%} of weights decode to exactly the same value")
""")

nb.md(r"""
Nearly every byte comes back. The rest are blocks where the recomputed `d = (max − min)/15` rounds to a
neighbouring float16, or where a block never used code 0 or 15 (then the decoded min/max are not the
stored `m`, `m + 15d`) — and even then most weights decode to the same value.

**What this means for every later measurement:** our reference is not the original bf16 model but Q4_1.
Quantizing it to Q4_1 costs *nothing* (the perplexity below will not move), Q8_0 and Q5_1 can only add a
little noise to a model that already has Q4_1's, and no format can recover what the original file threw
away. Formats are compared here on *top* of Q4_1: differences between them are real, absolute quality
losses are understated. (The RMSE comparisons in section 4 therefore use random tensors as well.)
""")

# --- 4 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 4. K-quants

llama.cpp's K-quants group 8 (or 16) sub-blocks into a **super-block of 256 weights** and quantize the
sub-blocks' scales themselves, against one float16 scale per super-block. **Q4_K** (144 bytes):

| bytes | what |
|---|---|
| 0–1 | `d`, float16: the scale of the sub-block scales |
| 2–3 | `dmin`, float16: the scale of the sub-block minimums |
| 4–15 | 8 six-bit scales `sc[j]` and 8 six-bit mins `m[j]`, packed in 12 bytes (below) |
| 16–143 | 256 four-bit codes: 4 groups of 32 bytes; group `g` holds sub-block `2g` in the low nibbles and `2g+1` in the high nibbles |

Weight `i` of sub-block `j` (32 weights each) is `(d·sc[j]) · q − (dmin·m[j])`. The 12 scale bytes:

    bytes 0-3:  sc[0..3] in the low 6 bits; the top 2 bits of sc[4..7] in bits 6-7
    bytes 4-7:  m[0..3]  in the low 6 bits; the top 2 bits of m[4..7]  in bits 6-7
    bytes 8-11: the low 4 bits of sc[4..7] | the low 4 bits of m[4..7] << 4

**Predict from the table, before you write the decoder:** how many bits per weight does Q4_K spend, and how many
of them on scales and minimums? Set that against Q4_1's (section 2): every 32 weights get their own scale and
minimum in both. (The count is after the check.)

Bit-exact needs float32, but here not a particular order: a float16 `d` has an 11-bit significand and `sc` 6
bits, so `d·sc` (17 bits) and then `(d·sc)·q` (21 bits) are exact in float32's 24 whichever way you group them;
only the final subtraction rounds. Writing the unpacking is the point of this exercise (practice with bit fields).
""")

nb.exercise("dequantize_q4_k", r'''
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
''')
nb.test("test_dequantize_q4_k", "check_dequantize_q4_k(dequantize_q4_k)", points=2)

nb.md(r"""
**The count, now that your check passes.** (2 + 2 + 12 + 128) bytes · 8 / 256 weights = **4.5 bits per weight**, of
which (2 + 2 + 12)·8 / 256 = 0.5 go to scales and minimums — Q4_0's price — while, as in Q4_1 at 5.0, every 32
weights get their own scale *and* minimum: quantizing the scales to 6 bits against one float16 per 256 weights is
what saves the half bit. (Q6_K: 16 sub-blocks of 16 with int8 scales and 6-bit codes, 210 bytes, 6.5625 bits; there
`d·sc` with an int8 `sc` and a 6-bit `q` needs 25 bits, so gguf's order — `d·sc` first — matters.)

gguf-py has no K-quant *quantizer*; write one. The obvious one takes each sub-block's min and max:
`scale = (max − min)/15`. On Gaussian weights it only matches Q4_1 (the table after the check measures it) —
Q4_K's extra structure buys nothing. llama.cpp does better, and that is your problem: per sub-block, find the scale `s ≥ 0` and the min
`m ≥ 0` (weights `s·q − m`, `q` integer codes 0…15) that make a *weighted* squared error small,

$$E(s, m) = \sum_i w_i\,(s\,q_i - m - x_i)^2, \qquad w_i = \sqrt{\tfrac{1}{32}\textstyle\sum_k x_k^2} + |x_i|$$

(an error on a large weight counts more, but none counts for nothing; in section 5 the weights will come from
activations instead). Min/max is rarely the minimizer: the extremes need not be levels. Two observations to build
on: for fixed codes `q`, `E` is a quadratic in `(s, m)` — its minimum is yours to derive (mind that a negative `m`
cannot be stored: mins are 6-bit *unsigned*); and for fixed `(s, m)` the best codes are obvious. How you search
over the codes is your design.

Then the 8 scales and 8 mins of a super-block are stored in 6 bits against float16 super-block scales — the
format, not a choice: `d = max(s)/63`, `dmin = max(m)/63` (stored as float16; use the float16 values from here
on), `sc = nearest_int(s/d)`, `mn = nearest_int(m/dmin)`, and the codes are recomputed against the *stored*
scales: `q = clip(nearest_int((x + dmin·mn)/(d·sc)), 0, 15)`. ggml's K-quants round with `nearest_int`, which
sends halves to the **even** neighbour (`np.rint`): a third rule beside Q8_0's `roundf` and Q4_1's `trunc(v + 0.5)`.

The check decodes your bytes with gguf-py and wants the weighted error Σ w (x̂ − x)² within 0.5 % of llama.cpp's
search as `lib.gguf.qformats` runs it (5 % on heavy-tailed rows; a search on the *unweighted* error lowers the plain RMSE
a little and misses this bound), the plain RMSE within 1 % of it (3 % heavy-tailed), and below 0.95× Q4_1's
on Gaussian weights. Both comparisons leave out the super-blocks where two candidate fits tie in `E` (a sub-block
of one outlier and weights that all land on one code is fitted exactly by several; which one a search keeps is
a rounding detail that moves `d`, and with it the whole super-block). If your search falls short, the failure
message says what llama.cpp's does.
""")

nb.exercise("quantize_q4_k", r'''
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
''')
nb.test("test_quantize_q4_k", "check_quantize_q4_k(quantize_q4_k)", points=2)

nb.md(r"""
**llama.cpp's search, now that yours passes** (`make_qkx2_quants` in ggml-quants.c; compare it with yours):

* Let `lo = min(0, min x)`, `hi = max x`. The **candidates** are the inverse scales `(15 + δ)/(hi − lo)` for
  δ = −1.0, −0.9, …, +1.0 (21 of them), plus min/max itself (`s = (hi − lo)/15`, `m = −lo`).
* For a candidate, the **codes** are `q_i = clip(nearest_int((x_i − lo)·iscale), 0, 15)`.
* With the codes fixed, setting ∂E/∂s = ∂E/∂m = 0 gives two linear equations,
  `s·Σwq² − m·Σwq = Σwqx` and `s·Σwq − m·Σw = Σwx`: solve them. If `m < 0`, set `m = 0` and take
  `s = Σwqx / Σwq²` (the minimum over `s` alone).
* Keep the candidate with the smallest `E` (the min/max one if none is smaller, or if a fit gives `s ≤ 0`).

Stretching or shrinking the grid a little lets the two extremes fall between levels while every other weight gets
nearer one; the refit then places the levels where the weighted errors balance.

**What the search buys.** RMSE relative to Q4_1's (5.0 bits) on a Gaussian tensor, a Student-t(3) one
(heavier tails), and SmolLM2's `ffn_down` (rows of 1536 = 6 × 256, the one linear whose rows fit whole
super-blocks) jittered off its Q4_1 grid by noise of a tenth of the weights' spread (as stored it *is*
decoded Q4_1, which Q4_1 reproduces exactly: section 3). "min/max" is `qformats.quantize(x, "Q4_K", search=False)`.
""")

nb.code(r"""
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
""")

nb.md(r"""
Read the ratios: with the search, Q4_K at 4.5 bits has less error than Q4_1 at 5.0 on Gaussian weights and on
Student-t, where min/max alone only matches Q4_1: the search is what makes K-quants good. On the stored
SmolLM2 tensor Q4_1 is exact, so every other format can only lose to it; jittered, the search wins again.
Q5_K and Q6_K follow: each extra bit halves the step, and so roughly the error.

**SmolLM2 has a catch:** `d_model = 576` is not a multiple of 256, so only `ffn_down` (1536 columns) can
be stored as a K-quant at all. llama.cpp's quantizer (`llama-quant.cpp`) falls back for such rows:
Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0 (`lib.gguf.qformats.K_FALLBACK`). A "Q4_K" SmolLM2 is mostly Q5_0.
""")

# --- 5 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 5. Perplexity versus bits per weight

Now the whole model: quantize every linear of the 30 blocks (the tied embedding / LM head stays as it is
stored, Q8_0), and measure perplexity on the committed Hamlet text. Bits per weight are averaged over the
linears *as stored* (with the fallbacks). Besides the GGUF types: a **Q4_K_M-like mix** — Q4_K, except that two
of the seven per-layer tensor types get Q6_K in some of the layers, as llama.cpp's `_M` mixes do (which
two, and why, is section 12's question; section 6 measures the answer) — and a 3-bit level (round-to-nearest, min/max per group:
no GGUF type, the baseline of section 7).
""")

nb.code(r"""
text_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[0]
EVAL_WINDOWS = 17 if FULL else 4  # windows of 255 scored tokens: 4,335 with FULL, 1,020 in the short run
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
    for name in ["Q6_K", "Q5_0", "3-bit g32 (RTN)"]:
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
""")

nb.md(r"""
Seed 004's table for **Llama-3.1-8B-Instruct** (WikiText-2 perplexity, llama.cpp; bits per weight from the
reported size reductions against F16, so embeddings included) sits next to ours. A point is on the
**Pareto front** if no other point is both smaller and better.
""")

nb.code(r"""
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
""")

nb.md(r"""
Read the two panels together. Seed 004's panel is what quantizing an *original* FP16 model looks like:
flat down to about 5 bits, then bending up (what each format costs it is printed under the plot). Ours is
not monotone, and section 3 says why — the reference is Q4_1:

* **Q4_1 costs exactly nothing**, and Q8_0 (and Q6_K, stored as Q8_0 on 576-wide rows) add almost nothing:
  their steps are many times finer than Q4_1's.
* **Q5_0 and Q5_1 are not free**, although they have twice Q4_1's levels: their grids do not contain
  Q4_1's, so every weight is rounded a second time, by up to half a Q5 step. And Q5_1 does worse than that
  suggests, for a reason of its own (next cell): it keeps each block's min and max, which *are* Q4_1's
  levels 0 and 15, and divides their distance into 31 steps instead of 15 — so Q4_1's level i lands at
  31/15·i = 2.067·i Q5_1 steps, and rounding moves it by −0.067·i steps (mod 1): an error that grows with
  the weight's position in its block, a *gain* error, where Q5_0's grid (centred on zero, its step from
  the abs-max) re-rounds each level by an amount unrelated to its value. Measuring a quantizer on
  already-quantized weights measures the *interaction* of two grids.
* **Below 4 bits both models fall off a cliff**, and the 135M model far harder: plain 3-bit rounding
  multiplies its perplexity several times, where Q3_K_S costs the 8B model far less. A small model has little
  redundancy to absorb the noise — and 3-bit round-to-nearest is cruder than llama.cpp's Q3_K.

The Q4_K_M-like mix buys back part of Q4_K's loss for 0.3 bits: where the extra bits go matters. Section 6
asks that question directly; sections 7 and 8 spend the same bits more cleverly.

The gain error, measured: the slope of the re-rounding error against the weight (least squares,
error ≈ slope·w, per tensor of a few layers). A slope `s` makes every weight `1 + s` times too large.
""")

nb.code(r"""
for qtype in ["Q5_0", "Q5_1"]:
    slopes = []
    for layer in [0, 15, 29]:
        w = model.layers[layer].mlp.down_proj.weight.detach().cpu().numpy()
        err = qformats.dequantize(qformats.quantize(w, qtype), qtype) - w
        slopes.append(float((err * w).sum() / (w * w).sum()))
    print(f"{qtype}: error-on-weight slope (ffn_down of layers 0, 15, 29): " + ", ".join(f"{v:+.4f}" for v in slopes))
""")

nb.md(r"""
### The importance matrix

The search of section 4 weighted each weight's error by the size of the weights around it. What the model
cares about is the *output* of each linear: a row computes Σ_i w_i x_i, so rounding changes its output by

$$e = \textstyle\sum_i \Delta w_i\, x_i .$$

The search can minimize any per-column weighted error Σ_i c_i Δw_i², one vector c per tensor (shared by its
rows), and the inputs the model really sees can be measured: hook a linear and record what it is given while
the model reads calibration text. llama.cpp does exactly this (`llama-imatrix` writes the vectors,
`llama-quantize --imatrix` hands them to the search; every modern low-bit GGUF is made that way).

**Exercise 7 (derivation).** Which c makes Σ_i c_i Δw_i² the expected squared output error E[e²] over the
calibration tokens? Expand E[e²] yourself; in the cell after the check, say which terms you had to drop for it to
take that form, and for which inputs dropping them costs the most. Then write `column_importance(x)`: from the
inputs one linear saw, `x [..., in]` (every dim but the last counts tokens; any float dtype — half-precision
activations included), the weights `c [in]`, float32. Any positive multiple of c gives the same search, and the
check accepts any.
""")

nb.exercise("column_importance", r'''
def column_importance(x: torch.Tensor) -> torch.Tensor:
    """x [..., in]: the inputs one linear saw (all dims but the last are tokens) -> [in] float32, the per-column
    weights c that make Σ_i c_i Δw_i² the expected squared output error over those tokens."""
    ### BEGIN SOLUTION
    flat = x.reshape(-1, x.shape[-1]).float()  # float16 squares pass 65,504 from |x| > 256
    return (flat * flat).mean(0)
    ### END SOLUTION
''')
nb.test("test_column_importance", "check_column_importance(column_importance)", points=1)
nb.answer("column_importance_why", r"""
**Model answer.** E[e²] = Σ_i Σ_j Δw_i Δw_j E[x_i x_j] = Σ_i Δw_i² E[x_i²] + Σ_{i≠j} Δw_i Δw_j E[x_i x_j], so
c_i = E[x_i²], the mean squared activation of column i (not its variance: the error sees x, mean included;
not E|x|). The cross terms are dropped: exact when the columns are uncorrelated (or the rounding errors of a
row are independent with mean zero, so the cross terms average out); they cost the most when inputs are
strongly correlated — then errors in correlated columns add up or cancel, which only the whole matrix
E[x xᵀ] sees. GPTQ (section 7) keeps it: its Hessian 2XᵀX/n is that matrix, and c is its diagonal.

**Mark scheme (1 point).** The cross terms Σ_{i≠j} Δw_i Δw_j E[x_i x_j] named as what is dropped, and
correlated inputs as when it matters most.
""", points=1)

nb.md(r"""
The derivation, for after your answer: E[e²] = Σ_i Δw_i² E[x_i²] + Σ_{i≠j} Δw_i Δw_j E[x_i x_j]; the diagonal
terms are the form the search minimizes, so c_i = E[x_i²] — the **importance matrix** (a vector per tensor,
despite the name). GPTQ in section 7 keeps the cross terms too: its Hessian is the whole matrix E[x xᵀ].

Your `column_importance` now builds it: `ref.input_column_means` hooks every linear in `some` and averages
what your function returns over the 1,024 calibration tokens of Hamlet (which the evaluation never reads);
the cell compares the result with `ref.collect_imatrix`. `quantize_model(..., importance=imatrix)` hands each
tensor its vector to the search (the legacy fallbacks search too, as llama.cpp's do with an imatrix). At 3
bits, `ref.search_quantize` is the same search on 3-bit groups of 32 with a float16 scale and min (RTN's
format: 4.0 bits per weight).

The short run quantizes the linears of `IMATRIX_LAYERS` only (the search over all 30 layers takes minutes);
`FULL` does all of them.
""")

nb.code(r"""
IMATRIX_LAYERS = list(range(cfg.n_layers)) if FULL else [0, 15, 29]
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
""")

# --- 6 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 6. Per-layer sensitivity

Not every tensor suffers equally from rounding. Measure it: quantize **one tensor type** (in all 30 layers),
or **one layer** (all 7 of its linears), to a low format — 3-bit round-to-nearest in groups of 64, 3.5 bits
per weight — leave everything else as it is, and see how much perplexity rises (`FULL`: every layer).
""")

nb.code(r"""
LOW_BITS, HIGH_BITS, GROUP = 3, 4, 64
low_bpw, high_bpw = ref.rtn_bits_per_weight(LOW_BITS, GROUP), ref.rtn_bits_per_weight(HIGH_BITS, GROUP)
def rtn_model(bits_of):  # {parameter name: bits}; other tensors untouched
    return ref.quantize_model(model, bits_of, weight_fn=lambda name, w, bits: ref.rtn_quantize(w, bits, GROUP))


params = dict(model.named_parameters())
kinds = ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
probe_layers = list(range(cfg.n_layers)) if FULL else [0, 11, 18, 29]
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
""")

nb.md(r"""
Read the two panels. Which tensor type costs the most in total, and which the most *per weight* — where
would an extra bit buy the most? (Section 12's `answer_q9` reads the quiz's answer off this measurement,
`kind_delta`, and compares it with the types llama.cpp's `_M` mixes give Q6_K.) llama.cpp's choice of *layers* for the extra bits (the first and last
eighth, every third between: `lib.quantization.quant.use_more_bits`) is a rule of thumb; look at the right panel for
whether the first and last layers are really the sensitive ones here — measure, don't assume.

Now turn the measurements into an allocation. Two formats, low (3-bit, 3.5 bits per weight) and high (4-bit,
4.5), and a budget of 4.0 bits per weight on average. Which units (here: tensor types) should get the high format?
Every unit starts low; raising unit `u` costs (high − low) bits for each of its weights and saves `delta_ppl[u]`
(what rounding it low cost in your measurement). Find a set that saves as much perplexity as you can while the
average stays within the budget — how to choose is yours (the check compares the perplexity your choice saves
with what a good allocation saves, on budgets and measurements you have not seen). A measured ΔPPL can
be zero or negative (noise on a short text, or rounding that happened to help): bits spent there buy nothing.
""")

nb.exercise("allocate_bits", r'''
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
''')
nb.test("test_allocate_bits", "check_allocate_bits(allocate_bits)", points=1)

nb.md(r"""
**The rule, now that your check passes.** This is a knapsack: each unit has a value (the ΔPPL raising it saves) and
a weight (its extra bits), and the budget is the sack. The check asks for at least what the greedy rule saves: take
units in order of ΔPPL *per weight* (the perplexity one extra bit buys there), highest first, each one that still
fits, skipping those with ΔPPL ≤ 0. Greedy is not always optimal (a big unit that just misses can leave room
unused that two small ones would have filled), but it falls short of the optimum by at most the value of the
first unit that did not fit, nothing when the units are small next to the budget; a dynamic program over the budget finds the optimum, and passes too. By
*total* ΔPPL instead of per weight, the big tensors win every time even where the same bits spread over small,
sensitive ones would buy more.
""")

nb.md(r"""
**Milestone: beats uniform allocation at the same size.** The uniform model at 4.0 bits per weight is 3-bit
in groups of 32 (the scales take the extra half bit) for every tensor.
""")

nb.code(r"""
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
""")

# --- 7 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 7. GPTQ

Round-to-nearest treats every weight alone. GPTQ (Frantar et al., 2023) quantizes a layer to keep its
*output* on calibration inputs `X [n, in]` unchanged. For one row `w` of the weight matrix the error
‖Xwᵀ − Xŵᵀ‖²/n is a quadratic in `ŵ − w` with Hessian `H = 2XᵀX/n` — the same `H` for every row.

GPTQ's plan: fix the columns one at a time, left to right (the same order for every row), each to the nearest
level of its grid; after column `j` is fixed, the columns not yet fixed are still free to move — they will be
rounded later anyway — and can cancel part of the damage column `j`'s rounding did to the output. Two problems are
yours:

1. **The update.** Column `j` has moved by `q_j − w_j`. What move of the not-yet-fixed columns `F` minimizes the
   output error, and what error remains? (A quadratic minimized under one linear constraint: the answer needs the
   inverse of `H` restricted to the free columns — not the restriction of `H⁻¹`.)
2. **The cost.** That inverse is a different matrix at every step. Find a way to get every step's from one
   factorization computed once. (Start with an explicit inverse per step if you like: the check accepts any
   route to GPTQ's weights; then think about what eliminating the first row and column of a matrix does to its
   inverse, and which factorization does exactly that, row by row.)

What the check (and the paper's code) expects besides — the interface, not the method:

* **groups**: each row's columns are cut into groups of `group_size`, each on its own `bits`-bit min/max grid
  (levels `lo + scale·k`, k = 0 … 2^bits − 1). The grid is taken from the weights **as they stand when the
  group's first column is reached** — already moved by the earlier columns' corrections.
* **damping**: add `damp · mean(diag H)` to the diagonal of `H` before inverting (1 % by default).
* **dead inputs**: a column whose input is always zero has `H_jj = 0`; set `H_jj = 1` and its weight to 0.
* `w` is the caller's: do not change it. Every tensor you create lives on `w`'s device.

The derivation follows the check; the failure message names the route if you are stuck.
""")

nb.exercise("gptq_quantize", r'''
def gptq_quantize(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, damp: float = 0.01) -> torch.Tensor:
    """GPTQ of w [out, in] on calibration inputs x [n, in]: the dequantized weights, each group of group_size
    columns of a row on a bits-bit min/max grid."""
    ### BEGIN SOLUTION
    W = w.detach().float().clone()
    x = x.reshape(-1, x.shape[-1]).float()
    H = 2 * x.T @ x / x.shape[0]  # [in, in]
    dead = torch.diag(H) == 0  # inputs that are always 0: their weights do not matter
    H = H + torch.diag(dead.to(H.dtype))
    W = W * ~dead
    H += damp * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)  # H⁻¹ = UᵀU
    Q = torch.zeros_like(W)
    levels, block = 2**bits - 1, group_size * max(1, 128 // group_size)  # lazy batch: 128 columns or a group
    for b0 in range(0, W.shape[1], block):
        b1 = min(b0 + block, W.shape[1])
        E = torch.zeros_like(W[:, b0:b1])  # the scaled errors of this block's columns
        for j in range(b0, b1):
            if j % group_size == 0:
                g = W[:, j:j + group_size]
                lo = g.amin(1)
                scale = ((g.amax(1) - lo) / levels).clamp_min(1e-12)
            Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
            E[:, j - b0] = (W[:, j] - Q[:, j]) / U[j, j]
            W[:, j:b1] -= E[:, j - b0, None] * U[j, j:b1][None, :]  # compensate inside the block now ...
        W[:, b1:] -= E @ U[b0:b1, b1:]  # ... and in every later column once per block
    return Q.to(w.dtype)
    ### END SOLUTION
''')
nb.test("test_gptq_quantize", "check_gptq_quantize(gptq_quantize)", points=3)

nb.md(r"""
**The derivation, now that your check passes** (Optimal Brain Surgeon, as GPTQ uses it). Minimize
½ δ H_F δᵀ (the error's growth when the free weights move by δ) subject to δ_j = q_j − w_j: with a Lagrange
multiplier λ, H_F δᵀ = λ e_j, so δ = λ [H_F⁻¹]_{j,·} and the constraint fixes λ:

$$\delta w_F = -\frac{w_j - q_j}{[H_F^{-1}]_{jj}}\,[H_F^{-1}]_{F,j}, \qquad
\text{cost} = \frac{(w_j - q_j)^2}{2\,[H_F^{-1}]_{jj}}.$$

The cost: let `U` be the **upper Cholesky factor of `H⁻¹`** (`H⁻¹ = UᵀU`). Removing the first row and column of a
matrix from its inverse is one step of Gaussian elimination, which is what a Cholesky factorization does row by
row, so for `F = {j, …}`:

$$[H_F^{-1}]_{jj} = U_{jj}^2, \qquad [H_F^{-1}]_{j,k} = U_{jj}\,U_{jk} \quad (k \ge j).$$

The update for column `j` is then `W[:, j:] −= ((W[:, j] − Q[:, j]) / U[j, j]) ⊗ U[j, j:]`: one factorization,
one loop. The paper's "lazy batch" applies the corrections to far-away columns once per block of 128 columns
instead of once per column — faster, the same result up to float rounding.
""")

nb.md(r"""
Calibration: the inputs every linear sees over 1024 tokens of Hamlet from a part we do not evaluate on.
First, a warning the paper does not need: its calibration set is 128 sequences of 2048 tokens; ours is 1024, fewer
than `ffn_down` has inputs (1536). Then `H` is (nearly) singular and GPTQ **overfits** the calibration
tokens. The error on *held-out* tokens shows it, and shows that damping is a regularizer:
""")

nb.code(r"""
GPTQ_LAYERS = list(range(cfg.n_layers)) if FULL else [0, 6, 12, 18, 24]
CAL_GROUP = 192  # the paper's groups are 128, which does not divide 576; 192 divides 576 and 1536
gptq_names = [n for n in linears if int(n.split(".")[1]) in GPTQ_LAYERS]
held_out = [text_ids[8000:8256].unsqueeze(0)]  # calibration: section 5


def inputs_of(names, windows):
    parts = [ref_gptq.collect_inputs(model, ids, names) for ids in windows]
    return {n: torch.cat([p[n] for p in parts]) for n in names}  # [tokens, in]


with torch.no_grad():
    calib_x = inputs_of(gptq_names, calibration)
    probe = "layers.12.mlp.down_proj.weight"
    test_x = inputs_of([probe], held_out)[probe]
w = params[probe].detach()
print(f"{probe}: output error, 3 bits, group {CAL_GROUP}  (calibration tokens / held-out tokens)")
print(f"{'RTN':>12}: {ref_gptq.output_error(w, ref.rtn_quantize(w, 3, CAL_GROUP), calib_x[probe]):.3e} / "
      f"{ref_gptq.output_error(w, ref.rtn_quantize(w, 3, CAL_GROUP), test_x):.3e}")
for damp in [0.01, 0.1, 1.0]:
    q = gptq_quantize(w, calib_x[probe], 3, CAL_GROUP, damp)
    print(f"{'GPTQ ' + str(damp):>12}: {ref_gptq.output_error(w, q, calib_x[probe]):.3e} / {ref_gptq.output_error(w, q, test_x):.3e}")
q = ref_gptq.gptq_quantize(w, calib_x[probe], 3, CAL_GROUP, 0.1, act_order=True)  # lib's, columns by H_jj
print(f"{'act-order .1':>12}: {ref_gptq.output_error(w, q, calib_x[probe]):.3e} / {ref_gptq.output_error(w, q, test_x):.3e}")
""")

nb.md(r"""
With 1 % damping GPTQ fits the calibration tokens several times better than RTN and can do *worse* on the
held-out ones; stronger damping trades calibration fit for generalization. We use 10 % below (`GPTQ_DAMP`).

**Milestone: lower perplexity than round-to-nearest at 3 and 4 bits** — on every linear of layers
`GPTQ_LAYERS` (all 30 with `FULL`), the rest left as they are, in groups of 192. (Try `CAL_GROUP = 64`:
at 4 bits, round-to-nearest in groups of 64 is then almost free on our weights — two Q4_1 blocks share a
grid — and there is nothing left for GPTQ to win: section 3 again.)
""")

nb.code(r"""
GPTQ_DAMP = 0.1
gptq_rows = {}
for bits in (3, 4):
    rtn_ppl = ppl(ref.quantize_model(model, {n: bits for n in gptq_names},
                                     weight_fn=lambda name, w, b: ref.rtn_quantize(w, b, CAL_GROUP)))
    q = {n: gptq_quantize(params[n].detach(), calib_x[n], bits, CAL_GROUP, GPTQ_DAMP) for n in tqdm(gptq_names, desc=f"GPTQ {bits}-bit")}
    gptq_ppl = ppl(ref.quantize_model(model, q, weight_fn=lambda name, w, _: q[name]))
    gptq_rows[bits] = (rtn_ppl, gptq_ppl)
print(f"layers {GPTQ_LAYERS}, group {CAL_GROUP}, damping {GPTQ_DAMP}; unquantized {base_quick:.2f} (one window)")
for bits, (r, g_) in gptq_rows.items():
    print(f"{bits}-bit: RTN {r:.2f}, GPTQ {g_:.2f} -> GPTQ {'better' if g_ < r else 'NOT better'}")
""")

# --- 8 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 8. AWQ

AWQ (Lin et al., 2024) starts from an observation (their Table 1): keeping just **1 % of the weights** in
full precision recovers most of the loss of 3-bit rounding — *if* those are the input channels with the
largest **activations**; chosen by weight magnitude, or at random, they do little. Reproduce the direction
on SmolLM2 (3-bit, groups of 64, every linear; the 1 % columns kept as they are):
""")

nb.code(r"""
with torch.no_grad():
    act_mean = ref_awq.activation_means(model, calibration[:2], linears)  # E|x| per input channel
gen = torch.Generator().manual_seed(0)
table1 = {"RTN 3-bit": low_ppl}
for by in ["activation", "weight", "random"]:
    keep = {n: ref_awq.salient_channels(params[n].detach(), act_mean[n], 0.01, by, generator=gen) for n in linears}
    m = ref.quantize_model(model, {n: 3 for n in linears},
                           weight_fn=lambda name, w, b: ref_awq.rtn_keep_channels(w, keep[name], b, GROUP))
    table1[f"1 % kept, by {by}"] = ppl(m)
for name, p in table1.items():
    print(f"{name:>26}: PPL {p:.2f}")
""")

nb.md(r"""
Mixed precision inside a matrix is awkward for kernels, so AWQ protects the salient channels another way.
For any positive vector `s` (one number per input channel), `x·Wᵀ = (x / s)·(W·diag(s))ᵀ`: scale weight
column `j` up by `s_j` and input channel `j` down by the same factor (folded into the RMSNorm gain or the
previous linear: free at run time), and the layer computes the same thing. Now quantize `W·diag(s)` instead
of `W`. Think about what that does to column `j`'s error *as the layer sees it*: the grid's step is set by
the group's range, which one scaled column barely changes, so the rounding error of the scaled weight is
about the same — and it reaches the output divided by `s_j`. Large `s_j` on the channels with large
activations shrinks exactly the errors that matter; but push it too far and those columns take over the
group's range, and everyone else's step grows.

The problem: choose `s` so that the rounded layer's **output** on the calibration inputs changes least. AWQ
narrows the choice to one parameter, `s = (E|x|)^α` per input channel (`E|x|`: the mean absolute activation over
the calibration tokens), normalized so that `sqrt(max(s)·min(s)) = 1` as the AWQ code does (the check rebuilds your
grid with that `s`), and `α` one of `0, 1/n_grid, …, (n_grid−1)/n_grid`. The rounding itself stays plain: min/max
round-to-nearest in groups of `group_size`. Return the effective weights (what the layer computes with, in the
original scale) and the `α` you chose. What the layer computes for a given `α`, how to compare two `α`, and on what
— those are yours. (`α = 0` is plain rounding: a search that is right never loses to it on the calibration inputs.)
""")

nb.exercise("awq_quantize", r'''
def awq_quantize(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, n_grid: int = 20):
    """AWQ of w [out, in] on calibration inputs x [n, in]: (w_eff, alpha), the weights the layer computes with and
    the alpha of s = (E|x|)^alpha (alpha in 0, 1/n_grid, ..., (n_grid-1)/n_grid) that changes its output least."""
    ### BEGIN SOLUTION
    x = x.reshape(-1, x.shape[-1]).float()
    mean_abs = x.abs().mean(0).clamp_min(1e-5)  # [in]
    levels = 2**bits - 1
    best = (float("inf"), None, 0.0)
    for i in range(n_grid):
        alpha = i / n_grid
        s = mean_abs.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        g = (w.float() * s).reshape(w.shape[0], -1, group_size)  # [out, groups, group_size]
        lo = g.amin(-1, keepdim=True)
        scale = ((g.amax(-1, keepdim=True) - lo) / levels).clamp_min(1e-12)
        w_eff = (torch.clamp(torch.round((g - lo) / scale), 0, levels) * scale + lo).reshape(w.shape) / s
        err = ((x @ (w.float() - w_eff).T) ** 2).mean().item()
        if err < best[0]:
            best = (err, w_eff.to(w.dtype), alpha)
    return best[1], best[2]
    ### END SOLUTION
''')
nb.test("test_awq_quantize", "check_awq_quantize(awq_quantize)", points=2)

nb.md(r"""
**The procedure, now that your check passes.** For each `α` of the grid: `s = (E|x|)^α`, normalized; the effective
weights are the min/max round-to-nearest of `W·diag(s)` mapped back, `Ŵ = RTN(W·diag(s))·diag(s)⁻¹`; their error
is the mean squared output change on the calibration inputs, `mean((x·(W − Ŵ)ᵀ)²)` over every token — the whole
product, so correlated channels' errors add or cancel as they do in the layer (a score from a diagonal of `XᵀX`
alone misses that). Keep the `α` with the smallest error. The search is cheap (n_grid roundings of one matrix) and
fits one number per layer, not the weights.
""")

nb.code(r"""
awq_rows = {}
# one s per group of linears that read the same input (q/k/v after one RMSNorm, gate/up after the other): a single
# norm gain must absorb 1/s. Stacking their rows makes your function search one α for all of them (the output
# error of the stack is the sum of theirs). o_proj reads attention's output; with GQA v_proj has 192 outputs for
# o_proj's 576 inputs, so no 1/s folds into v_proj: o_proj is rounded plainly (α = 0), as AutoAWQ does here.
groups = [[f"layers.{l}.attn.{k}.weight" for k in ("q_proj", "k_proj", "v_proj")] for l in GPTQ_LAYERS] + \
         [[f"layers.{l}.mlp.{k}.weight" for k in ("gate_proj", "up_proj")] for l in GPTQ_LAYERS] + \
         [[f"layers.{l}.mlp.down_proj.weight"] for l in GPTQ_LAYERS]
for bits in (3, 4):
    found, alphas = {}, []
    for names in tqdm(groups, desc=f"AWQ {bits}-bit"):
        stacked = torch.cat([params[n].detach() for n in names])  # [sum of outputs, in]
        w_eff, alpha = awq_quantize(stacked, calib_x[names[0]][::4], bits, CAL_GROUP)  # 256 tokens fit 20 numbers
        found.update(zip(names, w_eff.split([params[n].shape[0] for n in names])))
        alphas.append(alpha)
    for l in GPTQ_LAYERS:
        n = f"layers.{l}.attn.o_proj.weight"
        found[n] = ref.rtn_quantize(params[n].detach(), bits, CAL_GROUP)
    awq_ppl = ppl(ref.quantize_model(model, found, weight_fn=lambda name, w, _: found[name]))
    awq_rows[bits] = awq_ppl
    print(f"{bits}-bit, layers {GPTQ_LAYERS}: RTN {gptq_rows[bits][0]:.2f}, GPTQ {gptq_rows[bits][1]:.2f}, "
          f"AWQ {awq_ppl:.2f} (α from {min(alphas):.2f} to {max(alphas):.2f}, median {sorted(alphas)[len(alphas) // 2]:.2f})")
""")

nb.md(r"""
AWQ needs no Hessian and no weight updates — a scale per channel and plain rounding — and it is robust to a
small calibration set: it fits one number per layer, not the weights themselves (GPTQ fits every weight, which
is why it needed damping against 1024 calibration tokens). The two combine (AWQ scales, then GPTQ), as
several toolkits do. One caution before ranking them: the GPTQ above goes through the columns in their
stored order. Real GPTQ usually runs **act-order** — the columns with the largest `H_jj` first, while
the most columns remain to absorb their error (`ref_gptq.gptq_quantize(..., act_order=True)`; each column
then keeps its group index): the `act-order` row of the probe above. Where it lowers the error, a
GPTQ-vs-AWQ ranking without it understates GPTQ.
""")

nb.md(r"""
**AWQ's second search: clipping.** A min/max grid spends its two end levels on each group's two most extreme
weights. Shrink the group's range (toward zero, by a factor r ≤ 1) and those few weights clip, but every other
weight gets a finer step. AWQ's code searches r per row and group (here r = 1, 0.95, …, 0.55), keeping the one
whose rounded group changes *its share of the layer's output* least on the calibration inputs
(`ref_awq.clip_search`, run after the α search on the scaled weights: `awq_quantize(..., clip=True)`). A search
fitted to the calibration tokens must be judged on others: below, the output error on the held-out window of
section 7, for layer 12's three input-sharing groups.
""")

nb.code(r"""
CLIP_LAYER = 12
clip_groups = {"q/k/v": [f"layers.{CLIP_LAYER}.attn.{k}.weight" for k in ("q_proj", "k_proj", "v_proj")],
               "gate/up": [f"layers.{CLIP_LAYER}.mlp.{k}.weight" for k in ("gate_proj", "up_proj")],
               "down": [f"layers.{CLIP_LAYER}.mlp.down_proj.weight"]}
with torch.no_grad():
    held_x = inputs_of([names[0] for names in clip_groups.values()], held_out)
print(f"layer {CLIP_LAYER}, group {CAL_GROUP}: output error on {held_x[clip_groups['down'][0]].shape[0]} held-out tokens "
      f"(mean squared, relative to RTN's)")
print(f"{'':>14} {'RTN':>10} {'RTN + clip':>11} {'AWQ':>7} {'AWQ + clip':>11}")
clip_ratio = {}
for bits in (3, 4):
    for label, names in clip_groups.items():
        stacked = torch.cat([params[n].detach() for n in names])  # [sum of outputs, in]
        cal, test = calib_x[names[0]][::4], held_x[names[0]]
        w_awq, alpha = ref_awq.awq_quantize(stacked, cal, bits, CAL_GROUP)
        s = ref_awq.awq_scales(cal.abs().mean(0), alpha)  # the same α, then each group's range searched
        candidates = [ref.rtn_quantize(stacked, bits, CAL_GROUP), ref_awq.clip_search(stacked, cal, bits, CAL_GROUP),
                      w_awq, ref_awq.clip_search(stacked * s, cal / s, bits, CAL_GROUP) / s]
        err = [ref_gptq.output_error(stacked, q, test) for q in candidates]
        clip_ratio[bits, label] = err[3] / err[2]
        print(f"{f'{bits}-bit {label}':>14} {err[0]:>10.3e} " + " ".join(f"{e / err[0]:>{w}.3f}" for e, w in zip(err[1:], (11, 7, 11))))
print(f"AWQ + clip / AWQ on held-out tokens: {min(clip_ratio.values()):.2f} to {max(clip_ratio.values()):.2f}")
""")

nb.md(r"""
Read the columns against each other, on held-out tokens: does the clipping search lower AWQ's error further (the
last line)? Where does clipping alone beat the α search, and where not? The two fix different things — the scales
protect the salient input channels, the clipping spends each group's levels where its weights are — so they can add
up. It is cheap — a handful of candidate ranges per group, no weights refitted — and AutoAWQ runs it by default.

### Three claims from the seeds, checked

* **Seed 002: "FP16 → INT4: expect +0.1 to +0.3 PPL".** An absolute ΔPPL depends on the base perplexity; the
  relative change is what transfers between models. Seed 004's table: Q4_K_S costs Llama-3.1-8B 7.32 → 7.62
  (its relative cost is printed below, beside ours from section 5's table — on a model that is already Q4_1, so a
  lower bound on what 4 bits cost the original bf16 weights).
* **Seed 000: "Q4_K_M and AutoGPTQ INT4 may produce different perplexity despite the same nominal bit depth"**,
  because K-quants mix precisions. True, but "the same nominal bit depth" hides different *real* sizes: count
  the bits. AutoGPTQ's INT4 stores a float16 scale and a 4-bit zero per group of 128: 4 + 20/128 = 4.16 bits per
  weight (here groups of 192: 4.10). Q4_K_M spends 4.5 bits on its Q4_K tensors and 6.5625 on its Q6_K ones — and on
  SmolLM2, whose 576-wide rows fall back to Q5_0 (5.5 bits), more. Below, both on the linears of `GPTQ_LAYERS`:
""")

nb.code(r"""
q4_rows = {n: b for n, b in results.items() if n in ("Q4_0", "Q4_K", "Q4_K_M-like")}
for name, (bpw, p, se, d, d_se) in q4_rows.items():
    base = results["F32 (decoded Q4_1)"][1]
    print(f"seed 002 — {name:>12} ({bpw:.2f} bits/weight): ΔPPL {d:+.2f} ± {d_se:.2f} on a base of {base:.2f}, "
          f"{100 * d / base:+.1f} %  (seed 004, Llama-3.1-8B Q4_K_S: +0.30, {100 * 0.30 / 7.32:+.1f} %)")
k_m = ref.q4_k_m_plan(model)
k_m_some = {n: k_m[n] for n in gptq_names}
k_m_ppl = ppl(ref.quantize_model(model, k_m_some))
sizes = {n: params[n].numel() for n in gptq_names}
gptq_bpw = 4 + (16 + 4) / CAL_GROUP
print(f"seed 000 — layers {GPTQ_LAYERS}: Q4_K_M-like {ref.plan_bits_per_weight(model, k_m_some):.2f} bits/weight, "
      f"PPL {k_m_ppl:.2f}; GPTQ INT4 g{CAL_GROUP} {gptq_bpw:.2f} bits/weight, PPL {gptq_rows[4][1]:.2f}; "
      f"RTN INT4 g{CAL_GROUP} PPL {gptq_rows[4][0]:.2f} (unquantized {base_quick:.2f}; one window)")
""")

nb.md(r"""
Seed 002's "+0.1 to +0.3" is an absolute figure for a 7–8B model whose perplexity is about 7; SmolLM2's is several
times higher, and its 4-bit ΔPPL is points, not tenths. In *relative* terms the K-quants cost it a few per cent
— about what Q4_K_S costs the 8B model, on a reference that already carries Q4_1's rounding — while Q4_0 costs
several times more: the format matters more than the "INT4" label. And the Q4_K_M-vs-GPTQ comparison is not one
of "the same bit depth": the K-quant mix spends more than a bit per weight extra here, GPTQ spends its effort on
error feedback instead. Compare formats at equal *measured* bits per weight, as section 5's Pareto plot does.
""")

# --- 9 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 9. SmoothQuant (W8A8)

Weight-only quantization leaves the matrix products in floating point. Quantizing the **activations** too
(W8A8) lets int8 hardware do the products, but activations have outlier channels. Look at the largest
input each channel sees over 512 calibration tokens, for `ffn_down` in the layer your section-6 run found most
sensitive and for the linear whose largest channel stands highest above its median:
""")

nb.code(r"""
from lib.quantization import smoothquant as ref_sq

with torch.no_grad():
    act_max = ref_sq.activation_absmax(model, calibration[:2], linears)  # max|x| per input channel
sensitive = max(layer_delta, key=layer_delta.get)  # section 6: the probed layer whose rounding cost the most
peak = {n: float(act_max[n].max() / act_max[n].median()) for n in linears}
fig, axes = plt.subplots(1, 2, figsize=(12, 3))
for ax, name in zip(axes, [f"layers.{sensitive}.mlp.down_proj.weight", max(peak, key=peak.get)]):
    m = act_max[name]
    ax.semilogy(m.cpu().numpy(), lw=0.7)
    ax.set_title(f"{name.rsplit('.', 1)[0]}: max/median = {peak[name]:.0f}", fontsize=9)
    ax.set_xlabel("input channel")
axes[0].set_ylabel("max |x|")
plt.tight_layout(); plt.show()
print(f"section 6's most sensitive probed layer: {sensitive} (ΔPPL {layer_delta[sensitive]:+.2f}); the largest "
      f"max/median of any linear's input: {max(peak.values()):.0f} ({max(peak, key=peak.get).rsplit('.', 1)[0]}), "
      f"the median linear's: {sorted(peak.values())[len(peak) // 2]:.0f}")
""")

nb.md(r"""
Where one channel stands orders of magnitude above the median (the titles and the last line: is it in the layer
section 6 found sensitive?), one int8 scale per tensor gives that channel all the range and leaves the typical
channels a handful of levels. SmoothQuant divides each
input channel by `s_j = max|X_j|^α / max|W_j|^(1−α)` and multiplies the weight column by `s_j` — the same
product, with the difficulty shared between activations and weights (`lib/quantization/smoothquant.py`; simulated int8,
per-tensor dynamic activations, per-channel weights, every linear of the 30 blocks):
""")

nb.code(r"""
sq_rows = {"naive W8A8": ppl(ref_sq.w8a8_model(model))}
for alpha in [0.5, 0.8]:
    sq_rows[f"SmoothQuant α = {alpha}"] = ppl(ref_sq.w8a8_model(model, act_max, alpha))
print(f"unquantized: {base_quick:.2f} (one window)")
for name, p in sq_rows.items():
    print(f"{name:>22}: PPL {p:.2f}")
""")

nb.md(r"""
Compare the rows: where migrating the outliers recovers the loss, and whether a larger α (more migration into
the weights) helps more than the paper's 0.5 for OPT — the paper used 0.75 for GLM-130B, whose activations are
harder: the more extreme a model's outliers, the more of them the weights must take.
""")

# --- 10 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 10. Quantized decode

Everything so far *simulated* quantization: weights rounded, then stored as float32 again. To get the speed
the bytes must stay small in memory and be expanded inside the matrix product. torch has CPU kernels for
exactly that (`lib/quantization/quant_linear.py`): int8 per output channel (`aten._weight_int8pack_mm`) and int4 in
groups with a scale and a zero (`aten._weight_int4pack_mm_for_cpu`), both with bfloat16 activations.
int4 with groups of 32 and a min/max grid is **Q4_1's grid** — so on our weights (section 3) it loses
nothing but the bfloat16 rounding of scales and activations. The LM head (the tied embedding, stored as
Q8_0) goes to int8 in that variant. These are CPU kernels, and so are `lib.gguf.qmatmul`'s below: on a machine with a
GPU this section runs on a CPU copy of the model (`qmodel`) and measures the CPU's bandwidth for its rooflines.
""")

nb.code(r"""
from torch.utils._python_dispatch import TorchDispatchMode

from lib.modeling.generate import generate
from lib.quantization.quant_linear import quantize_linears

# torch's int8/int4 kernels are CPU kernels (quantize_linears refuses a model on a GPU): this section runs on the CPU
qmodel = model if dev.type == "cpu" else shared_smollm2("cpu")[0]
if dev.type == "cpu":
    cpu_bandwidth, cpu_from = roof_bandwidth, roof_from  # section 1: the best this machine class has shown
else:  # the CPU of a GPU machine: no record of its class, so this run's probe
    cpu_bandwidth, cpu_from = roofline.measure_bandwidth(mib=256 if FULL else 128, repeats=3), "measured in this run"
paths_ = {"F32": (qmodel, 32.0),
          "int8": (quantize_linears(qmodel, "int8"), 8.0),
          "int4 g32 (int8 head)": (quantize_linears(qmodel, "int4", 32, lm_head="int8"), None)}
head = model.embed.weight.numel()
paths_["int4 g32 (int8 head)"] = (paths_["int4 g32 (int8 head)"][0], ((n_weights - head) * 5.0 + head * 8.0) / n_weights)
prompt = tok("The history of the printing press begins", return_tensors="pt").input_ids  # generate moves it
N_NEW = 32 if FULL else 16
outputs = {}


def generating(name):  # a timed call: prefill and N_NEW greedy tokens on one path
    return lambda: outputs.__setitem__(name, generate(paths_[name][0], prompt, N_NEW))


with torch.no_grad():
    conditions = Conditions.now()
    timed = interleaved({name: generating(name) for name in paths_}, repeats=5 if FULL else 2)  # the paths take turns
    conditions.done()
    reference_ids = outputs["F32"]  # greedy, so every F32 run gives these tokens
    step = {}
    for name, (m, bpw) in paths_.items():
        ids = outputs[name]
        same = int((ids[0, prompt.shape[1]:] == reference_ids[0, prompt.shape[1]:]).int().cumprod(0).sum())
        step[name] = (N_NEW / timed[name].best, cpu_bandwidth / (n_weights * bpw / 8), same, ppl(m))
print(report(timed, conditions, unit="ms per token, prefill included", per={name: N_NEW for name in paths_}))
print(f"{'path':>22} {'tok/s':>7} {'vs F32':>7} {'bytes':>7} {'roofline':>9} {'tokens = F32':>13} {'PPL':>7}")
for name, (tok_s, roof, same, p) in step.items():
    print(f"{name:>22} {tok_s:>7.1f} {tok_s / step['F32'][0]:>6.2f}x {32 / paths_[name][1]:>6.1f}x {roof:>9.0f} "
          f"{same:>9}/{N_NEW} {p:>7.2f}")
print(f"(best of the repeats; 'bytes': how many times fewer than F32; roofline at {cpu_bandwidth / 1e9:.1f} GB/s, "
      f"{cpu_from})")


class CountOps(TorchDispatchMode):  # counts the aten operations torch runs (each a kernel call)
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def ops_of(fn):
    with torch.no_grad(), CountOps() as counter:
        fn()
    return counter.n


step_ops = ops_of(lambda: generate(qmodel, prompt, 2)) - ops_of(lambda: generate(qmodel, prompt, 1))
print(f"one decode step of the F32 model (lib.modeling.llama): {step_ops} aten operations, each a kernel call from Python")
""")

nb.md(r"""
The quantized paths read fewer bytes per step (the 'bytes' column), but they stay far from their rooflines: at
135M parameters a step is the many small operations counted above, each a kernel call dispatched from Python, and
those overheads weigh as much as the bytes (week 16, section 6). Greedy tokens stay identical to the F32 model
for a while and then may drift: bfloat16 activations and rounded scales nudge a near-tie between two tokens —
while the perplexity barely moves, which is the right measure. `python benchmarks/quant.py` measures decode
alone, with repeats, and llama.cpp when it is installed.
""")

nb.md(r"""
### The file's own blocks, multiplied as they lie

The int4 path above *requantizes*: it decodes the file's Q4_1 weights and packs them again in torch's layout,
with bfloat16 scales and activations — a slightly different model. `lib.gguf.qmatmul` instead multiplies the GGUF
blocks exactly as the file stores them (20 bytes per 32 weights for Q4_1, 34 for Q8_0), decoding each block
in registers inside the dot product. Its readable reference, `block_dot_q4_1`, is the whole idea for one
block: the two float16 numbers `d` and `m`, the 32 four-bit codes `q`, and

$$\sum_{i=0}^{31} x_i\,(d\,q_i + m).$$

Each weight `d·q + m` is formed in float32 exactly as section 2's dequantizer forms it, so the product is
`x · dequantize(W)ᵀ` up to the order of the float32 sum: the model *is* the file's model, with 32 / 5 = 6.4 times fewer
bytes read than float32. (llama.cpp goes one step further and rounds the activations `x` to 8 bits per block, so it
can form `Σ xᵢ qᵢ` in integer SIMD and apply `d` and `m` once per block — faster arithmetic, a slightly
different model.) The C++ kernel in `lib/gguf/csrc/qmatmul.cpp` does the same sum 16 lanes at a time, one weight row
for up to 8 rows of `x`, with one trick worth knowing: a Q4_1 block has only 16 distinct weights, `d·j + m` for
j = 0…15, so the AVX-512 loop computes those 16 once per block and looks each of the 32 weights up by its nibble
(one `vpermps` per 16 weights) instead of converting and scaling every code. `backend()` says which code runs
here.
""")

nb.code(r"""
import inspect

from lib.gguf import qmatmul
from lib.quantization.quant_linear import GGUFFastLlama, quantize_blocks, read_gguf_blocks

print(inspect.getsource(qmatmul.block_dot_q4_1))
gguf_blocks = read_gguf_blocks()  # every matmul weight of the file as (type, uint8 blocks [out, bytes per row])
qtype, w_blocks = gguf_blocks["layers.0.mlp.gate_proj.weight"]
x = torch.randn(w_blocks.shape[1] // 20 * 32, generator=torch.Generator().manual_seed(0))
row = w_blocks[0].numpy()
by_block = sum(float(qmatmul.block_dot_q4_1(x[32 * b:32 * b + 32].numpy(), row[20 * b:20 * b + 20]))
               for b in range(len(row) // 20))
print(f"{qtype}, {w_blocks.shape[0]} rows of {w_blocks.shape[1]} bytes; backend: {qmatmul.backend()}")
print(f"row 0 · x, block by block (block_dot_q4_1): {by_block:.6f}")
print(f"row 0 · x, float64 reference (row_dot_reference): {qmatmul.row_dot_reference(x.numpy(), row, qtype):.6f}")
print(f"row 0 · x, the kernel (qmatmul): {qmatmul.qmatmul(x[None], w_blocks, qtype)[0, 0].item():.6f}")
print(f"row 0 · x, the F32 model's weight: {(model.layers[0].mlp.gate_proj.weight[0] @ x.to(dev)).item():.6f}")
""")

nb.md(r"""
Four routes, one number (up to float32 rounding in the last digits): the blocks hold the model's weights.
Now the speed of each format next to its roofline, side by side in one cell: lib.modeling.fast's fused decoder on
float32 weights, on torch's int4 layout (via `quantize_linears`), and on GGUF blocks (`GGUFFastLlama`) — the
file's Q4_1, and Q8_0 blocks quantized from the same weights by `quantize_blocks` (a requantization: a
slightly different model, timed only for its speed). The paths take turns, so a busy machine slows all of
them alike; each time is the best of a few runs of decode steps alone (prefill subtracted).
""")

nb.code(r"""
import copy

from lib.modeling.fast import FastLlama


def model_of_blocks(blocks):  # the float32 model whose weights are exactly these blocks' values
    other = copy.deepcopy(qmodel)
    with torch.no_grad():
        for name, (t, b) in blocks.items():
            other.get_parameter(name).copy_(qmatmul.dequantize_blocks(b, t))
    return other


q8_blocks = quantize_blocks(qmodel, "Q8_0")
head_bytes = gguf_blocks["embed.weight"][1].numel()  # the tied LM head stays Q8_0 in every GGUF path
decoders = {  # name: (decoder, bytes of weights read per token); on the CPU, like the kernels they compare
    "F32 (lib.modeling.fast)": (FastLlama(qmodel), n_weights * 4),
    "int4 g32 (torch)": (quantize_linears(qmodel, "int4", 32), n_weights * 5 / 8),
    "Q8_0 blocks": (GGUFFastLlama(model_of_blocks(q8_blocks), q8_blocks), sum(b.numel() for _, b in q8_blocks.values())),
    # layout="file": the blocks as the file lays them out (lib.quantization.quant_linear's "wide" layout, d and m widened to
    # float32, reads 20 % more bytes with fewer shuffles; `python benchmarks/quant.py` times both)
    "Q4_1 blocks (the file)": (GGUFFastLlama(qmodel, gguf_blocks, layout="file"),
                               sum(b.numel() for _, b in gguf_blocks.values())),
}
print("lib.modeling.fast's kernel:", decoders["F32 (lib.modeling.fast)"][0].kernel_reason)
N_STEPS, REPEATS = (32, 5) if FULL else (16, 3)
runs = {}  # per decoder: the prefill and first token alone, and with N_STEPS decode steps after it
for name, (m, _) in decoders.items():
    runs[f"{name}: 1 token"] = lambda m=m: generate(m, prompt, 1)
    runs[f"{name}: {1 + N_STEPS} tokens"] = lambda m=m: generate(m, prompt, 1 + N_STEPS)
with torch.no_grad():
    conditions = Conditions.now()
    timed = interleaved(runs, repeats=REPEATS, device=qmodel.device)  # every path takes turns, round by round
    conditions.done()
    same = torch.equal(generate(decoders["Q4_1 blocks (the file)"][0], prompt, N_NEW), reference_ids)
print(report(timed, conditions))
print(f"greedy tokens of the Q4_1 blocks equal to the F32 model's ({N_NEW} tokens): {same}")
print(f"{'format':>24} {'MB/token':>9} {'roofline tok/s':>15} {'measured tok/s':>15} {'share':>6}")
speed, over = {}, []
for name, (m, nbytes) in decoders.items():
    per_step = (timed[f"{name}: {1 + N_STEPS} tokens"].best - timed[f"{name}: 1 token"].best) / N_STEPS
    speed[name] = (cpu_bandwidth / nbytes, 1 / per_step)
    share = speed[name][1] / speed[name][0]
    over += [name] if share > 1 else []
    print(f"{name:>24} {nbytes / 1e6:>9.1f} {speed[name][0]:>15.0f} {speed[name][1]:>15.1f} {share:>6.0%}")
print(f"(decode steps alone: the best run with {1 + N_STEPS} tokens less the best with 1; roofline at "
      f"{cpu_bandwidth / 1e9:.1f} GB/s, {cpu_from})")
if over:
    print(f"measurement problem: {', '.join(over)} above 100 % of the roofline — no decode reads its weights faster "
          f"than the memory delivers: the bandwidth probe read low (a busy moment) or the timing was disturbed")

fig, ax = plt.subplots(figsize=(7, 3.2))
pos = np.arange(len(speed))
ax.bar(pos - 0.2, [r for r, _ in speed.values()], 0.4, label="roofline (bandwidth / bytes per token)", color="0.8")
ax.bar(pos + 0.2, [t for _, t in speed.values()], 0.4, label="measured decode", color="C0")
ax.set_xticks(pos, list(speed), fontsize=8)
ax.set_ylabel("tokens / s")
ax.set_title(f"SmolLM2-135M decode on the CPU, batch 1, {torch.get_num_threads()} threads, roofline at "
             f"{cpu_bandwidth / 1e9:.0f} GB/s", fontsize=9)
ax.legend(fontsize=8)
plt.show()
""")

nb.md(r"""
Read the shares, not the absolute speeds (a shared machine lowers all of them). Fewer bytes raise the ceiling
in proportion; how much of it a path reaches depends on everything else a step does. The ceiling is only as
good as the bandwidth behind it: a probe on a shared or virtual machine reads differently from minute to minute,
which is why the rooflines use the best streaming bandwidth recorded for this class of machine (section 1) and a
share above 100 % is reported as a measurement problem, not a result. On one of the lab's reference machines,
`benchmarks/quant.py` recorded a streaming bandwidth of {RECORDED_BANDWIDTH}. The GGUF decoder runs a one-token step of all 30 layers
in one C++ call (`decode_steps`, the same arithmetic as lib.modeling.fast's Python step; lib.modeling.fast's float32 decoder makes
the same call where it chose its "cpp" kernel, printed above), because at 135M parameters the Python and tensor
bookkeeping between the small operations of a step (counted in the first cell of this section) cost as much as the
matmuls themselves. `python benchmarks/quant.py` repeats this measurement with more paths, perplexity with its
standard error, batch 8, and llama.cpp on the same file when it is installed.
""".replace("{RECORDED_BANDWIDTH}", recorded_md("quant", "streaming bandwidth", "amd-epyc-avx512")))

nb.md(r"""
**Seed 001: "Quantization: +10–30 % speed".** At batch 1 the step time is bytes ÷ bandwidth (section 1), so the
gain to expect is the ratio of bytes: FP16 → INT8 halves them, FP16 → INT4 with group scales cuts them by
16 / 4.5 ≈ 3.6; from our F32, by the ratio printed beside each path. Against that, the decode speed-ups just
measured (decode steps alone, best of the repeats, the paths taking turns):
""")

nb.code(r"""
f32_bytes = decoders["F32 (lib.modeling.fast)"][1]
for name, (roof, tok_s) in list(speed.items())[1:]:
    ratio = tok_s / speed["F32 (lib.modeling.fast)"][1]
    print(f"seed 001 — {name:>24}: {ratio:.2f}x the F32 decode, {100 * (ratio - 1):+.0f} % "
          f"({f32_bytes / decoders[name][1]:.1f}x fewer bytes per token)")
""")

nb.md(r"""
Batch-1 decoding waits for weight bytes, so every path here should beat the seed's figure, and the fused GGUF ones
by far; how much of the byte ratio turns into speed depends on what else a step does (the shares above). The seed's figure fits a step that
is not waiting for weight bytes — large batches, compute-bound — where dequantizing costs arithmetic and saves
no time.
""")

# --- 11 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 11. A GGUF file of your own

Blocks are half of a GGUF file; the other half is the container that tells a reader where each tensor is, what
type it is and what shape. llama.cpp memory-maps the file and points its tensors straight into it, so the
container is mostly about **offsets and alignment**. The layout (GGUF version 3; everything little-endian):

| part | what |
|---|---|
| header | the 4 bytes `GGUF`; the version, uint32 (3); the number of tensors, uint64; the number of metadata pairs, uint64 |
| metadata | each pair: its key (a string), the value's type (uint32; 4 means uint32), the value |
| tensor infos | each tensor: its name (a string), its number of dims (uint32), the dims (uint64 each), its ggml type (uint32), its offset (uint64) |
| padding | zero bytes |
| data | the tensors' bytes, as stored (section 2's blocks) |

A *string* is its length in **bytes** (uint64) followed by its UTF-8 bytes, no terminator. The ggml type numbers are
`gguf.GGMLQuantizationType` (a table of constants: use it). Four things to work out from how a reader uses the file:

* **dims**: ggml numbers a tensor's dimensions from the innermost, `ne[0]` being the length of a row; which order
  does a `[rows, cols]` weight matrix go in?
* **offsets**: a reader maps the data section and finds tensor `i` at `start of data + offset_i`. The data section
  starts at the first multiple of the **alignment** after the infos, and every offset is a multiple of it too
  (so a tensor can be used in place by vector loads). Blocks of 34 or 210 bytes rarely end on such a multiple.
* **alignment**: 32, unless the file says otherwise in the metadata key `general.alignment` (a uint32) — a file
  with another alignment that does not say so is read wrongly.
* **order**: gguf-py reads any consistent offsets, but ggml's own loader (what llama.cpp runs) wants each tensor's
  data right where the previous one's ended, padded: in the order of the infos, no gaps.

Write the bytes of a file holding the tensors you are given (and whatever metadata the alignment needs) without
gguf-py's writer (`gguf.GGUFWriter`: while your code is graded it is a stub that says so); its reader is the
oracle: the check reads your
bytes with `gguf.GGUFReader` and compares every name, type, dim and byte.
""")

nb.exercise("gguf_bytes", r'''
def gguf_bytes(tensors: dict, alignment: int = 32) -> bytes:
    """{name: (data, qtype, (rows, cols))} -> the bytes of a GGUF v3 file holding those tensors in that order.
    `data` is a tensor as stored: uint8 [rows, row bytes] for a quantized type, float32 [rows, cols] for "F32";
    `qtype` a gguf.GGMLQuantizationType name. Every tensor's data starts at a multiple of `alignment`."""
    ### BEGIN SOLUTION
    import struct

    def string(text):  # uint64 byte length, then the UTF-8 bytes
        raw = text.encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
    head += string("general.alignment") + struct.pack("<II", 4, alignment)  # value type 4: uint32
    blobs, offset = [], 0
    for name, (data, qtype, shape) in tensors.items():
        raw = np.ascontiguousarray(data).tobytes()
        dims = [int(d) for d in reversed(shape)]  # innermost first: (cols, rows)
        head += string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims,
                                           int(gguf.GGMLQuantizationType[qtype]), offset)
        raw += bytes(-len(raw) % alignment)  # the next tensor starts aligned
        blobs.append(raw)
        offset += len(raw)
    return head + bytes(-len(head) % alignment) + b"".join(blobs)
    ### END SOLUTION
''')
nb.test("test_gguf_bytes", "check_gguf_bytes(gguf_bytes)", points=2)

nb.md(r"""
Your blocks in your container: two SmolLM2 tensors quantized with your own functions (`ffn_down` of layer 5 as
Q4_K with your search, the first 64 rows of the embedding as Q8_0), written with your writer, read back by
gguf-py and decoded by it. (`lib.quantization.quant.write_gguf` writes a whole model this way, metadata and tokenizer
included; `tests/test_llama_cpp.py` loads such a file — the Q4_K_M-like mix — in llama.cpp and compares its
greedy tokens with the lab's model.)
""")

nb.code(r"""
import tempfile
from pathlib import Path

mine = {"blk.5.ffn_down.weight": (quantize_q4_k(down), "Q4_K", down.shape),
        "token_embd.weight": (quantize_q8_0(model.embed.weight.detach()[:64].cpu().numpy()), "Q8_0", (64, cfg.d_model))}
with tempfile.TemporaryDirectory() as tmp:
    file = Path(tmp) / "mine.gguf"
    file.write_bytes(gguf_bytes(mine, alignment=64))
    back = gguf.GGUFReader(file)
    print(f"{file.stat().st_size:,} bytes; general.alignment = {back.fields['general.alignment'].contents()}")
    for t in back.tensors:
        data, qtype, shape = mine[t.name]
        decoded = gguf_dequantize(np.asarray(t.data), t.tensor_type)
        print(f"{t.name:>22}: {t.tensor_type.name}, dims {[int(d) for d in t.shape]}, data at byte {t.data_offset} "
              f"(= {t.data_offset // 64} x 64), decodes like your dequantizer: "
              f"{np.array_equal(decoded, dequantize_q4_k(data) if qtype == 'Q4_K' else dequantize_q8_0(data))}")
""")

# --- 12 ---------------------------------------------------------------------------------------------------
nb.md(r"""
## 12. Check your understanding (seed 002, Q6–Q9)

**Q6.** Why can't you apply standard per-tensor INT8 quantization to LLMs without significant accuracy loss?
""")
nb.answer("answer_q6", r"""
**Model answer.** One scale per tensor is set by the largest magnitude in it, and LLM activations (and some
weights) have **outliers**: a few channels with values one to two orders of magnitude above the rest (SmoothQuant, LLM.int8()). With
`Δ = max|x| / 127`, the ordinary values use only a handful of the 255 levels, so their rounding error is huge
relative to their size; naive W8A8 on OPT-175B reaches perplexity ~93,000 (SmoothQuant, Table 3). Finer
granularity (per channel, per token, per block of 32 as in GGUF — section 2), outlier handling
(mixed precision, smoothing) fix it.

**Mark scheme (2 points).** 1: outliers (a few channels/values much larger than the rest). 1: one scale
per tensor is set by them, so most values get few levels / large relative error; naming a fix (finer
granularity or outlier handling) is expected but not required.
""", points=2)

nb.md(r"""
**Q7.** GPTQ compensates for rounding error by adjusting un-quantized weights using what mathematical object?
""")
nb.answer("answer_q7", r"""
**Model answer.** The (inverse) **Hessian** of the layer's reconstruction error, `H = 2XXᵀ` from calibration
activations: after a column is rounded, its error times row `j` of `H⁻¹` (via the Cholesky factor of
`H⁻¹`, section 7) is subtracted from the columns not yet quantized — the Optimal Brain Surgeon update.

**Mark scheme (1 point).** The Hessian / inverse Hessian (second-order information from calibration inputs).
""", points=1)

nb.md(r"""
**Q8.** AWQ scales up "salient" weight channels before quantizing. How does it determine which channels are salient?
""")
nb.answer("answer_q8", r"""
**Model answer.** By the **activations**, not the weights: the input channels whose calibration activations
have the largest average magnitude `E|x|` (section 8: choosing the 1 % by activation recovers far more than
by weight magnitude or at random). The scale is `s = (E|x|)^α` with `α` found by a grid search that
minimizes the layer's output error on the calibration set.

**Mark scheme (1 point).** Activation magnitude on calibration data (not weight magnitude).
""", points=1)

nb.md(r"""
**Q9.** In GGUF K-quants, Q4_K_M uses more bits for certain layer types. Which, and why? Answer from your own
measurement: `answer_q9(delta_ppl)` gets a measurement like section 6's `kind_delta` (what 3-bit rounding of each
tensor type, in every layer, costs in perplexity; keys as there) and returns the GGUF names (as in
`blk.N.<name>.weight`: `attn_q`, `attn_k`, `attn_v`, `attn_output`, `ffn_gate`, `ffn_up`, `ffn_down`) of the two
types whose rounding costs the most. The check feeds it measurements you have not seen; the next cell feeds it
yours and sets it beside llama.cpp's rule.
""")
nb.exercise("answer_q9", r'''
def answer_q9(delta_ppl: dict) -> set:
    """{tensor type as in section 6 ("attn.v_proj", ...): ΔPPL of rounding it to 3 bits} -> the GGUF names of
    the two types whose rounding costs the most."""
    ### BEGIN SOLUTION
    gguf_name = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    return {gguf_name[k] for k in sorted(delta_ppl, key=delta_ppl.get, reverse=True)[:2]}
    ### END SOLUTION
''')
nb.test("test_answer_q9", "check_answer_q9(answer_q9)", points=1)

nb.code(r"""
mine = answer_q9(kind_delta)  # your measurement of section 6
rule = {ref.gguf_tensor_name(n).split(".")[2] for n, t in ref.q4_k_m_plan(model).items() if t == "Q6_K"}
print(f"your measurement singles out {sorted(mine)}; llama.cpp's Q4_K_M gives Q6_K to {sorted(rule)} "
      f"(in the layers of lib.quantization.quant.use_more_bits) -> {'the same' if mine == rule else 'NOT the same: read section 6 again'}")
""")
nb.answer("answer_q9_why", r"""
**Model answer.** `attn_v` and `ffn_down` get Q6_K in the first and last eighth of the layers and every third
layer in between (and the output head gets Q6_K too). They are where rounding costs the most: section 6's
measurement puts them far above the other five types — `attn_v` with an eighth of `ffn_down`'s weights, so per
weight it is the most sensitive of all, and `ffn_down` the most in total (its inputs, after SwiGLU, carry the
heaviest outliers; errors in V pass straight into every attention output). A few extra bits there buy more
quality than anywhere else.

**Mark scheme (1 point).** Sensitivity: these tensors' rounding errors cost the most quality (measured, or argued
from outliers / their place in the network), with the measurement cited.
""", points=1)

nb.md(r"""
## What you built

The llama.cpp block formats byte for byte and a model of the error each makes, the K-quants' packed scales and
scale search, a measured quality-per-bit curve of a real model, a bit allocation from measured sensitivities that beats uniform at the same size, and the two
calibration methods every serving stack offers. Check: `pytest weeks/20` for every exercise.
""")

nb.write(str(REPO / "solutions" / "20" / "week20_quantization.ipynb"))
print("wrote solutions/20/week20_quantization.ipynb")
