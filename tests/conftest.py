import pytest


@pytest.fixture(scope="session")
def smollm2():
    """The lab's SmolLM2 (fp32, CPU) and tokenizer, loaded once for the whole run."""
    from lib.model import load_smollm2

    return load_smollm2(device="cpu")


@pytest.fixture(scope="session")
def hf_smollm2():
    """transformers' LlamaForCausalLM, loaded by transformers itself from the same GGUF file."""
    from transformers import AutoModelForCausalLM

    from lib import paths
    from lib.fetch import check_smollm2

    check_smollm2()
    model = AutoModelForCausalLM.from_pretrained(str(paths.MODELS_DIR), gguf_file=paths.SMOLLM2_FILE)
    return model.eval()
