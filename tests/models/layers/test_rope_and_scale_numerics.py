"""Numerics that decide ids at long context: RoPE tables as Hugging Face computes them, and
the attention scale applied in float32.

Hugging Face computes RoPE angles in float32 (float32 inverse frequencies times float32
positions). The rounding of a float32 angle grows with the position, so at position 4000 a
float64 table differs from Hugging Face's by ~2e-4, about half a float16 ulp of cos near 1,
enough to flip roundings; trt_kv's tables stay within one float32 ulp (6e-8).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from trt_kv._trt import trt
from trt_kv.builder import create_network
from trt_kv.interpreter import execute
from trt_kv.models.layers.attention import scale_queries
from trt_kv.models.layers.graph import Graph
from trt_kv.models.llama import LlamaConfig, RopeScaling, rope_tables

FIRST, LAST = 4000, 4128  # positions compared
LLAMA3 = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
CASES = {
    "smollm2_theta_1e5_h64": (LlamaConfig(), {}),
    "llama3_theta_5e5_h128": (
        LlamaConfig(
            hidden_size=512,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=128,
            rope_theta=500000.0,
            rope_scaling=LLAMA3,
        ),
        {"rope_type": "llama3", **vars(LLAMA3)},
    ),
}


def _hugging_face_tables(config: LlamaConfig, rope_parameters: dict) -> tuple:
    rope = {"rope_type": "default", "rope_theta": config.rope_theta, **rope_parameters}
    hf = transformers.LlamaConfig(
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        head_dim=config.head_dim,
        max_position_embeddings=8192,
        rope_parameters=rope,
    )
    positions = torch.arange(FIRST, LAST)[None]
    cos, sin = LlamaRotaryEmbedding(hf)(torch.zeros(1, dtype=torch.float32), positions)
    half = config.head_dim // 2
    return cos[0, :, :half].numpy(), sin[0, :, :half].numpy()


def _float64_tables(config: LlamaConfig) -> tuple:
    """What trt_kv did before: a float64 table (default RoPE) rounded to float32 at the end."""
    h = config.head_dim
    angles = np.arange(FIRST, LAST)[:, None] / config.rope_theta ** (np.arange(0, h, 2) / h)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_rope_tables_stay_within_one_float32_ulp_of_hugging_face_past_position_4000(case):
    config, rope_parameters = CASES[case]
    hf_cos, hf_sin = _hugging_face_tables(config, rope_parameters)
    cos, sin = rope_tables(config, LAST)
    assert np.abs(cos[FIRST:] - hf_cos).max() <= 6e-8
    assert np.abs(sin[FIRST:] - hf_sin).max() <= 6e-8


def test_a_float64_rope_table_is_2e4_away_from_hugging_face_at_position_4000():
    config, rope_parameters = CASES["smollm2_theta_1e5_h64"]
    hf_cos, _ = _hugging_face_tables(config, rope_parameters)
    old_cos, _ = _float64_tables(config)
    assert np.abs(old_cos - hf_cos).max() > 2e-4
    # ... which changes 137 of these 4096 float16 values; trt_kv's float16 table differs in at
    # most a value or two that sit on a float16 rounding boundary (measured: 1), where the
    # last float32 bit of torch's cos decides
    cos, _ = rope_tables(config, LAST)
    assert (old_cos.astype(np.float16) != hf_cos.astype(np.float16)).sum() == 137
    assert (cos[FIRST:].astype(np.float16) != hf_cos.astype(np.float16)).sum() <= 2


def test_queries_are_scaled_in_float32_and_rounded_once():
    """H = 128: 1/sqrt(128) rounds to 0.0884 in float16, so a float16 multiply by it gives
    other values than float32 scaling rounded once (159 of these 1024)."""
    q = np.random.default_rng(0).standard_normal((1, 1, 8, 128)).astype(np.float16)
    _builder, network = create_network()  # the builder stays alive with the network
    g = Graph(network, "float16")
    out = scale_queries(g, network.add_input("q", trt.float16, q.shape), 128)
    out.name = "scaled"
    network.mark_output(out)
    got = execute(network, {"q": q})["scaled"]
    assert got.dtype == np.float16
    once = (q.astype(np.float32) * np.float32(128**-0.5)).astype(np.float16)
    np.testing.assert_array_equal(got, once)
    in_float16 = (q.astype(np.float32) * np.float16(128**-0.5).astype(np.float32)).astype(
        np.float16
    )
    assert (in_float16 != once).sum() == 159
