"""The fast plan's float16 finisher (:func:`trt_kv.interpreter.half.round_any`): the bits of
``x.astype(np.float16).astype(np.float32)`` for whatever a kernel returns (its short path
takes C-contiguous float32 arrays of the helper's size; everything else takes the checked
one)."""

from __future__ import annotations

import numpy as np
import pytest

from trt_kv.interpreter import half, native


def _values(n: int) -> np.ndarray:
    """``n`` float32 values: ties, overflow to infinity, subnormals, NaN, signed zeros."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(n) * rng.choice([1e-7, 1e-3, 1.0, 6e4, 7e4], n)).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, -0.0, 65520.0, 2.0**-25]
    return x


@pytest.mark.parametrize(
    "make",
    [
        lambda: _values(576).reshape(1, 1, 576),  # a decode step's row: the short path
        lambda: _values(64).reshape(1, 64),  # small: NumPy's casts
        lambda: _values(2 * 576).reshape(2, 576)[:, ::2],  # strided
        lambda: _values(576).reshape(24, 24).T,  # transposed
        lambda: _values(576).astype(np.float64),  # another dtype: cast first
        lambda: np.float32(70000.0),  # a NumPy scalar
        lambda: [1.0, 2.0**-25, 65519.0],  # not an array
    ],
)
def test_round_any_matches_numpy_casts(make) -> None:
    a = make()
    with np.errstate(over="ignore"):
        expected = np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)
    got = half.round_any(a)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


def test_round_any_returns_a_new_array() -> None:
    """The finisher's output is the layer's tensor: never the kernel's array itself."""
    a = _values(576)
    out = half.round_any(a)
    assert out is not a and not np.shares_memory(out, a)


@pytest.mark.skipif(native.LIB is None, reason="no compiled helper here")
def test_short_path_equals_checked_path() -> None:
    a = _values(4096).reshape(4, 1024)
    assert native.round_any(a).tobytes() == native.round_float16(a).tobytes()
