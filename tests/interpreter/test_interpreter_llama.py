"""Interpreter on trt_kv's own Llama network: the built network, executed layer by layer,
agrees with the NumPy reference model (trt_kv.models.llama.reference) on prefill and decode."""

from __future__ import annotations

import numpy as np

from tests.support.tiny_models import TINY_GQA
from trt_kv.builder import build_engine
from trt_kv.builder.model_caches import cache_names
from trt_kv.interpreter import compile_network
from trt_kv.models.llama import build_llama_network, random_weights, reference

CONFIG = TINY_GQA
S_MAX = 16


def _feed(caches: dict, ids, positions, write_indices, kv_lengths, last_rows) -> dict:
    return {
        **caches,
        "input_ids": np.asarray(ids, np.int32),
        "position_ids": np.asarray(positions, np.int64),
        "write_indices": np.asarray(write_indices, np.int32),
        "key_value_lengths": np.asarray(kv_lengths, np.int32),
        "last_token_rows": np.asarray(last_rows, np.int32),
    }


def test_llama_network_matches_reference_on_ragged_prefill_then_decode():
    weights = random_weights(CONFIG, seed=1)
    built = build_llama_network(
        CONFIG, weights, max_seq_len=S_MAX, max_batch=2, max_step_tokens=4, dtype="float32"
    )
    build_engine(built.builder, built.network, built.profiles)  # TensorRT accepts it
    plan = compile_network(built.network)
    ref_caches = reference.empty_caches(CONFIG, 2, S_MAX)
    caches = {
        name: np.zeros_like(ref_caches[i][j])
        for i in range(CONFIG.num_hidden_layers)
        for j, name in enumerate(cache_names(i)[:2])
    }
    # Prefill: sequence 0 has 3 tokens, sequence 1 has 2 (right-padded); then one decode step.
    steps = [
        ([[3, 5, 7], [9, 2, 0]], [[0, 1, 2], [0, 1, 2]], [0, 0], [3, 2], [2, 4]),
        ([[11], [13]], [[3], [2]], [3, 2], [4, 3], [0, 1]),
    ]
    for ids, positions, write_indices, kv_lengths, last_rows in steps:
        feed = _feed(caches, ids, positions, write_indices, kv_lengths, last_rows)
        out = plan.run({k: v for k, v in feed.items() if k in plan.input_names})
        expected = reference.forward(
            CONFIG,
            weights.astype(np.float32),
            np.array(ids),
            np.array(positions),
            ref_caches,
            np.array(write_indices),
            np.array(kv_lengths),
        )
        last = np.array(kv_lengths) - np.array(write_indices) - 1  # last new token per sequence
        np.testing.assert_allclose(out["logits"], expected[[0, 1], last], rtol=1e-5, atol=1e-6)
    for i in range(CONFIG.num_hidden_layers):
        past_key, past_value, *_ = cache_names(i)
        np.testing.assert_allclose(caches[past_key], ref_caches[i][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(caches[past_value], ref_caches[i][1], rtol=1e-5, atol=1e-6)
