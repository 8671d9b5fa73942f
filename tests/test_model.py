"""The reference model: it reads the real GGUF file right and matches transformers on the same weights."""
import pytest
import torch

from lib.bench import paths
from lib.modeling.generate import generate
from lib.modeling.llama import SMOLLM2_135M, LlamaModel, read_gguf_llama, tiny_model

pytestmark = pytest.mark.model


def _prompts(tokenizer):
    hamlet = (paths.TEXT_DIR / "hamlet.txt").read_text()
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Explain what a KV cache is."}],
                                         tokenize=False, add_generation_prompt=True)
    texts = ["The capital of France is", chat, hamlet[20000:23000]]
    ids = [tokenizer(t, return_tensors="pt").input_ids for t in texts]
    ids[2] = ids[2][:, :256]
    return ids


def test_gguf_metadata_gives_smollm2_config():
    cfg, state = read_gguf_llama(paths.smollm2_path())
    assert cfg == SMOLLM2_135M
    model_keys = set(LlamaModel(cfg).state_dict())
    assert set(state) == model_keys
    assert all(v.dtype == torch.float32 for v in state.values())


def test_fast_load_cache_holds_the_gguf_weights(smollm2):
    """The cache `lib.modeling.fetch` builds is the GGUF file's weights, bit for bit."""
    model, _ = smollm2
    cfg, state = read_gguf_llama(paths.smollm2_path())
    ours = model.state_dict()
    for name in ["embed.weight", "layers.0.attn.q_proj.weight", "layers.29.mlp.down_proj.weight", "norm.weight"]:
        assert torch.equal(ours[name], state[name]), name


def test_logits_match_transformers(smollm2, hf_smollm2):
    model, tok = smollm2
    prompts = _prompts(tok)
    assert prompts[2].shape[1] >= 200
    worst = 0.0
    with torch.no_grad():
        for ids in prompts:
            diff = (model(ids) - hf_smollm2(ids).logits.float()).abs().max().item()
            worst = max(worst, diff)
            assert diff <= 1e-3, f"max |logit difference| {diff:.2e} on a {ids.shape[1]}-token prompt"
    print(f"max |lib - transformers| logits over {len(prompts)} prompts: {worst:.2e}")


def test_greedy_generation_matches_transformers(smollm2, hf_smollm2):
    model, tok = smollm2
    ids = _prompts(tok)[1]
    ours = generate(model, ids, max_new_tokens=32, eos_token_id=tok.eos_token_id)
    theirs = hf_smollm2.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.eos_token_id)
    assert ours.shape[1] - ids.shape[1] == 32, "the chosen prompt should not hit eos within 32 tokens"
    assert torch.equal(ours, theirs), f"lib: {tok.decode(ours[0, ids.shape[1]:])!r}\nhf: {tok.decode(theirs[0, ids.shape[1]:])!r}"


def test_cached_equals_uncached_on_smollm2(smollm2):
    model, tok = smollm2
    ids = _prompts(tok)[0]
    a, la = generate(model, ids, 24, use_cache=True, return_logits=True)
    b, lb = generate(model, ids, 24, use_cache=False, return_logits=True)
    assert torch.equal(a, b)
    assert (la - lb).abs().max().item() <= 1e-4


def test_model_picks_gpu_when_present_and_cpu_otherwise():
    from lib.modeling.llama import default_device

    assert default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_too_long_input_is_a_clear_error():
    model = tiny_model(max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds"):
        generate(model, torch.zeros(1, 10, dtype=torch.long), max_new_tokens=7)
    with pytest.raises(ValueError, match=r"\[batch, seq_len\]"):
        model(torch.zeros(5, dtype=torch.long))
