"""A decoder layer's attention (Q/K/V columns to output) as one step of a fast plan.

Oracle: the same network with one more output, Q's RoPE result of every layer, which leaves
the steps as they were (a block whose inner tensor something else reads is not fused); the
two plans run the same kernels, so their logits and caches agree bit for bit, prefill and
decode, one sequence and several at different write indices. ``attention_step.COUNTS``
shows which path ran.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.compiled_helper import require_compiled_helper
from tests.support.tiny_models import TINY_GQA
from trt_kv._trt import trt
from trt_kv.errors import CacheOverflowError
from trt_kv.interpreter import attention_step, compile_network
from trt_kv.models.llama import build_llama_network, random_weights

L = trt.LayerType

S_MAX = 12


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled_helper()


def _network(batch: int, rope_q_out: bool = False) -> object:
    """The tiny GQA Llama, float16; ``rope_q_out``: each layer's Q RoPE result an output."""
    net = build_llama_network(
        TINY_GQA, random_weights(TINY_GQA, seed=3), max_seq_len=S_MAX, max_batch=batch,
        max_step_tokens=4, dtype="float16",
    )  # fmt: skip
    if rope_q_out:
        n = net.network
        ropes = [n.get_layer(i) for i in range(n.num_layers)]
        ropes = [x for x in ropes if x.type == L.ROTARY_EMBEDDING]
        assert len(ropes) == 2 * TINY_GQA.num_hidden_layers
        for i, layer in enumerate(ropes[::2]):  # Q's, then K's, in each layer
            layer.get_output(0).name = f"rope_q.{i}"
            n.mark_output(layer.get_output(0))
    return net


def _feed(caches: dict, ids: np.ndarray, start: np.ndarray) -> dict:
    """The network's inputs: ``ids [B, S]`` at positions from ``start [B]``, its caches."""
    b, s = ids.shape
    positions = start[:, None] + np.arange(s)
    last = np.arange(1, b + 1) * s - 1  # each sequence's last row in the flattened [B*S]
    return dict(
        caches, input_ids=ids.astype(np.int32), position_ids=positions.astype(np.int64),
        write_indices=start.astype(np.int32), last_token_rows=last.astype(np.int32),
    )  # fmt: skip


def _run(plan: object, starts: list[int], tokens: int = 3, wide: bool = True) -> tuple[list, dict]:
    """A prefill of 4 tokens at ``starts`` (one a sequence), then ``tokens`` decode steps:
    the logits of each call and the caches at the end (float16 caches held as float32 where
    ``wide``, else as float16)."""
    batch = len(starts)
    shape = (batch, TINY_GQA.num_key_value_heads, S_MAX, TINY_GQA.head_dim)
    dtype = np.float32 if wide else np.float16
    caches = {n: np.zeros(shape, dtype) for n in plan.input_names if "past" in n}
    rng = np.random.default_rng(7)
    start = np.array(starts, np.int64)
    logits = [plan.run(_feed(caches, rng.integers(1, 60, (batch, 4)), start))["logits"]]
    for i in range(tokens):
        ids = rng.integers(1, 60, (batch, 1))
        logits.append(plan.run(_feed(caches, ids, start + 4 + i))["logits"])
    return logits, caches


def _plans(batch: int, wide: bool = True) -> tuple[object, object]:
    fused = compile_network(_network(batch).network, wide_float16_caches=wide)
    steps = compile_network(_network(batch, True).network, wide_float16_caches=wide)
    return fused, steps


def test_each_layer_attention_is_one_step():
    """11 steps a layer become one: no RoPE, cache update or attention step is left."""
    fused, steps = _plans(1)
    layers = TINY_GQA.num_hidden_layers
    assert len(steps._steps) - len(fused._steps) == 10 * layers
    n = _network(1).network
    kinds = (L.ROTARY_EMBEDDING, L.KV_CACHE_UPDATE, L.ATTENTION_INPUT, L.ATTENTION_OUTPUT)
    inner = {n.get_layer(i).name for i in range(n.num_layers) if n.get_layer(i).type in kinds}
    assert len(inner) == 6 * layers
    assert inner <= {s.layer for s in steps._steps}
    assert not inner & {s.layer for s in fused._steps}


@pytest.mark.parametrize(("starts", "wide"), [([0], True), ([0, 5, 2], True), ([0, 5], False)])
def test_decode_gives_the_bits_of_the_steps_one_by_one(starts, wide):
    """Prefill (the original steps, in the one step) and decode (its fast path) give the
    logits and caches of the plan that keeps the steps, bit for bit; several sequences at
    their own write indices too. Caches held as float16 (not wide): the decode path does not
    write them, the steps run (and give the same bits)."""
    fused, steps = _plans(len(starts), wide)
    before = dict(attention_step.COUNTS)
    got, got_caches = _run(fused, starts, wide=wide)
    layers = TINY_GQA.num_hidden_layers
    ran = {k: attention_step.COUNTS[k] - before.get(k, 0) for k in ("decode", "steps")}
    assert ran == (
        {"decode": 3 * layers, "steps": layers} if wide else {"decode": 0, "steps": 4 * layers}
    )
    middle = dict(attention_step.COUNTS)
    want, want_caches = _run(steps, starts, wide=wide)
    assert dict(attention_step.COUNTS) == middle  # the oracle's plan has no block step
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
    assert got_caches.keys() == want_caches.keys()
    for name in got_caches:
        np.testing.assert_array_equal(got_caches[name], want_caches[name])


def test_a_write_past_the_cache_fails_as_the_steps_fail_with_nothing_written():
    """A decode write at S_max: the cache update's own error, before any cache changes."""
    fused, _ = _plans(1)
    shape = (1, TINY_GQA.num_key_value_heads, S_MAX, TINY_GQA.head_dim)
    caches = {n: np.zeros(shape, np.float32) for n in fused.input_names if "past" in n}
    feed = _feed(caches, np.array([[5]]), np.array([S_MAX]))
    feed["position_ids"] = np.zeros((1, 1), np.int64)  # a position within the tables
    with pytest.raises(CacheOverflowError, match="write"):
        fused.run(feed)
    assert not any(c.any() for c in caches.values())
