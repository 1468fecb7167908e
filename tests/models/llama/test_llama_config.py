"""Llama config and checkpoint loading: ``LlamaConfig.from_hf`` on transformers-5 and legacy
``config.json`` files, the SmolLM2-135M defaults, every unsupported field, and
``load_hf_weights`` on single and sharded safetensors checkpoints.

Checkpoints are written here with ``safetensors`` under Hugging Face names spelled out in
this file, so the loader's name mapping is checked against the names, not against itself.
"""

import json
import re

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.tiny_models import TINY_CHECKPOINT as TINY
from tests.support.tiny_models import TINY_CHECKPOINT_TIED
from tests.support.tiny_models import tiny_checkpoint_tensors as _tiny_tensors
from trt_kv.errors import ArgumentError, ConfigError, ShapeError
from trt_kv.models.llama import LlamaConfig, RopeScaling, load_hf_weights

# HuggingFaceTB/SmolLM2-135M config.json as published (transformers 4.40, legacy rope keys).
SMOLLM2_135M_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "vocab_size": 49152,
}

# What transformers 5 writes (save_pretrained): rope settings nested in rope_parameters.
TRANSFORMERS5_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "dtype": "float32",
    "eos_token_id": 2,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 40,
    "initializer_range": 0.2,
    "intermediate_size": 72,
    "max_position_embeddings": 2048,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 5,
    "num_hidden_layers": 2,
    "num_key_value_heads": 5,
    "pad_token_id": None,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "transformers_version": "5.23.0",
    "use_cache": True,
    "vocab_size": 97,
}

LLAMA3_ROPE = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LLAMA3_SCALING = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

# LayerWeights field -> Hugging Face name inside ``model.layers.{i}.``
LAYER_FIELDS = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


def _assert_weights_are(w, t):
    """Every array of ``w`` equals the tensor of ``t`` with its Hugging Face name."""
    np.testing.assert_array_equal(w.embed, t["model.embed_tokens.weight"])
    np.testing.assert_array_equal(w.final_norm, t["model.norm.weight"])
    np.testing.assert_array_equal(w.head, t["lm_head.weight"])
    assert len(w.layers) == 2
    for i, layer in enumerate(w.layers):
        for field, name in LAYER_FIELDS.items():
            np.testing.assert_array_equal(getattr(layer, field), t[f"model.layers.{i}.{name}"])


# -- LlamaConfig defaults ---------------------------------------------------------------------


def test_defaults_are_the_smollm2_135m_shape():
    assert LlamaConfig().to_json() == {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    }


def test_smollm2_135m_preset_equals_the_defaults():
    assert LlamaConfig.smollm2_135m() == LlamaConfig()


def test_to_json_round_trips_with_llama3_scaling():
    c = LlamaConfig(rope_theta=500000.0, rope_scaling=LLAMA3_SCALING)
    assert LlamaConfig.from_json(json.loads(json.dumps(c.to_json()))) == c


# -- from_hf: reading config.json -------------------------------------------------------------


def test_from_hf_reads_the_published_smollm2_135m_config_into_the_defaults():
    assert LlamaConfig.from_hf(SMOLLM2_135M_CONFIG_JSON) == LlamaConfig()


def test_from_hf_reads_a_config_json_path_and_its_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_135M_CONFIG_JSON))
    assert LlamaConfig.from_hf(tmp_path / "config.json") == LlamaConfig()
    assert LlamaConfig.from_hf(str(tmp_path)) == LlamaConfig()


@pytest.mark.parametrize("source", [None, 3, b"config.json"])
def test_from_hf_refuses_a_source_that_is_no_dict_str_or_path(source):
    with pytest.raises(ArgumentError) as err:
        LlamaConfig.from_hf(source)
    assert str(err.value) == (
        "source: expected a config dict, or a config.json file or its folder, got "
        + type(source).__name__
    )


def test_from_hf_reads_transformers5_rope_parameters():
    assert LlamaConfig.from_hf(TRANSFORMERS5_CONFIG_JSON) == LlamaConfig(
        vocab_size=97,
        hidden_size=40,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=5,
        num_key_value_heads=5,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=500000.0,
        rope_scaling=None,
        tie_word_embeddings=False,
        max_position_embeddings=2048,
    )


def test_from_hf_reads_transformers5_llama3_rope_parameters():
    d = {
        **TRANSFORMERS5_CONFIG_JSON,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_ROPE},
    }
    c = LlamaConfig.from_hf(d)
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == LLAMA3_SCALING


@pytest.mark.parametrize("type_key", ["rope_type", "type"])
def test_from_hf_reads_legacy_llama3_rope_scaling(type_key):
    d = {
        **SMOLLM2_135M_CONFIG_JSON,
        "rope_theta": 500000.0,
        "rope_scaling": {type_key: "llama3", **LLAMA3_ROPE},
    }
    c = LlamaConfig.from_hf(d)
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == LLAMA3_SCALING


MINIMAL = {
    "vocab_size": 97,
    "hidden_size": 40,
    "intermediate_size": 72,
    "num_hidden_layers": 2,
    "num_attention_heads": 5,
}


def test_from_hf_missing_optional_fields_take_hugging_face_defaults():
    c = LlamaConfig.from_hf(MINIMAL)
    assert c.num_key_value_heads == 5  # MHA
    assert c.head_dim == 8  # hidden_size // num_attention_heads
    assert c.rope_theta == 10000.0
    assert c.rope_scaling is None
    assert c.rms_norm_eps == 1e-6
    assert c.tie_word_embeddings is False
    assert c.max_position_embeddings == 2048


# -- from_hf: every unsupported field is a ConfigError naming it --------------------------


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("model_type", "mixtral", "model_type.*mixtral"),
        ("hidden_act", "gelu", "hidden_act"),
        ("attention_bias", True, "attention_bias"),
        ("mlp_bias", True, "mlp_bias"),
        (
            "rope_parameters",
            {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
            "rope_type.*yarn",
        ),
        ("sliding_window", 4096, "sliding_window"),
    ],
    ids=[
        "model_type_mixtral",
        "hidden_act_gelu",
        "attention_bias",
        "mlp_bias",
        "rope_yarn",
        "sliding_window",
    ],
)
def test_from_hf_unsupported_field_raises_config_error_naming_it(field, value, named):
    with pytest.raises(ConfigError, match=named):
        LlamaConfig.from_hf({**TRANSFORMERS5_CONFIG_JSON, field: value})


@pytest.mark.parametrize(
    ("rope_scaling", "named"),
    [
        ({"type": "linear", "factor": 2.0}, "rope_type.*linear"),
        ({"rope_type": "dynamic", "factor": 2.0}, "rope_type.*dynamic"),
    ],
    ids=["linear", "dynamic"],
)
def test_from_hf_unsupported_legacy_rope_scaling_raises_config_error_naming_it(rope_scaling, named):
    with pytest.raises(ConfigError, match=named):
        LlamaConfig.from_hf({**SMOLLM2_135M_CONFIG_JSON, "rope_scaling": rope_scaling})


def test_from_hf_heads_not_a_multiple_of_kv_heads_raises():
    d = {**SMOLLM2_135M_CONFIG_JSON, "num_key_value_heads": 4}  # 9 % 4 != 0
    with pytest.raises(ConfigError, match="num_attention_heads"):
        LlamaConfig.from_hf(d)


def test_heads_not_a_multiple_of_kv_heads_raises():
    with pytest.raises(ConfigError, match="num_attention_heads"):
        LlamaConfig(num_attention_heads=9, num_key_value_heads=2)


# -- load_hf_weights ----------------------------------------------------------------------


def test_load_hf_weights_maps_hugging_face_names(tmp_path):
    t = _tiny_tensors()
    save_file(t, str(tmp_path / "model.safetensors"))
    _assert_weights_are(load_hf_weights(tmp_path, TINY), t)


def test_load_hf_weights_tied_checkpoint_uses_the_embedding_as_head(tmp_path):
    t = _tiny_tensors()
    del t["lm_head.weight"]  # save_pretrained drops the tied head
    save_file(t, str(tmp_path / "model.safetensors"))
    tied = TINY_CHECKPOINT_TIED
    w = load_hf_weights(tmp_path, tied)
    assert w.lm_head is None
    np.testing.assert_array_equal(w.head, t["model.embed_tokens.weight"])


@pytest.mark.parametrize("name", ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"])
def test_load_hf_weights_missing_tensor_raises_config_error_naming_it(tmp_path, name):
    t = _tiny_tensors()
    del t[name]
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=re.escape(name)):
        load_hf_weights(tmp_path, TINY)


def test_load_hf_weights_wrong_shape_raises_shape_error_naming_it(tmp_path):
    t = _tiny_tensors()
    t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 8), np.float32)  # MHA-sized
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(ShapeError, match=re.escape("model.layers.0.self_attn.k_proj.weight")):
        load_hf_weights(tmp_path, TINY)


def test_load_hf_weights_without_safetensors_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match=re.escape("model.safetensors")):
        load_hf_weights(tmp_path, TINY)


def test_sharded_checkpoint_loads_the_same_as_a_single_file(tmp_path):
    t = _tiny_tensors()
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    single.mkdir()
    sharded.mkdir()
    save_file(t, str(single / "model.safetensors"))
    names = sorted(t)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for file, keys in shards.items():
        save_file({k: t[k] for k in keys}, str(sharded / file))
    index = {
        "metadata": {"total_size": sum(a.nbytes for a in t.values())},
        "weight_map": {k: file for file, keys in shards.items() for k in keys},
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))

    assert len({file for file in index["weight_map"].values()}) == 2
    _assert_weights_are(load_hf_weights(single, TINY), t)
    _assert_weights_are(load_hf_weights(sharded, TINY), t)


def test_llama3_rope_with_a_missing_field_names_it():
    cfg = {**MINIMAL, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}
    with pytest.raises(ConfigError, match=r"llama3.*missing.*low_freq_factor"):
        LlamaConfig.from_hf(cfg)


@pytest.mark.parametrize("key", ["vocab_size", "num_attention_heads"])
def test_missing_required_field_names_it(key):
    cfg = {k: v for k, v in MINIMAL.items() if k != key}
    with pytest.raises(ConfigError, match=rf"got missing \['{key}'\]"):
        LlamaConfig.from_hf(cfg)


def test_legacy_rope_scaling_replaces_rope_parameters():
    cfg = {
        **MINIMAL,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    with pytest.raises(ConfigError, match="linear"):
        LlamaConfig.from_hf(cfg)
