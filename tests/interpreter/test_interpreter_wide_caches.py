"""float16 caches held as float32 (``wide_float16_caches``) against float16 caches.

A plan compiled with ``wide_float16_caches=True`` is fed each float16 cache as a float32
array of float16 values and reads it without widening; the results must be the same bits as
the plan fed the float16 caches, step after step, and the wide arrays must hold exactly the
float16 caches' values. ``HostCaches(wide_float16_caches=True)`` keeps that promise for its
own writes (rounding to float16) and reads back float16.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.interpreter.test_interpreter_fast import ROUTES, STEPS, _caches, _network, step_feed
from tests.support.tiny_models import TINY_GQA
from trt_kv._trt import trt
from trt_kv.builder.kv_cache import cache_aliases
from trt_kv.builder.routes import Routes
from trt_kv.errors import ArgumentError, DTypeError, UnsupportedLayerError
from trt_kv.interpreter import compile_network
from trt_kv.runtime import Session
from trt_kv.runtime.interpreter_backend import InterpreterBackend
from trt_kv.runtime.storage import HostCaches


def _feeds(plan: object, caches: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The feeds of STEPS (ragged prefill, a second chunk, decode) on ``caches``."""
    return [step_feed(plan, caches, step) for step in STEPS]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("route", ["mask_only", "key_value_lengths", "primitive", "sliding_window"])
def test_wide_float16_caches_give_the_same_bits(route, fast):
    """NaN-filled caches (unwritten rows hold NaN): same logits at every step, bit for bit,
    and the wide caches equal the float16 caches widened, NaN rows included."""
    config, routes = ROUTES[route]
    net = _network(config, "float16", 2, routes)
    narrow_plan = compile_network(net.network, fast=fast)
    wide_plan = compile_network(net.network, fast=fast, wide_float16_caches=True)
    narrow = _caches("float16")
    wide = {name: cache.astype(np.float32) for name, cache in narrow.items()}
    for narrow_feed, wide_feed in zip(_feeds(narrow_plan, narrow), _feeds(wide_plan, wide)):
        got = wide_plan.run(wide_feed)
        want = narrow_plan.run(narrow_feed)
        assert np.isfinite(want["logits"]).all()
        np.testing.assert_array_equal(got["logits"], want["logits"])
        for alias in cache_aliases(net.network):
            name = alias.input
            assert got[alias.output] is wide[name]  # the aliased output: the fed array itself
            assert wide[name].dtype == np.float32
            np.testing.assert_array_equal(wide[name], narrow[name].astype(np.float32))
    assert any(np.isfinite(c).any() for c in wide.values())  # the steps did write


def test_each_plan_refuses_the_other_cache_dtype():
    net = _network(TINY_GQA, "float16", 2, Routes())
    narrow_plan = compile_network(net.network)
    wide_plan = compile_network(net.network, wide_float16_caches=True)
    narrow = _caches("float16")
    wide = {name: cache.astype(np.float32) for name, cache in narrow.items()}
    with pytest.raises(DTypeError, match=r"past_key\.0: expected dtype \(float16 cache held "):
        wide_plan.run(_feeds(wide_plan, narrow)[0])
    with pytest.raises(DTypeError, match=r"past_key\.0: expected dtype float16, got float32"):
        narrow_plan.run(_feeds(narrow_plan, wide)[0])
    assert np.isnan(narrow["past_key.0"]).all() and np.isnan(wide["past_key.0"]).all()


def test_a_float32_network_is_fed_as_before():
    """Only float16 caches are held wide: a float32 network's plan takes float32 caches."""
    net = _network(TINY_GQA, "float32", 2, Routes())
    caches = _caches("float32")
    plan = compile_network(net.network, wide_float16_caches=True)
    want = compile_network(net.network).run(_feeds(plan, _caches("float32"))[0])
    np.testing.assert_array_equal(plan.run(_feeds(plan, caches)[0])["logits"], want["logits"])


def test_wide_float16_caches_must_be_a_bool():
    net = _network(TINY_GQA, "float16", 2, Routes())
    with pytest.raises(ArgumentError, match="wide_float16_caches: expected a bool, got int"):
        compile_network(net.network, wide_float16_caches=1)
    with pytest.raises(ArgumentError, match="wide_float16_caches: expected a bool, got str"):
        InterpreterBackend(net, wide_float16_caches="yes")


def test_an_update_not_in_the_cache_dtype_is_unsupported():
    """A float32 update of a float16 cache (TensorRT requires one dtype): the interpreter
    refuses it at compile time instead of choosing a rounding."""
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    strongly_typed = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(strongly_typed)
    cache = network.add_input("cache", trt.float16, (1, 2, 8, 4))
    update = network.add_input("update", trt.float32, (1, 2, 1, 4))
    write = network.add_input("write_indices", trt.int32, (1,))
    layer = network.add_kv_cache_update(cache, update, write, trt.KVCacheMode.LINEAR)
    network.mark_output(layer.get_output(0))
    with pytest.raises(UnsupportedLayerError, match=r"update dtype DataType\.FLOAT differs"):
        compile_network(network)


def test_host_caches_hold_float16_values_and_read_back_float16():
    net = _network(TINY_GQA, "float16", 2, Routes())
    storage = HostCaches(cache_aliases(net.network), 2, wide_float16_caches=True)
    n, s_max, h = storage.slot_shape
    assert all(arr.dtype == np.float32 for arr in storage.arrays.values())
    assert storage.nbytes()["past_key.0"] == 2 * n * s_max * h * 4
    rows = np.full((n, 3, h), 1 / 3, np.float64)
    storage.write_slot("past_key.0", 1, rows)
    assert storage.arrays["past_key.0"][1, 0, 0, 0] == np.float32(np.float16(1 / 3))
    assert storage.arrays["past_key.0"][1, 0, 0, 0] != np.float32(1 / 3)
    back = storage.read_slot("past_key.0", 1)
    assert back.dtype == np.float16 and back[0, 0, 0] == np.float16(1 / 3)
    with pytest.raises(DTypeError, match="values within float16 range"):
        storage.write_slot("past_key.0", 0, np.full((n, 1, h), 1e6, np.float32))
    assert not storage.arrays["past_key.0"][0].any()


def test_sessions_with_wide_and_float16_caches_generate_the_same():
    """The interpreter backend's default (wide) against float16 caches: the same logits at
    every step of a ragged prefill and decode, and the same float16 snapshot."""
    net = _network(TINY_GQA, "float16", 2, Routes())
    sessions = [
        Session(InterpreterBackend(net, wide_float16_caches=wide)) for wide in (True, False)
    ]
    assert [s.backend.storage.arrays["past_key.0"].dtype for s in sessions] == [
        np.float32,
        np.float16,
    ]
    prompt = [[3, 5, 7, 9], [2, 4]]
    logits = [s.prefill(prompt) for s in sessions]
    np.testing.assert_array_equal(logits[0], logits[1])
    for _ in range(4):
        tokens = logits[0].argmax(-1)
        logits = [s.decode(tokens) for s in sessions]
        np.testing.assert_array_equal(logits[0], logits[1])
    snaps = [s.snapshot(1) for s in sessions]
    for name in snaps[1]:
        assert snaps[0][name].dtype == np.float16
        np.testing.assert_array_equal(snaps[0][name], snaps[1][name])
