"""One random-weight Hugging Face model per GGUF architecture, odd sizes, 2 layers, written
as llama.cpp's converter writes it (import as ``from gguf_family_cases import ...``).

``HF_GGUF`` cases are ones transformers' own GGUF loader reads whole (its architecture list and
metadata keys, ``modeling_gguf_pytorch_utils``): it is their oracle. The others carry what that
loader does not read -- Gemma (not in its list), Phi-3's partial rotary and window (it reads
neither key), a window in a Mistral file, Llama 3.1's ``rope_freqs`` (dropped) -- and are
checked against the Hugging Face model the file was written from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import transformers

from tests.support.family_cases import CASES as FOLDER_CASES
from tests.support.gguf_files import write_family_gguf
from tests.support.hf_models import save_random_model


# case -> (config class, model class, config arguments, GGUF arch, writer arguments); most
# are the folder cases of ``family_cases`` (the same odd sizes), some with keys changed.
def _family(name: str, arch: str, writer: dict | None = None, **changed: object) -> tuple:
    config_class, model_class, args = FOLDER_CASES[name]
    return config_class, model_class, {**args, **changed}, arch, writer or {}


CASES = {
    # q/k/v biases, GQA 5:1, no window; matrices stored as F16 (the converter's default).
    "qwen2": _family(
        "qwen2_window",
        "qwen2",
        {"dtype": np.float16},
        use_sliding_window=False,
        sliding_window=None,
    ),
    # per-head q/k norms; head_dim 128 is the one transformers' loader assumes for qwen3 (it
    # does not read attention.key_length there), 3 heads of it over D = 44.
    "qwen3": _family(
        "qwen3_bias",
        "qwen3",
        hidden_size=44,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=128,
        attention_bias=False,
        tie_word_embeddings=False,
    ),
    # head_dim 12 != D / heads, biases on q/k/v/o, tied head.
    "qwen3_bias": _family("qwen3_bias", "qwen3"),
    # MistralForCausalLM as the converter writes it: arch llama, Q/K permuted; head_dim 10;
    # transformers loads it as a Llama too (its Mistral switch wants general.name == "mistral",
    # and then fails: gguf-py has no arch "mistral").
    "mistral": _family(
        "mistral_window", "llama", {"general.name": "Mistral Tiny"}, sliding_window=None
    ),
    # a newer file: arch mistral3 with a sliding window (4 < the 7-token prompt).
    "mistral3_window": _family("mistral_window", "mistral3", {"window": 4}),
    # norms stored as 1 + w, sqrt(D) embedding scale, GELU-tanh, tied head, head_dim 18.
    "gemma": _family("gemma", "gemma"),
    # fused attn_qkv / ffn_up, full rotary, no window (what transformers' loader reads).
    "phi3": _family(
        "phi3_partial_window",
        "phi3",
        sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    # partial rotary (6 of head_dim 12) and a window of 5 < 7.
    "phi3_partial_window": _family("phi3_partial_window", "phi3"),
    # longrope short factors, as rope_factors_short/long tensors; GQA 4:2, head_dim 8.
    "phi3_longrope": _family("phi3_longrope", "phi3"),
    # Llama 3.1 RoPE scaling, written as rope_freqs: head_dim 16 with theta 5e5 puts
    # frequencies in all three bands (kept, smoothed, divided by 8).
    "llama31_rope": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=44,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=131072,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        "llama",
        {},
    ),
}

HF_GGUF = ("qwen2", "qwen3", "mistral", "phi3")


def written_case(name: str, folder: Path) -> tuple[object, Path]:
    """``(hf_model, gguf path)``: case ``name``'s random-weight model, saved to ``folder`` with
    ``save_pretrained`` and written to ``folder / "gguf" / f"{name}.gguf"``."""
    config_class, model_class, args, arch, writer = CASES[name]
    config = config_class(num_hidden_layers=2, initializer_range=0.2, **args)
    model = save_random_model(model_class, config, folder)
    (folder / "gguf").mkdir()
    path = write_family_gguf(folder / "gguf" / f"{name}.gguf", model, arch, **writer)
    return model, path
