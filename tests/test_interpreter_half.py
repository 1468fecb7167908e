"""float16 conversions of the fast plan: the same bits as NumPy's casts, everywhere.

Golden values are NumPy's own ``astype`` results; the inputs cover every float16 value,
every tie between two neighbours, and each edge of the float32 ranges that round to a normal
float16, a subnormal one, infinity or NaN. (Every one of the 2^32 float32 bit patterns was
also checked once by hand, in chunks: no difference.)
"""

from __future__ import annotations

import numpy as np

from trt_kv.interpreter.half import round_float16, widen


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _every_float16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def _reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def test_widen_gives_numpys_bits_for_every_float16_value():
    h = _every_float16()
    np.testing.assert_array_equal(_bits(widen(h)), _bits(h.astype(np.float32)))


def test_widen_reads_strided_windows():
    window = _every_float16().reshape(4, 128, 128)[:, :57, ::3]  # a cache window: not contiguous
    np.testing.assert_array_equal(_bits(widen(window)), _bits(window.astype(np.float32)))
    assert widen(window).shape == window.shape


def test_round_float16_keeps_every_float16_value():
    x = _every_float16().astype(np.float32)
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(x))


def test_round_float16_rounds_ties_to_even_and_neighbours_to_nearest():
    """Midpoints between consecutive finite float16 values (ties), and one float32 ulp on
    either side of each, in both signs."""
    h = _every_float16()
    finite = np.sort(np.unique(h[np.isfinite(h)].astype(np.float32)))
    mid = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # exact in float32 here
    mid = mid.astype(np.float32)
    x = np.concatenate(
        [mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))]
    )
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))


def test_round_float16_at_the_edges_of_its_ranges():
    """2^-14 (smallest normal), 2^-24 (smallest subnormal) and below, 65504 (largest),
    65520 (rounds to inf), inf, NaN with payloads, -0."""
    edges = np.array(
        [
            2.0**-14,
            2.0**-24,
            2.0**-25,
            2.0**-26,
            3 * 2.0**-26,
            1e-30,
            0.0,
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            1e30,
            np.inf,
        ],
        np.float32,
    )
    around = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf)])
    nans = np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFFFFFFFF], np.uint32)
    x = np.tile(np.concatenate([around, -around, nans.view(np.float32)]), 64)  # the bit recipe
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))


def test_small_arrays_take_numpys_casts_with_the_same_results():
    h = _every_float16()[::4096]  # 16 values: below the size where the bit recipes start
    np.testing.assert_array_equal(_bits(widen(h)), _bits(h.astype(np.float32)))
    x = h.astype(np.float32) * np.float32(1.0001)
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))


def test_round_float16_random_values_and_shapes():
    rng = np.random.default_rng(0)
    shape = (3, 50, 70)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-20, 12, shape))).astype(np.float32)
    strided = x[:, ::2]
    got = round_float16(strided)
    assert got.shape == strided.shape and got.dtype == np.float32
    np.testing.assert_array_equal(_bits(got), _bits(_reference(strided)))
