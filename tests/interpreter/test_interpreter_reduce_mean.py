"""The fast plan's AVG reduce (:func:`trt_kv.interpreter.linalg._mean`): ``np.mean``'s bits
by its own two operations, for every shape, axes and keepdims, and ``np.mean`` itself for
what it does not take (float16 and float64 arrays, empty reductions, reductions to a
scalar)."""

from __future__ import annotations

import numpy as np
import pytest

from trt_kv.interpreter.linalg import _mean


def _rows(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape) * rng.choice([1e-6, 1.0, 3e3], shape)
    return (x * x).astype(dtype)  # squares, as an RMSNorm averages


@pytest.mark.parametrize(
    ("shape", "axes", "keep"),
    [
        ((1, 1, 576), (2,), True),  # a decode step's RMSNorm
        ((8, 128, 576), (2,), True),  # a prefill chunk's
        ((3, 5, 7), (0, 2), False),
        ((3, 5, 7), (-1,), True),
        ((3, 5, 7), (0, 1, 2), True),
        ((2, 0, 4), (2,), True),  # nothing reduced into an empty result
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_mean_is_numpys_bit_for_bit(shape, axes, keep, dtype) -> None:
    a = _rows(shape, dtype)
    expected = np.mean(a, axis=axes, keepdims=keep)
    got = _mean(a, axes, keep)
    assert np.asarray(got).dtype == np.asarray(expected).dtype
    assert np.asarray(got).shape == np.asarray(expected).shape
    assert np.asarray(got).tobytes() == np.asarray(expected).tobytes()


def test_mean_to_a_scalar_and_of_nothing_are_numpys() -> None:
    a = _rows((4, 6))
    assert _mean(a, (0, 1), False) == np.mean(a)
    with pytest.warns(RuntimeWarning):
        got = _mean(np.zeros((2, 0), np.float32), (1,), True)
    assert got.shape == (2, 1) and np.isnan(got).all()


def test_mean_of_a_strided_view() -> None:
    a = _rows((6, 40))[::2, 1::3]
    assert _mean(a, (1,), True).tobytes() == np.mean(a, axis=(1,), keepdims=True).tobytes()
