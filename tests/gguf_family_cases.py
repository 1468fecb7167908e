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
from gguf_files import write_family_gguf
from hf_models import save_random_model

# case -> (config class, model class, config arguments, GGUF arch, writer arguments)
CASES = {
    # q/k/v biases, GQA 5:1; matrices stored as F16 (the converter's default outtype).
    "qwen2": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(
            vocab_size=97,
            hidden_size=40,
            intermediate_size=72,
            num_attention_heads=5,
            num_key_value_heads=1,
        ),
        "qwen2",
        dict(dtype=np.float16),
    ),
    # per-head q/k norms; head_dim 128 is the one transformers' loader assumes for qwen3 (it
    # does not read attention.key_length there), 3 heads of it over D = 44.
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(
            vocab_size=101,
            hidden_size=44,
            intermediate_size=56,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=128,
        ),
        "qwen3",
        {},
    ),
    # head_dim 12 != D / heads, biases on q/k/v/o, tied head.
    "qwen3_bias": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(
            vocab_size=101,
            hidden_size=40,
            intermediate_size=56,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            attention_bias=True,
            tie_word_embeddings=True,
        ),
        "qwen3",
        {},
    ),
    # MistralForCausalLM as the converter writes it: arch llama, Q/K permuted; head_dim 10;
    # transformers loads it as a Llama too (its Mistral switch wants general.name == "mistral",
    # and then fails: gguf-py has no arch "mistral").
    "mistral": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        dict(
            vocab_size=89,
            hidden_size=36,
            intermediate_size=60,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=10,
            sliding_window=None,
        ),
        "llama",
        {"general.name": "Mistral Tiny"},
    ),
    # a newer file: arch mistral3 with a sliding window (4 < the 7-token prompt).
    "mistral3_window": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        dict(
            vocab_size=89,
            hidden_size=36,
            intermediate_size=60,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=10,
            sliding_window=4,
        ),
        "mistral3",
        {"window": 4},
    ),
    # norms stored as 1 + w, sqrt(D) embedding scale, GELU-tanh, tied head, head_dim 18.
    "gemma": (
        transformers.GemmaConfig,
        transformers.GemmaForCausalLM,
        dict(
            vocab_size=103,
            hidden_size=44,
            intermediate_size=76,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=18,
        ),
        "gemma",
        {},
    ),
    # fused attn_qkv / ffn_up, full rotary, no window (what transformers' loader reads).
    "phi3": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            vocab_size=91,
            hidden_size=36,
            intermediate_size=52,
            num_attention_heads=3,
            num_key_value_heads=3,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "phi3",
        {},
    ),
    # partial rotary (6 of head_dim 12) and a window of 5 < 7.
    "phi3_partial_window": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            vocab_size=91,
            hidden_size=36,
            intermediate_size=52,
            num_attention_heads=3,
            num_key_value_heads=3,
            sliding_window=5,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
        ),
        "phi3",
        {},
    ),
    # longrope short factors, as rope_factors_short/long tensors; GQA 4:2, head_dim 8.
    "phi3_longrope": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            vocab_size=91,
            hidden_size=32,
            intermediate_size=40,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=192,
            original_max_position_embeddings=48,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.5, 2.5, 4.0],
                "long_factor": [2.0, 3.0, 5.0, 8.0],
                "original_max_position_embeddings": 48,
            },
        ),
        "phi3",
        {},
    ),
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
