"""The interpreter's products and attention on several threads: the weight rows (N), or the
(sequence, KV head) pairs, split across them, never K, so every count gives the same bits
(``--threads 1`` included); the default count, defined once in build_defaults."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.support.compiled_helper import require_compiled_helper
from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.build_defaults import THREADS_ENV, default_threads
from trt_kv.errors import ArgumentError
from trt_kv.interpreter import compile_network, native, products
from trt_kv.interpreter.blocks import BlockWeight


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_helper_products_give_the_same_bits_on_any_thread_count(dtype, rows):
    require_compiled_helper()
    w = rand(1000, 200, seed=3).astype(dtype)
    x = rand(rows, 200, seed=4)
    one = native.product(x, w, threads=1)
    wide = (False, True) if native.WIDE else (False,)
    panels = [native.panel_product(x, w, wide=v, threads=1) for v in wide]
    for threads in (2, 3, 7):
        assert np.array_equal(native.product(x, w, threads=threads), one)
        for v, first in zip(wide, panels):
            assert np.array_equal(native.panel_product(x, w, wide=v, threads=threads), first)


def test_block_products_give_the_same_bits_call_after_call_whatever_the_count():
    """Parts are claimed by whichever thread is free (up to 4 a thread): many calls in a row,
    the count changing between them (workers past the count take none), each gives the bits
    of one thread, every row written."""
    require_compiled_helper()
    rng = np.random.default_rng(5)
    codes = rng.integers(-8, 8, (3000, 256)).astype(np.int8)
    scales = (rng.random((3000, 8)) / 64).astype(np.float16)
    w = BlockWeight.from_codes(codes, scales, -scales, 4)
    x = rand(2, 256, seed=6)
    args = (w.codes, 4, 32, w.scales, w.offsets, x)
    one = native.block_product(*args, threads=1)
    assert np.isfinite(one).all()
    for call in range(120):
        count = (2, 3, 7, 1, 2)[call % 5]
        assert np.array_equal(native.block_product(*args, threads=count), one), (call, count)


@pytest.mark.parametrize(("b", "sq", "n"), [(1, 1, 300), (3, 1, 700), (2, 9, 40), (3, 20, 260)])
def test_attention_gives_the_same_bits_on_any_thread_count(b, sq, n):
    """The (sequence, KV head) pairs split across threads (decode steps, one or three
    sequences; prefill-like chunks): every count gives the bits of one thread, every row
    written (a part is at least ATT_WORK multiply-adds: the small call runs alone)."""
    require_compiled_helper()
    q, k, v = rand(b, 9, sq, 64, seed=7), rand(b, 3, n, 64, seed=8), rand(b, 3, n, 64, seed=9)
    keep = np.random.default_rng(10).random((b, 1, sq, n)) < 0.9
    one = native.attention(q, k, v, keep, 0.125, threads=1)
    assert np.isfinite(one).all()
    for count in (2, 3, 7, 2):
        assert np.array_equal(native.attention(q, k, v, keep, 0.125, threads=count), one)


@pytest.fixture
def threads():
    """Restores the interpreter's thread count after the test."""
    before = products.threads()
    yield products.set_threads
    products.set_threads(before)


@pytest.mark.parametrize("rows", [1, 8, 100, 300])
def test_a_plan_gives_the_same_bits_on_one_thread_and_two(threads, rows):
    """Q/K/V products (float16 weights kept narrow, stacked) of one input, each route."""
    net = Net()
    x = net.input("x", "float32", (-1, 256))
    for name, n, seed in (("q", 640, 30), ("k", 256, 31), ("v", 256, 32)):
        w = net.const(rand(n, 256, seed=seed).astype(np.float16))
        product = net.network.add_matrix_multiply(
            x, trt.MatrixOperation.NONE, w, trt.MatrixOperation.TRANSPOSE
        )
        net.mark(product.get_output(0), name)
    plan = compile_network(net.network)
    feed = {"x": rand(rows, 256, seed=33)}
    threads(1)
    one = plan.run(feed)
    threads(2)
    two = plan.run(feed)
    assert all(np.array_equal(one[k], two[k]) for k in one)


def test_thread_count_defaults_to_the_environment_else_the_cores(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3
    for value in ("0", "two", ""):
        monkeypatch.setenv(THREADS_ENV, value)
        assert default_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_set_threads_refuses_anything_but_a_positive_integer(count):
    with pytest.raises(ArgumentError, match="threads"):
        products.set_threads(count)
