"""Week 20's lib.quantization.quant against gguf-py (the oracle): legacy formats bit-exact both ways, K-quants dequantized
bit-exact, the lab's Q4_K / Q6_K quantizers decoded by gguf-py, bad input refused."""
import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

from lib.gguf import qformats  # noqa: E402
from lib.quantization import quant  # noqa: E402

LEGACY = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def _inputs():
    rng = np.random.default_rng(20)
    ties = (np.round(rng.standard_normal((16, 512)) * 40) / 2).astype(np.float32)  # many exact halves
    ties[:, ::32] = 127.0  # Q8_0: d = 1, so every k + 0.5 is a roundf tie
    q41_ties = (rng.integers(0, 15, (16, 512)) + 0.5).astype(np.float32)
    q41_ties[:, ::32], q41_ties[:, 1::32] = 0.0, 15.0  # Q4_1 / Q4_0: d = 1
    return {
        "normal": rng.standard_normal((32, 1024)).astype(np.float32),
        "heavy": (0.02 * rng.standard_t(2, (32, 1024))).astype(np.float32),
        "ties": ties,
        "q41_ties": q41_ties,
        "zeros": np.zeros((3, 512), np.float32),
        "constant": np.full((3, 512), -0.75, np.float32),
        "3d": rng.standard_normal((2, 3, 256)).astype(np.float32),
    }


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("qtype", LEGACY)
@pytest.mark.parametrize("case", list(_inputs()))
def test_legacy_quantize_and_dequantize_are_bit_exact(qtype, case):
    x = _inputs()[case]
    want = gguf_quantize(x, gguf.GGMLQuantizationType[qtype])
    got = qformats.quantize(x, qtype)
    assert got.dtype == np.uint8 and got.shape == want.shape
    assert np.array_equal(got, want)
    assert np.array_equal(_bits(qformats.dequantize(got, qtype)), _bits(gguf_dequantize(want, gguf.GGMLQuantizationType[qtype])))


def test_roundf_sends_halves_away_from_zero():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 126.5], np.float32)
    assert qformats.roundf(x).tolist() == [1, 2, 3, -1, -3, 0, 0, 127]
    assert np.round(x).tolist() != qformats.roundf(x).tolist()  # numpy (and torch) round halves to even


@pytest.mark.parametrize("qtype", qformats.DEQUANTIZE_TYPES)
def test_dequantize_random_bytes_is_bit_exact(qtype):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (6, 5 * qformats.BLOCK_SIZES[qtype][1]), dtype=np.uint8)
    with np.errstate(all="ignore"):  # random float16 fields include inf and NaN: both sides must agree on those too
        got, want = qformats.dequantize(data, qtype), gguf_dequantize(data, gguf.GGMLQuantizationType[qtype])
    assert got.dtype == np.float32 and got.shape == want.shape == (6, 5 * qformats.BLOCK_SIZES[qtype][0])
    assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_lab_k_quantizers_decode_with_gguf(qtype):
    for case, x in _inputs().items():
        if x.shape[-1] % 256:
            continue
        data = qformats.quantize(x, qtype)
        assert data.shape == (*x.shape[:-1], x.shape[-1] // 256 * qformats.BLOCK_SIZES[qtype][1])
        ours = qformats.dequantize(data, qtype)
        assert np.array_equal(_bits(ours), _bits(gguf_dequantize(data, gguf.GGMLQuantizationType[qtype])))
        if case in ("normal", "heavy"):
            rmse = np.sqrt(np.mean((ours - x) ** 2))
            q41 = np.sqrt(np.mean((qformats.dequantize(qformats.quantize(x, "Q4_1"), "Q4_1") - x) ** 2))
            q51 = np.sqrt(np.mean((qformats.dequantize(qformats.quantize(x, "Q5_1"), "Q5_1") - x) ** 2))
            if qtype == "Q4_K":  # the search: 4.5 bpw below Q4_1's 5.0 bpw (0.92x on Gaussian weights)
                assert rmse <= 0.95 * q41
            elif qtype == "Q5_K":  # 5.5 bpw vs Q5_1's 6.0 (0.95x)
                assert rmse <= 0.97 * q51
            else:  # 6.56 bpw: about half Q5_1's error (0.46x Gaussian, 0.57x heavy tails), as one more bit should
                assert rmse < 0.6 * q51


def _rmse(a, b):
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - b) ** 2)))


def test_searched_q4_k_beats_q4_1_and_min_max_on_gaussian_and_t3():
    """The issue's table: Q4_K with the search about 0.92x Q4_1's RMSE on Gaussian data, 0.93x on Student-t(3);
    the min/max Q4_K is worse than the search by ~9 % / ~8 %. Bounds from measured spreads (64 x 1024): Gaussian
    (24 seeds) searched/Q4_1 0.917 ± 0.002 (bound 0.93), min-max/searched 1.092 ± 0.002 (bound 1.07); Student-t(3)
    (600 seeds), whose rare huge values skew the ratios, searched/Q4_1 mean 0.927, worst 0.943 (bound 0.97),
    min-max/searched mean 1.085, worst 1.065 (bound 1.04). The old t(3) bounds, 0.95 and 1.07, sat inside that
    spread (a CI run failed at 1.068, seed 847356017)."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    for x, bound, margin in [(rng.standard_normal((64, 1024)).astype(np.float32), 0.93, 1.07),
                             (rng.standard_t(3, (64, 1024)).astype(np.float32), 0.97, 1.04)]:
        q41 = _rmse(qformats.dequantize(qformats.quantize(x, "Q4_1"), "Q4_1"), x)
        searched = _rmse(qformats.dequantize(qformats.quantize(x, "Q4_K"), "Q4_K"), x)
        assert searched <= bound * q41, (seed, searched / q41)
        minmax = _rmse(qformats.dequantize(qformats.quantize(x, "Q4_K", search=False), "Q4_K"), x)
        assert searched * margin <= minmax, (seed, minmax / searched)


def test_the_least_squares_fit_is_the_minimum():
    """weighted_affine_fit: no small step in (scale, offset) lowers the weighted error it minimizes."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((50, 32)), rng.random((50, 32))
    q = rng.integers(0, 16, (50, 32)).astype(np.float64)
    s, m = qformats.weighted_affine_fit(x, w, q)

    def err(s, m):
        return (w * (s[:, None] * q + m[:, None] - x) ** 2).sum(-1)

    for ds, dm in [(1e-3, 0), (-1e-3, 0), (0, 1e-3), (0, -1e-3)]:
        assert (err(s + ds, m + dm) > err(s, m)).all()


def test_importance_lowers_the_weighted_error_and_zero_importance_is_harmless():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 512)).astype(np.float32)
    imp = (rng.random(512) ** 6).astype(np.float32)
    for qtype in ["Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]:
        plain = qformats.dequantize(qformats.quantize(x, qtype), qtype)
        data = qformats.quantize(x, qtype, importance=imp)
        weighted = qformats.dequantize(data, qtype)
        assert np.array_equal(weighted.view(np.uint32),
                              gguf_dequantize(data, gguf.GGMLQuantizationType[qtype]).view(np.uint32))
        assert (imp * (weighted - x) ** 2).sum() < 0.9 * (imp * (plain - x) ** 2).sum(), qtype
    zero = qformats.quantize(x, "Q4_K", importance=np.zeros(512, np.float32))
    assert np.isfinite(qformats.dequantize(zero, "Q4_K")).all()
    assert np.array_equal(qformats.quantize(x, "Q8_0", importance=imp), qformats.quantize(x, "Q8_0"))  # Q8_0: no search


def test_k_quant_codes_round_half_to_even():
    assert qformats.nearest_int(np.array([0.5, 1.5, 2.5, -0.5, -2.5])).tolist() == [0, 2, 2, -0, -2]


def test_bfloat16_is_accepted():
    w = torch.randn(4, 256).to(torch.bfloat16)
    for qtype in ["Q8_0", "Q4_K", "Q6_K"]:
        assert np.array_equal(qformats.quantize(w, qtype), qformats.quantize(w.float(), qtype))
    assert qformats.fake_quantize(w, "Q4_K").dtype == torch.float32


def test_perplexity_se_from_chunks():
    from lib.modeling.text import perplexity_se

    nll = torch.tensor([1.0, 3.0] * 256)  # chunks of 2: every chunk mean is 2, no spread
    assert perplexity_se(nll, chunk=2) == pytest.approx((np.exp(2.0), 0.0))
    nll = torch.cat([torch.full((4,), 1.0), torch.full((4,), 3.0)]).double()  # chunks of 4: means 1 and 3
    ppl, se = perplexity_se(nll, chunk=4)
    assert ppl == pytest.approx(np.exp(2.0)) and se == pytest.approx(np.exp(2.0) * np.sqrt(2.0) / np.sqrt(2))
    d, se_d = perplexity_se(nll + 0.1, chunk=4, baseline=nll)  # a constant shift: no paired spread
    assert d == pytest.approx(np.exp(2.1) - np.exp(2.0)) and se_d == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="2 chunks"):
        perplexity_se(nll, chunk=8)


def test_block_sizes_and_bits_per_weight_match_gguf():
    for qtype, (block, nbytes) in qformats.BLOCK_SIZES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]] == (block, nbytes)
    assert [qformats.bits_per_weight(t) for t in ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")] == [8.5, 4.5, 5.0, 4.5, 6.5625]


def test_torch_in_numpy_out_and_fake_quantize():
    w = torch.randn(4, 64)
    data = qformats.quantize(w, "Q8_0")
    assert isinstance(data, np.ndarray) and np.array_equal(data, qformats.quantize(w.numpy(), "Q8_0"))
    assert np.array_equal(qformats.dequantize(torch.from_numpy(data), "Q8_0"), qformats.dequantize(data, "Q8_0"))
    fq = qformats.fake_quantize(w, "Q4_1")
    assert isinstance(fq, torch.Tensor) and fq.dtype == torch.float32 and fq.shape == w.shape


def test_bad_input_is_refused_with_a_message():
    with pytest.raises(ValueError, match="multiple of 32"):
        qformats.quantize(np.zeros((2, 48), np.float32), "Q4_1")
    with pytest.raises(ValueError, match="multiple of 256"):
        qformats.quantize(np.zeros((2, 576), np.float32), "Q4_K")
    with pytest.raises(ValueError, match="multiple of 20 bytes"):
        qformats.dequantize(np.zeros((2, 30), np.uint8), "Q4_1")
    with pytest.raises(ValueError, match="supported types are Q8_0, Q4_0"):
        qformats.quantize(np.zeros(32, np.float32), "Q3_K")
    with pytest.raises(ValueError, match="Q5_K"):
        qformats.dequantize(np.zeros(32, np.uint8), "IQ4_NL")
    with pytest.raises(ValueError, match="importance must be"):
        qformats.quantize(np.zeros((2, 256), np.float32), "Q4_K", importance=np.ones(255, np.float32))
    with pytest.raises(ValueError, match="importance must be"):
        qformats.quantize(np.zeros((2, 256), np.float32), "Q4_K", importance=-np.ones(256, np.float32))


@pytest.mark.model
def test_write_gguf_loads_back_in_lib_model(tmp_path, smollm2):
    from lib.modeling.llama import read_gguf_llama

    model, _ = smollm2
    plan = {"layers.0.mlp.down_proj.weight": "Q4_K", "layers.1.attn.v_proj.weight": "Q6_K",  # 576 wide: Q8_0
            "layers.2.attn.q_proj.weight": "Q4_0", "layers.3.attn.k_proj.weight": "Q5_1"}
    path = quant.write_gguf(tmp_path / "mixed.gguf", plan)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert [types[quant.gguf_tensor_name(n)] for n in plan] == ["Q4_K", "Q8_0", "Q4_0", "Q5_1"]
    assert types["blk.0.ffn_up.weight"] == "Q4_1" and types["token_embd.weight"] == "Q8_0"  # the rest as stored
    # the file says what it is: Q4_K holds the most rewritten weights (ffn_down is 576 x 1536), not the source's Q4_1
    assert gguf.GGUFReader(path).fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_S
    mix = quant.write_gguf(tmp_path / "mix.gguf", {"layers.0.mlp.down_proj.weight": "Q4_K"}, file_type="MOSTLY_Q4_K_M")
    assert gguf.GGUFReader(mix).fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M
    with pytest.raises(ValueError, match="file_type"):
        quant.write_gguf(tmp_path / "bad.gguf", plan, file_type="Q4_K")
    cfg, state = read_gguf_llama(path)
    assert cfg == model.config
    want = quant.quantize_model(model, plan).state_dict()
    for name, w in state.items():  # Q and K rows come back un-permuted: quantization is per row, so it commutes
        assert torch.equal(w, want[name]), name


@pytest.mark.model
def test_write_gguf_loads_in_transformers(tmp_path, smollm2):
    from transformers import AutoModelForCausalLM

    model, tok = smollm2
    plan = quant.q4_k_m_plan(model)
    path = quant.write_gguf(tmp_path / "q4_k_m.gguf", plan)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name).eval()
    ids = tok("To be, or not to be, that is the question:", return_tensors="pt").input_ids
    with torch.no_grad():
        ours = quant.quantize_model(model, plan)(ids)
        theirs = hf(ids).logits.float()
    assert (ours - theirs).abs().max().item() < 1e-3


def _correlated_inputs(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g) / d**0.5
    x = torch.randn(n, d, generator=g) @ mix
    x[:, :4] *= 20  # a few outlier channels, as in LLM activations
    return x


def test_gptq_beats_rtn_on_its_calibration_inputs_and_stays_on_the_grid():
    from lib.quantization.gptq import gptq_quantize, output_error

    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    x = _correlated_inputs(1024, 256, 1)
    for bits in (3, 4):
        q = gptq_quantize(w, x, bits=bits, group_size=64)
        assert q.shape == w.shape and q.dtype == w.dtype
        assert output_error(w, q, x) < 0.6 * output_error(w, quant.rtn_quantize(w, bits, 64), x)
        levels = q.reshape(48, 4, 64)
        assert max(len(torch.unique(g)) for row in levels for g in row) <= 2**bits
    with pytest.raises(ValueError, match="group_size"):
        gptq_quantize(w, x, group_size=48)


def test_awq_alpha_zero_is_rtn_and_search_never_loses_to_it():
    from lib.quantization.awq import awq_quantize, awq_scales, salient_channels
    from lib.quantization.gptq import output_error

    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(2)) * 0.05
    x = _correlated_inputs(512, 128, 3)
    assert torch.allclose(awq_scales(x.abs().mean(0), 0.0), torch.ones(128))
    q, alpha = awq_quantize(w, x, bits=3, group_size=32)
    assert 0.0 <= alpha < 1.0
    assert output_error(w, q, x) <= output_error(w, quant.rtn_quantize(w, 3, 32), x)
    assert set(salient_channels(w, x.abs().mean(0), 4 / 128, "activation").tolist()) == {0, 1, 2, 3}  # the outliers
    with pytest.raises(ValueError, match="activation"):
        salient_channels(w, x.abs().mean(0), 0.01, "size")


def test_awq_clip_search_beats_min_max_per_group_and_on_held_out_inputs():
    from lib.quantization.awq import awq_quantize, clip_search
    from lib.quantization.gptq import output_error

    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(8)) * 0.05
    x_all = _correlated_inputs(1024, 256, 10)  # one distribution: the first half calibrates, the second judges
    x, x_test = x_all[:512], x_all[512:]
    for bits in (3, 4):
        rtn, clipped = quant.rtn_quantize(w, bits, 64), clip_search(w, x, bits, 64)
        assert clipped.shape == w.shape and clipped.dtype == w.dtype
        # per (row, group): the group's share of the output on x is never worse than min/max's (r = 1 is a candidate)
        xg = x.reshape(-1, 4, 64)
        def share(q):  # [48, 4]
            return ((xg[:, None] * (w - q).reshape(1, 48, 4, 64)).sum(-1) ** 2).mean(0)

        assert (share(clipped) <= share(rtn) * (1 + 1e-5) + 1e-12).all()
        assert (share(clipped) < 0.99 * share(rtn)).float().mean() > 0.5  # and it clips most groups
        levels = clipped.reshape(48, 4, 64)  # still 2^bits levels per group
        assert max(len(torch.unique(g)) for row in levels for g in row) <= 2**bits
        assert output_error(w, clipped, x_test) < 0.8 * output_error(w, rtn, x_test)
        plain, alpha = awq_quantize(w, x, bits, 64)
        both, alpha_c = awq_quantize(w, x, bits, 64, clip=True)
        assert alpha_c == alpha and output_error(w, both, x_test) < output_error(w, plain, x_test)
    with pytest.raises(ValueError, match="group_size"):
        clip_search(w, x, 3, 48)


def test_int8_and_int4_linears_match_their_dequantized_weights():
    from lib.spec_decode.drafts import Int8Linear
    from lib.quantization.quant_linear import Int4Linear

    w = torch.randn(96, 128, generator=torch.Generator().manual_seed(4)) * 0.05
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(5))
    lin8 = Int8Linear(w)
    y8 = lin8(x)
    assert y8.shape == (3, 5, 96) and y8.dtype == torch.float32
    torch.testing.assert_close(y8, x @ lin8.dequantized().T, atol=0.03, rtol=0.02)  # bf16 activations
    lin4 = Int4Linear(w, group_size=32)
    torch.testing.assert_close(lin4(x), x @ quant.rtn_quantize(w, 4, 32).T, atol=0.05, rtol=0.03)
    with pytest.raises(ValueError, match="group_size"):
        Int4Linear(w, group_size=48)


def test_quantize_linears_keeps_a_tiny_model_close_and_the_original_unchanged():
    from lib.modeling.llama import tiny_model
    from lib.spec_decode.drafts import Int8Linear
    from lib.quantization.quant_linear import Int4Linear, quantize_linears

    model = tiny_model(seed=6)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(ids)
        for kind, cls in (("int8", Int8Linear), ("int4", Int4Linear)):
            fast = quantize_linears(model, kind, group_size=32)
            assert isinstance(fast.layers[0].mlp.down_proj, cls) and isinstance(fast.lm_head, cls)
            got = fast(ids)
            assert got.shape == want.shape and (got - want).abs().max() < 0.1 * want.abs().max()
        assert model.lm_head is None and isinstance(model.layers[0].mlp.down_proj, torch.nn.Linear)
        torch.testing.assert_close(model(ids), want)
    with pytest.raises(ValueError, match="kind"):
        quantize_linears(model, "int2")


def test_smoothquant_migrates_an_outlier_channel():
    from lib.quantization.smoothquant import W8A8Linear, smooth_scales

    g = torch.Generator().manual_seed(8)
    w = torch.randn(64, 128, generator=g) * 0.05
    x = torch.randn(256, 128, generator=g)
    x[:, 7] *= 300  # one outlier channel, as in an LLM's activations
    want = x @ w.T
    naive = W8A8Linear(w)(x)
    smooth = W8A8Linear(w, smooth_scales(x.abs().amax(0), w, 0.5))(x)
    assert (smooth - want).pow(2).mean() < 0.2 * (naive - want).pow(2).mean()


def test_smoothquant_shares_scales_where_they_fold_and_leaves_o_proj():
    """q/k/v read one RMSNorm's output and gate/up another's: one smoothing vector each (one norm gain absorbs
    1/s); o_proj (fed by attention, fewer v outputs than o inputs under GQA) stays unsmoothed."""
    from lib.modeling.llama import tiny_model
    from lib.quantization.smoothquant import activation_absmax, w8a8_model

    model = tiny_model(seed=8)
    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(9))
    names = quant.linear_names(model)
    with torch.no_grad():
        act_max = activation_absmax(model, [ids], names)
        smooth = w8a8_model(model, act_max, alpha=0.5)
        layer = smooth.layers[0]
        assert torch.equal(layer.attn.q_proj.inv_s, layer.attn.k_proj.inv_s)
        assert torch.equal(layer.attn.q_proj.inv_s, layer.attn.v_proj.inv_s)
        assert torch.equal(layer.mlp.gate_proj.inv_s, layer.mlp.up_proj.inv_s)
        assert not torch.equal(layer.attn.q_proj.inv_s, torch.ones_like(layer.attn.q_proj.inv_s))
        assert torch.equal(layer.attn.o_proj.inv_s, torch.ones_like(layer.attn.o_proj.inv_s))
        assert (smooth(ids) - model(ids)).abs().max() < 0.1 * model(ids).abs().max()


# llama.cpp multiplies quantized weights by activations rounded to 8 bits, so its logits are not the lab's exactly:
# measured max |Δlogit| over prompt and continuation 1.6–2.7 on four prompts for the lab's Q4_K_M-like file, and
# 1.25–1.36 for llama.cpp on the original Q4_1 file against lib.modeling.llama. A wrong tensor, type or row order moves
# logits by tens. Greedy choices are compared where the lab's top-2 margin is at least NEAR_TIE.
LLAMA_CPP_LOGIT_TOL = 5.0
NEAR_TIE = 0.5


@pytest.mark.model
def test_llama_cpp_runs_a_lab_q4_k_m_file_like_the_lab_model(tmp_path, smollm2):
    """A GGUF file written by the lab (the Q4_K_M-like mix: searched Q4_K, Q6_K, and their Q5_0 / Q8_0 fallbacks)
    loads in llama.cpp, whose logits and greedy tokens are the lab model's on the dequantized weights."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.skip("llama-cpp-python is not installed (the optional peer: pip install -e '.[llamacpp]', a build "
                    "from source of several minutes)")
    from lib.modeling.generate import generate

    model, tok = smollm2
    plan = quant.q4_k_m_plan(model)
    path = quant.write_gguf(tmp_path / "q4_k_m.gguf", plan, file_type="MOSTLY_Q4_K_M")
    llm = quant.llama_cpp_model(path, logits_all=True)
    lab = quant.quantize_model(model, plan)
    ids = tok("The history of the printing press begins", return_tensors="pt").input_ids
    t, n_new = ids.shape[1], 16
    with torch.no_grad():
        out, step_logits = generate(lab, ids, n_new, return_logits=True)  # [1, t + 16], [1, 16, vocab]
        lab_logits = lab(out)[0]  # [t + 16, vocab]
    ours = out[0, t:]
    llm.eval(out[0].tolist())  # teacher-forced: prompt and the lab's continuation
    cpp_logits = torch.from_numpy(np.array(llm.scores[:t + n_new]))
    err = (cpp_logits - lab_logits).abs().max().item()
    assert err < LLAMA_CPP_LOGIT_TOL, f"llama.cpp's logits differ from the lab model's by {err:.3g}"
    top2 = step_logits[0].topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) >= NEAR_TIE  # [16]: positions that are not near-ties
    assert int(clear.sum()) >= 12, "the prompt's continuation is mostly near-ties: it tests nothing"
    cpp_choice = cpp_logits[t - 1:-1].argmax(-1)
    assert torch.equal(cpp_choice[clear], ours[clear]), f"llama.cpp picks {cpp_choice.tolist()}, the lab {ours.tolist()}"
    theirs = []  # free-running greedy decode in llama.cpp: the lab's tokens up to the first near-tie
    for token in llm.generate(ids[0].tolist(), top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
        theirs.append(int(token))
        if len(theirs) == n_new:
            break
    first_tie = int((~clear).nonzero()[0]) if (~clear).any() else n_new
    assert theirs[:first_tie] == ours[:first_tie].tolist(), f"llama.cpp generates {theirs}, the lab {ours.tolist()}"
