"""Weights read as stored: the native product and a fast plan's float16 weights.

``native.product`` multiplies a few rows by a float16 or float32 weight, each element read
once; ``native.panel_product`` many rows (a prefill chunk), like a matrix product. A fast
float32 plan of a float16 network keeps each weight that only products read as float16 and
multiplies it as stored (up to 16 rows: half the bytes of a decode step; up to 128 in
panels, widening a few weight rows at a time; more rows against the weight widened for the
call). Expected values are float64 products of the same values; the plain plan (every
constant widened once, NumPy's products) is the yardstick of the fast one.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tests.support.compiled_helper import require_compiled_helper
from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.errors import ArgumentError, DTypeError, ShapeError
from trt_kv.interpreter import compile_network, linalg, native

M = trt.MatrixOperation


@pytest.fixture(autouse=True)
def _compiled():
    """Every test here needs the compiled helper, which must be built wherever it can be."""
    require_compiled_helper()


def _float32_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Float32 rounding of a sum of K products, relative to the sum of their magnitudes."""
    k = max(x.shape[-1], 1)
    return 2 * k * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w.astype(np.float32)).T)


WEIGHT_DTYPES = ["float16", "float32"]


def avx2_panels(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The panel product with AVX2 (tiles of 6 weight rows against one panel of 16 rows)."""
    return native.panel_product(x, w, wide=False)


def wide_panels(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The panel product with AVX-512 (tiles of 12 weight rows against two panels)."""
    if not native.WIDE:
        pytest.skip("this processor has no AVX-512: the AVX2 panels are the ones it runs")
    return native.panel_product(x, w, wide=True)


PANELS = [avx2_panels, wide_panels]
PRODUCTS = [native.product, *PANELS]


# Every tile shape. product: up to 4 input rows, one weight row at a time against 1-4 of them;
# more, weight rows in fours and a remainder against input rows in pairs and a remainder; K in
# eights and a tail (K below 8 is all tail). Panels: panels of 16 rows, full and partial (rows
# past M zero; AVX-512: pairs of panels and a last single one), against tiles of 6 (12) weight
# rows and every remainder; K of 1 and odd (x copied 8 x 8 at a time, and a tail).
PANEL_SHAPES = [(17, 7, 577), (33, 6, 1), (128, 13, 64), (16, 1, 8), (5, 11, 3), (130, 300, 200)]
PANEL_SHAPES += [(48, 25, 64), (32, 12, 9), (9, 23, 15)]
SHAPES = [
    *[(native.product, *s) for s in [(1, 7, 577), (2, 9, 8), (3, 4, 3), (4, 6, 40)]],
    *[(native.product, *s) for s in [(16, 1000, 333), (5, 13, 1536), (1, 1, 1)]],
    *[(fn, *s) for fn in PANELS for s in PANEL_SHAPES],
]


@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
@pytest.mark.parametrize(("fn", "rows", "n", "k"), SHAPES)
def test_product_is_the_float64_product_within_float32_rounding(fn, rows, n, k, dtype):
    x, w = rand(rows, k, seed=1), rand(n, k, seed=2, dtype=dtype)
    out = fn(x, w)
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    assert out.dtype == np.float32 and out.shape == (rows, n)
    assert (np.abs(out - expected) <= _float32_bound(x, w)).all()


@pytest.mark.parametrize("fn", PRODUCTS)
@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
@pytest.mark.parametrize(("rows", "n", "k"), [(0, 4, 8), (3, 0, 8), (2, 3, 0), (20, 7, 0)])
def test_product_of_empty_operands(rows, n, k, dtype, fn):
    out = fn(rand(rows, k), rand(n, k, dtype=dtype))
    np.testing.assert_array_equal(out, np.zeros((rows, n), np.float32))


@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
def test_each_element_has_the_same_bits_whatever_is_computed_with_it(dtype):
    """An element's sum does not depend on the other rows of x or of w in the call: rows one
    to four at a time (read one weight row at a time) against seven (in tiles of four
    weight rows), weight rows sliced anywhere (across a tile of four) and two weights stacked
    all give the bits of the one call. This is what lets a plan run Q/K/V as one product,
    and a sequence's decode step give the same bits in a batch of 1, 4 or 7."""
    slices = [(m, m + rows) for rows in range(1, 5) for m in range(7 - rows + 1)]
    _same_bits_in_any_grouping(native.product, 7, 200, slices, dtype)


def _same_bits_in_any_grouping(fn, m: int, k: int, slices: list, dtype: str) -> None:
    """``fn`` of x ``[m, k]`` and w ``[22, k]``: each row slice of x, w's rows 5:19, and w
    stacked on another weight give the bits of the one call."""
    x, w = rand(m, k, seed=3), rand(22, k, seed=4, dtype=dtype)
    whole = fn(x, w)
    for lo, hi in slices:
        np.testing.assert_array_equal(fn(x[lo:hi], w), whole[lo:hi])
    np.testing.assert_array_equal(fn(x, w[5:19]), whole[:, 5:19])
    other = rand(9, k, seed=5, dtype=dtype)
    stacked = fn(x, np.concatenate([w, other]))
    np.testing.assert_array_equal(stacked[:, :22], whole)
    np.testing.assert_array_equal(stacked[:, 22:], fn(x, other))


@pytest.mark.parametrize("fn", PANELS)
@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
def test_panel_product_element_has_the_same_bits_whatever_is_computed_with_it(dtype, fn):
    """As for the product: rows in any slice (across panels of 16 and pairs of them), weight
    rows sliced anywhere (across tiles of 6 and 12) and two weights stacked give the bits of
    the one call."""
    slices = [(0, 16), (3, 20), (17, 40), (39, 40), (0, 33)]
    _same_bits_in_any_grouping(fn, 40, 96, slices, dtype)


@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
@pytest.mark.parametrize(("rows", "n", "k"), [(128, 30, 577), (40, 13, 96), (7, 25, 8)])
def test_avx2_and_avx512_panels_give_the_same_bits(rows, n, k, dtype):
    """Each element is the same float32 sum over K in order either way, so a plan gives the
    same bits on processors with and without AVX-512."""
    x, w = rand(rows, k, seed=8), rand(n, k, seed=9, dtype=dtype)
    np.testing.assert_array_equal(wide_panels(x, w), avx2_panels(x, w))


def test_wide_panels_are_refused_without_avx512(monkeypatch):
    monkeypatch.setattr(native, "WIDE", False)
    with pytest.raises(ArgumentError, match=r"^wide: expected"):
        native.panel_product(rand(20, 8), rand(3, 8), wide=True)


@pytest.mark.parametrize("fn", PRODUCTS)
@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
def test_strided_operands_are_read_as_their_values(dtype, fn):
    x = rand(40, 64, seed=6)[::2]  # rows 2 apart
    w = rand(64, 9, seed=7, dtype=dtype).T  # [9, 64], a transposed view: not contiguous
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    assert (np.abs(fn(x, w) - expected) <= _float32_bound(x, w)).all()


@pytest.mark.parametrize("fn", PRODUCTS)
@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
def test_infinity_and_nan_in_a_weight_give_ieee_results(dtype, fn):
    x = np.ones((2, 16), np.float32)
    w = np.ones((3, 16), dtype)
    w[0, 3], w[1, 15] = np.inf, np.nan
    out = fn(x, w)
    assert np.isposinf(out[:, 0]).all() and np.isnan(out[:, 1]).all()
    np.testing.assert_array_equal(out[:, 2], [16.0, 16.0])


@pytest.mark.parametrize(
    ("x", "w", "error", "names"),
    [
        (rand(2, 8, dtype="float16"), rand(3, 8, dtype="float16"), DTypeError, "x"),
        (rand(2, 8), rand(3, 8).astype(np.float64), DTypeError, "w"),
        (rand(2, 8), rand(3, 9, dtype="float16"), ShapeError, "x, w"),
        (rand(8), rand(3, 8, dtype="float16"), ShapeError, "x, w"),
    ],
    ids=["x float16", "w float64", "K differs", "x not a matrix"],
)
@pytest.mark.parametrize("fn", PRODUCTS)
def test_product_refuses_other_dtypes_and_shapes(x, w, error, names, fn):
    with pytest.raises(error, match=f"^{names}: expected"):
        fn(x, w)


def _linear(w: np.ndarray, rows: int) -> tuple[Net, dict[str, np.ndarray]]:
    """``x [rows, K] @ W^T`` in W's dtype, W a constant ``[N, K]`` read transposed."""
    net = Net()
    x = net.input("x", w.dtype.name, (-1, w.shape[1]))
    product = net.network.add_matrix_multiply(x, M.NONE, net.const(w), M.TRANSPOSE)
    net.mark(product.get_output(0))
    feed = {"x": rand(rows, w.shape[1], seed=8, dtype=w.dtype.name)}
    net.build(feed)
    return net, feed


@pytest.mark.parametrize("rows", [1, 5, 8, 9, 40, 128, 129])
def test_float32_weight_fast_and_plain_agree(rows):
    """Up to 8 rows: the compiled product; 9-128 its panels; 129 and more: BLAS. Each within
    float32 rounding of the float64 product, as the plain plan's BLAS product is."""
    w = rand(300, 256, seed=9)
    net, feed = _linear(w, rows)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    expected = feed["x"].astype(np.float64) @ w.astype(np.float64).T
    bound = _float32_bound(feed["x"], w)
    assert (np.abs(fast - expected) <= bound).all() and (np.abs(plain - expected) <= bound).all()


def _agree_within_one_float16_rounding(fast: np.ndarray, plain: np.ndarray, x, w) -> None:
    """Both round a float32 sum to float16: equal, or one float16 ulp apart where the two
    float32 sums (other summation orders) fall on either side of a rounding boundary."""
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert fast.dtype == plain.dtype == np.float16
    gap = np.abs(fast.astype(np.float64) - plain.astype(np.float64))
    assert (gap <= ulp + _float32_bound(x.astype(np.float32), w)).all()
    assert (gap == 0).mean() > 0.95


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40, 128, 129])
def test_float16_weight_fast_and_plain_agree(rows):
    """Up to 16 rows: the compiled product; 17-128 its panels; 129 and more: one product
    against W widened."""
    w = rand(300, 200, seed=9, dtype="float16")
    net, feed = _linear(w, rows)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    _agree_within_one_float16_rounding(fast, plain, feed["x"], w)


def test_a_weight_over_16_mb_widened_is_multiplied_in_blocks():
    """``[4200, 1024]`` float16 (8.4 MB; 16.8 MB widened) and more rows than the panels take:
    two blocks of rows."""
    w = rand(4200, 1024, seed=10, dtype="float16")
    net, feed = _linear(w, linalg.panel_rows(np.float16) + 1)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    _agree_within_one_float16_rounding(fast, plain, feed["x"], w)


def test_fast_plan_holds_a_product_weight_as_float16():
    """A ``[2048, 1024]`` float16 weight is 4 MiB as stored, 8 MiB widened: the fast plan
    holds the first (the plain plan the second)."""
    w = rand(2048, 1024, seed=11, dtype="float16")
    net, feed = _linear(w, 2)
    held = {}
    for fast in (True, False):
        tracemalloc.start()
        plan = compile_network(net.network, fast=fast)
        held[fast] = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        assert plan.run(feed)["out"].shape == (2, 2048)
    assert held[True] < 5 < 8 < held[False], held


@pytest.mark.parametrize("rows", [1, 3, 20])
def test_tied_float16_table_gathered_wide_and_multiplied_narrow(rows):
    """A float16 table gathered by token and tied to the head: the gather reads it widened
    (its rows exact), the head a float16 copy; logits agree with the plain plan."""
    table = rand(4096, 256, seed=12, dtype="float16")
    net = Net()
    ids = net.input("ids", "int32", (-1,))
    t = net.const(table)
    x = net.network.add_gather(t, ids, 0).get_output(0)  # [rows, 256]
    net.mark(x, "rows")
    net.mark(net.network.add_matrix_multiply(x, M.NONE, t, M.TRANSPOSE).get_output(0), "logits")
    feed = {"ids": np.arange(5, 5 + 7 * rows, 7, dtype=np.int32)}
    net.build(feed)
    fast = compile_network(net.network).run(feed)
    plain = compile_network(net.network, fast=False).run(feed)
    np.testing.assert_array_equal(fast["rows"], table[feed["ids"]])
    _agree_within_one_float16_rounding(fast["logits"], plain["logits"], table[feed["ids"]], table)
