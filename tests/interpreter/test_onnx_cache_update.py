"""The cache update and attention layers TensorRT-RTX's ONNX parser makes of ``TensorScatter``
(opset 24), trt_kv's ``TRT_KVCacheUpdate`` node and opset-23 ``Attention``, run by the
interpreter: vs onnxruntime where it runs the op, vs a NumPy write where it does not."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto as T
from onnx import helper

from tests.support.onnx_graphs import (
    assert_matches,
    graph,
    onnxruntime_outputs,
    parse,
)
from trt_kv.errors import CacheOverflowError
from trt_kv.interpreter import compile_network

F = T.FLOAT
RNG = np.random.default_rng(3)
CACHE = RNG.standard_normal((2, 2, 8, 4)).astype(np.float32)  # [B, N, S_max, H]
UPDATE = RNG.standard_normal((2, 2, 3, 4)).astype(np.float32)  # [B, N, S, H]
WRITE = np.array([1, 4])


def vi(name: str, dtype: int, shape: list | None = None) -> object:
    return helper.make_tensor_value_info(name, dtype, shape)


CACHE_IO = [vi("cache", F, [2, 2, 8, 4]), vi("update", F, [2, 2, "s", 4])]


def _written(cache: np.ndarray, update: np.ndarray, write: np.ndarray) -> np.ndarray:
    """``cache`` with each sequence's update rows at its write index (a copy)."""
    out = cache.copy()
    for b, w in enumerate(write):
        out[b, :, w : w + update.shape[2]] = update[b]
    return out


def _tensor_scatter(index_dtype: int = T.INT64) -> bytes:
    op = helper.make_node("TensorScatter", ["cache", "update", "w"], ["y"], axis=-2, mode="linear")
    return graph([op], [*CACHE_IO, vi("w", index_dtype, [2])], [vi("y", F, [2, 2, 8, 4])], opset=24)


def test_tensor_scatter_writes_the_fed_cache_in_place_as_onnxruntime_writes_a_copy():
    data = _tensor_scatter()
    parsed = parse(data)
    assert "KV_CACHE_UPDATE" in parsed.layer_types()
    feed = {"cache": CACHE, "update": UPDATE, "w": WRITE}
    want = onnxruntime_outputs(data, feed)
    np.testing.assert_array_equal(want["y"], _written(CACHE, UPDATE, WRITE))  # the oracle
    for fast in (True, False):
        cache = CACHE.copy()
        out = compile_network(parsed.network, fast=fast).run({**feed, "cache": cache})
        assert out["y"] is cache
        assert_matches(out, want)


def test_tensor_scatter_refuses_a_write_past_the_cache_and_writes_nothing():
    parsed = parse(_tensor_scatter())
    cache = CACHE.copy()
    with pytest.raises(CacheOverflowError):
        compile_network(parsed.network).run(
            {"cache": cache, "update": UPDATE, "w": np.array([1, 6])}
        )
    np.testing.assert_array_equal(cache, CACHE)


@pytest.mark.parametrize("domain", ["", "trt"])
def test_trt_kv_cache_update_node_writes_each_sequence_at_its_index(domain):
    op = helper.make_node(
        "TRT_KVCacheUpdate",
        ["cache", "update", "w"],
        ["y"],
        update_form="padded_bhnd",
        mode="linear",
        axis=-2,
        domain=domain,
    )
    outs = [vi("y", F, [2, 2, 8, 4])]
    data = graph([op], [*CACHE_IO, vi("w", T.INT32, [2])], outs, opset=24)
    parsed = parse(data)
    assert "KV_CACHE_UPDATE" in parsed.layer_types()
    cache = CACHE.copy()
    out = compile_network(parsed.network).run(
        {"cache": cache, "update": UPDATE, "w": WRITE.astype(np.int32)}
    )
    assert out["y"] is cache
    np.testing.assert_array_equal(cache, _written(CACHE, UPDATE, WRITE))


def _attention(mask: bool) -> tuple[bytes, dict]:
    q = RNG.standard_normal((2, 4, 3, 8)).astype(np.float32)  # GQA: 4 query heads, 2 KV
    k = RNG.standard_normal((2, 2, 5, 8)).astype(np.float32)
    v = RNG.standard_normal((2, 2, 5, 8)).astype(np.float32)
    ins = [vi("q", F, [2, 4, 3, 8]), vi("k", F, [2, 2, 5, 8]), vi("v", F, [2, 2, 5, 8])]
    feed = {"q": q, "k": k, "v": v}
    if mask:
        keep = RNG.random((2, 1, 3, 5)) > 0.4
        keep[..., 0] = True
        feed["m"] = keep
        ins.append(vi("m", T.BOOL, [2, 1, 3, 5]))
        op = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"])
    else:
        op = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    return graph([op], ins, [vi("y", F)], opset=23), feed


@pytest.mark.parametrize("mask", [False, True], ids=["causal", "bool_mask"])
def test_opset_23_attention_runs_as_onnxruntime_runs_it(mask):
    data, feed = _attention(mask)
    parsed = parse(data)
    assert "ATTENTION_INPUT" in parsed.layer_types()
    want = onnxruntime_outputs(data, feed)
    for fast in (True, False):
        assert_matches(parsed.run(feed, fast=fast), want)


def test_attention_reads_the_cache_the_same_run_updated_as_onnxruntime_does():
    """The rewritten decoder's shape: ``TensorScatter`` writes the step's keys, then
    ``q @ cache^T``, keys past each sequence's length masked (``Where``), softmax, ``@ v``."""
    nodes = [
        helper.make_node("TensorScatter", ["cache", "update", "w"], ["k"], axis=-2),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),  # [B, N, S, S_max]
        helper.make_node("Add", ["w", "s"], ["ends"]),  # each sequence's length after the step
        helper.make_node("Unsqueeze", ["ends", "axes"], ["ends4"]),  # [B, 1, 1, 1]
        helper.make_node("Less", ["slots", "ends4"], ["keep"]),  # [B, 1, 1, S_max]
        helper.make_node("Where", ["keep", "scores", "ninf"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "k"], ["y"]),
    ]
    inits = {
        "s": np.array(UPDATE.shape[2]),
        "axes": np.array([1, 2, 3]),
        "slots": np.arange(8).reshape(1, 1, 1, 8),
        "ninf": np.float32(-np.inf),
    }
    ins = [*CACHE_IO, vi("w", T.INT64, [2]), vi("q", F, [2, 2, "s", 4])]
    data = graph(nodes, ins, [vi("y", F)], inits, opset=24)
    parsed = parse(data)
    assert {"KV_CACHE_UPDATE", "SOFTMAX", "SELECT"} <= parsed.layer_types()
    q = RNG.standard_normal(UPDATE.shape).astype(np.float32)
    feed = {"cache": CACHE, "update": UPDATE, "w": WRITE, "q": q}
    want = onnxruntime_outputs(data, feed)
    for fast in (True, False):
        assert_matches(parsed.run(feed, fast=fast), want)
