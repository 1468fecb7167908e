"""One random-weight Hugging Face model per decoder family, odd sizes, 2 layers (import as
``from family_cases import ...``); windowed cases have windows shorter than the longer prompt.
"""

from __future__ import annotations

from pathlib import Path

import transformers

from tests.support.hf_models import save_random_model
from trt_kv.models.llama import LlamaConfig, LlamaWeights, load_hf_weights

PROMPTS = [[5, 17, 3, 88, 42, 7, 9], [60, 1, 33]]  # ragged: the second is padded

# case -> (Hugging Face config class, model class, config arguments); 2 layers each.
CASES = {
    # q/k/v biases; layer 1 slides (window 3 < 7), layer 0 is full (max_window_layers=1).
    "qwen2_window": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(
            vocab_size=97,
            hidden_size=40,
            intermediate_size=72,
            num_attention_heads=5,
            num_key_value_heads=1,
            use_sliding_window=True,
            sliding_window=3,
            max_window_layers=1,
        ),
    ),
    # per-head q/k RMSNorm; explicit head_dim 12 (4 * 12 != D = 40); attention_bias on q/k/v/o.
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
    ),
    # every layer slides (window 4 < 7); explicit head_dim 10.
    "mistral_window": (
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
    ),
    # sqrt(D) embedding scale, (1 + w) RMSNorm, GELU-tanh MLP, tied head, head_dim 18.
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
    ),
    # fused qkv/gate_up, partial rotary (6 of head_dim 12 rotate), window 5 < 7.
    "phi3_partial_window": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            vocab_size=91,
            hidden_size=36,
            intermediate_size=52,
            num_attention_heads=3,
            num_key_value_heads=3,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
            sliding_window=5,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # longrope short factors (every position < original 48) and its attention factor
    # sqrt(1 + ln(192 / 48) / ln(48)); GQA 4:2, head_dim 8.
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
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.5, 2.5, 4.0],
                "long_factor": [2.0, 3.0, 5.0, 8.0],
                "original_max_position_embeddings": 48,
            },
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
}


# case -> the sliding window of layers 0 and 1 (None: full causal attention).
WINDOWS = {
    "qwen2_window": [None, 3],
    "qwen3_bias": [None, None],
    "mistral_window": [4, 4],
    "gemma": [None, None],
    "phi3_partial_window": [5, 5],
    "phi3_longrope": [None, None],
}


def saved_family(name: str, folder: Path) -> tuple[object, LlamaConfig, LlamaWeights]:
    """``(hf_model, config, weights)`` of case ``name``: the Hugging Face model with seeded
    random weights, saved to ``folder`` with ``save_pretrained`` and read back by trt_kv."""
    config_class, model_class, args = CASES[name]
    hf_config = config_class(num_hidden_layers=2, initializer_range=0.2, **args)
    model = save_random_model(model_class, hf_config, folder)
    config = LlamaConfig.from_hf(folder)
    return model, config, load_hf_weights(folder, config)
