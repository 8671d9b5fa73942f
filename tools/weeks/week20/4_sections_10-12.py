# %% [markdown]
# ## 10. Quantized decode
#
# Everything so far *simulated* quantization: weights rounded, then stored as float32 again. To get the speed
# the bytes must stay small in memory and be expanded inside the matrix product. torch has CPU kernels for
# exactly that (`lib/quantization/quant_linear.py`): int8 per output channel (`aten._weight_int8pack_mm`) and int4 in
# groups with a scale and a zero (`aten._weight_int4pack_mm_for_cpu`), both with bfloat16 activations.
# int4 with groups of 32 and a min/max grid is **Q4_1's grid** — so on our weights (section 3) it loses
# nothing but the bfloat16 rounding of scales and activations. The LM head (the tied embedding, stored as
# Q8_0) goes to int8 in that variant. These are CPU kernels, and so are `lib.gguf.qmatmul`'s below: on a machine with a
# GPU this section runs on a CPU copy of the model (`qmodel`) and measures the CPU's bandwidth for its rooflines.

# %%
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
N_NEW = 32 if FULL else 8 if QUICK else 16
outputs = {}


def generating(name):  # a timed call: prefill and N_NEW greedy tokens on one path
    return lambda: outputs.__setitem__(name, generate(paths_[name][0], prompt, N_NEW))


with torch.no_grad():
    conditions = Conditions.now()
    timed = interleaved({name: generating(name) for name in paths_}, repeats=5 if FULL else 1 if QUICK else 2)  # the paths take turns
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

# %% [markdown]
# The quantized paths read fewer bytes per step (the 'bytes' column), but they stay far from their rooflines: at
# 135M parameters a step is the many small operations counted above, each a kernel call dispatched from Python, and
# those overheads weigh as much as the bytes (week 16, section 6). Greedy tokens stay identical to the F32 model
# for a while and then may drift: bfloat16 activations and rounded scales nudge a near-tie between two tokens —
# while the perplexity barely moves, which is the right measure. `python benchmarks/quant.py` measures decode
# alone, with repeats, and llama.cpp when it is installed.

# %% [markdown]
# ### The file's own blocks, multiplied as they lie
#
# The int4 path above *requantizes*: it decodes the file's Q4_1 weights and packs them again in torch's layout,
# with bfloat16 scales and activations — a slightly different model. `lib.gguf.qmatmul` instead multiplies the GGUF
# blocks exactly as the file stores them (20 bytes per 32 weights for Q4_1, 34 for Q8_0), decoding each block
# in registers inside the dot product. Its readable reference, `block_dot_q4_1`, is the whole idea for one
# block: the two float16 numbers `d` and `m`, the 32 four-bit codes `q`, and
#
# $$\sum_{i=0}^{31} x_i\,(d\,q_i + m).$$
#
# Each weight `d·q + m` is formed in float32 exactly as section 2's dequantizer forms it, so the product is
# `x · dequantize(W)ᵀ` up to the order of the float32 sum: the model *is* the file's model, with 32 / 5 = 6.4 times fewer
# bytes read than float32. (llama.cpp goes one step further and rounds the activations `x` to 8 bits per block, so it
# can form `Σ xᵢ qᵢ` in integer SIMD and apply `d` and `m` once per block — faster arithmetic, a slightly
# different model.) The C++ kernel in `lib/gguf/csrc/qmatmul.cpp` does the same sum 16 lanes at a time, one weight row
# for up to 8 rows of `x`, with one trick worth knowing: a Q4_1 block has only 16 distinct weights, `d·j + m` for
# j = 0…15, so the AVX-512 loop computes those 16 once per block and looks each of the 32 weights up by its nibble
# (one `vpermps` per 16 weights) instead of converting and scaling every code. `backend()` says which code runs
# here.

# %%
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

# %% [markdown]
# Four routes, one number (up to float32 rounding in the last digits): the blocks hold the model's weights.
# Now the speed of each format next to its roofline, side by side in one cell: lib.modeling.fast's fused decoder on
# float32 weights, on torch's int4 layout (via `quantize_linears`), and on GGUF blocks (`GGUFFastLlama`) — the
# file's Q4_1, and Q8_0 blocks quantized from the same weights by `quantize_blocks` (a requantization: a
# slightly different model, timed only for its speed). The paths take turns, so a busy machine slows all of
# them alike; each time is the best of a few runs of decode steps alone (prefill subtracted).

# %%
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
N_STEPS, REPEATS = (32, 5) if FULL else (4, 1) if QUICK else (16, 3)
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

# %% [markdown]
# Read the shares, not the absolute speeds (a shared machine lowers all of them). Fewer bytes raise the ceiling
# in proportion; how much of it a path reaches depends on everything else a step does. The ceiling is only as
# good as the bandwidth behind it: a probe on a shared or virtual machine reads differently from minute to minute,
# which is why the rooflines use the best streaming bandwidth recorded for this class of machine (section 1) and a
# share above 100 % is reported as a measurement problem, not a result. On one of the lab's reference machines,
# `benchmarks/quant.py` recorded a streaming bandwidth of {{ recorded_md("quant", "streaming bandwidth", "amd-epyc-avx512") }}. The GGUF decoder runs a one-token step of all 30 layers
# in one C++ call (`decode_steps`, the same arithmetic as lib.modeling.fast's Python step; lib.modeling.fast's float32 decoder makes
# the same call where it chose its "cpp" kernel, printed above), because at 135M parameters the Python and tensor
# bookkeeping between the small operations of a step (counted in the first cell of this section) cost as much as the
# matmuls themselves. `python benchmarks/quant.py` repeats this measurement with more paths, perplexity with its
# standard error, batch 8, and llama.cpp on the same file when it is installed.

# %% [markdown]
# **Seed 001: "Quantization: +10–30 % speed".** At batch 1 the step time is bytes ÷ bandwidth (section 1), so the
# gain to expect is the ratio of bytes: FP16 → INT8 halves them, FP16 → INT4 with group scales cuts them by
# 16 / 4.5 ≈ 3.6; from our F32, by the ratio printed beside each path. Against that, the decode speed-ups just
# measured (decode steps alone, best of the repeats, the paths taking turns):

# %%
f32_bytes = decoders["F32 (lib.modeling.fast)"][1]
for name, (roof, tok_s) in list(speed.items())[1:]:
    ratio = tok_s / speed["F32 (lib.modeling.fast)"][1]
    print(f"seed 001 — {name:>24}: {ratio:.2f}x the F32 decode, {100 * (ratio - 1):+.0f} % "
          f"({f32_bytes / decoders[name][1]:.1f}x fewer bytes per token)")

# %% [markdown]
# Batch-1 decoding waits for weight bytes, so every path here should beat the seed's figure, and the fused GGUF ones
# by far; how much of the byte ratio turns into speed depends on what else a step does (the shares above). The seed's figure fits a step that
# is not waiting for weight bytes — large batches, compute-bound — where dequantizing costs arithmetic and saves
# no time.

# %% [markdown]
# ## 11. A GGUF file of your own
#
# Blocks are half of a GGUF file; the other half is the container that tells a reader where each tensor is, what
# type it is and what shape. llama.cpp memory-maps the file and points its tensors straight into it, so the
# container is mostly about **offsets and alignment**. The layout (GGUF version 3; everything little-endian):
#
# | part | what |
# |---|---|
# | header | the 4 bytes `GGUF`; the version, uint32 (3); the number of tensors, uint64; the number of metadata pairs, uint64 |
# | metadata | each pair: its key (a string), the value's type (uint32; 4 means uint32), the value |
# | tensor infos | each tensor: its name (a string), its number of dims (uint32), the dims (uint64 each), its ggml type (uint32), its offset (uint64) |
# | padding | zero bytes |
# | data | the tensors' bytes, as stored (section 2's blocks) |
#
# A *string* is its length in **bytes** (uint64) followed by its UTF-8 bytes, no terminator. The ggml type numbers are
# `gguf.GGMLQuantizationType` (a table of constants: use it). Four things to work out from how a reader uses the file:
#
# * **dims**: ggml numbers a tensor's dimensions from the innermost, `ne[0]` being the length of a row; which order
#   does a `[rows, cols]` weight matrix go in?
# * **offsets**: a reader maps the data section and finds tensor `i` at `start of data + offset_i`. The data section
#   starts at the first multiple of the **alignment** after the infos, and every offset is a multiple of it too
#   (so a tensor can be used in place by vector loads). Blocks of 34 or 210 bytes rarely end on such a multiple.
# * **alignment**: 32, unless the file says otherwise in the metadata key `general.alignment` (a uint32) — a file
#   with another alignment that does not say so is read wrongly.
# * **order**: gguf-py reads any consistent offsets, but ggml's own loader (what llama.cpp runs) wants each tensor's
#   data right where the previous one's ended, padded: in the order of the infos, no gaps.
#
# Write the bytes of a file holding the tensors you are given (and whatever metadata the alignment needs) without
# gguf-py's writer (`gguf.GGUFWriter`: while your code is graded it is a stub that says so); its reader is the
# oracle: the check reads your
# bytes with `gguf.GGUFReader` and compares every name, type, dim and byte.

# %% nbgrader={"grade": false, "grade_id": "gguf_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
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

# %% nbgrader={"grade": true, "grade_id": "test_gguf_bytes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_gguf_bytes(gguf_bytes)

# %% [markdown]
# Your blocks in your container: two SmolLM2 tensors quantized with your own functions (`ffn_down` of layer 5 as
# Q4_K with your search, the first 64 rows of the embedding as Q8_0), written with your writer, read back by
# gguf-py and decoded by it. (`lib.quantization.quant.write_gguf` writes a whole model this way, metadata and tokenizer
# included; `tests/test_llama_cpp.py` loads such a file — the Q4_K_M-like mix — in llama.cpp and compares its
# greedy tokens with the lab's model.)

# %%
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

# %% [markdown]
# ## 12. Check your understanding (seed 002, Q6–Q9)
#
# **Q6.** Why can't you apply standard per-tensor INT8 quantization to LLMs without significant accuracy loss?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_q6", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# **Model answer.** One scale per tensor is set by the largest magnitude in it, and LLM activations (and some
# weights) have **outliers**: a few channels with values one to two orders of magnitude above the rest (SmoothQuant, LLM.int8()). With
# `Δ = max|x| / 127`, the ordinary values use only a handful of the 255 levels, so their rounding error is huge
# relative to their size; naive W8A8 on OPT-175B reaches perplexity ~93,000 (SmoothQuant, Table 3). Finer
# granularity (per channel, per token, per block of 32 as in GGUF — section 2), outlier handling
# (mixed precision, smoothing) fix it.
#
# **Mark scheme (2 points).** 1: outliers (a few channels/values much larger than the rest). 1: one scale
# per tensor is set by them, so most values get few levels / large relative error; naming a fix (finer
# granularity or outlier handling) is expected but not required.

# %% [markdown]
# **Q7.** GPTQ compensates for rounding error by adjusting un-quantized weights using what mathematical object?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_q7", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# **Model answer.** The (inverse) **Hessian** of the layer's reconstruction error, `H = 2XXᵀ` from calibration
# activations: after a column is rounded, its error times row `j` of `H⁻¹` (via the Cholesky factor of
# `H⁻¹`, section 7) is subtracted from the columns not yet quantized — the Optimal Brain Surgeon update.
#
# **Mark scheme (1 point).** The Hessian / inverse Hessian (second-order information from calibration inputs).

# %% [markdown]
# **Q8.** AWQ scales up "salient" weight channels before quantizing. How does it determine which channels are salient?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_q8", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# **Model answer.** By the **activations**, not the weights: the input channels whose calibration activations
# have the largest average magnitude `E|x|` (section 8: choosing the 1 % by activation recovers far more than
# by weight magnitude or at random). The scale is `s = (E|x|)^α` with `α` found by a grid search that
# minimizes the layer's output error on the calibration set.
#
# **Mark scheme (1 point).** Activation magnitude on calibration data (not weight magnitude).

# %% [markdown]
# **Q9.** In GGUF K-quants, Q4_K_M uses more bits for certain layer types. Which, and why? Answer from your own
# measurement: `answer_q9(delta_ppl)` gets a measurement like section 6's `kind_delta` (what 3-bit rounding of each
# tensor type, in every layer, costs in perplexity; keys as there) and returns the GGUF names (as in
# `blk.N.<name>.weight`: `attn_q`, `attn_k`, `attn_v`, `attn_output`, `ffn_gate`, `ffn_up`, `ffn_down`) of the two
# types whose rounding costs the most. The check feeds it measurements you have not seen; the next cell feeds it
# yours and sets it beside llama.cpp's rule.

# %% nbgrader={"grade": false, "grade_id": "answer_q9", "locked": false, "schema_version": 3, "solution": true, "task": false}
def answer_q9(delta_ppl: dict) -> set:
    """{tensor type as in section 6 ("attn.v_proj", ...): ΔPPL of rounding it to 3 bits} -> the GGUF names of
    the two types whose rounding costs the most."""
    ### BEGIN SOLUTION
    gguf_name = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    return {gguf_name[k] for k in sorted(delta_ppl, key=delta_ppl.get, reverse=True)[:2]}
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_answer_q9", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer_q9(answer_q9)

# %%
mine = answer_q9(kind_delta)  # your measurement of section 6
rule = {ref.gguf_tensor_name(n).split(".")[2] for n, t in ref.q4_k_m_plan(model).items() if t == "Q6_K"}
print(f"your measurement singles out {sorted(mine)}; llama.cpp's Q4_K_M gives Q6_K to {sorted(rule)} "
      f"(in the layers of lib.quantization.quant.use_more_bits) -> {'the same' if mine == rule else 'NOT the same: read section 6 again'}")

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_q9_why", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# **Model answer.** `attn_v` and `ffn_down` get Q6_K in the first and last eighth of the layers and every third
# layer in between (and the output head gets Q6_K too). They are where rounding costs the most: section 6's
# measurement puts them far above the other five types — `attn_v` with an eighth of `ffn_down`'s weights, so per
# weight it is the most sensitive of all, and `ffn_down` the most in total (its inputs, after SwiGLU, carry the
# heaviest outliers; errors in V pass straight into every attention output). A few extra bits there buy more
# quality than anywhere else.
#
# **Mark scheme (1 point).** Sensitivity: these tensors' rounding errors cost the most quality (measured, or argued
# from outliers / their place in the network), with the measurement cited.

# %% [markdown]
# ## What you built
#
# The llama.cpp block formats byte for byte and a model of the error each makes, the K-quants' packed scales and
# scale search, a measured quality-per-bit curve of a real model, a bit allocation from measured sensitivities that beats uniform at the same size, and the two
# calibration methods every serving stack offers. Check: `pytest weeks/20` for every exercise.
