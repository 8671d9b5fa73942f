"""lib.modeling.fast.FastLlama, and lib.modeling.llama.LlamaModel after lib.modeling.fast_kernels.pack_linears, are the same function as lib.modeling.llama.LlamaModel: greedy tokens identical, logits within
1e-4 + 1e-5·|logit| (fp32 sums taken in another order: the packed oneDNN path's largest difference on SmolLM2
was 1.02e-4, on a logit of 15.4, a relative 7e-6)."""
import copy

import pytest
import torch
import torch.nn as nn

from lib.gguf import qmatmul as Q
from lib.modeling.fast import FastLlama
from lib.modeling.fast_kernels import PackedLinear, can_pack, choose_kernel, kernels_for, pack_linears
from lib.modeling.generate import generate
from lib.modeling.llama import tiny_model
from lib.bench.roofline import matmul_params


PACKED = [False] + ([True] if can_pack("cpu", torch.float32) else [])
KERNELS = kernels_for([torch.zeros(16, 16)])  # cpp (with a C++ compiler), packed (oneDNN), plain
if Q._compiler() is not None:
    assert "cpp" in KERNELS, "the C++ kernel did not build, though this machine has a compiler"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_tiny_logits_cached_and_uncached(n_heads, n_kv_heads, kernel):
    model = tiny_model(seed=n_heads + n_kv_heads, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=48 if n_heads == 6 else 64)
    fast = FastLlama(model, kernel=kernel)
    assert fast.kernel == kernel and fast.packed == (kernel == "packed")
    assert (fast._step is not None) == (kernel == "cpp")
    ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), model(ids), atol=1e-4, rtol=0)
        c_ref, c_fast = model.new_cache(2, 32), fast.new_cache(2, 32)
        for chunk in (ids[:, :5], ids[:, 5:8], ids[:, 8:9], ids[:, 9:]):  # prefill, a 3-token verify, decode
            torch.testing.assert_close(fast(chunk, cache=c_fast), model(chunk, cache=c_ref), atol=1e-4, rtol=0)
    assert torch.equal(generate(fast, ids, 24), generate(model, ids, 24))
    assert torch.equal(generate(fast, ids, 8, use_cache=False), generate(model, ids, 8))


@pytest.mark.skipif(not can_pack("cpu", torch.float32), reason="oneDNN weight packing needs an fp32 CPU build with it")
@pytest.mark.parametrize("tie", [True, False])
def test_pack_linears_keeps_the_function_and_is_never_stale(tie):
    ref = tiny_model(seed=3, n_heads=4, n_kv_heads=2, tie_embeddings=tie)
    model = pack_linears(copy.deepcopy(ref))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)
    assert (model.lm_head is None) == tie  # a tied head stays F.linear(x, embed.weight)
    assert list(model.state_dict()) == list(ref.state_dict())  # same keys: copies made from it still load
    assert matmul_params(model) == matmul_params(ref)  # the roofline still counts each weight once
    ids = torch.randint(0, ref.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids), atol=1e-4, rtol=0)
        c_ref, c_model = ref.new_cache(2, 16), model.new_cache(2, 16)
        for chunk in (ids[:, :6], ids[:, 6:9], ids[:, 9:10], ids[:, 10:]):
            torch.testing.assert_close(model(chunk, cache=c_model), ref(chunk, cache=c_ref), atol=1e-4, rtol=0)
    assert torch.equal(generate(model, ids, 16), generate(ref, ids, 16))
    with torch.no_grad():  # a weight changed in place, or replaced, after packing: the next call sees it
        for m in (ref, model):
            m.layers[0].mlp.down_proj.weight.mul_(-3.0)
            m.layers[1].attn.o_proj.weight = nn.Parameter(torch.ones_like(m.layers[1].attn.o_proj.weight) * 0.01)
        torch.testing.assert_close(model(ids), ref(ids), atol=1e-4, rtol=0)
    x = torch.randn(3, ref.config.d_model, requires_grad=True)  # training still works: F.linear with autograd
    model.layers[0].attn.q_proj(x).square().sum().backward()
    assert x.grad is not None and model.layers[0].attn.q_proj.weight.grad is not None


def test_pack_linears_changes_nothing_where_packing_does_not_apply():
    for model in (tiny_model(seed=0).to(torch.bfloat16), tiny_model(seed=0).to("meta")):
        pack_linears(model)
        assert not any(isinstance(m, PackedLinear) for m in model.modules())
        assert model.lm_head is None


def test_bad_input_and_overflow_are_clear_errors():
    fast = FastLlama(tiny_model(seed=0))
    with pytest.raises(ValueError, match="input_ids must be"):
        fast(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="max_seq_len"):
        fast(torch.zeros(1, fast.config.max_seq_len + 1, dtype=torch.long))


def test_packed_is_chosen_only_where_it_applies():
    assert not FastLlama(tiny_model(seed=0), dtype=torch.bfloat16).packed  # oneDNN's packing is for fp32 here
    with pytest.raises(ValueError, match="packed=True needs float32"):
        FastLlama(tiny_model(seed=0), dtype=torch.bfloat16, packed=True)
    assert not FastLlama(tiny_model(seed=0), compile=True).packed  # inductor cannot lower the packed op
    if can_pack("cpu", torch.float32):
        with pytest.raises(ValueError, match="cannot be combined with compile"):
            FastLlama(tiny_model(seed=0), compile=True, packed=True)


def test_meta_device_creates_nothing_on_the_cpu():
    model = tiny_model(seed=0).to("meta")
    fast = FastLlama(model)
    assert not fast.packed
    out = fast(torch.zeros(1, 3, dtype=torch.long, device="meta"), cache=fast.new_cache(1, 8))
    assert out.device.type == "meta" and out.shape == (1, 3, model.config.vocab_size)


@pytest.mark.model
@pytest.mark.parametrize("kernel", KERNELS)
def test_smollm2_logits_and_64_greedy_tokens(smollm2, kernel):
    model, tok = smollm2
    fast = FastLlama(model, kernel=kernel)
    ids = torch.tensor([tok.encode("The history of the printing press begins")])
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), model(ids), atol=1e-4, rtol=1e-5)
    assert torch.equal(generate(fast, ids, 64), generate(model, ids, 64))


# --- item 9: the kernel, chosen by measuring; the one-call C++ step -----------------------------------------------

@pytest.mark.skipif("cpp" not in KERNELS, reason="no C++ compiler: the one-call step is C++")
def test_the_cpp_kernel_decodes_and_verifies_in_one_call(monkeypatch):
    """kernel="cpp": a one-token step on lib.modeling.kv_cache's cache (any batch), and a multi-token step of up to
    `step_max_rows` rows (batch x new tokens), runs no Python layer step at all — decode steps and verify steps alike (the layer step is
    switched off after the prefill, and the logits are still lib.modeling.llama's, for every row of a batch and every
    new position: the causal mask inside the new tokens holds); a larger step runs the Python step; a rolling
    cache takes the Python step."""
    from lib.modeling.kv_cache import KVCache

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the kernel's two-thread split runs
    model = tiny_model(seed=5, n_heads=4, n_kv_heads=2, d_model=64)
    fast = FastLlama(model, kernel="cpp")
    assert fast.step_max_rows == Q.F32_MAX_ROWS
    ids = torch.randint(0, model.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(3))
    c_ref, c_fast = model.new_cache(3, 40), fast.new_cache(3, 40)
    with torch.no_grad():
        torch.testing.assert_close(fast(ids[:, :8], c_fast), model(ids[:, :8], c_ref), atol=1e-4, rtol=0)
        python_step = fast._layer
        fast._layer = lambda *a: pytest.fail("a step of at most step_max_rows rows ran lib.modeling.fast's Python layer step")
        for i in range(8, 10):
            logits, hidden = fast.forward_hidden(ids[:, i:i + 1], c_fast)
            torch.testing.assert_close(logits, model(ids[:, i:i + 1], c_ref), atol=1e-4, rtol=0)
            assert hidden.shape == (3, 1, model.config.d_model) and c_fast.length == i + 1
        for start, t in ((10, 2), (12, 4)):  # verify steps of 6 and 12 rows: one C++ call each
            logits, hidden = fast.forward_hidden(ids[:, start:start + t], c_fast)
            torch.testing.assert_close(logits, model(ids[:, start:start + t], c_ref), atol=1e-4, rtol=0)
            assert hidden.shape == (3, t, model.config.d_model) and c_fast.length == start + t
        for a, b in zip(c_fast.layers, c_ref.layers):  # the keys and values it wrote, at their positions
            torch.testing.assert_close(a.k[:, :, :16], b.k[:, :, :16], atol=1e-5, rtol=0)
            torch.testing.assert_close(a.v[:, :, :16], b.v[:, :, :16], atol=1e-5, rtol=0)
        calls = []
        fast._layer = lambda *a, f=python_step: calls.append(1) or f(*a)
        c_ref.truncate(12)
        c_fast.truncate(12)
        torch.testing.assert_close(fast(ids[:, 12:17], c_fast), model(ids[:, 12:17], c_ref), atol=1e-4, rtol=0)
        assert len(calls) == len(fast.layers), "15 rows (over step_max_rows): the Python step, layer by layer"
        wide = torch.randint(0, model.config.vocab_size, (16, 5), generator=torch.Generator().manual_seed(4))
        c_wide, c_wide_ref = fast.new_cache(16, 8), model.new_cache(16, 8)
        fast(wide[:, :4], c_wide)
        model(wide[:, :4], c_wide_ref)
        calls.clear()  # a one-token step of 16 rows: still one C++ call, whatever the batch
        torch.testing.assert_close(fast(wide[:, 4:], c_wide), model(wide[:, 4:], c_wide_ref), atol=1e-4, rtol=0)
        assert not calls, "a one-token step of a batch of 16 ran the Python layer step"
        fast._layer = python_step
        rolling = KVCache.rolling(model.config, 40, batch=3)
        fast(ids[:, :8], rolling)
        assert fast._cache_pointers(rolling) is None
        full = fast.new_cache(3, 40)
        fast(ids[:, :8], full)
        torch.testing.assert_close(fast(ids[:, 8:9], rolling), fast(ids[:, 8:9], full), atol=1e-5, rtol=0)


def test_choose_kernel_measures_once_remembers_and_obeys_the_override(tmp_path, monkeypatch):
    """Over 64 MB of weights the kernels are timed and the fastest remembered (the second call reads the file);
    INFERENCE_LAB_FAST_KERNEL forces one, refuses one that cannot run here, and `measure` times again; a busy
    machine gets the default, unmeasured and not remembered; tiny weights are not measured."""
    cache = tmp_path / "fast_kernels.json"
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(2048, 2048, generator=gen) for _ in range(5)]  # 80 MB, over MEASURE_MIN_BYTES
    avail = kernels_for(weights)
    monkeypatch.delenv("INFERENCE_LAB_FAST_KERNEL", raising=False)
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 9.0, 9.0))
    kernel, why = choose_kernel(weights, cache, repeats=1)
    assert kernel == avail[0] and "not measured: load average 9.0" in why and not cache.exists()
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))
    kernel, why = choose_kernel(weights, cache, repeats=1)
    assert kernel in avail and why.startswith(f"{kernel}: measured now") and all(k in why for k in avail)
    again, why2 = choose_kernel(weights, cache, repeats=1)
    assert again == kernel and "measured on this machine" in why2
    for k in avail:
        monkeypatch.setenv("INFERENCE_LAB_FAST_KERNEL", k)
        assert choose_kernel(weights, cache) == (k, f"INFERENCE_LAB_FAST_KERNEL={k}")
    monkeypatch.setenv("INFERENCE_LAB_FAST_KERNEL", "measure")
    assert "measured now" in choose_kernel(weights, cache, repeats=1)[1]
    monkeypatch.setenv("INFERENCE_LAB_FAST_KERNEL", "fastest")
    with pytest.raises(ValueError, match="use one of cpp, packed, plain or measure"):
        choose_kernel(weights, cache)
    monkeypatch.setenv("INFERENCE_LAB_FAST_KERNEL", "cpp")
    with pytest.raises(ValueError, match="cannot run here"):  # a width the C++ loops do not take
        choose_kernel([torch.randn(8, 20)], cache)
    monkeypatch.delenv("INFERENCE_LAB_FAST_KERNEL")
    kernel, why = choose_kernel([torch.randn(8, 32)], cache)
    assert kernel == kernels_for([torch.randn(8, 32)])[0] and "too small to measure" in why


@pytest.mark.model
def test_smollm2_chooses_its_kernel_by_timing_whole_steps(smollm2, tmp_path, monkeypatch):
    """On the real model the choice is measured on whole steps of it (not skipped as tiny), remembered, and read
    back by the next FastLlama; the chosen kernel is one that runs here."""
    from lib.bench import paths

    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    monkeypatch.setenv("INFERENCE_LAB_FAST_KERNEL", "measure")  # a loaded test machine would otherwise not time
    model, _ = smollm2
    fast = FastLlama(model)
    assert fast.kernel in KERNELS and "measured now" in fast.kernel_reason
    assert "a step at 1 and 4 rows" in fast.kernel_reason and all(k in fast.kernel_reason for k in KERNELS)
    monkeypatch.delenv("INFERENCE_LAB_FAST_KERNEL")
    again = FastLlama(model)
    assert again.kernel == fast.kernel and "measured on this machine" in again.kernel_reason


def test_weights_are_copied_onto_one_buffer_of_large_pages():
    """Item 10: the "cpp" and "plain" kernels' weights lie in one buffer starting on a 2 MB boundary, which Linux
    was asked to back with 2 MB pages (smaps says the region is eligible where transparent huge pages are
    `madvise` or `always`); the model's own weights are left alone."""
    import re

    from lib.bench.roofline import HUGE_PAGE, huge_page_empty

    model = tiny_model(seed=1)
    for kernel in [k for k in KERNELS if k != "packed"]:
        fast = FastLlama(model, kernel=kernel)
        ws = [lw[k] for lw in fast.layers for k in ("wqkv", "wo", "w_gate_up", "w_down")] + [fast.lm_head]
        base = ws[0].untyped_storage().data_ptr()
        assert all(w.untyped_storage().data_ptr() == base for w in ws) and ws[0].data_ptr() % HUGE_PAGE == 0
        assert fast.lm_head.data_ptr() != model.embed.weight.data_ptr()
    buf = huge_page_empty(8 * HUGE_PAGE)
    assert buf.numel() == 8 * HUGE_PAGE and buf.data_ptr() % HUGE_PAGE == 0
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
        smaps = open("/proc/self/smaps").read()
    except OSError:
        pytest.skip("no transparent huge pages here (not Linux)")
    if "[never]" in mode or "THPeligible" not in smaps:
        pytest.skip(f"transparent huge pages are off here ({mode.strip()})")
    addr = buf.data_ptr()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", smaps):
        lo, hi = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
        if lo <= addr < hi:
            assert re.search(r"THPeligible:\s+1", block), f"the buffer's mapping is not eligible for 2 MB pages:\n{block}"
            break
    else:
        pytest.fail("the buffer's address is in no mapping of /proc/self/smaps")


def test_kernel_and_packed_arguments_are_checked():
    model = tiny_model(seed=0)
    assert FastLlama(model, packed=False).kernel == "plain"
    with pytest.raises(ValueError, match="disagree"):
        FastLlama(model, packed=True, kernel="plain")
    with pytest.raises(ValueError, match="kernel must be one of"):
        FastLlama(model, kernel="avx512")
    with pytest.raises(ValueError, match="kernel='cpp' needs float32"):
        FastLlama(model, dtype=torch.bfloat16, kernel="cpp")
    odd = tiny_model(seed=0, d_model=40, n_heads=4, n_kv_heads=2)  # 40 inputs: not a multiple of 16
    assert FastLlama(odd).kernel != "cpp"


# --- item 8: the decode step CUDA graphs replay -----------------------------------------------------------------
# On the CPU the replayed step's code runs uncaptured (GraphedDecode(capture=False)): the same buffers, windows,
# index_copy_ writes and masks a graph replays, checked against lib.modeling.llama. On a GPU the tests below capture.

def _windowed(model, bucket, monkeypatch, packed=False):
    import lib.modeling.fast_graphs as graphs_mod
    monkeypatch.setattr(graphs_mod, "GRAPH_BUCKET", bucket)
    fast = FastLlama(model, packed=packed)
    fast.graphs = graphs_mod.GraphedDecode(fast, capture=False)
    return fast


@pytest.mark.parametrize("bucket", [1, 4, 256])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 1), (6, 3)])
def test_replayed_decode_step_is_the_model(n_heads, n_kv_heads, bucket, monkeypatch):
    model = tiny_model(seed=7 + n_heads, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=48 if n_heads == 6 else 64)
    fast = _windowed(model, bucket, monkeypatch)
    ids = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        c_ref, c_fast = model.new_cache(2, 13), fast.new_cache(2, 13)
        torch.testing.assert_close(fast(ids, cache=c_fast), model(ids, cache=c_ref), atol=1e-4, rtol=0)
        x = ids[:, -1:]
        for step in range(8):  # windows of 1, 4 or 256 positions, capped at the cache's 13
            want, got = model(x, cache=c_ref), fast(x, cache=c_fast)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
            assert c_fast.length == c_ref.length == 6 + step
            x = want[:, -1].argmax(-1, keepdim=True)
        c_ref.truncate(8), c_fast.truncate(8)  # a speculative rollback, then decode again over stale slots
        torch.testing.assert_close(fast(x, cache=c_fast), model(x, cache=c_ref), atol=1e-4, rtol=0)
    widths = set(c_fast.graph_slot.graphs)
    assert widths == ({13} if bucket == 256 else {min(13, -(-n // bucket) * bucket) for n in range(6, 15)} - {14})
    assert torch.equal(generate(fast, ids, 20), generate(model, ids, 20))


def test_replayed_caches_recycle_their_buffers_and_never_share_them(monkeypatch):
    model = tiny_model(seed=1, n_heads=4, n_kv_heads=2)
    fast = _windowed(model, 4, monkeypatch)
    a = fast.new_cache(1, 10)
    b = fast.new_cache(1, 10)  # both alive: different buffers
    assert a.graph_slot is not b.graph_slot and a[0].k.data_ptr() != b[0].k.data_ptr()
    slot = a.graph_slot
    del a
    c = fast.new_cache(1, 10)  # a's buffers (and the graphs captured on them) come back, empty
    assert c.graph_slot is slot and c.length == 0 and fast.graphs.owns(c)
    c.layers[0] = type(c.layers[0])(1, 2, 10, model.config.head_dim)  # a layer swapped out: not replayed
    assert not fast.graphs.owns(c)
    assert fast.new_cache(1, 11).graph_slot is not slot  # another shape: other buffers
    with torch.no_grad():  # the step's errors are the eager path's
        full = fast.new_cache(1, 2)
        fast(torch.tensor([[1, 2]]), cache=full)
        with pytest.raises(ValueError, match="overflow"):
            fast(torch.tensor([[3]]), cache=full)
    with pytest.raises(ValueError, match="CUDA"):
        FastLlama(model, graphs=True)
    assert FastLlama(model).graphs is None  # on a CPU nothing is captured


@pytest.mark.model
def test_smollm2_replayed_decode_64_greedy_tokens(smollm2, monkeypatch):
    model, tok = smollm2
    fast = _windowed(model, 16, monkeypatch, packed=PACKED[-1])
    ids = torch.tensor([tok.encode("The history of the printing press begins")])
    assert torch.equal(generate(fast, ids, 64), generate(model, ids, 64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch", [1, 3])
def test_cuda_graph_decode_is_the_model(batch):
    model = tiny_model(seed=2, n_heads=4, n_kv_heads=2).to("cuda")
    fast = FastLlama(model)
    assert fast.graphs is not None and fast.graphs.capture
    ids = torch.randint(0, model.config.vocab_size, (batch, 7), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    with torch.no_grad():
        want, got = generate(model, ids, 40, return_logits=True), generate(fast, ids, 40, return_logits=True)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-5)
    captured = fast.graphs.captures
    assert captured >= 1 and fast.graphs.replays >= 39 - captured
    assert torch.equal(generate(fast, ids, 40), want[0])  # the recycled cache: replayed, not captured again
    assert fast.graphs.captures == captured


@pytest.mark.model
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_smollm2_cuda_graph_decode_64_greedy_tokens():
    from lib.modeling.llama import load_smollm2
    model, tok = load_smollm2(device="cuda")
    fast = FastLlama(model)
    ids = torch.tensor([tok.encode("The history of the printing press begins")], device="cuda")
    assert torch.equal(generate(fast, ids, 64), generate(model, ids, 64))
    assert fast.graphs.captures >= 1
