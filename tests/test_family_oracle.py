"""Every decoder family's NumPy reference against its Hugging Face class.

Each case is a random-weight Hugging Face model of odd sizes written with ``save_pretrained``
and read back through ``LlamaConfig.from_hf`` and ``load_hf_weights`` (Phi-3's fused
projections split on load). Expected values come from PyTorch: each prompt alone, unpadded,
recomputed from scratch; the reference runs both prompts as one right-padded batch through its
KV cache. Windowed cases use a window shorter than the longer prompt (7 tokens), so keys drop
out of the window in prefill and in every decode step.

Tolerance: float32 on both sides, ``1e-4 * max|logit|`` absolute (as the Llama oracle).
"""

import numpy as np
import pytest
import torch
import transformers
from hf_models import greedy_ids, save_random_model

from trt_kv.models.llama import LlamaConfig, load_hf_weights
from trt_kv.reference.llama import empty_caches, forward
from trt_kv.runtime import ReferenceBackend, Session, generate

RTOL_OF_SCALE = 1e-4
PROMPTS = [[5, 17, 3, 88, 42, 7, 9], [60, 1, 33]]  # ragged: the second is padded
S_MAX = 32

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


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, tmp_path_factory):
    """``(hf_model, config, weights)``: a saved and reloaded random Hugging Face model."""
    config_class, model_class, args = CASES[request.param]
    hf_config = config_class(num_hidden_layers=2, initializer_range=0.2, **args)
    folder = tmp_path_factory.mktemp(request.param)
    model = save_random_model(model_class, hf_config, folder)
    config = LlamaConfig.from_hf(folder)
    return model, config, load_hf_weights(folder, config)


# case -> the sliding window of layers 0 and 1 (None: full causal attention).
WINDOWS = {
    "qwen2_window": [None, 3],
    "qwen3_bias": [None, None],
    "mistral_window": [4, 4],
    "gemma": [None, None],
    "phi3_partial_window": [5, 5],
    "phi3_longrope": [None, None],
}


@pytest.mark.parametrize("name", list(CASES))
def test_windows_read_from_the_saved_config(name, tmp_path):
    config_class, _, args = CASES[name]
    config_class(num_hidden_layers=2, **args).save_pretrained(tmp_path)
    config = LlamaConfig.from_hf(tmp_path)
    assert config.model_type == config_class.model_type
    assert [config.window(i) for i in range(2)] == WINDOWS[name]


def test_prefill_logits_of_a_ragged_batch_match_hugging_face_per_prompt(case):
    model, config, weights = case
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    ids = np.zeros((2, lengths.max()), np.int32)
    for b, p in enumerate(PROMPTS):
        ids[b, : len(p)] = p
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    caches = empty_caches(config, 2, S_MAX)
    logits = forward(config, weights, ids, positions, caches, np.zeros(2, np.int32), lengths)
    for b, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            expected = model(torch.tensor([prompt])).logits[0].numpy()
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(
            logits[b, : len(prompt)], expected, rtol=0, atol=RTOL_OF_SCALE * scale
        )


def test_16_greedy_ids_of_a_ragged_batch_match_hugging_face_generate(case):
    model, config, weights = case
    session = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    ours = generate(session, PROMPTS, 16).ids
    theirs = greedy_ids(model, PROMPTS, 16)
    assert [len(t) for t in theirs] == [16, 16]
    assert ours == theirs
