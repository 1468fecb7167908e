"""float16 <-> float32 conversions for the fast plan: the same bits as NumPy's casts, faster.

NumPy converts float16 one element at a time (~2-4 ns an element here), which made rounding
every tensor of a float16 network and widening its float16 caches the largest costs of a
decode step after the matrix products. These give bit-for-bit the results of
``x.astype(np.float16).astype(np.float32)`` and ``h.astype(np.float32)`` (tested on every
float16 value and on every boundary of the float32 ranges), at a fraction of the time:

- :func:`widen`: a lookup in a 65536-entry table that NumPy's own cast filled;
- :func:`round_float16`: round-to-nearest-even on the float32 bits (drop 13 mantissa bits)
  where the result is a normal float16; elements outside that range (subnormal results,
  overflow to infinity, NaN) take NumPy's cast itself, so their bits match by construction.
"""

from __future__ import annotations

import numpy as np

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
# float32 value of every float16 bit pattern, by NumPy's own cast (NaN payloads included)
_WIDEN = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
_WIDEN.flags.writeable = False
# |x| bit patterns whose nearest float16 is a normal number: [2^-14, 65520)
_NORMAL_LO = np.uint32(0x38800000)  # 2^-14, the smallest normal float16
_NORMAL_SPAN = np.uint32(0x477FF000 - 0x38800000)  # 65520 = 65504 + half an ulp: rounds to inf
_ABS = np.uint32(0x7FFFFFFF)
_KEEP = np.uint32(0xFFFFE000)  # the sign, exponent and 10 mantissa bits float16 keeps
_HALF_ULP = np.uint32(0xFFF)


def widen(h: np.ndarray) -> np.ndarray:
    """``h.astype(np.float32)`` for a float16 array ``h`` (any shape, any strides)."""
    return np.take(_WIDEN, h.view(np.uint16))


def round_float16(x: np.ndarray) -> np.ndarray:
    """A new float32 array holding ``x.astype(np.float16).astype(np.float32)`` for a float32
    array ``x``: each element rounded to the nearest float16 (ties to even)."""
    x = np.ascontiguousarray(x)
    u = x.view(np.uint32)
    out = np.right_shift(u, 13)  # round half to even: add 0xFFF plus the kept last bit
    out &= 1
    out += _HALF_ULP
    out += u
    out &= _KEEP
    magnitude = np.bitwise_and(u, _ABS)
    magnitude -= _NORMAL_LO  # wraps below 2^-14: one unsigned compare tests both ends
    special = magnitude >= _NORMAL_SPAN
    rounded = out.view(np.float32)
    if special.any():
        with np.errstate(over="ignore"):  # overflow to inf is the rounding asked for
            rounded[special] = x[special].astype(np.float16).astype(np.float32)
    return rounded


def widen_to(a: np.ndarray, compute: np.dtype) -> np.ndarray:
    """``a`` in ``compute`` (float32 from float16 through :func:`widen`; else NumPy's cast)."""
    if a.dtype == compute:
        return a
    if a.dtype == _F16 and compute == _F32:
        return widen(a)
    return a.astype(compute)
