"""Hugging Face folders into a checkpoint and weights checked against the config: every
missing or malformed file and every tensor that does not fit is a named error (the library's
error kept as the cause), and generation_config.json's EOS ids are read."""

import json
import re

import numpy as np
import pytest
from safetensors import SafetensorError
from safetensors.numpy import save_file

from tests.support.tiny_models import TINY_CHECKPOINT as TINY
from tests.support.tiny_models import TINY_CHECKPOINT_TIED
from tests.support.tiny_models import tiny_checkpoint_tensors as _tiny_tensors
from trt_kv.checkpoints import read_hf_folder
from trt_kv.errors import ArgumentError, ConfigError, DTypeError, ShapeError
from trt_kv.models.llama import llama_weights
from trt_kv.models.loading import load_model

TINY_CONFIG_JSON = {
    "model_type": "llama",
    "vocab_size": 11,
    "hidden_size": 8,
    "intermediate_size": 12,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 2,
    "tie_word_embeddings": False,
    "eos_token_id": 7,
}


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG_JSON))
    save_file(_tiny_tensors(), str(tmp_path / "model.safetensors"))
    return tmp_path


def test_a_folder_reads_config_tensors_and_eos(folder):
    checkpoint = read_hf_folder(folder)
    assert checkpoint.config == TINY_CONFIG_JSON
    assert sorted(checkpoint.tensors) == sorted(_tiny_tensors())
    assert checkpoint.eos_token_ids == (7,)  # no generation_config.json: config.json's


@pytest.mark.parametrize(("value", "ids"), [(5, (5,)), ([5, 9, 5], (5, 9)), (None, ())])
def test_generation_config_eos_ids_one_or_several(folder, value, ids):
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
    assert read_hf_folder(folder).eos_token_ids == ids


def test_bad_eos_id_is_named(folder):
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(ConfigError, match=r"generation_config\.json: eos_token_id: expected"):
        read_hf_folder(folder)


def test_missing_folder_is_a_config_error(tmp_path):
    with pytest.raises(
        ConfigError, match=r"^spec: expected .*a checkpoint folder or a \.gguf file, got missing '/"
    ):
        load_model(tmp_path / "absent")


def test_missing_config_json_is_a_config_error(folder):
    (folder / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"config\.json: expected a file, got missing"):
        read_hf_folder(folder)


def test_malformed_config_json_keeps_the_cause(folder):
    (folder / "config.json").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ConfigError, match="expected JSON") as info:
        read_hf_folder(folder)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def test_malformed_safetensors_keeps_the_cause(folder):
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ConfigError, match="expected a safetensors file") as info:
        read_hf_folder(folder)
    assert isinstance(info.value.__cause__, SafetensorError)


def test_a_shard_named_by_the_index_but_missing_is_named(folder):
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        ConfigError, match=re.escape("missing ['model-00002-of-00002.safetensors']")
    ):
        read_hf_folder(folder)


# -- weights against the config -----------------------------------------------------------


def test_integer_weight_is_a_dtype_error_naming_it():
    t = _tiny_tensors()
    t["model.layers.0.self_attn.q_proj.weight"] = np.ones((8, 8), np.int8)
    with pytest.raises(
        DTypeError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight: expected dtype"
    ):
        llama_weights(t, TINY)


def test_bfloat16_and_float16_weights_are_accepted():
    import ml_dtypes

    t = _tiny_tensors()
    t["model.norm.weight"] = t["model.norm.weight"].astype(ml_dtypes.bfloat16)
    t["lm_head.weight"] = t["lm_head.weight"].astype(np.float16)
    w = llama_weights(t, TINY)
    assert w.final_norm.dtype == ml_dtypes.bfloat16 and w.head.dtype == np.float16


def test_embedding_rows_not_the_vocab_size_is_a_shape_error():
    t = _tiny_tensors()
    t["model.embed_tokens.weight"] = np.zeros((12, 8), np.float32)  # vocab_size is 11
    with pytest.raises(ShapeError, match=r"model\.embed_tokens\.weight: expected shape \(11, 8\)"):
        llama_weights(t, TINY)


def test_a_layer_beyond_the_config_is_refused_not_dropped():
    t = _tiny_tensors()
    t["model.layers.2.mlp.up_proj.weight"] = np.zeros((12, 8), np.float32)  # 2 layers
    with pytest.raises(ConfigError, match=re.escape("extra ['model.layers.2.mlp.up_proj.weight']")):
        llama_weights(t, TINY)


def test_biases_are_refused_as_extra_tensors():
    t = _tiny_tensors()
    t["model.layers.0.self_attn.q_proj.bias"] = np.zeros(8, np.float32)
    with pytest.raises(ConfigError, match=r"extra \['model\.layers\.0\.self_attn\.q_proj\.bias'\]"):
        llama_weights(t, TINY)


def test_tensors_transformers_drops_on_load_are_ignored():
    tied = TINY_CHECKPOINT_TIED
    t = _tiny_tensors()
    # a stored head equal to the embedding: the same model tied or not (a different one is
    # refused: tests/models/test_tied_head.py)
    t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(1, np.float32)  # old saves
    w = llama_weights(t, tied)
    assert w.lm_head is None
    np.testing.assert_array_equal(w.head, t["model.embed_tokens.weight"])


def test_folder_without_tokenizer_names_the_way_out(folder):
    with pytest.raises(ConfigError, match=r"tokenizer\.json.*--prompt-ids"):
        read_hf_folder(folder).tokenizer()


@pytest.mark.parametrize("spec", [3, None, ""])
def test_a_model_spec_that_is_no_name_or_path_is_refused_by_name(spec):
    with pytest.raises(ArgumentError, match=rf"^spec: expected 'default', .*, got {spec!r}$"):
        load_model(spec)
