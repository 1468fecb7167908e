"""Interpreter: KV-cache update layer, written in place into the caller's cache array."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.support.interpreter_support import Net, rand
from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.builder import add_kv_cache_update
from trt_kv.errors import CacheOverflowError
from trt_kv.interpreter import compile_network


def test_kv_cache_update_docs_example():
    """The KVCacheUpdate operator page's shapes: cache [4, 2, 8, 1], update [4, 2, 4, 1],
    write_indices [2, 1, 1, 3]. The page's own arrays were not retrievable, so the inputs are
    ours (zeros, and 1..32) and the golden output is the documented rule worked by hand:
    ``output[i, :, write_indices[i] + s, :] = update[i, :, s, :]``."""
    net = Net()
    cache = net.input("cache", "float32", (4, 2, 8, 1))
    update = net.input("update", "float32", (4, 2, 4, 1))
    write_indices = net.input("write_indices", "int32", (4,))
    layer = net.network.add_kv_cache_update(cache, update, write_indices, trt.KVCacheMode.LINEAR)
    net.mark(layer.get_output(0))
    feed = {
        "cache": np.zeros((4, 2, 8, 1), np.float32),
        "update": np.arange(1, 33, dtype=np.float32).reshape(4, 2, 4, 1),
        "write_indices": np.array([2, 1, 1, 3], np.int32),
    }
    expected = [
        [[0, 0, 1, 2, 3, 4, 0, 0], [0, 0, 5, 6, 7, 8, 0, 0]],
        [[0, 9, 10, 11, 12, 0, 0, 0], [0, 13, 14, 15, 16, 0, 0, 0]],
        [[0, 17, 18, 19, 20, 0, 0, 0], [0, 21, 22, 23, 24, 0, 0, 0]],
        [[0, 0, 0, 25, 26, 27, 28, 0], [0, 0, 0, 29, 30, 31, 32, 0]],
    ]
    out = net.run(feed)["out"]
    np.testing.assert_array_equal(out[..., 0], expected)


def _cache_net(dtype: str, s_max: int = 8, packed: bool = False, batch: int = 2) -> Net:
    """cache [B, 3, S_max, 4] updated from ``update`` (padded [B, 3, S, 4] or packed [T, 3, 4])."""
    net = Net()
    cache = net.input("cache", dtype, (batch, 3, s_max, 4))
    update = net.input("update", dtype, (-1, 3, 4) if packed else (batch, 3, -1, 4))
    write_indices = net.input("write_indices", "int32", (batch,))
    lengths = net.input("update_lengths", "int32", (3,)) if packed else None
    add_kv_cache_update(
        net.network, cache, update, write_indices, output_name="out", update_lengths=lengths
    )
    return net


def _random_bits(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Arbitrary bit patterns (NaN payloads, subnormals, -0 included) of a 2-byte dtype."""
    bits = np.random.default_rng(seed).integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return bits.view(dtypes.to_numpy(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_kv_cache_update_returns_the_fed_cache_object(dtype):
    net = _cache_net(dtype)
    cache = np.zeros((2, 3, 8, 4), dtypes.to_numpy(dtype))
    feed = {
        "cache": cache,
        "update": rand(2, 3, 1, 4, dtype=dtype),
        "write_indices": np.array([0, 5], np.int32),
    }
    out = net.run(feed)["out"]
    assert out is cache


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kv_cache_update_changes_only_the_written_window_bit_for_bit(dtype):
    net = _cache_net(dtype)
    cache = _random_bits((2, 3, 8, 4), dtype)
    before = cache.view(np.uint16).copy()
    update = rand(2, 3, 2, 4, seed=1, dtype=dtype)
    net.run({"cache": cache, "update": update, "write_indices": np.array([1, 6], np.int32)})
    after = cache.view(np.uint16)
    window = np.zeros(cache.shape, bool)
    window[0, :, 1:3] = window[1, :, 6:8] = True
    np.testing.assert_array_equal(after[~window], before[~window])
    np.testing.assert_array_equal(after[0, :, 1:3], update[0].view(np.uint16))
    np.testing.assert_array_equal(after[1, :, 6:8], update[1].view(np.uint16))


def test_kv_cache_update_past_s_max_raises_and_writes_nothing():
    net = _cache_net("float16")
    cache = _random_bits((2, 3, 8, 4), "float16")
    before = cache.copy()
    feed = {
        "cache": cache,
        "update": rand(2, 3, 2, 4, dtype="float16"),
        "write_indices": np.array([0, 7], np.int32),  # 7 + 2 > S_max = 8
    }
    with pytest.raises(CacheOverflowError, match="write_indices"):
        compile_network(net.network).run(feed)
    np.testing.assert_array_equal(cache.view(np.uint16), before.view(np.uint16))


def test_kv_cache_update_packed_form_splits_tokens_by_cumulative_lengths():
    net = _cache_net("float32", packed=True)
    cache = np.zeros((2, 3, 8, 4), np.float32)
    update = rand(5, 3, 4)  # sequence 0 gets tokens 0..1, sequence 1 tokens 2..4
    feed = {
        "cache": cache,
        "update": update,
        "write_indices": np.array([3, 0], np.int32),
        "update_lengths": np.array([0, 2, 5], np.int32),
    }
    out = net.run(feed)["out"]
    expected = np.zeros_like(cache)
    expected[0, :, 3:5] = update[0:2].transpose(1, 0, 2)
    expected[1, :, 0:3] = update[2:5].transpose(1, 0, 2)
    np.testing.assert_array_equal(out, expected)


def test_kv_cache_update_accumulates_over_decode_steps():
    """A compiled plan run step after step fills the cache one position at a time."""
    net = _cache_net("bfloat16")
    plan = compile_network(net.network)
    cache = np.zeros((2, 3, 8, 4), ml_dtypes.bfloat16)
    steps = [rand(2, 3, 1, 4, seed=t, dtype="bfloat16") for t in range(3)]
    for t, update in enumerate(steps):
        plan.run(
            {"cache": cache, "update": update, "write_indices": np.array([t, t + 4], np.int32)}
        )
    np.testing.assert_array_equal(cache[0, :, 0:3], np.concatenate(steps, axis=2)[0])
    np.testing.assert_array_equal(cache[1, :, 4:7], np.concatenate(steps, axis=2)[1])
    assert not cache[0, :, 3:].any() and not cache[1, :, :4].any() and not cache[1, :, 7:].any()


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("tokens", [1, 3], ids=["decode", "prefill"])
def test_kv_cache_update_fast_and_plain_plans_write_the_same_bits(tokens, batch):
    """The fast plan's whole-array checks and indexed write (one sequence's decode row: a
    view) against the reference's loop."""
    net = _cache_net("float16", batch=batch)
    update = rand(batch, 3, tokens, 4, seed=4, dtype="float16")
    caches = {}
    for fast in (True, False):
        cache = _random_bits((batch, 3, 8, 4), "float16", seed=5)
        feed = {
            "cache": cache,
            "update": update,
            "write_indices": np.array([5, 2][:batch], np.int32),
        }
        assert compile_network(net.network, fast=fast).run(feed)["out"] is cache
        caches[fast] = cache.view(np.uint16)
    np.testing.assert_array_equal(caches[True], caches[False])
    np.testing.assert_array_equal(caches[True][0, :, 5 : 5 + tokens], update[0].view(np.uint16))


@pytest.mark.parametrize("start", [-1, 6, 2**31 - 1], ids=["negative", "past_end", "int32_max"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
def test_one_sequence_write_out_of_range_raises_and_writes_nothing(fast, start):
    """One sequence (the fast plan reads its start without a reduction): a 3-token update
    from 6 passes S_max 8; the reference's error, nothing written."""
    net = _cache_net("float32", batch=1)
    cache = rand(1, 3, 8, 4, seed=6)
    before = cache.copy()
    feed = {
        "cache": cache,
        "update": rand(1, 3, 3, 4),
        "write_indices": np.array([start], np.int32),
    }
    with pytest.raises(CacheOverflowError, match=r"write_indices\[0\]"):
        compile_network(net.network, fast=fast).run(feed)
    np.testing.assert_array_equal(cache, before)


@pytest.mark.parametrize("bad_index", [-1, 2**31 - 1], ids=["negative", "int32_max"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
def test_kv_cache_update_write_index_out_of_range_raises_and_writes_nothing(fast, bad_index):
    """A negative index, and ``2**31 - 1`` (whose ``+ S`` must not wrap around in int32)."""
    net = _cache_net("float32")
    cache = rand(2, 3, 8, 4, seed=6)
    before = cache.copy()
    feed = {
        "cache": cache,
        "update": rand(2, 3, 1, 4),
        "write_indices": np.array([0, bad_index], np.int32),
    }
    with pytest.raises(CacheOverflowError, match=r"write_indices\[1\]"):
        compile_network(net.network, fast=fast).run(feed)
    np.testing.assert_array_equal(cache, before)
