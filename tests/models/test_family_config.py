"""Family switches read from config.json, and what each family refuses by name."""

import numpy as np
import pytest

from trt_kv._trt import trt
from trt_kv.builder import create_network
from trt_kv.errors import ArgumentError, ConfigError, ShapeError
from trt_kv.interpreter import execute
from trt_kv.models.family import FAMILIES
from trt_kv.models.layers.graph import Graph
from trt_kv.models.llama import LlamaConfig, rope_tables
from trt_kv.models.llama.rope import long_rope_after, rope_row_ids, rope_rows
from trt_kv.models.llama.rope_layers import add_rope
from trt_kv.models.llama.weights import split_fused

BASE = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_every_family_names_its_hugging_face_class():
    assert {k: f.architecture for k, f in FAMILIES.items()} == {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "mistral": "MistralForCausalLM",
        "gemma": "GemmaForCausalLM",
        "phi3": "Phi3ForCausalLM",
    }


@pytest.mark.parametrize("model_type", ["mixtral", "gemma2", "phi", "gpt2"])
def test_a_family_not_built_is_refused_by_name(model_type):
    with pytest.raises(ConfigError, match=f"model_type.*'{model_type}'"):
        LlamaConfig.from_hf({**BASE, "model_type": model_type})


def test_qwen2_window_layers_from_max_window_layers_as_transformers_does():
    c = LlamaConfig.from_hf(
        {
            **BASE,
            "model_type": "qwen2",
            "use_sliding_window": True,
            "sliding_window": 5,
            "max_window_layers": 2,
        }
    )
    assert [c.window(i) for i in range(3)] == [None, None, 5]
    assert c.qkv_bias and not c.o_bias


def test_qwen2_window_off_without_use_sliding_window():
    c = LlamaConfig.from_hf({**BASE, "model_type": "qwen2", "sliding_window": 5})
    assert [c.window(i) for i in range(3)] == [None, None, None]


def test_explicit_layer_types_choose_the_sliding_layers():
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    c = LlamaConfig.from_hf(
        {
            **BASE,
            "model_type": "qwen3",
            "use_sliding_window": True,
            "sliding_window": 7,
            "layer_types": types,
        }
    )
    assert [c.window(i) for i in range(3)] == [7, None, 7]
    assert LlamaConfig.from_json(c.to_json()) == c


def test_mistral_window_is_on_every_layer():
    c = LlamaConfig.from_hf({**BASE, "model_type": "mistral", "sliding_window": 6})
    assert [c.window(i) for i in range(3)] == [6, 6, 6]


def test_gemma_switches():
    c = LlamaConfig.from_hf({**BASE, "model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"})
    assert (c.norm_offset, c.activation, c.embed_scale) == (1.0, "gelu_tanh", True)


@pytest.mark.parametrize(
    ("d", "named"),
    [
        ({"model_type": "gemma", "hidden_act": "gelu"}, "hidden_act.*gelu"),
        ({"model_type": "qwen2", "attention_bias": True}, "attention_bias"),
        ({"model_type": "llama", "sliding_window": 4}, "sliding_window"),
        ({"model_type": "mistral", "sliding_window": 0}, "sliding_window"),
        ({"model_type": "mistral", "mlp_bias": True}, "mlp_bias"),
        ({"model_type": "qwen2", "layer_types": ["full_attention"]}, "layer_types"),
        ({"model_type": "qwen3", "layer_types": ["chunked_attention"] * 3}, "layer_types"),
        (
            {"model_type": "llama", "rope_parameters": {"rope_type": "longrope"}},
            "rope_type.*longrope",
        ),
        (
            {"model_type": "llama", "rope_parameters": {"partial_rotary_factor": 0.5}},
            r"partial_rotary_factor: expected 1.0 \(llama rotates the whole head\), got 0.5",
        ),
        (
            {"model_type": "qwen3", "rope_parameters": {"partial_rotary_factor": 0.25}},
            r"partial_rotary_factor: expected 1.0 \(qwen3 rotates the whole head\), got 0.25",
        ),
    ],
)
def test_switches_a_family_does_not_build_are_refused_by_name(d, named):
    with pytest.raises(ConfigError, match=named):
        LlamaConfig.from_hf({**BASE, **d})


PHI3_LONGROPE = {
    **BASE,
    "model_type": "phi3",
    "max_position_embeddings": 64,
    "original_max_position_embeddings": 16,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 2.0],
        "long_factor": [4.0, 8.0],
        "partial_rotary_factor": 0.5,
    },
}


def test_a_whole_head_factor_is_accepted_in_every_family():
    for model_type in FAMILIES:
        d = {**BASE, "model_type": model_type, "rope_parameters": {"partial_rotary_factor": 1.0}}
        assert LlamaConfig.from_hf(d).partial_rotary_factor == 1.0


def test_phi3_longrope_short_factors_and_attention_factor():
    c = LlamaConfig.from_hf(PHI3_LONGROPE)
    assert c.rotary_dim == 4  # int(8 * 0.5)
    assert c.rope_scaling.attention_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(16)))
    cos, _ = rope_tables(c, 16)
    # position 1: angle = 1 / (short_factor * 10000 ** (2i / 4)), times the attention factor
    angle = 1.0 / (np.array([1.0, 2.0]) * 10000.0 ** np.array([0.0, 0.5]))
    np.testing.assert_allclose(cos[1], np.cos(angle) * c.rope_scaling.attention_factor, rtol=1e-6)
    assert LlamaConfig.from_json(c.to_json()) == c


def test_phi3_longrope_past_the_original_length_stacks_the_long_table_after_the_short():
    c = LlamaConfig.from_hf(PHI3_LONGROPE)
    assert long_rope_after(c, 16) is None  # S_max 16 never passes 16: one table
    assert long_rope_after(c, 17) == 16
    cos, sin = rope_rows(c, 17)
    assert cos.shape == sin.shape == (34, 2)  # short rows 0..16, then long rows 17..33
    factor = c.rope_scaling.attention_factor
    short = 1.0 / (np.array([1.0, 2.0]) * 10000.0 ** np.array([0.0, 0.5]))
    long = 1.0 / (np.array([4.0, 8.0]) * 10000.0 ** np.array([0.0, 0.5]))
    np.testing.assert_allclose(cos[3], np.cos(3 * short) * factor, rtol=1e-6)
    np.testing.assert_allclose(sin[17 + 3], np.sin(3 * long) * factor, rtol=1e-6)
    # a sequence whose length after the step is 17 (> 16) reads the long rows, 16 the short
    rows = rope_row_ids(c, np.array([[15, 16], [14, 15]]), np.array([17, 16]), 17)
    np.testing.assert_array_equal(rows, [[32, 33], [14, 15]])


def test_add_rope_refuses_longrope_without_rope_lengths_before_adding_layers():
    _builder, network = create_network()  # the builder stays alive with the network
    positions = network.add_input("position_ids", trt.int64, (1, 4))
    c = LlamaConfig.from_hf(PHI3_LONGROPE)
    with pytest.raises(ArgumentError, match=r"rope_lengths: expected a \[B\] int32 .* got None"):
        add_rope(Graph(network, "float32"), "elementwise", c, positions, 17)
    assert network.num_layers == 0
    add_rope(Graph(network, "float32"), "elementwise", c, positions, 16)  # one table: unused
    assert network.num_layers > 0


def test_rope_table_rows_are_positions_plus_s_max_on_the_long_table():
    _builder, network = create_network()  # the builder stays alive with the network
    positions = network.add_input("position_ids", trt.int64, (2, 2))
    lengths = network.add_input("rope_lengths", trt.int32, (2,))
    c = LlamaConfig.from_hf(PHI3_LONGROPE)  # original length 16
    g = Graph(network, "float32")  # alive while the network is run: it holds the constants
    rope = add_rope(g, "rotary_layer", c, positions, 17, lengths)
    rope.table_rows.name = "rows"
    network.mark_output(rope.table_rows)
    feed = {"position_ids": np.array([[15, 16], [14, 15]]), "rope_lengths": np.array([17, 16])}
    rows = execute(
        network, {k: v.astype(np.int64 if k[0] == "p" else np.int32) for k, v in feed.items()}
    )
    np.testing.assert_array_equal(rows["rows"], [[32, 33], [14, 15]])  # long rows: + S_max 17


def test_phi3_fused_projections_split_in_order():
    c = LlamaConfig.from_hf({**BASE, "model_type": "phi3"})  # Nq*H = 32, Nkv*H = 16, F = 48
    qkv = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    gate_up = np.arange(96 * 32, dtype=np.float32).reshape(96, 32)
    out = split_fused(
        {
            "model.layers.0.self_attn.qkv_proj.weight": qkv,
            "model.layers.0.mlp.gate_up_proj.weight": gate_up,
            "model.norm.weight": np.ones(32, np.float32),
        },
        c,
    )
    p = "model.layers.0."
    np.testing.assert_array_equal(out[p + "self_attn.q_proj.weight"], qkv[:32])
    np.testing.assert_array_equal(out[p + "self_attn.k_proj.weight"], qkv[32:48])
    np.testing.assert_array_equal(out[p + "self_attn.v_proj.weight"], qkv[48:])
    np.testing.assert_array_equal(out[p + "mlp.gate_proj.weight"], gate_up[:48])
    np.testing.assert_array_equal(out[p + "mlp.up_proj.weight"], gate_up[48:])
    assert "model.norm.weight" in out and p + "self_attn.qkv_proj.weight" not in out


def test_phi3_fused_projection_of_the_wrong_size_raises():
    c = LlamaConfig.from_hf({**BASE, "model_type": "phi3"})
    with pytest.raises(ShapeError, match="qkv_proj"):
        split_fused({"model.layers.0.self_attn.qkv_proj.weight": np.zeros((63, 32))}, c)


def test_gemma_hidden_activation_of_transformers_4_must_agree_with_hidden_act():
    d = {**BASE, "model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"}
    same = LlamaConfig.from_hf({**d, "hidden_activation": "gelu_pytorch_tanh"})
    assert same.activation == "gelu_tanh"
    with pytest.raises(ConfigError, match=r"hidden_activation.*silu"):
        LlamaConfig.from_hf({**d, "hidden_activation": "silu"})
