"""lib.gguf.qmatmul: the kernel that multiplies GGUF blocks as the file stores them, and the layers built on it.

Random blocks are drawn per run (the seed is printed in every failure: rerun with INFERENCE_LAB_SEED=...). The
kernel's sum runs in float32 in its own order, so it is held to the float64 product of lib.gguf.qformats' dequantized
weights within the worst-case float32 bound of a k-term dot product, |err| <= 2k·2⁻²⁴·Σ|x||w|, which a correct
kernel can never exceed and a wrong nibble, scale or row exceeds by orders of magnitude. The decoded weights
themselves must equal lib.gguf.qformats' bit for bit. The first build of the kernel costs about 3 s (cached after).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grader.checks import generator, run_seed, seed_note
from lib.gguf import qmatmul as Q
from lib.gguf.qformats import BLOCK_SIZES, dequantize

REPO = Path(__file__).resolve().parent.parent
# where each type keeps its float16 scales (byte offsets in a block): random bytes there could be inf or nan
SCALE_BYTES = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2],
               "Q6_K": [208]}


def random_blocks(qtype: str, n: int, nblocks: int, offset: int) -> torch.Tensor:
    """Random bytes (every nibble, 6-bit scale and high bit pattern occurs) with finite float16 scales."""
    block, nbytes = BLOCK_SIZES[qtype]
    g = generator(offset)
    b = torch.randint(0, 256, (n, nblocks, nbytes), dtype=torch.uint8, generator=g)
    for at in SCALE_BYTES[qtype]:
        scale = (torch.rand(n, nblocks, generator=g) * 0.02 - 0.005).to(torch.float16)  # some negative, like m
        b[:, :, at:at + 2] = scale.view(torch.uint8).reshape(n, nblocks, 2)
    return b.reshape(n, nblocks * nbytes)


def assert_matches_reference(y: torch.Tensor, x: torch.Tensor, blocks: torch.Tensor, qtype: str, what: str):
    want = Q.matmul_reference(x, blocks, qtype)
    w = torch.from_numpy(dequantize(blocks, qtype)).double()
    k = w.shape[1]
    bound = 2 * k * 2.0 ** -24 * (x.double().abs() @ w.abs().T) + 1e-30
    err = (y.double() - want).abs()
    assert y.dtype == torch.float32 and y.shape == want.shape, f"{what}: {y.dtype} {tuple(y.shape)}"
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{what}: error {err.max().item():.3g} is {worst:.3g}x the float32 bound {seed_note()}"


@pytest.fixture(autouse=True)
def _fresh_kernel_choice():
    Q.reset()
    yield
    Q.reset()


@pytest.mark.parametrize("qtype", Q.QTYPES)
def test_kernel_equals_the_reference_on_random_blocks(qtype):
    if Q._compiler() is not None:  # with a compiler the kernel must build; without one this tests the fallback
        assert Q.backend().startswith("C++"), "the C++ kernel did not build, though this machine has a compiler"
    block, _ = BLOCK_SIZES[qtype]
    cases = [(1, 1, 1), (7, 3, 1), (33, 2, 2), (97, 5, 3), (16, 1, 4), (5, 4, 5), (64, 2, 6), (3, 3, 7),
             (31, 2, 8), (9, 2, 11), (6, 1, Q.FUSED_MAX_ROWS + 4)]  # (out, blocks per row, rows of x)
    for i, (n, nblocks, rows) in enumerate(cases):
        blocks = random_blocks(qtype, n, nblocks, offset=100 * i)
        x = torch.randn(rows, nblocks * block, generator=generator(100 * i + 1))
        assert_matches_reference(Q.qmatmul(x, blocks, qtype), x, blocks, qtype, f"{qtype} out={n} rows={rows}")
    # the decoded weights are lib.gguf.qformats', bit for bit
    blocks = random_blocks(qtype, 13, 3, offset=7)
    got = Q.dequantize_blocks(blocks, qtype)
    assert torch.equal(got, torch.from_numpy(dequantize(blocks, qtype))), f"{qtype} decode {seed_note()}"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """One folder for this module's builds with narrower instruction sets: Q.build names each by its source and
    flags, so the tests that build the same flags share one compile."""
    return tmp_path_factory.mktemp("qmatmul-builds")


@pytest.mark.parametrize("isa, flags", [("avx2", ("-mno-avx512f",)), ("generic", ("-mno-avx512f", "-mno-avx2"))])
def test_the_avx2_and_portable_loops_equal_the_reference(isa, flags, builds):
    """This CPU's build takes the widest loops it has; the narrower ones (for CPUs without AVX-512 or AVX2) are
    built here with those instructions switched off and held to the same reference."""
    import ctypes

    if Q._compiler() is None:
        pytest.skip("no C++ compiler")
    if isa == "avx2" and "avx2" not in Q._cpu_flags().split():
        pytest.skip("this CPU has no AVX2")
    lib = ctypes.CDLL(str(Q.build(builds, extra_flags=flags)))
    lib.qmatmul_isa.restype = ctypes.c_char_p
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.qmatmul_f32.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, i64, ptr, ctypes.c_int]
    assert lib.qmatmul_isa().decode() == isa
    for i, qtype in enumerate(("Q4_1", "Q8_0", "Q4_K")):
        block, _ = BLOCK_SIZES[qtype]
        for n, nblocks, rows in [(37, 3, 1), (9, 2, 3), (64, 1, 8), (5, 2, 11)]:
            blocks = random_blocks(qtype, n, nblocks, offset=300 + 10 * i + rows)
            x = torch.randn(rows, nblocks * block, generator=generator(400 + 10 * i + rows))
            y = torch.empty(rows, n)
            assert lib.qmatmul_f32(Q._CODES[qtype], blocks.data_ptr(), n, nblocks * block, x.data_ptr(), rows,
                                   nblocks * block, y.data_ptr(), 2) == 0
            assert_matches_reference(y, x, blocks, qtype, f"{isa} {qtype} out={n} rows={rows}")


@pytest.mark.parametrize("flags", [(), ("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")])
def test_plain_float32_weights_through_every_loop(flags, builds):
    """lib.modeling.fast's "cpp" kernel: the F32 "type" (plain float32 weights, no blocks) in this CPU's widest loops and
    in the narrower ones, against a float64 product, for 1-8 rows per pass and more; `linear_f32` likewise."""
    import ctypes

    if Q._compiler() is None:
        pytest.skip("no C++ compiler")
    lib = ctypes.CDLL(str(Q.build(builds, extra_flags=flags)))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.qmatmul_f32.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, i64, ptr, ctypes.c_int]
    for i, (n, k, rows) in enumerate([(37, 16, 1), (9, 48, 2), (64, 576, 3), (5, 80, 4), (300, 1536, 8), (7, 32, 11)]):
        w = torch.randn(n, k, generator=generator(500 + i))
        x = torch.randn(rows, k, generator=generator(600 + i))
        y = torch.full((rows, n), float("nan"))
        assert lib.qmatmul_f32(Q._STEP_CODES["F32"], w.data_ptr(), n, k, x.data_ptr(), rows, k, y.data_ptr(), 2) == 0
        want = x.double() @ w.double().T
        err = (y.double() - want).abs().max().item()
        assert err < 1e-5 * k ** 0.5 * (1 + want.abs().max().item()), f"{flags} n={n} k={k} rows={rows}: {err:.3g}"
        if not flags:
            got = Q.linear_f32(x.reshape(1, rows, k), w)
            assert got.shape == (1, rows, n) and (got.double()[0] - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("flags", [(), ("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")])
def test_the_wide_q4_1_layout_is_the_same_weights_in_every_loop(flags, builds):
    """`repack_q4_1` (d and m as float32, "Q4_1F") changes how the kernel reads a block, not what it computes:
    in this CPU's widest loops and the narrower ones the products equal the Q4_1 ones bit for bit (same
    arithmetic, same order), and every decoder (C++, the PyTorch fallback's) gives lib.gguf.qformats' weights."""
    import ctypes

    if Q._compiler() is None:
        pytest.skip("no C++ compiler")
    lib = ctypes.CDLL(str(Q.build(builds, extra_flags=flags)))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.qmatmul_f32.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, i64, ptr, ctypes.c_int]
    lib.dequantize_f32.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, ctypes.c_int]
    for i, (n, nblocks, rows) in enumerate([(37, 3, 1), (9, 2, 3), (64, 18, 4), (5, 2, 8), (300, 18, 1), (7, 1, 11)]):
        blocks = random_blocks("Q4_1", n, nblocks, offset=700 + 10 * i)
        wide = Q.repack_q4_1(blocks)
        assert wide.shape == (n, nblocks * 24) and wide.dtype == torch.uint8
        k = nblocks * 32
        x = torch.randn(rows, k, generator=generator(800 + i))
        ys = []
        for qtype, b in (("Q4_1", blocks), ("Q4_1F", wide)):
            y = torch.full((rows, n), float("nan"))
            assert lib.qmatmul_f32(Q._STEP_CODES[qtype], b.data_ptr(), n, k, x.data_ptr(), rows, k, y.data_ptr(), 2) == 0
            ys.append(y)
        assert torch.equal(ys[0], ys[1]), f"{flags} out={n} rows={rows}: the wide layout's products differ"
        assert_matches_reference(ys[1], x, blocks, "Q4_1", f"{flags} Q4_1F out={n} rows={rows}")
        want = torch.from_numpy(dequantize(blocks, "Q4_1"))
        w = torch.empty(n, k)
        assert lib.dequantize_f32(Q._STEP_CODES["Q4_1F"], wide.data_ptr(), n, k, w.data_ptr(), 2) == 0
        assert torch.equal(w, want) and torch.equal(torch.from_numpy(Q._dequantize_q4_1f(wide)), want)
    with pytest.raises(ValueError, match="20 bytes"):
        Q.repack_q4_1(torch.zeros(2, 30, dtype=torch.uint8))


def test_leading_dimensions_a_strided_x_and_unchanged_arguments():
    blocks = random_blocks("Q4_1", 40, 3, offset=11)
    x = torch.randn(2, 3, 4 * 96, generator=generator(12))[..., ::4]  # [2, 3, 96], not contiguous
    x0, b0 = x.clone(), blocks.clone()
    y = Q.qmatmul(x, blocks, "Q4_1")
    assert y.shape == (2, 3, 40)
    assert_matches_reference(y.reshape(6, 40), x.reshape(6, 96), blocks, "Q4_1", "[2, 3, 96] strided x")
    assert torch.equal(x, x0) and torch.equal(blocks, b0)


def test_the_readable_references_agree_with_each_other():
    qtype = "Q4_1"
    blocks = random_blocks(qtype, 4, 3, offset=21).numpy()
    x = torch.randn(96, generator=generator(22)).numpy()
    want = Q.matmul_reference(torch.from_numpy(x)[None], torch.from_numpy(blocks), qtype)[0]
    w = dequantize(blocks, qtype)
    for j in range(4):
        assert Q.row_dot_reference(x, blocks[j], qtype) == pytest.approx(want[j].item(), rel=1e-12, abs=1e-12)
        one = sum(float(Q.block_dot_q4_1(x[32 * b:32 * (b + 1)], blocks[j, 20 * b:20 * (b + 1)])) for b in range(3))
        bound = 2 * 96 * 2.0 ** -24 * float(np.abs(x) @ np.abs(w[j]))
        assert abs(one - want[j].item()) <= bound, seed_note()


def test_bad_input_gets_a_clear_error():
    blocks = random_blocks("Q4_1", 8, 2, offset=31)
    with pytest.raises(ValueError, match="unsupported type"):
        Q.qmatmul(torch.randn(1, 64), blocks, "Q3_K")
    with pytest.raises(ValueError, match="features"):
        Q.qmatmul(torch.randn(1, 96), blocks, "Q4_1")
    with pytest.raises(ValueError, match="float32"):
        Q.qmatmul(torch.randn(1, 64, dtype=torch.float64), blocks, "Q4_1")
    with pytest.raises(ValueError, match="20 bytes"):
        Q.qmatmul(torch.randn(1, 64), blocks[:, :30], "Q4_1")
    with pytest.raises(ValueError, match="uint8"):
        Q.qmatmul(torch.randn(1, 64), blocks.to(torch.int16), "Q4_1")


def test_meta_tensors_give_shapes_without_running_the_kernel():
    from lib.quantization.quant_linear import GGUFLinear

    lin = GGUFLinear(random_blocks("Q8_0", 24, 2, offset=41), "Q8_0").to("meta")
    y = lin(torch.empty(3, 5, 64, device="meta"))
    assert y.device.type == "meta" and y.shape == (3, 5, 24) and y.dtype == torch.float32
    with pytest.raises(ValueError, match="meta"):
        lin(torch.randn(1, 64))  # x on the CPU, blocks on meta


def test_no_compiler_falls_back_to_pytorch_and_says_so(monkeypatch, capfd):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    blocks = random_blocks("Q4_1", 10, 2, offset=51)
    x = torch.randn(3, 64, generator=generator(52))
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*PyTorch fallback"):
        y = Q.qmatmul(x, blocks, "Q4_1")
    assert "PyTorch fallback" in capfd.readouterr().err
    assert Q.backend() == "PyTorch fallback"
    assert_matches_reference(y, x, blocks, "Q4_1", "fallback")


def test_a_failing_build_falls_back_and_shows_the_compiler_error(monkeypatch, tmp_path):
    fake = tmp_path / "broken-c++"
    fake.write_text("#!/bin/sh\necho 'fatal error: cannot compile here' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.warns(RuntimeWarning, match="cannot compile here"):
        assert Q.backend() == "PyTorch fallback"


def test_the_build_is_cached_per_source_and_cpu(tmp_path):
    import time

    t0 = time.perf_counter()
    first = Q.build(cache_dir=tmp_path)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert Q.build(cache_dir=tmp_path) == first and time.perf_counter() - t0 < 0.5
    assert first.is_file() and not list(tmp_path.glob("*.part")), list(tmp_path.iterdir())
    print(f"a fresh build of the kernel took {build_s:.1f} s")


def _weights_from_blocks(model, blocks):
    """A copy of `model` whose weights are exactly what `blocks` decode to (the fp32 model of a GGUF file)."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for name, (qtype, b) in blocks.items():
            other.get_parameter(name).copy_(torch.from_numpy(dequantize(b, qtype)))
    return other


def test_a_non_editable_install_carries_the_kernel_source(tmp_path):
    """lib/gguf/csrc/qmatmul.cpp is package data: a wheel of the project (what a plain `pip install .` installs)
    holds it beside lib/gguf/qmatmul.py, where lib.gguf.qmatmul.SOURCE looks for it."""
    import shutil
    import zipfile

    src = tmp_path / "src"  # a copy of what the build reads, so no build/ folder of the checkout is reused
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in ("lib", "grader"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("inference_lab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "lib/gguf/qmatmul.py" in names and "lib/gguf/csrc/qmatmul.cpp" in names, sorted(n for n in names if "lib/" in n)
    assert Q.SOURCE == Path(Q.__file__).parent / "csrc" / "qmatmul.cpp" and Q.SOURCE.is_file()


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K", "Q4_K_M"])
def test_a_tiny_model_on_blocks_is_the_fp32_model_of_those_blocks(qtype):
    from lib.modeling.generate import generate
    from lib.modeling.llama import tiny_model
    from lib.quantization.quant import q4_k_m_plan
    from lib.quantization.quant_linear import GGUFFastLlama, GGUFLinear, gguf_linears, quantize_blocks

    cfg = dict(d_model=256, d_ff=512) if "_K" in qtype else {}
    base = tiny_model(seed=run_seed() % 1000, **cfg)
    blocks = quantize_blocks(base, q4_k_m_plan(base) if qtype == "Q4_K_M" else qtype)
    if qtype == "Q4_K_M":  # a mix: Q6_K for some v/down projections, so QKV is multiplied in parts
        assert {t for t, _ in blocks.values()} == {"Q4_K", "Q6_K", "Q8_0"}
    model = _weights_from_blocks(base, blocks)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    qmodel = gguf_linears(model, blocks)
    qfast = GGUFFastLlama(model, blocks)
    assert qfast.layout == "file" and "too small to measure" in qfast.layout_reason  # a tiny model: the default
    fasts = [("GGUFFastLlama", qfast)]
    if Q.kernel() is not None and qtype == "Q4_1":  # Q4_1's other layout (d and m widened), chosen where faster
        fasts.append(("GGUFFastLlama wide", GGUFFastLlama(model, blocks, layout="wide")))
        assert fasts[1][1].layers[0]["wqkv"][0][0] == "Q4_1F"
    else:
        with pytest.raises(ValueError, match="layout must be one of file here"):
            GGUFFastLlama(model, blocks, layout="wide")
    assert isinstance(qmodel.lm_head, GGUFLinear) and isinstance(qmodel.layers[0].mlp.up_proj, GGUFLinear)
    prompt = torch.randint(0, model.config.vocab_size, (2, 7), generator=generator(61))
    with torch.no_grad():
        want = model(prompt)
        for name, m in [("gguf_linears", qmodel)] + fasts:
            got = m(prompt)
            assert (got - want).abs().max().item() < 1e-4, f"{name} {qtype} {seed_note()}"
    ref = generate(model, prompt, 8)
    assert torch.equal(generate(qmodel, prompt, 8), ref)
    for name, m in fasts:
        assert torch.equal(generate(m, prompt, 8), ref), f"{name} {qtype} {seed_note()}"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "the float model changed"
    # the step CUDA graphs replay (lib.modeling.fast item 8), run uncaptured: it multiplies through the blocks too
    from lib.modeling.fast_graphs import GraphedDecode
    qfast.graphs = GraphedDecode(qfast, capture=False)
    c_fast, c_ref = qfast.graphs.new_cache(2, 16), model.new_cache(2, 16)
    with torch.no_grad():
        x = prompt
        for _ in range(4):
            want = model(x, cache=c_ref)
            got = qfast.forward_hidden(x, c_fast)[0]
            assert (got - want).abs().max().item() < 1e-4, f"replayed step {qtype} {seed_note()}"
            x = want[:, -1:].argmax(-1)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_1 wide", "Q4_K_M"])
def test_the_cpp_decode_step_is_the_python_step(qtype, monkeypatch):
    """GGUFFastLlama runs a step on a KVCache (one token per row, or a few: a verify step) as one C++ call
    (decode_steps); the same model with that call switched off runs lib.modeling.fast's Python step. Both must give the same logits, step after step, for every
    row of a batch, and leave the same keys and values in the cache; other caches take the Python path."""
    from lib.modeling.kv_cache import KVCache
    from lib.modeling.llama import tiny_model
    from lib.quantization.quant import q4_k_m_plan
    from lib.quantization.quant_linear import GGUFFastLlama, quantize_blocks

    if Q._compiler() is None:
        pytest.skip("no C++ compiler: the decode step is C++ only")
    qtype, _, layout = qtype.partition(" ")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the step's thread count: its split paths run
    # Q4_1: heads of 64 and a 90-token prompt, so batch · heads · positions · head_dim passes the C++ step's
    # threshold for splitting attention over threads (its parallel branch); the mix: heads of 32, serial
    cfg = dict(d_model=256, d_ff=512, n_heads=8, n_kv_heads=2) if "_K" in qtype else dict(
        d_model=256, d_ff=256, n_heads=4, n_kv_heads=2)
    prompt_len = 9 if "_K" in qtype else 90
    base = tiny_model(seed=run_seed() % 1000, **cfg)
    blocks = quantize_blocks(base, q4_k_m_plan(base) if qtype == "Q4_K_M" else qtype)
    model = _weights_from_blocks(base, blocks)
    fast, slow = GGUFFastLlama(model, blocks, layout=layout or None), GGUFFastLlama(model, blocks)
    slow._step = None
    assert fast._step is not None, "the C++ decode step is not in use though the kernel built"
    prompt = torch.randint(0, model.config.vocab_size, (3, prompt_len), generator=generator(71))
    caches = [m.new_cache(3, prompt_len + 31) for m in (fast, slow)]
    logits = [m(prompt, c) for m, c in zip((fast, slow), caches)]
    for step in range(12):
        nxt = logits[1][:, -1:].argmax(-1)
        logits = [m(nxt, c) for m, c in zip((fast, slow), caches)]
        assert logits[0].shape == logits[1].shape == (3, 1, model.config.vocab_size)
        err = (logits[0] - logits[1]).abs().max().item()
        assert err < 1e-4, f"step {step}: logits differ by {err:.3g} {seed_note()}"
        assert caches[0].length == caches[1].length == prompt_len + 1 + step
    chunk = torch.randint(0, model.config.vocab_size, (3, 4), generator=generator(72))  # a verify step: 4 tokens
    logits = [m(chunk, c) for m, c in zip((fast, slow), caches)]
    assert logits[0].shape == (3, 4, model.config.vocab_size)
    err = (logits[0] - logits[1]).abs().max().item()
    assert err < 1e-4, f"a 4-token step: logits differ by {err:.3g} {seed_note()}"
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert (a.k[:, :, :a.length] - b.k[:, :, :b.length]).abs().max() < 1e-4
        assert (a.v[:, :, :a.length] - b.v[:, :, :b.length]).abs().max() < 1e-4
    # a rolling cache is not lib.modeling.kv_cache's plain buffer: the Python step serves it, with the same results
    rolling = KVCache.rolling(model.config, prompt_len + 31, batch=3)  # a window that drops nothing yet
    fast(prompt, rolling)
    assert fast._cache_pointers(rolling) is None
    full = fast.new_cache(3, prompt_len + 31)
    fast(prompt, full)
    nxt = prompt[:, -1:]
    assert (fast(nxt, rolling) - fast(nxt, full)).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="overflow"):  # a full cache is refused as lib.modeling.kv_cache refuses it
        small = fast.new_cache(3, prompt_len)
        fast(prompt, small)
        fast(nxt, small)


def test_blocks_of_another_model_are_refused():
    from lib.modeling.llama import tiny_model
    from lib.quantization.quant_linear import gguf_linears, quantize_blocks

    model = tiny_model(seed=1)
    blocks = quantize_blocks(model, "Q8_0")  # a requantization: the blocks no longer decode to model's weights
    with pytest.raises(ValueError, match="do not decode to the model's weights"):
        gguf_linears(model, blocks)


@pytest.mark.model
def test_smollm2_on_its_own_blocks_gives_the_fp32_models_tokens(smollm2):
    from lib.modeling.generate import generate
    from lib.quantization.quant_linear import GGUFFastLlama, gguf_linears, read_gguf_blocks

    model, tok = smollm2
    blocks = read_gguf_blocks()
    assert {t for t, _ in blocks.values()} == {"Q4_1", "Q8_0"} and blocks["embed.weight"][0] == "Q8_0"
    prompt = tok("The history of the printing press begins", return_tensors="pt").input_ids
    ref = generate(model, prompt, 16)
    for m in (gguf_linears(model, blocks), GGUFFastLlama(model, blocks, layout="file"),
              GGUFFastLlama(model, blocks, layout="wide")):
        with torch.no_grad():
            # measured 4e-5 (float32 sums in another order through 30 layers); 1e-3 leaves a 25x margin
            assert (m(prompt) - model(prompt)).abs().max().item() < 1e-3
        assert torch.equal(generate(m, prompt, 16), ref)


@pytest.mark.model
def test_smollm2_chooses_its_gguf_layout_by_timing_whole_steps(smollm2, tmp_path, monkeypatch):
    """GGUFFastLlama's layout ("file" or "wide") is timed on whole steps once per machine and remembered;
    INFERENCE_LAB_GGUF_LAYOUT forces one, or measures again; a name it does not know is refused."""
    from lib.quantization.quant_linear import choose_gguf_layout, read_gguf_blocks

    if Q.kernel() is None:
        pytest.skip("no C++ kernel: the file's layout is the only one")
    model, _ = smollm2
    blocks = read_gguf_blocks()
    cache = tmp_path / "kernels.json"
    monkeypatch.setenv("INFERENCE_LAB_GGUF_LAYOUT", "measure")  # whatever the load: time them now
    layout, why = choose_gguf_layout(model, blocks, cache, repeats=1)
    assert layout in ("file", "wide") and "measured now" in why and "file" in why and "wide" in why, why
    monkeypatch.delenv("INFERENCE_LAB_GGUF_LAYOUT")
    again, why = choose_gguf_layout(model, blocks, cache)
    assert again == layout and "measured on this machine" in why, why
    monkeypatch.setenv("INFERENCE_LAB_GGUF_LAYOUT", "wide")
    assert choose_gguf_layout(model, blocks, cache) == ("wide", "INFERENCE_LAB_GGUF_LAYOUT=wide")
    monkeypatch.setenv("INFERENCE_LAB_GGUF_LAYOUT", "narrow")
    with pytest.raises(ValueError, match="narrow"):
        choose_gguf_layout(model, blocks, cache)


def test_prefetch_changes_when_bytes_arrive_not_the_products():
    """Software prefetch (`set_prefetch`) in the Q4_1 (both layouts) and Q8_0 loops: the same products bit for
    bit, on and off, for 1-8 rows and more, and the setting reads back."""
    if Q.kernel() is None:
        pytest.skip("no C++ kernel")
    before = Q.set_prefetch(0)
    try:
        for i, (qtype, n, nblocks, rows) in enumerate([("Q4_1", 300, 18, 1), ("Q4_1", 97, 48, 3), ("Q8_0", 211, 18, 1),
                                                       ("Q8_0", 64, 5, 9)]):
            blocks = random_blocks(qtype, n, nblocks, offset=500 + i)
            x = torch.randn(rows, nblocks * 32, generator=generator(600 + i))
            layouts = [(qtype, blocks)] + ([(Q.WIDE[qtype], Q.repack_q4_1(blocks))] if qtype in Q.WIDE else [])
            for code, b in layouts:
                ys = []
                for ahead in (0, Q.PREFETCH_BYTES, 64):
                    Q.set_prefetch(ahead)
                    y = torch.empty(rows, n)
                    assert Q.kernel().qmatmul_f32(Q._STEP_CODES[code], b.data_ptr(), n, nblocks * 32, x.data_ptr(), rows,
                                                  nblocks * 32, y.data_ptr(), 2) == 0
                    ys.append(y)
                assert all(torch.equal(ys[0], y) for y in ys[1:]), f"{code} rows={rows}: prefetch changed a product"
                if code == qtype:
                    assert_matches_reference(ys[0], x, blocks, qtype, f"{code} rows={rows}")
        assert Q.set_prefetch(4096) == 64 and Q.set_prefetch(-5) == 4096 and Q.set_prefetch(0) == 0  # < 0: off
    finally:
        Q.set_prefetch(before)


@pytest.mark.model
def test_smollm2_chooses_prefetch_by_timing_whole_steps(smollm2, tmp_path, monkeypatch):
    """GGUFFastLlama's prefetch ("on" or "off") is timed on whole steps once per machine and remembered;
    INFERENCE_LAB_GGUF_PREFETCH forces it, or measures again; a name it does not know is refused; an engine
    applies its own setting before each step, whatever another engine set."""
    from lib.modeling.generate import generate
    from lib.quantization.quant_linear import GGUFFastLlama, choose_gguf_prefetch, read_gguf_blocks

    if Q.kernel() is None:
        pytest.skip("no C++ kernel: nothing to prefetch")
    model, tok = smollm2
    blocks = read_gguf_blocks()
    cache = tmp_path / "kernels.json"
    monkeypatch.setenv("INFERENCE_LAB_GGUF_PREFETCH", "measure")
    choice, why = choose_gguf_prefetch(model, blocks, cache, repeats=1)
    assert choice in ("on", "off") and "measured now" in why and "on" in why and "off" in why, why
    monkeypatch.delenv("INFERENCE_LAB_GGUF_PREFETCH")
    again, why = choose_gguf_prefetch(model, blocks, cache)
    assert again == choice and "measured on this machine" in why, why
    monkeypatch.setenv("INFERENCE_LAB_GGUF_PREFETCH", "off")
    assert choose_gguf_prefetch(model, blocks, cache) == ("off", "INFERENCE_LAB_GGUF_PREFETCH=off")
    monkeypatch.setenv("INFERENCE_LAB_GGUF_PREFETCH", "sometimes")
    with pytest.raises(ValueError, match="sometimes"):
        choose_gguf_prefetch(model, blocks, cache)
    with pytest.raises(ValueError, match="prefetch must be one of"):
        GGUFFastLlama(model, blocks, layout="file", prefetch="sometimes")
    on = GGUFFastLlama(model, blocks, layout="wide", prefetch="on")
    off = GGUFFastLlama(model, blocks, layout="wide", prefetch="off")  # built last: the process's setting is off
    prompt = tok("The history of the printing press begins", return_tensors="pt").input_ids
    assert torch.equal(generate(on, prompt, 8), generate(off, prompt, 8))
    Q.set_prefetch(0)
    on(prompt)
    assert Q.set_prefetch(0) == Q.PREFETCH_BYTES, "the engine did not apply its own prefetch setting"


@pytest.mark.model
def test_the_quick_benchmark_runs_as_documented():
    out = subprocess.run([sys.executable, "benchmarks/quant.py", "--quick"], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr[-3000:]
    for row in ("lab F32 (lib.modeling.llama)", "GGUF blocks, lib.modeling.llama", "GGUF blocks, fused", "Batch 8", "load average"):
        assert row in out.stdout, out.stdout
