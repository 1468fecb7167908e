"""A tiny Llama whose every layer matrix is held in one GGUF type (each type trt_kv maps
exactly), run by the fast plan's fused block products, against dequantize-then-multiply in
float32 (the float32 network of the same weights, gguf's dequantization): its logits at
most 4x as far from them as the float16 network's own layers (``fast=False``: the
``IDequantizeLayer``, its product and the minimum's product, each rounded to float16) are,
plus ``2^-11`` of the largest, and the same greedy id at every position. Both carry the
float16 network's roundings of every activation, which dominate (random weights: 0.02-11%
of the largest logit, either way); the fused product only moves the weights' own roundings
(measured over 3 draws of each type: 0.3x-2.9x the float16 layers' distance)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.quantization import test_quantized_weights
from tests.quantization.test_quantized_weights import _HAND_BUILT, EXACT, _stored
from tests.support.tiny_models import tiny_llama
from trt_kv.checkpoints.gguf_blocks import keep_quantized
from trt_kv.interpreter import blocks, compile_network
from trt_kv.interpreter.program import identity
from trt_kv.models.llama import build_llama_network
from trt_kv.models.llama.weights import _from_named, random_weights, to_hf_tensors

# K = 256: the K-quants' super-block; Q/K/V, O, gate/up and down all 256 wide
CONFIG = tiny_llama(
    vocab_size=97, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
)  # fmt: skip
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
S_MAX = 16


def _matrix(type_name: str, shape: tuple[int, int]) -> object:
    """A random matrix of ``type_name``; hand-built blocks (random bytes) with their float16
    super-scales divided by 64 (exact), so that a float16 network holds the layer's values."""
    raw, _ = _stored(type_name, *shape)
    if type_name in _HAND_BUILT:
        size, fields = _HAND_BUILT[type_name]
        blocks_ = raw.reshape(-1, size).copy()
        for at in fields:
            scale = blocks_[:, at : at + 2].copy().view(np.float16) * np.float16(2**-6)
            blocks_[:, at : at + 2] = scale.view(np.uint8)
        raw = blocks_.reshape(raw.shape)
    return keep_quantized(type_name, raw, shape, lambda: pytest.fail("re-quantized"))


def _logits(net: object, fast: bool = True) -> np.ndarray:
    plan = compile_network(net.network, fast=fast)
    s = len(PROMPT)
    feed = {
        "input_ids": np.array([PROMPT], dtype=np.int32),
        "position_ids": np.arange(s, dtype=np.int64)[None],
        "write_indices": np.zeros(1, np.int32),
        "last_token_rows": np.array([s - 1], np.int32),
    }
    dtype = np.float32 if net.dtype == "float32" else np.float16
    cache = np.zeros((1, CONFIG.num_key_value_heads, S_MAX, CONFIG.head_dim), dtype)
    feed |= {n: cache.copy() for n in plan.input_names if n.startswith("past_")}
    feed = {k: v for k, v in feed.items() if k in plan.input_names}
    return plan.run(feed)["logits"][0].astype(np.float64)  # [S, V]


def _network(weights: object, dtype: str, weight_format: str | None) -> object:
    return build_llama_network(
        CONFIG, weights, max_seq_len=S_MAX, max_batch=1, max_step_tokens=len(PROMPT),
        dtype=dtype, weight_format=weight_format, all_logits=True,
    )  # fmt: skip


@pytest.mark.parametrize("type_name", list(EXACT))
def test_tiny_model_of_each_type_runs_fused_within_the_float16_networks_own_distance(
    type_name, monkeypatch
):
    # the blocks drawn from a generator of this test's own (whatever ran before)
    monkeypatch.setattr(test_quantized_weights, "RNG", np.random.default_rng(43))
    weights = random_weights(CONFIG, seed=7)
    named = to_hf_tensors(weights)
    for name, w in list(named.items()):
        if name.startswith("model.layers.") and w.ndim == 2:
            weights.quantized[name] = q = _matrix(type_name, w.shape)
            named[name] = q.dequantize()  # gguf's float32 values
    assert len(weights.quantized) == 7
    kept = _network(weights, "float16", "keep")
    before = sum(blocks.COUNTS.values())
    fused = _logits(kept)
    assert sum(blocks.COUNTS.values()) - before == 4  # Q/K/V, O, gate/up, down
    plain = _logits(kept, fast=False)
    exact = _logits(_network(_from_named(named, CONFIG), "float32", None))
    assert np.isfinite(exact).all()
    top = np.abs(exact).max()
    assert np.abs(fused - exact).max() <= 4 * np.abs(plain - exact).max() + 2**-11 * top
    assert np.array_equal(fused.argmax(-1), exact.argmax(-1))


def test_products_of_one_input_run_as_one_step_giving_each_its_columns():
    """The fast plan of a kept network runs Q/K/V as one step with three outputs and
    gate/up as one with two (each output a member's columns of one product, named as the
    member's own output was); O and down stay steps of one output. Each product is rounded
    to float16 values in the helper's call: no finisher rounds it again."""
    weights = random_weights(CONFIG, seed=7)
    for name, w in list(to_hf_tensors(weights).items()):
        if name.startswith("model.layers.") and w.ndim == 2:
            weights.quantized[name] = _matrix("Q4_1", w.shape)
    net = _network(weights, "float16", "keep").network
    plan = compile_network(net)
    kinds = ("_units.", "_columns.")  # fused.py's kernels: one product, stacked products
    products = [s for s in plan._steps if s.kernel.fn.__qualname__.startswith(kinds)]
    assert sorted(len(s.outputs) for s in products) == [1, 1, 2, 3]
    assert all(f is identity for s in products for _, f in s.outputs)  # rounded in the call
    produced = {name for s in plan._steps for name, _ in s.outputs}
    read = {name for s in plan._steps for name, _ in s.inputs}
    assert {name for s in products for name, _ in s.outputs} <= read  # each output is read
    assert len(produced) == sum(len(s.outputs) for s in plan._steps)  # each made once
