"""Which aten ops compute, and how much each output of an op combines: the table `grader.observe`'s recorder reads
for every op an observed call runs.

An op is either *known not to combine* — elementwise (one output from the same position of each input, random draws
included), a view, a copy (cat, pad, flip: each output is one input element), creation, indexing (gather, scatter
without accumulation, boolean masks: values are moved, none combined) or metadata — or *classified*: a reduction
(many elements combine into each output: sum, amax, softmax, norms, cumulative scans, sorting and selection, pools,
FFTs, scatter-add and the like), recorded as (op, input shape, how many elements one output combines at most), or a
matrix product (mm, conv, cdist, linear algebra), recorded as (shape of a, shape of b) with a's last dim the
contraction length, a's second-last the rows and b's last the columns. Any other op — one this table does not
name, or one whose classification fails — is *unclassified*, and the checks treat it as a verdict, not a pass.

Names are aten's overload packets, in-place forms (`add_`) and `out=` overloads included. Composite ops (einsum,
tensordot, matmul, conv1d, max_pool1d, argsort, ...) are not classified: they decompose into these first (one that
reaches the observers, `aten.matmul` under `torch.inference_mode`, is run by them as its decomposition, whose parts
are classified: `grader.observers`, `OpRecorder.after`).
"""
from __future__ import annotations

from types import MappingProxyType

import torch
from torch.utils._python_dispatch import _disable_current_modes


def _names(text: str) -> frozenset:
    return frozenset(text.split())


# --- ops that combine nothing ---------------------------------------------------------------------------------

ELEMENTWISE = _names("""
    __and__ __iand__ __ilshift__ __ior__ __irshift__ __ixor__ __lshift__ __or__ __rshift__ __xor__
    _add_relu _conj_physical _masked_scale _prelu_kernel abs acos acosh add addcdiv addcmul angle asin asinh atan
    atan2 atanh bitwise_and bitwise_left_shift bitwise_not bitwise_or bitwise_right_shift bitwise_xor ceil celu clamp
    clamp_max clamp_min clip complex conj_physical copysign cos cosh deg2rad digamma div elu eq erf erfc erfinv exp exp2
    expm1 float_power floor floor_divide fmax fmin fmod frac frexp gcd ge gelu glu gt hardshrink hardsigmoid
    hardswish hardtanh heaviside hypot i0 igamma igammac isfinite isinf isnan isneginf isposinf lcm ldexp le
    leaky_relu lerp lgamma log log10 log1p log2 log_sigmoid_forward logaddexp logaddexp2 logical_and logical_not
    logical_or logical_xor logit lt masked_fill maximum minimum mish mul mvlgamma nan_to_num ne neg nextafter polar
    polygamma positive pow rad2deg reciprocal relu relu6 remainder round rsqrt rsub selu sgn sigmoid sign signbit silu
    sin sinc sinh softplus softshrink sqrt square sub tan tanh threshold tril triu true_divide trunc where xlogy
    elu_backward gelu_backward glu_backward hardshrink_backward hardsigmoid_backward hardswish_backward
    hardtanh_backward leaky_relu_backward log_sigmoid_backward logit_backward native_dropout_backward
    sigmoid_backward silu_backward softplus_backward softshrink_backward tanh_backward threshold_backward
    special_airy_ai special_bessel_j0 special_bessel_j1 special_bessel_y0 special_bessel_y1
    special_chebyshev_polynomial_t special_chebyshev_polynomial_u special_chebyshev_polynomial_v
    special_chebyshev_polynomial_w special_entr special_erfcx special_hermite_polynomial_h
    special_hermite_polynomial_he special_i0e special_i1 special_i1e special_laguerre_polynomial_l
    special_legendre_polynomial_p special_log_ndtr special_modified_bessel_i0 special_modified_bessel_i1
    special_modified_bessel_k0 special_modified_bessel_k1 special_ndtri special_scaled_modified_bessel_k0
    special_scaled_modified_bessel_k1 special_shifted_chebyshev_polynomial_t special_shifted_chebyshev_polynomial_u
    special_shifted_chebyshev_polynomial_v special_shifted_chebyshev_polynomial_w special_spherical_bessel_j0
    special_xlog1py special_zeta
    bernoulli binomial cauchy exponential geometric log_normal native_dropout normal poisson random uniform
    _fused_dropout _standard_gamma rrelu rrelu_with_noise
    _foreach_abs _foreach_acos _foreach_add _foreach_addcdiv _foreach_addcmul _foreach_asin _foreach_atan
    _foreach_ceil _foreach_clamp_max _foreach_clamp_min _foreach_cos _foreach_cosh _foreach_div _foreach_erf
    _foreach_erfc _foreach_exp _foreach_expm1 _foreach_floor _foreach_frac _foreach_lerp _foreach_lgamma _foreach_log
    _foreach_log10 _foreach_log1p _foreach_log2 _foreach_maximum _foreach_minimum _foreach_mul _foreach_neg
    _foreach_pow _foreach_reciprocal _foreach_round _foreach_rsqrt _foreach_sigmoid _foreach_sign _foreach_sin
    _foreach_sinh _foreach_sqrt _foreach_sub _foreach_tan _foreach_tanh _foreach_trunc
""")
VIEWS = _names("""
    view _unsafe_view _reshape_alias as_strided expand permute t transpose squeeze unsqueeze select slice narrow
    diagonal unfold unbind split split_with_sizes unsafe_split unsafe_split_with_sizes alias detach view_as_real
    view_as_complex _conj _neg_view real imag _fw_primal _make_dual slice_inverse
""")
COPIES = _names("""
    clone copy _copy_from _copy_from_and_resize _to_copy _lazy_clone contiguous cat stack _stack _chunk_cat repeat
    flip roll rot90 constant_pad_nd reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d
    replication_pad2d replication_pad3d block_diag diag_embed as_strided_scatter slice_scatter select_scatter
    diagonal_scatter select_backward slice_backward diagonal_backward pixel_shuffle pixel_unshuffle channel_shuffle
    im2col resize resize_as _resize_output narrow_copy _pin_memory _convert_weight_to_int4pack
    _convert_weight_to_int4pack_for_cpu upsample_nearest1d upsample_nearest2d upsample_nearest3d
    _upsample_nearest_exact1d _upsample_nearest_exact2d _upsample_nearest_exact3d
    alias_copy as_strided_copy detach_copy diagonal_copy expand_copy permute_copy select_copy slice_copy split_copy
    split_with_sizes_copy squeeze_copy t_copy transpose_copy unbind_copy unfold_copy unsqueeze_copy view_copy
    view_as_real_copy view_as_complex_copy _conj_copy _neg_view_copy _reshape_alias_copy _reshape_copy
    _fw_primal_copy _make_dual_copy _foreach_copy _foreach_clone
""")
CREATION = _names("""
    empty empty_like empty_permuted empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full
    full_like new_full new_zeros new_ones arange range linspace logspace eye scalar_tensor rand rand_like randn
    randn_like randint randint_like randperm normal_functional tril_indices triu_indices bartlett_window
    blackman_window hamming_window hann_window kaiser_window fft_fftfreq fft_rfftfreq lift lift_fresh
    lift_fresh_copy fill zero _efficientzerotensor _new_zeros_with_same_feature_meta _foreach_zero
""")
# Values moved, none combined (a boolean mask's compaction moves the elements it keeps). `index_put`, `put` and
# `scatter` are indexing too unless they accumulate: then they are reductions (below).
INDEXING = _names("""
    index _unsafe_index index_select gather take embedding index_copy index_fill masked_scatter masked_select
    nonzero nonzero_static _unsafe_masked_index max_unpool2d max_unpool3d repeat_interleave
""")
METADATA = _names("""
    _local_scalar_dense is_same_size is_set_to is_pinned is_coalesced _has_same_storage_numel dense_dim sparse_dim
    _nnz _dimI _dimV record_stream set _assert_async _assert_scalar _assert_tensor_metadata _functional_assert_async
    _functional_assert_scalar sym_constrain_range sym_constrain_range_for_size _functional_sym_constrain_range
    _functional_sym_constrain_range_for_size _make_dep_token _print _fused_sdp_choice _linalg_check_errors sym_size
    sym_stride sym_numel sym_storage_offset promote_types result_type can_cast _nnpack_available is_vulkan_available
""")
COMBINE_NOTHING = ELEMENTWISE | VIEWS | COPIES | CREATION | INDEXING | METADATA


# --- extents ----------------------------------------------------------------------------------------------------

def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _over(x: torch.Tensor, dims) -> int:
    """How many elements of `x` one output combines when `dims` are reduced (None or []: all of them)."""
    if x.dim() == 0:
        return 1
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return x.numel()
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not all(isinstance(d, int) for d in dims):  # named dims: all of them, to be safe
        return x.numel()
    return _prod(x.shape[d] for d in dims)


def _bind(func, args, kwargs) -> dict:
    """The op's arguments by their schema names, defaults filled in."""
    b = {}
    arguments = func._schema.arguments
    for a, v in zip(arguments, args):
        b[a.name] = v
    for a in arguments[len(args):]:
        if a.name in kwargs:
            b[a.name] = kwargs[a.name]
        elif a.has_default_value():
            b[a.name] = a.default_value
    return b


def _tensors(b: dict) -> list:
    out = []
    for v in b.values():
        out += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    return out


def _first(b: dict, *names) -> torch.Tensor:
    for n in names:
        if isinstance(b.get(n), torch.Tensor):
            return b[n]
    return _tensors(b)[0]


def _real(*ts) -> bool:
    """Whether data-dependent counts can be read (not on the meta device)."""
    return all(t.device.type != "meta" for t in ts if isinstance(t, torch.Tensor))


def _counted(make) -> int:
    """max() of a count tensor made by `make`, out of the observers' sight (their modes are off meanwhile)."""
    with _disable_current_modes():
        counts = make()
        return int(counts.max()) if counts.numel() else 0


def _spatial(values, n: int) -> list:
    values = [int(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
    return values * n if len(values) == 1 else values[-n:]


# Reduction handlers: (name, bound args, result) -> [(input shape, extent), ...]

def _by_dim(tensor="self", dim="dim", none_is_last=False):
    def extent(b, result):
        x = _first(b, tensor)
        if "other" in b and isinstance(b["other"], torch.Tensor):
            return []  # max(a, b), min(a, b): elementwise
        d = b.get(dim)
        if d is None and none_is_last:
            d = -1
        return [(x.shape, _over(x, d))]
    return extent


def _whole(tensor="self"):
    return lambda b, result: [(_first(b, tensor).shape, max(_first(b, tensor).numel(), 1))]


def _pairwise(b, result):  # equal, allclose, dist: every element of the broadcast pair, one answer
    x, y = _tensors(b)[:2]
    return [(x.shape, max(x.numel(), y.numel()))]


def _last_dim(tensor):
    return lambda b, result: [(_first(b, tensor).shape, int(_first(b, tensor).shape[-1]) if _first(b, tensor).dim() else 1)]


def _all_but_dim(b, result):  # renorm, weight norm: a norm over every dim but `dim`
    x, d = _first(b, "self", "v"), b.get("dim", 0)
    return [(x.shape, x.numel() // max(int(x.shape[d]), 1) if x.dim() and -x.dim() <= d < x.dim() else x.numel())]


def _isin(b, result):
    test = b.get("test_elements")
    x = _first(b, "elements", "self", "test_elements")
    return [(x.shape, test.numel() if isinstance(test, torch.Tensor) else 1)]


def _pool(n: int, kernel="kernel_size"):
    def extent(b, result):
        x = b["self"]
        k = _spatial(b[kernel], n)
        return [(x.shape, _prod(min(ki, si) for ki, si in zip(k, x.shape[-n:])))]
    return extent


def _adaptive(n: int):
    def extent(b, result):
        x = b["self"]
        out = _spatial(b["output_size"], n)
        return [(x.shape, _prod(min(s, -(-s // max(o, 1)) + (1 if o and s % o else 0)) for s, o in zip(x.shape[-n:], out)))]
    return extent


def _gradient_positions(n: int):  # a pool's or an upsample's backward: every gradient position, to be safe
    def extent(b, result):
        g = b["grad_output"]
        return [(g.shape, _prod(g.shape[-n:]))]
    return extent


def _fixed(n_elements: int, tensor="self"):
    return lambda b, result: [(_first(b, tensor, "input").shape, n_elements)]


def _batch_norm(b, result):
    x = b["input"]
    if not b.get("training", True):
        return []  # running statistics: elementwise
    return [(x.shape, x.numel() // max(int(x.shape[1]), 1) if x.dim() > 1 else x.numel())]


def _unfold_backward(b, result):
    g, dim, size, step = b["grad_in"], b["dim"], b["size"], b["step"]
    windows = int(g.shape[dim]) if g.dim() > dim >= -g.dim() else 1
    return [(g.shape, min(-(-int(size) // max(int(step), 1)), windows))]


def _scatter(b, result):
    if b.get("reduce") is None and b.get("_name") == "scatter":
        return []  # plain scatter: last write wins, nothing combined
    x, dim, index = b["self"], b["dim"], b["index"]
    if not _real(x, index):
        return [(x.shape, int(index.shape[dim]) if index.dim() else 1)]
    return [(x.shape, _counted(lambda: torch.zeros(x.shape, dtype=torch.int64, device=x.device).scatter_add_(
        dim, index, torch.ones(index.shape, dtype=torch.int64, device=x.device))))]


def _index_add(b, result):  # index_add, index_reduce: source slices at equal indices land in one slice
    x, index = b["self"], b["index"]
    if not _real(index):
        return [(x.shape, index.numel())]
    return [(x.shape, _counted(lambda: torch.bincount(index.reshape(-1).long())))]


def _index_put(b, result):
    if not b.get("accumulate", b.get("_name") == "_unsafe_masked_index_put_accumulate"):
        return []  # assignment: nothing combined
    x, values = b["self"], b["values"]
    indices = [i for i in b["indices"] if i is not None]
    if not _real(x, values, *indices):
        return [(x.shape, max([i.numel() for i in indices] + [values.numel()]))]
    return [(x.shape, _counted(lambda: torch.zeros(x.shape, dtype=torch.int64, device=x.device).index_put_(
        tuple(b["indices"]), torch.ones(values.shape, dtype=torch.int64, device=x.device), accumulate=True)))]


def _put(b, result):
    if not b.get("accumulate"):
        return []
    x, index = b["self"], b["index"]
    if not _real(x, index):
        return [(x.shape, index.numel())]
    return [(x.shape, _counted(lambda: torch.zeros(x.numel(), dtype=torch.int64, device=x.device).put_(
        index, torch.ones(index.shape, dtype=torch.int64, device=x.device), accumulate=True)))]


def _embedding_bag(b, result):
    indices, offsets = b["indices"], b["offsets"]
    if not _real(indices, offsets):
        return [(indices.shape, indices.numel())]

    def sizes():
        ends = offsets.reshape(-1).long()
        if not b.get("include_last_offset"):
            ends = torch.cat([ends, torch.tensor([indices.numel()], device=ends.device)])
        return ends.diff() if ends.numel() > 1 else ends[:0]
    return [(indices.shape, _counted(sizes))]


def _segment_reduce(b, result):
    data, axis = b["data"], b.get("axis", 0)
    lengths, offsets = b.get("lengths"), b.get("offsets")
    if isinstance(lengths, torch.Tensor) and _real(lengths):
        return [(data.shape, _counted(lambda: lengths))]
    if isinstance(offsets, torch.Tensor) and _real(offsets):
        return [(data.shape, _counted(lambda: offsets.diff(dim=-1)))]
    return [(data.shape, int(data.shape[axis]))]


def _multiplicity(tensor):  # bincount, embedding's backward: how often the commonest value occurs
    def extent(b, result):
        x = b[tensor]
        if not _real(x) or x.numel() == 0:
            return [(x.shape, x.numel())]
        return [(x.shape, _counted(lambda: torch.bincount(x.reshape(-1).long())))]
    return extent


def _foreach(b, result):  # _foreach_norm, _foreach_max: one reduction of each tensor of the list; the largest
    ts = _tensors(b)
    return [max(((t.shape, max(t.numel(), 1)) for t in ts), key=lambda e: e[1])] if ts else []


def _loss(over_row=False, items="self"):  # reduction 0 ("none"): per element (or row of classes); else all items
    def extent(b, result):
        x = b["self"]
        row = int(x.shape[-1]) if over_row and x.dim() else 1
        return [(x.shape, row if int(b.get("reduction", 1)) == 0 else max(b[items].numel() * row, 1))]
    return extent


REDUCTIONS = MappingProxyType({
    **{n: _by_dim() for n in """sum nansum mean prod amax amin max min aminmax _aminmax argmax argmin logsumexp all any
        count_nonzero std var std_mean var_mean norm native_norm linalg_vector_norm linalg__powsum _softmax
        _log_softmax _safe_softmax softmax log_softmax cumsum cumprod cummax cummin _cummax_helper _cummin_helper
        logcumsumexp _logcumsumexp sort topk kthvalue median nanmedian mode hash_tensor""".split()},
    "_masked_softmax": _by_dim(none_is_last=True),
    "_softmax_backward_data": _by_dim("grad_output"), "_log_softmax_backward_data": _by_dim("grad_output"),
    **{n: _whole() for n in """histc histogram _histogramdd_bin_edges _histogramdd_from_bin_cts
        _histogramdd_from_bin_tensors _unique _unique2 unique_dim unique_consecutive unique_dim_consecutive
        _is_all_true _is_any_true""".split()},
    "equal": _pairwise, "allclose": _pairwise, "dist": _pairwise, "isin": _isin,
    "trace": lambda b, r: [(b["self"].shape, min(b["self"].shape[-2:]) if b["self"].dim() >= 2 else b["self"].numel())],
    "searchsorted": _last_dim("sorted_sequence"), "bucketize": _whole("boundaries"),
    "multinomial": _last_dim("self"), "_sample_dirichlet": _last_dim("self"), "embedding_renorm": _last_dim("self"),
    "renorm": _all_but_dim, "_weight_norm_interface": _all_but_dim,
    # pools: each output combines its window (kernel elements within the input)
    "avg_pool1d": _pool(1), "avg_pool2d": _pool(2), "avg_pool3d": _pool(3), "max_pool2d_with_indices": _pool(2),
    "max_pool3d_with_indices": _pool(3), "mkldnn_max_pool2d": _pool(2), "mkldnn_max_pool3d": _pool(3),
    "fractional_max_pool2d": _pool(2), "fractional_max_pool3d": _pool(3),
    "adaptive_avg_pool1d": _adaptive(1), "adaptive_avg_pool2d": _adaptive(2), "_adaptive_avg_pool2d": _adaptive(2),
    "adaptive_avg_pool3d": _adaptive(3), "_adaptive_avg_pool3d": _adaptive(3), "adaptive_max_pool2d": _adaptive(2),
    "adaptive_max_pool3d": _adaptive(3), "mkldnn_adaptive_avg_pool2d": _adaptive(2),
    **{n: _gradient_positions(2) for n in """avg_pool2d_backward max_pool2d_with_indices_backward max_pool2d_backward
        _adaptive_avg_pool2d_backward adaptive_max_pool2d_backward fractional_max_pool2d_backward
        mkldnn_max_pool2d_backward mkldnn_adaptive_avg_pool2d_backward upsample_bilinear2d_backward
        upsample_bicubic2d_backward upsample_nearest2d_backward _upsample_nearest_exact2d_backward
        _upsample_bilinear2d_aa_backward _upsample_bicubic2d_aa_backward""".split()},
    **{n: _gradient_positions(3) for n in """avg_pool3d_backward max_pool3d_with_indices_backward
        _adaptive_avg_pool3d_backward adaptive_avg_pool3d_backward adaptive_max_pool3d_backward
        fractional_max_pool3d_backward mkldnn_max_pool3d_backward upsample_trilinear3d_backward
        upsample_nearest3d_backward _upsample_nearest_exact3d_backward""".split()},
    **{n: _gradient_positions(1) for n in """upsample_linear1d_backward upsample_nearest1d_backward
        _upsample_nearest_exact1d_backward""".split()},
    "reflection_pad1d_backward": _fixed(3, "grad_output"), "reflection_pad2d_backward": _fixed(9, "grad_output"),
    "reflection_pad3d_backward": _fixed(27, "grad_output"),
    # replication pads copy an edge element `pad` times: its gradient sums them
    **{f"replication_pad{n}d_backward": lambda b, r: [(b["grad_output"].shape, max([int(p) for p in b["padding"]] + [0]) + 1)]
       for n in (1, 2, 3)},
    # interpolation: 2 or 4 taps per dim; antialiased: the whole input, to be safe
    "upsample_linear1d": _fixed(2, "self"), "upsample_bilinear2d": _fixed(4, "self"),
    "upsample_trilinear3d": _fixed(8, "self"), "upsample_bicubic2d": _fixed(16, "self"),
    "_upsample_bilinear2d_aa": _whole(), "_upsample_bicubic2d_aa": _whole(),
    "grid_sampler_2d": _fixed(16, "input"), "grid_sampler_3d": _fixed(64, "input"),
    "_grid_sampler_2d_cpu_fallback": _fixed(16, "input"),
    **{n: lambda b, r: [(b["self"].shape, _over(b["self"], list(b["dim"])))] for n in ("_fft_r2c", "_fft_c2c", "_fft_c2r")},
    "linalg_cross": _fixed(3),
    "native_layer_norm": lambda b, r: [(b["input"].shape, _prod(b["normalized_shape"]))],
    "native_group_norm": lambda b, r: [(b["input"].shape, int(b["C"]) // max(int(b["group"]), 1) * int(b["HxW"]))],
    "native_batch_norm": _batch_norm,
    "_native_batch_norm_legit": _batch_norm, "_native_batch_norm_legit_functional": _batch_norm,
    "_native_batch_norm_legit_no_training": lambda b, r: [], "_batch_norm_no_update": lambda b, r: [],
    "_batch_norm_with_update": _batch_norm, "_batch_norm_with_update_functional": _batch_norm,
    "batch_norm_stats": _batch_norm,
    "col2im": lambda b, r: [(b["self"].shape, min(_prod(_spatial(b["kernel_size"], 2)), int(b["self"].shape[-1])))],
    "unfold_backward": _unfold_backward,
    # into an output: how many elements land on one output position at most
    "scatter": _scatter, "scatter_add": _scatter, "scatter_reduce": _scatter, "index_add": _index_add,
    "index_reduce": _index_add, "index_put": _index_put, "_index_put_impl": _index_put,
    "_unsafe_index_put": _index_put, "_unsafe_masked_index_put_accumulate": _index_put, "put": _put,
    "_embedding_bag": _embedding_bag, "_embedding_bag_forward_only": _embedding_bag,
    "segment_reduce": _segment_reduce, "bincount": _multiplicity("self"), "embedding_dense_backward": _multiplicity("indices"),
    "_foreach_norm": _foreach, "_foreach_max": _foreach, "_foreach_powsum": _foreach,
    **{n: _loss() for n in """mse_loss huber_loss smooth_l1_loss soft_margin_loss binary_cross_entropy
        binary_cross_entropy_with_logits""".split()},
    "nll_loss_forward": _loss(items="target"), "nll_loss2d_forward": _loss(items="target"),
    "multi_margin_loss": _loss(True, "target"), "multilabel_margin_loss_forward": _loss(True, "target"),
})


# --- matrix products: (shape of a, shape of b), a [..., rows, contraction], b [..., contraction, columns] -------

def _shape(*dims) -> tuple:
    return tuple(int(d) for d in dims)


def _mm(left="self", right="mat2"):
    return lambda b, result: [(tuple(b[left].shape), tuple(b[right].shape))]


def _mm_to_result(left="self"):  # packed or quantized right operands: the columns are the result's
    def shapes(b, result):
        a = _first(b, left, "input", "inp")
        out = result[0] if isinstance(result, (list, tuple)) else result
        return [(tuple(a.shape), _shape(a.shape[-1], out.shape[-1]))]
    return shapes


def _mv(b, result):
    return [(tuple(b["mat"].shape if "mat" in b else b["self"].shape), tuple(b["vec"].shape) + (1,))]


def _dot(b, result):
    x, y = _tensors(b)[:2]
    return [((1,) + tuple(x.shape), tuple(y.shape) + (1,))]


def _addr(b, result):  # an outer product: contraction 1
    return [(_shape(b["vec1"].numel(), 1), _shape(1, b["vec2"].numel()))]


def _addbmm(b, result):  # sums over the batch too: the contraction is batch × K
    x, y = b["batch1"], b["batch2"]
    return [(_shape(x.shape[-2], x.shape[0] * x.shape[-1]), _shape(x.shape[0] * x.shape[-1], y.shape[-1]))]


def _linear(b, result):
    x, w = _first(b, "input", "self"), _first(b, "weight")
    out = result[0] if isinstance(result, (list, tuple)) else result
    return [(tuple(x.shape), _shape(x.shape[-1], out.shape[-1] if out.dim() else w.shape[0]))]


def _matmul_backward(b, result):
    x, y = b["self"], b["other"]
    m, k, n = (x.shape[-2] if x.dim() > 1 else 1), x.shape[-1], (y.shape[-1] if y.dim() > 1 else 1)
    return [(_shape(m, n), _shape(n, k)), (_shape(k, m), _shape(m, n))]


def _linear_backward(b, result):
    x, w = b["self"], b["weight"]
    rows = x.numel() // max(int(x.shape[-1]), 1)
    return [(_shape(rows, w.shape[0]), _shape(w.shape[0], w.shape[-1])), (_shape(w.shape[0], rows), _shape(rows, x.shape[-1]))]


def _conv(b, result):
    """An im2col matmul per group: rows = output positions, contraction = input channels of a group × kernel
    elements, columns = output channels of a group."""
    x, w = _first(b, "input", "self"), _first(b, "weight")
    groups = int(b.get("groups", 1) or 1)
    name = b["_name"]
    if name == "conv_tbc":  # input [T, B, Cin], weight [k, Cin, Cout]
        out = result
        return [(_shape(out.shape[0], w.shape[0] * w.shape[1]), _shape(w.shape[0] * w.shape[1], w.shape[2]))]
    transposed = bool(b.get("transposed", False)) or "transpose" in name
    kernel = _prod(w.shape[2:])
    if transposed:  # weight [Cin, Cout / groups, *k]
        k, cols = int(x.shape[1]) // groups * kernel, int(w.shape[1])
    else:  # weight [Cout, Cin / groups, *k]
        k, cols = int(w.shape[1]) * kernel, int(w.shape[0]) // groups
    out = result[0] if isinstance(result, (list, tuple)) else result
    rows = _prod(out.shape[2:]) if out.dim() > 2 else 1
    return [(_shape(rows, k), _shape(k, cols))]


def _conv_backward(b, result):
    """grad_input: a transposed conv of the gradient (contraction Cout/groups × kernel); grad_weight: input against
    gradient over every output position of the batch (contraction batch × output positions)."""
    g, x, w = b["grad_output"], b["input"], b["weight"]
    groups, kernel = int(b.get("groups", 1) or 1), _prod(w.shape[2:])
    positions = int(g.shape[0]) * _prod(g.shape[2:])
    cin, cout = int(x.shape[1]) // groups, int(g.shape[1]) // groups
    return [(_shape(_prod(x.shape[2:]), cout * kernel), _shape(cout * kernel, cin)),
            (_shape(cin * kernel, positions), _shape(positions, cout))]


def _cdist(b, result):
    x1, x2 = _tensors(b)[:2]
    return [(tuple(x1.shape), tuple(x2.shape[:-2]) + _shape(x2.shape[-1], x2.shape[-2]))]


def _trilinear(b, result):
    """bilinear's kernel: three inputs broadcast (after unsqueezing at `expand*`), summed over `sumdim`."""
    sizes = {}
    for t, expand in ((b["i1"], b["expand1"]), (b["i2"], b["expand2"]), (b["i3"], b["expand3"])):
        rank, dims = t.dim() + len(expand), iter(t.shape)
        for d in range(rank):
            size = 1 if d in expand else int(next(dims))
            sizes[d] = max(sizes.get(d, 1), size)
    k = _prod(sizes[d] for d in b["sumdim"])
    rest = max([s for d, s in sizes.items() if d not in b["sumdim"]] + [1])
    return [(_shape(rest, k), _shape(k, rest))]


def _affine_grid(b, result):
    size = [int(s) for s in b["size"]]
    d = len(size) - 2
    return [(_shape(_prod(size[2:]), d + 1), _shape(d + 1, d))]


def _linear_combination(b, result):
    c, x = b["coefficients"], b["input"]
    return [(tuple(c.shape), _shape(x.shape[0], x.numel() // max(int(x.shape[0]), 1)))]


def _linalg(b, result):
    """A solve, factorization or inverse of an n×n system: an n×n by n×n product (n its largest matrix dim)."""
    n = max([max(int(s) for s in t.shape[-2:]) for t in _tensors(b) if t.dim() >= 2] + [0])
    return [(_shape(n, n), _shape(n, n))] if n else []


MATMULS = MappingProxyType({
    "mm": _mm(), "bmm": _mm(), "_int_mm": _mm(), "_scaled_mm": _mm(), "_scaled_mm_v2": _mm(), "_grouped_mm": _mm(),
    "_scaled_grouped_mm": _mm(), "addmm": _mm("mat1", "mat2"), "_addmm_activation": _mm("mat1", "mat2"),
    "baddbmm": _mm("batch1", "batch2"), "addbmm": _addbmm, "mv": _mv, "addmv": _mv, "dot": _dot, "vdot": _dot,
    "addr": _addr, "linear": _linear, "mkldnn_linear": _linear, "_mixed_dtypes_linear": _linear,
    "_weight_int4pack_mm": _mm_to_result(), "_weight_int4pack_mm_for_cpu": _mm_to_result(),
    "_weight_int4pack_mm_with_scales_and_zeros": _mm_to_result(), "_weight_int8pack_mm": _mm_to_result(),
    "_dyn_quant_matmul_4bit": _mm_to_result("inp"), "matmul_backward": _matmul_backward,
    "linear_backward": _linear_backward,
    **{n: _conv for n in """convolution _convolution convolution_overrideable mkldnn_convolution _slow_conv2d_forward
        slow_conv3d_forward slow_conv_dilated2d slow_conv_dilated3d slow_conv_transpose2d slow_conv_transpose3d
        _conv_depthwise2d conv_depthwise3d _nnpack_spatial_convolution cudnn_convolution cudnn_convolution_transpose
        miopen_convolution miopen_convolution_transpose miopen_depthwise_convolution _mps_convolution
        _mps_convolution_transpose conv_tbc""".split()},
    "convolution_backward": _conv_backward, "convolution_backward_overrideable": _conv_backward,
    "_cdist_forward": _cdist, "_euclidean_dist": _cdist, "_trilinear": _trilinear,
    "_cdist_backward": lambda b, r: [(tuple(b["grad"].shape), _shape(b["grad"].shape[-1], b["x1"].shape[-1]))],
    "_pdist_forward": lambda b, r: [(_shape(*b["self"].shape), _shape(*b["self"].shape[::-1]))],  # N×M by M×N
    "_pdist_backward": lambda b, r: [(_shape(b["self"].shape[0], b["self"].shape[0]), _shape(*b["self"].shape))],
    "affine_grid_generator": _affine_grid, "_compute_linear_combination": _linear_combination,
    **{n: _linalg for n in """cholesky cholesky_inverse cholesky_solve _cholesky_solve_helper linalg_cholesky_ex
        linalg_inv_ex _linalg_solve_ex linalg_solve_triangular triangular_solve _linalg_det _linalg_slogdet
        _linalg_eigh _linalg_eigvals linalg_eig _linalg_svd linalg_qr geqrf ormqr linalg_householder_product
        linalg_lstsq linalg_lu linalg_lu_factor_ex linalg_lu_solve linalg_ldl_factor_ex linalg_ldl_solve
        linalg_matrix_exp linalg_pinv linalg_eigvals lu_unpack""".split()},
})


# --- attention kernels: QKᵀ, PV and a softmax over the keys ---------------------------------------------------

def _attention(b, result):
    q, k, v = b["query"], b["key"], b["value"]
    seq = 1 if b["_name"].startswith(("_flash_attention", "_efficient_attention")) else -2  # [B, N, H, d] there
    nq, nk, d, dv = int(q.shape[seq]), int(k.shape[seq]), int(q.shape[-1]), int(v.shape[-1])
    return [(_shape(nq, d), _shape(d, nk)), (_shape(nq, nk), _shape(nk, dv))], [(_shape(nq, nk), nk)]


ATTENTION = frozenset("""
    _scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
    _scaled_dot_product_fused_attention_overrideable _scaled_dot_product_attention_math_for_mps
    _scaled_dot_product_flash_attention_backward _scaled_dot_product_flash_attention_for_cpu_backward
    _scaled_dot_product_efficient_attention_backward _scaled_dot_product_cudnn_attention_backward
    _scaled_dot_product_fused_attention_overrideable_backward _flash_attention_forward _flash_attention_backward
    _efficient_attention_forward _efficient_attention_backward
""".split())
CLASSIFIED = frozenset(REDUCTIONS) | frozenset(MATMULS) | ATTENTION
KNOWN = COMBINE_NOTHING | CLASSIFIED


def base_name(name: str) -> str:
    """"aten.add_" -> "add": the table's key of an op the recorder names (in place and out= forms share it)."""
    base = name[5:] if name.startswith("aten.") else name
    return base[:-1] if base.endswith("_") and not base.startswith("__") else base


def classify(name: str, func, args, kwargs, result):
    """(matmuls, reductions) of one op call, as `Observation` records them; None when the op is not one this table
    knows (an unclassified op). `result` is what the op returned (a conv's output positions are read from it)."""
    base = base_name(name)
    if base in COMBINE_NOTHING:
        return [], []
    if base not in CLASSIFIED:
        return None
    b = _bind(func, args, kwargs or {})
    b["_name"] = base
    if base in ATTENTION:
        matmuls, reductions = _attention(b, result)
        return matmuls, [(name, shape, extent) for shape, extent in reductions]
    if base in MATMULS:
        return [(tuple(int(x) for x in a), tuple(int(x) for x in c)) for a, c in MATMULS[base](b, result)], []
    return [], [(name, tuple(int(x) for x in shape), int(extent)) for shape, extent in REDUCTIONS[base](b, result)]
