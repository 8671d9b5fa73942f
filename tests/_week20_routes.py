"""Week 20's wrong routes of issues 21 and 56 and the honest routes a problem posed without its method admits, as
the source of one notebook cell (`WRONG_ROUTES`): tests/test_week20_isolated.py runs it in an isolated process as
`pytest weeks/20` grades a student; tests/test_week20_checks.py execs it in-process for the boundary-block test.
The tests run with --import-mode=importlib, so they load this sibling by its path."""

WRONG_ROUTES = r'''
import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T


def dq4_k_gguf_class(data):
    return gguf.quants.Q4_K.dequantize(data)


def q8_0_gguf(x):
    return gguf.quants.quantize(x, T.Q8_0)


def q8_0_gguf_source(x):  # gguf's quants.py exec'd under another file name
    src = open(gguf.quants.__file__).read()
    ns = {"__name__": "my_quants", "__package__": "gguf"}
    exec(compile(src, "my_quants.py", "exec"), ns)
    return ns["quantize"](x, T.Q8_0)


def q8_0_lib_source(x):  # lib/gguf/qformats.py (quantize's home) exec'd under another file name
    import lib
    src = open(lib.__path__[0] + "/gguf/qformats.py").read()
    ns = {"__name__": "mine"}
    exec(compile(src, "mine.py", "exec"), ns)
    return ns["quantize"](x, "Q8_0")


def _q8_0_with(x, rounding):
    b = x.reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    q = rounding((b * inv).astype(np.float32)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(x.shape[0], -1)


def q8_0_trunc_in_float32(x):  # roundf as float32 trunc(v ± 0.5): 0.49999997 -> 1
    return _q8_0_with(x, lambda v: np.trunc(v + np.where(v >= 0, np.float32(0.5), np.float32(-0.5))))


def q8_0_flush_subnormal(x):  # a float16 scale below 2^-14 written as 0
    out = _q8_0_with(x, lambda v: np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5))
    d = out.reshape(-1, 34)[:, :2].copy().view(np.float16)
    flushed = np.where(np.abs(d) < np.float16(2.0**-14), np.float16(0), d)
    blocks = out.reshape(-1, 34).copy()
    blocks[:, :2] = flushed.view(np.uint8)
    return blocks.reshape(out.shape)


def q8_0_divide(x):  # ggml's Q8_0, but x / d instead of x * (1/d): one float32 rounding apart at a boundary
    b = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, np.float32(0), b / d).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(x.shape[0], -1)


def q8_0_float64(x):  # ggml's Q8_0 formula in float64 throughout: d and x/d unrounded to float32
    b = x.astype(np.float64).reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / 127
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, 0.0, b / d)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(x.shape[0], -1)


def q4_1_divide(x):  # ggml's Q4_1, but (x - min) / d instead of (x - min) * (1/d)
    b = x.astype(np.float32).reshape(-1, 32)
    lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, np.float32(0), (b - lo) / d).astype(np.float32)
    q = np.trunc(v + np.float32(0.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8),
                           q[:, :16] | (q[:, 16:] << 4)], 1).reshape(x.shape[0], -1)


def q5_0_divide(x):  # ggml's Q5_0, but x / d instead of x * (1/d)
    b = x.astype(np.float32).reshape(-1, 32)
    peak = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
    d = peak / np.float32(-16)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, np.float32(0), b / d).astype(np.float32)
    q = np.trunc(v + np.float32(16.5)).clip(0, 31).astype(np.uint32)
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    low = (q & 0x0F).astype(np.uint8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), qh.astype("<u4")[:, None].view(np.uint8),
                           low[:, :16] | (low[:, 16:] << 4)], axis=1).reshape(x.shape[0], -1)


def q4_1_exact_half_up(x):  # floor(v + 0.5) exactly (float64), not ggml's float32 trunc(v + 0.5f)
    b = x.reshape(-1, 32)
    lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    v = ((b - lo) * inv).astype(np.float32).astype(np.float64)
    q = np.floor(v + 0.5).clip(0, 15).astype(np.uint8)
    out = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8), q[:, :16] | (q[:, 16:] << 4)]
    return np.concatenate(out, 1).reshape(x.shape[0], -1)


def q4_k_min_max(x):  # the lab's former quantizer: each sub-block's min and max, no search
    rows, n_cols = x.shape
    sub = x.reshape(-1, 8, 32)
    n = sub.shape[0]
    lo = np.minimum(sub.min(2), 0)
    scale, mn = (sub.max(2) - lo) / np.float32(15), -lo
    d = (scale.max(1, keepdims=True) / np.float32(63)).astype(np.float16)
    dmin = (mn.max(1, keepdims=True) / np.float32(63)).astype(np.float16)
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.rint(scale / np.where(d32 > 0, d32, 1)).clip(0, 63).astype(np.uint8)
    m = np.rint(mn / np.where(dmin32 > 0, dmin32, 1)).clip(0, 63).astype(np.uint8)
    step = np.where(d32 * sc > 0, d32 * sc, 1)[..., None]
    q = np.rint((sub + (dmin32 * m)[..., None]) / step).clip(0, 15).astype(np.uint8)
    scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)], 1)
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qs], 1).reshape(rows, -1)


def q5_0_gguf_class(x):
    return gguf.quants.Q5_0.quantize(x)


def allocate_no_guard(delta, sizes, budget, low, high):  # spends bits on units that make perplexity worse
    spare, chosen = (budget - low) * sum(sizes.values()), set()
    for u in sorted(delta, key=lambda u: delta[u] / sizes[u], reverse=True):
        if sizes[u] * (high - low) <= spare + 1e-9:
            chosen.add(u)
            spare -= sizes[u] * (high - low)
    return chosen


def _kmeans(v, wt, k, iters=15):  # weighted 1-D k-means per row of v [n, g]
    c = torch.quantile(v, torch.linspace(0, 1, k, device=v.device), dim=1).T.contiguous()  # [n, k]
    for _ in range(iters):
        a = (v[:, :, None] - c[:, None, :]).abs().argmin(-1)
        oh = torch.nn.functional.one_hot(a, k).to(v.dtype) * wt[None, :, None]
        c = torch.where(oh.sum(1) > 0, (oh * v[:, :, None]).sum(1) / oh.sum(1).clamp_min(1e-30), c)
    return c.gather(1, (v[:, :, None] - c[:, None, :]).abs().argmin(-1))


def gptq_kmeans(w, x, bits, group, damp):  # an activation-weighted codebook per group: 2^bits values, not a grid
    wt = x.pow(2).mean(0)
    out = w.clone().float()
    for g0 in range(0, w.shape[1], group):
        out[:, g0:g0 + group] = _kmeans(out[:, g0:g0 + group], wt[g0:g0 + group], 2**bits)
    return out


def gptq_diag_search(w, x, bits, group, damp):  # plain rounding, grid clipped by a diagonal-Hessian search
    h = x.pow(2).mean(0)
    g = w.float().reshape(w.shape[0], -1, group)
    hg = h.reshape(1, -1, group)
    best, best_err = None, None
    for shrink in torch.linspace(0.5, 1.0, 11):
        lo, hi = g.amin(-1, keepdim=True) * shrink, g.amax(-1, keepdim=True) * shrink
        scale = ((hi - lo) / (2**bits - 1)).clamp_min(1e-12)
        q = torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1) * scale + lo
        err = ((q - g) ** 2 * hg).sum(-1, keepdim=True)
        best = q if best is None else torch.where(err < best_err, q, best)
        best_err = err if best_err is None else torch.minimum(err, best_err)
    return best.reshape(w.shape)


def imp_abs_mean(x):  # AWQ's statistic, E|x|
    return x.float().reshape(-1, x.shape[-1]).abs().mean(0)


def imp_variance(x):  # centred: the error sees x, not x minus its mean
    return x.float().reshape(-1, x.shape[-1]).var(0, unbiased=False)


def imp_rms(x):  # the square root of the right statistic
    return x.float().reshape(-1, x.shape[-1]).pow(2).mean(0).sqrt()


def imp_first_1024_tokens(x):  # a "calibration subset": the first 1,024 tokens only
    flat = x.reshape(-1, x.shape[-1]).float()[:1024]
    return (flat * flat).mean(0)


def imp_512_random_tokens(x):  # a random sample of 512 tokens
    flat = x.reshape(-1, x.shape[-1]).float()
    flat = flat[torch.randperm(flat.shape[0])[:512]]
    return (flat * flat).mean(0)


def imp_first_dim(x):  # averages over dim 0 only: [batch, tokens, in] gives [tokens, in]
    return x.float().pow(2).mean(0)


def imp_squares_in_half(x):  # squares in the input's dtype, converted after: float16 overflows to inf
    return (x * x).reshape(-1, x.shape[-1]).mean(0).float()


def imp_in_input_dtype(x):  # right in float32, but returns float16 for float16 activations
    flat = x.float().reshape(-1, x.shape[-1])
    return (flat * flat).mean(0).to(x.dtype)


def imp_in_place(x):  # squares the caller's activations in place
    flat = x.reshape(-1, x.shape[-1])
    return flat.float().square_().mean(0) if flat.dtype != torch.float32 else flat.square_().mean(0)


def imp_cpu_sum(x):  # accumulates into a tensor made without device=
    flat = x.float().reshape(-1, x.shape[-1])
    total = torch.zeros(flat.shape[-1])
    for row in flat:
        total = total + row * row
    return total / flat.shape[0]


def gptq_in_place(w, x, bits, group, damp):  # the solution's GPTQ without .clone(): the caller's w is overwritten
    W = w
    H = 2 * x.T @ x / x.shape[0]
    H += damp * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        W[:, j:] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:][None, :]
    return Q


def gptq_cpu_eye(w, x, bits, group, damp):  # torch.eye without device=: breaks on any other device
    W = w.clone()
    H = 2 * x.T @ x / x.shape[0]
    H = H + damp * torch.diag(H).mean() * torch.eye(H.shape[0])
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        W[:, j:] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:][None, :]
    return Q


def gptq_batch_only(w, x, bits, group, damp):  # lazy batches of 128 columns, but the error never leaves its batch
    W = w.clone()
    H = 2 * x.T @ x / x.shape[0]
    W[:, torch.diag(H) == 0] = 0  # the dead-input rule (the check draws dead inputs): only the named flaw is wrong
    H = H + torch.diag((torch.diag(H) == 0).to(H.dtype))
    H = H + damp * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels, block = 2**bits - 1, group * max(1, 128 // group)
    for b0 in range(0, W.shape[1], block):
        b1 = min(b0 + block, W.shape[1])
        for j in range(b0, b1):
            if j % group == 0:
                lo = W[:, j:j + group].amin(1)
                scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
            Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
            W[:, j:b1] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:b1][None, :]
        # missing: W[:, b1:] -= E @ U[b0:b1, b1:]
    return Q


def awq_zero_kmeans(w, x, bits, group, n_grid):  # α = 0 (searching nothing) and a k-means codebook
    return gptq_kmeans(w, x, bits, group, 0.0), 0.0


def gptq_damp_ignored(w, x, bits, group, damp):  # GPTQ, but always damped by 1 %, whatever `damp` says
    W = w.clone()
    H = 2 * x.T @ x / x.shape[0]
    W[:, torch.diag(H) == 0] = 0
    H = H + torch.diag((torch.diag(H) == 0).to(H.dtype))
    H = H + 0.01 * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        W[:, j:] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:][None, :]
    return Q


def _awq_at(w, x, bits, group, alpha):  # AWQ's scaling and round-to-nearest at one α
    s = x.reshape(-1, x.shape[-1]).float().abs().mean(0).clamp_min(1e-5).pow(alpha)
    s = s / (s.max() * s.min()).sqrt()
    g = (w.float() * s).reshape(w.shape[0], -1, group)
    lo = g.amin(-1, keepdim=True)
    scale = ((g.amax(-1, keepdim=True) - lo) / (2**bits - 1)).clamp_min(1e-12)
    return (torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1) * scale + lo).reshape(w.shape) / s


def awq_fixed_alpha_05(w, x, bits, group, n_grid):  # no search: an α the usual inputs often want (on every grid)
    return _awq_at(w, x, bits, group, 0.5), 0.5


def awq_fixed_alpha_09(w, x, bits, group, n_grid):  # no search: an α near 1
    return _awq_at(w, x, bits, group, 0.9), 0.9


def awq_n_grid_ignored(w, x, bits, group, n_grid):  # the search, but always over 20 values of α
    xf = x.reshape(-1, x.shape[-1]).float()
    errs = [(float(((xf @ (w - _awq_at(w, x, bits, group, k / 20)).T) ** 2).mean()), k / 20) for k in range(20)]
    alpha = min(errs)[1]
    return _awq_at(w, x, bits, group, alpha), alpha


def _awq_search(w, x, bits, group, n_grid, error):  # AWQ's grid search, each α scored by `error(w - ŵ)`
    errs = [(error(w - _awq_at(w, x, bits, group, k / n_grid)), k / n_grid) for k in range(n_grid)]
    alpha = min(errs)[1]
    return _awq_at(w, x, bits, group, alpha), alpha


def awq_diagonal_error(w, x, bits, group, n_grid):  # each α scored by diag(XᵀX) only: no cross terms
    d = (x.reshape(-1, x.shape[-1]).double() ** 2).mean(0)
    return _awq_search(w, x, bits, group, n_grid, lambda e: float((e.double() ** 2 * d).sum()))


def awq_first_128_tokens(w, x, bits, group, n_grid):  # each α scored on the first 128 tokens of x only
    xs = x.reshape(-1, x.shape[-1])[:128].double()
    return _awq_search(w, x, bits, group, n_grid, lambda e: float(((xs @ e.double().T) ** 2).mean()))


def _gguf(tensors, alignment=32, innermost_first=True, pad_each=True, char_length=False, key=True, pad_head=True,
          tail=b"", data_reversed=False, version=3, key_type="<II"):  # a GGUF writer with one thing wrong at a time
    import struct

    def string(text):
        raw = text.encode("utf-8")
        return struct.pack("<Q", len(text) if char_length else len(raw)) + raw

    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), int(key))
    if key:
        head += string("general.alignment") + struct.pack(key_type, {"<II": 4, "<IQ": 10}[key_type], alignment)
    blobs = []
    for data, _, _ in tensors.values():
        raw = np.ascontiguousarray(data).tobytes()
        blobs.append(raw + (bytes(-len(raw) % alignment) if pad_each else b""))
    order = list(range(len(blobs)))[::-1] if data_reversed else list(range(len(blobs)))
    offsets, offset = {}, 0
    for i in order:
        offsets[i] = offset
        offset += len(blobs[i])
    for i, (name, (data, qtype, shape)) in enumerate(tensors.items()):
        dims = [int(d) for d in (reversed(shape) if innermost_first else shape)]
        head += string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, int(T[qtype]), offsets[i])
    return head + (bytes(-len(head) % alignment) if pad_head else b"") + b"".join(blobs[i] for i in order) + tail


def gguf_via_writer(tensors, alignment=32):  # gguf-py's GGUFWriter, the bytes read back from its file
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(alignment)
    for name, (data, qtype, shape) in tensors.items():
        w.add_tensor(name, data, raw_dtype=None if qtype == "F32" else T[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return open(path, "rb").read()


def gguf_dims_as_torch(tensors, alignment=32):  # (rows, cols), not innermost first
    return _gguf(tensors, alignment, innermost_first=False)


def gguf_back_to_back(tensors, alignment=32):  # offsets without padding between tensors
    return _gguf(tensors, alignment, pad_each=False)


def gguf_characters(tensors, alignment=32):  # a string's length in characters, not UTF-8 bytes
    return _gguf(tensors, alignment, char_length=True)


def gguf_silent_alignment(tensors, alignment=32):  # pads to the alignment, never says which (no general.alignment)
    return _gguf(tensors, alignment, key=False)


def gguf_unpadded_infos(tensors, alignment=32):  # the data section right after the infos
    return _gguf(tensors, alignment, pad_head=False)


def gguf_trailing_bytes(tensors, alignment=32):  # something appended after the last tensor
    return _gguf(tensors, alignment, tail=b"lab")


def gguf_version_2(tensors, alignment=32):  # the right layout, but the header says version 2
    return _gguf(tensors, alignment, version=2)


def gguf_alignment_u64(tensors, alignment=32):  # general.alignment as a uint64 (type 10), not a uint32
    return _gguf(tensors, alignment, key_type="<IQ")


def gguf_data_out_of_order(tensors, alignment=32):  # the data in reverse order, the offsets consistent with it
    return _gguf(tensors, alignment, data_reversed=True)


def _step(lo, hi, qtype):  # each block's step: the right one for every format
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    amax = np.maximum(-lo, hi)
    return {"Q8_0": amax / 127, "Q4_0": amax / 8, "Q5_0": amax / 16, "Q4_1": (hi - lo) / 15, "Q5_1": (hi - lo) / 31}[qtype]


def predict_max_error(lo, hi, qtype):  # the largest error, Δ/2, taken for the RMS
    return float(np.sqrt(np.mean(_step(lo, hi, qtype) ** 2 / 4)))


def predict_mean_step(lo, hi, qtype):  # the mean of the blocks' steps, not the root of their mean square
    return float(np.mean(_step(lo, hi, qtype)) / 12 ** 0.5)


def predict_affine_everywhere(lo, hi, qtype):  # every 4-bit format on Q4_1's grid (range / 15), 5-bit on Q5_1's
    return float(np.sqrt(np.mean(_step(lo, hi, {"Q4_0": "Q4_1", "Q5_0": "Q5_1"}.get(qtype, qtype)) ** 2 / 12)))


def predict_symmetric_everywhere(lo, hi, qtype):  # Q4_1 and Q5_1 taken as symmetric: the offset forgotten
    return float(np.sqrt(np.mean(_step(lo, hi, {"Q4_1": "Q4_0", "Q5_1": "Q5_0"}.get(qtype, qtype)) ** 2 / 12)))


def predict_tensor_range(lo, hi, qtype):  # one grid for the whole tensor, from its min and max
    return float(np.sqrt(np.mean(_step(np.full_like(lo, lo.min()), np.full_like(hi, hi.max()), qtype) ** 2 / 12)))


def predict_no_root(lo, hi, qtype):  # the mean square, not its root
    return float(np.mean(_step(lo, hi, qtype) ** 2 / 12))


def predict_four_bits_for_q5(lo, hi, qtype):  # Q5_0 / Q5_1 given Q4's 16 levels: the fifth bit forgotten
    return float(np.sqrt(np.mean(_step(lo, hi, {"Q5_0": "Q4_0", "Q5_1": "Q4_1"}.get(qtype, qtype)) ** 2 / 12)))


def q9_fixed(delta):  # the quiz's answer typed in, whatever the measurement says
    return {"attn_v", "ffn_down"}


def q9_hf_names(delta):  # the measurement's own keys, not GGUF's names
    return set(sorted(delta, key=delta.get, reverse=True)[:2])


def q9_least_costly(delta):  # the two types whose rounding costs the least
    names = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    return {names[k] for k in sorted(delta, key=delta.get)[:2]}


def q9_first_two(delta):  # the first two keys, in the measurement's order
    names = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    return {names[k] for k in list(delta)[:2]}


# --- honest routes the posed problems admit (not the solution's method): each must pass ---

def gptq_explicit_inverse(w, x, bits, group, damp):  # the OBS update with the inverse of H_F taken afresh per column
    W = w.detach().float().clone()
    x = x.reshape(-1, x.shape[-1]).float()
    H = 2 * x.T @ x / x.shape[0]
    dead = torch.diag(H) == 0
    H = H + torch.diag(dead.float())
    W[:, dead] = 0
    H = H + damp * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        inv = torch.linalg.inv(H[j:, j:])  # H_F^-1 for F = {j, ...}
        W[:, j:] -= ((W[:, j] - Q[:, j]) / inv[0, 0])[:, None] * inv[:, 0][None, :]
    return Q.to(w.dtype)


def allocate_exact(delta, sizes, budget, low, high):  # a 0/1 knapsack solved exactly over the spare bits
    spare = (budget - low) * sum(sizes.values())
    best = {0.0: (0.0, frozenset())}  # bits spent -> (perplexity saved, units)
    for u in [u for u in delta if delta[u] > 0]:
        for spent, (saved, units) in list(best.items()):
            now = spent + sizes[u] * (high - low)
            if now <= spare + 1e-6 and (now not in best or best[now][0] < saved + delta[u]):
                best[now] = (saved + delta[u], units | {u})
    return set(max(best.values(), key=lambda t: t[0])[1])
'''
