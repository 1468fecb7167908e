"""Products against weights kept quantized (trt_kv/interpreter/blocks.py, fused.py): the
helper's block product and block panels, and NumPy's fallback, against the float64 product
with the dequantized weight; the same bits whatever the thread count; a network's
dequantize -> product (+ its minimum's product) run as one fused product, per GGUF type.

Bound of a block product (float32): each element is ``sum_b d_b P_b + o'_b s_b`` with ``P_b``
a block's codes times ``x`` (4-bit codes read unsigned, ``c + 8``, the 8 moved into
``o' = o - 8 d``) and ``s_b`` a block's sum of ``x``: at most ``2 K eps`` times the same sum
of magnitudes, ``|x| @ (|d| |u| + |o'|)^T`` (:func:`_bound`).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.quantization.test_quantized_weights import EXACT, _stored
from tests.support.compiled_helper import require_compiled_helper
from trt_kv import dtypes
from trt_kv.builder import create_network
from trt_kv.checkpoints.gguf_blocks import keep_quantized
from trt_kv.errors import DTypeError, ShapeError
from trt_kv.interpreter import blocks, compile_network, half, native, products
from trt_kv.interpreter.blocks import BlockWeight
from trt_kv.interpreter.products import Route, Weight, choose, multiply
from trt_kv.models.layers.graph import Graph
from trt_kv.quantization.network import block_offsets, quantized_linear

RNG = np.random.default_rng(41)
EPS = float(np.finfo(np.float32).eps)
# (bits, block, offsets): every form a GGUF type is held in (Q4_1: 4, 32, offsets; Q6_K: 8, 16)
FORMS = [(4, 32, True), (4, 32, False), (4, 16, False), (4, 16, True), (8, 32, False)]
FORMS += [(8, 16, False), (8, 32, True)]


def _weight(bits: int, block: int, offsets: bool, n: int = 72, k: int = 192) -> BlockWeight:
    lo, hi = (-8, 8) if bits == 4 else (-128, 128)
    codes = RNG.integers(lo, hi, (n, k)).astype(np.int8)
    scales = (RNG.random((n, k // block)) * 0.02).astype(np.float16)
    mins = (RNG.standard_normal((n, k // block)) * 0.05).astype(np.float16) if offsets else None
    return BlockWeight.from_codes(codes, scales, mins, bits)


def _bound(x: np.ndarray, w: BlockWeight) -> np.ndarray:
    """``2 K eps |x| @ (|d| |u| + |o'|)^T`` (see the module)."""
    d = np.repeat(w.scales.astype(np.float64), w.block, axis=1)
    o = 0.0 if w.offsets is None else np.repeat(w.offsets.astype(np.float64), w.block, axis=1)
    u = w.signed_codes().astype(np.float64) + (8 if w.bits == 4 else 0)
    shift = 8 * d if w.bits == 4 else 0.0
    magnitude = np.abs(d) * np.abs(u) + np.abs(o - shift) + np.abs(d * w.signed_codes())
    return 2 * x.shape[1] * EPS * (np.abs(x.astype(np.float64)) @ magnitude.T) + 1e-30


def _exact(x: np.ndarray, w: BlockWeight) -> np.ndarray:
    return x.astype(np.float64) @ w.dequantize().astype(np.float64).T


@pytest.mark.parametrize(("bits", "block", "offsets"), FORMS)
def test_block_weight_holds_the_codes_packed_and_dequantizes_as_stored(bits, block, offsets):
    w = _weight(bits, block, offsets)
    codes = w.signed_codes()
    assert w.codes.nbytes == codes.size * bits // 8
    assert w.nbytes == w.codes.nbytes + w.scales.nbytes * (2 if offsets else 1)
    d = np.repeat(w.scales.astype(np.float32), block, axis=1)
    expected = d * codes + (np.repeat(w.offsets.astype(np.float32), block, 1) if offsets else 0)
    assert np.array_equal(w.dequantize(), expected.astype(np.float32))


@pytest.mark.parametrize(("bits", "block", "offsets"), FORMS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 17, 128, 130])
def test_helper_block_products_are_the_float64_product_within_float32_rounding(
    bits, block, offsets, rows
):
    """Each kernel (AVX2 and AVX-512; few rows and panels) within the stated bound, and the
    same bits on 1, 2 and 3 threads (the weight rows split, never K)."""
    require_compiled_helper()
    w = _weight(bits, block, offsets)
    x = RNG.standard_normal((rows, w.shape[1])).astype(np.float32)
    expected, bound = _exact(x, w), _bound(x, w)
    for wide in (False, True) if native.WIDE else (False,):
        for panels in (False, True):
            run = lambda t, p=panels, v=wide: native.block_product(  # noqa: E731
                w.codes, bits, block, w.scales, w.offsets, x, t, p, v
            )
            one = run(1)
            assert (np.abs(one - expected) <= bound).all(), (wide, panels)
            for threads in (2, 3):
                assert np.array_equal(run(threads).view(np.uint32), one.view(np.uint32))


@pytest.mark.parametrize("rows", [1, 5, 130])
def test_a_product_rounded_in_its_call_is_the_product_rounded_after(rows, monkeypatch):
    """``rounded``: the float16 values a float16 network's product is rounded to, in the
    helper's call (few rows, panels; 1 and 2 threads) or after NumPy's fallback, the bits of
    the unrounded product's :func:`~trt_kv.interpreter.half.round_any`."""
    require_compiled_helper()
    w = _weight(4, 32, True)
    x = (RNG.standard_normal((rows, w.shape[1])) * 40).astype(np.float32)  # past float16's 2^-14
    for threads in (1, 2):
        monkeypatch.setattr(products, "_threads", [threads])
        plain = products.block_product(x, w)
        rounded = products.block_product(x, w, rounded=True)
        assert not np.array_equal(plain, rounded)
        assert np.array_equal(rounded.view(np.uint32), half.round_any(plain).view(np.uint32))
    monkeypatch.setattr(products.half, "NATIVE", False)
    before = blocks.COUNTS["block_numpy"]
    fallback = products.block_product(x, w, rounded=True)
    assert blocks.COUNTS["block_numpy"] == before + 1
    np.testing.assert_array_equal(fallback, half.round_any(products.block_product(x, w)))


@pytest.mark.parametrize("rows", [1, 3, 8, 9])
def test_a_block_caller_gives_block_products_route_count_and_bits(rows, monkeypatch):
    """``products.block_caller`` (a plan step's bound product): the route, the count and the
    bits of :func:`~trt_kv.interpreter.products.block_product`, for rows it sends straight to
    the helper (float32, contiguous, up to BLOCK_ROWS, any leading dims) and rows it does not
    (more rows, float16, a strided view); without the helper, the NumPy route."""
    require_compiled_helper()
    w = _weight(4, 32, True)
    x = RNG.standard_normal((rows, w.shape[1])).astype(np.float32)
    wide = np.ascontiguousarray(np.repeat(x, 2, axis=1))  # x its even columns: a strided view
    cases = (x, x.reshape(1, rows, -1), x.astype(np.float16), wide[:, ::2])
    route = "block_native" if rows <= products.BLOCK_ROWS else "block_panels"
    for rounded in (False, True):
        call = products.block_caller(w, rounded)
        for a in cases:
            want = products.block_product(a, w, rounded)
            before = dict(blocks.COUNTS)
            got = call(a)
            ran = {
                k: v - before.get(k, 0) for k, v in blocks.COUNTS.items() if v != before.get(k, 0)
            }
            assert ran == {route: 1}, (a.shape, a.dtype, ran)
            assert got.shape == want.shape == (*a.shape[:-1], w.shape[0])
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    monkeypatch.setattr(products.half, "NATIVE", False)
    before = blocks.COUNTS["block_numpy"]
    np.testing.assert_allclose(
        products.block_caller(w)(x), products.block_product(x, w), rtol=1e-5, atol=1e-5
    )
    assert blocks.COUNTS["block_numpy"] == before + 2


def test_the_helpers_block_calls_refuse_rows_of_another_k_or_dtype():
    """Rows whose K is not the weight's (the helper would read past them) and rows that are
    not float32 fail before the call, through the weight's bound calls (few rows, panels) as
    through :func:`~trt_kv.interpreter.native.block_product`."""
    require_compiled_helper()
    w = _weight(4, 32, True)
    x = RNG.standard_normal((1, w.shape[1] + 32)).astype(np.float32)
    for call in w.native_calls:
        with pytest.raises(ShapeError, match="x: expected K 192, got 224"):
            call(x, 1, 0)
    with pytest.raises(ShapeError, match="x: expected K"):
        native.block_product(w.codes, w.bits, w.block, w.scales, w.offsets, x)
    with pytest.raises(DTypeError, match="x"):
        multiply(Route.BLOCK_NATIVE, x[:, :192].astype(np.float64), w)
    np.testing.assert_array_equal(
        w.native_calls[0](np.ascontiguousarray(x[:, :192]), 1, 0),
        native.block_product(w.codes, w.bits, w.block, w.scales, w.offsets, x[:, :192]),
    )


@pytest.mark.parametrize(("bits", "block", "offsets"), FORMS[:3] + FORMS[5:6])
def test_numpy_fallback_is_the_float64_product_within_float32_rounding(bits, block, offsets):
    """Without the helper (the route choose gives where it is not built)."""
    w = _weight(bits, block, offsets, n=3000, k=96)  # 3000 rows: several blocks of rows
    x = RNG.standard_normal((2, 96)).astype(np.float32)
    route = choose(Weight.BLOCKS, 2, *w.shape, np.float32, np.float32, built=False)
    assert route is Route.BLOCK_NUMPY
    out = multiply(route, x, w)
    d = np.repeat(w.scales.astype(np.float64), block, axis=1)
    o = 0.0 if w.offsets is None else np.repeat(w.offsets.astype(np.float64), block, axis=1)
    magnitude = np.abs(d * w.signed_codes()) + np.abs(o)  # BLAS on d c + o, rounded once
    bound = 2 * 96 * EPS * (np.abs(x.astype(np.float64)) @ magnitude.T) + 1e-30
    assert (np.abs(out - _exact(x, w)) <= bound).all()


@pytest.mark.parametrize(
    ("rows", "built", "route"),
    [
        (1, True, "block_native"),
        (8, True, "block_native"),
        (9, True, "block_panels"),
        (128, True, "block_panels"),
        (129, True, "block_numpy"),
        (1, False, "block_numpy"),
    ],
)
def test_block_routes_follow_the_thresholds(rows, built, route):
    assert products.BLOCK_ROWS == 8 and products.BLOCK_PANEL_ROWS == 128
    got = choose(Weight.BLOCKS, rows, 576, 576, np.float32, np.float32, built=built)
    assert got.value == route


def _linear_network(q, dtype: str, rank: int = 3):
    k = q.shape[1]
    _, net = create_network()
    g = Graph(net, dtype)
    x = net.add_input("x", dtypes.to_trt(dtype), (-1,) * (rank - 1) + (k,))
    y = quantized_linear(g, x, q)
    y.name = "y"
    net.mark_output(y)
    return net


@pytest.mark.parametrize("type_name", list(EXACT))
@pytest.mark.parametrize("rows", [1, 8, 40])
def test_each_gguf_type_runs_as_one_fused_product(type_name, rows):
    """A float16 network's quantized product of each GGUF type mapped exactly: its layers
    (dequantize, product, the minimum's cast/reshape/reduce/product/sum, the reshapes
    around them) run as one block product, counted; the result is the float64 product with
    the network's weights (``fl16(d) c + fl16(o)``) within float32 rounding and one float16
    rounding of the output (``2^-11 |y|``, plus half a float16 subnormal step)."""
    raw, _ = _stored(type_name)
    q = keep_quantized(type_name, raw, (16, 256), lambda: pytest.fail("re-quantized"))
    net = _linear_network(q, "float16")
    plan = compile_network(net)
    before = sum(blocks.COUNTS.values())
    x = RNG.standard_normal((2, rows // 2 or 1, 256)).astype(np.float16)
    out = plan.run({"x": x})["y"].astype(np.float64)
    assert sum(blocks.COUNTS.values()) == before + 1
    d = np.repeat(q.scales.astype(np.float16).astype(np.float64), q.block, axis=1)
    o = np.repeat(block_offsets(q).astype(np.float16).astype(np.float64), q.block, axis=1)
    w = d * q.codes + o  # [N, K]
    x64 = x.astype(np.float64)
    exact = x64 @ w.T
    bound = 2 * 256 * EPS * (np.abs(x64) @ (np.abs(d * (q.codes + 8)) + np.abs(o - 8 * d)).T)
    bound = bound + 2 * 256 * EPS * (np.abs(x64) @ np.abs(w).T)
    assert (np.abs(out - exact) <= bound + 2**-11 * np.abs(exact) + 2**-25).all()
    plain = compile_network(net, fast=False).run({"x": x})["y"].astype(np.float64)
    assert out.shape == plain.shape == exact.shape


def test_a_float32_network_of_non_float16_scales_keeps_its_layers():
    """Q4_K's scales ``d * sc`` are float32 products a float16 does not hold: a float32
    network keeps the dequantize and products (nothing counted), with its own values."""
    raw, _ = _stored("Q4_K")
    q = keep_quantized("Q4_K", raw, (16, 256), lambda: pytest.fail("re-quantized"))
    assert not np.array_equal(q.scales.astype(np.float16).astype(np.float32), q.scales)
    before = sum(blocks.COUNTS.values())
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    out = compile_network(_linear_network(q, "float32", rank=2)).run({"x": x})["y"]
    assert sum(blocks.COUNTS.values()) == before
    np.testing.assert_allclose(out, x @ q.dequantize().T, rtol=1e-5, atol=1e-4)


def test_without_the_helper_a_plan_runs_the_fused_product_in_numpy(monkeypatch):
    """The fused step where the helper is not built (half.NATIVE False, as choose reads it
    on every call): the NumPy route, counted, the same values within float32 rounding."""
    raw, _ = _stored("Q4_1")
    q = keep_quantized("Q4_1", raw, (16, 256), lambda: pytest.fail("re-quantized"))
    plan = compile_network(_linear_network(q, "float32", rank=2))
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    helper = plan.run({"x": x})["y"]
    monkeypatch.setattr(products.half, "NATIVE", False)
    before = blocks.COUNTS["block_numpy"]
    out = plan.run({"x": x})["y"]
    assert blocks.COUNTS["block_numpy"] == before + 1
    np.testing.assert_allclose(out, helper, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, x @ q.dequantize().T, rtol=1e-5, atol=1e-4)
