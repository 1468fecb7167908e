"""float16 <-> float32 conversions for the fast plan: the same bits as NumPy's casts, faster.

NumPy converts float16 one element at a time (~2-4 ns an element here), which made rounding
every tensor of a float16 network and widening its float16 caches the largest costs of a
decode step after the matrix products. These give bit-for-bit the results of
``x.astype(np.float16).astype(np.float32)`` and ``h.astype(np.float32)`` (tested on every
float16 value and on every boundary of the float32 ranges), at a fraction of the time:

- :func:`widen`: the float16 bits moved into float32 position and rescaled by 2^112 (exact);
  infinity and NaN take NumPy's cast;
- :func:`round_float16`: round-to-nearest-even on the float32 bits (drop 13 mantissa bits)
  where the result is a normal float16; elements outside that range (subnormal results,
  overflow to infinity, NaN) take NumPy's cast itself, so their bits match by construction.
"""

from __future__ import annotations

import numpy as np

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
# Below these sizes NumPy's casts win (the bit recipes cost ~10 calls of fixed overhead)
_SMALL_WIDEN, _SMALL_ROUND = 8192, 2048
# float16 bits, sign-extended to 32 and shifted left by 13: keep bit 31 and bits 13..27
_SIGN_AND_MAGNITUDE = np.uint32(0x8FFFE000).view(np.int32)
_REBIAS = np.float32(2.0**112)  # 2^(127 - 15)
_MAGNITUDE16, _EXPONENT16 = np.uint16(0x7FFF), np.uint16(0x7C00)  # 0x7C00..: inf or NaN
# |x| bit patterns whose nearest float16 is a normal number: [2^-14, 65520)
_NORMAL_LO = np.uint32(0x38800000)  # 2^-14, the smallest normal float16
_NORMAL_SPAN = np.uint32(0x477FF000 - 0x38800000)  # 65520 = 65504 + half an ulp: rounds to inf
_ABS = np.uint32(0x7FFFFFFF)
_KEEP = np.uint32(0xFFFFE000)  # the sign, exponent and 10 mantissa bits float16 keeps
_HALF_ULP = np.uint32(0xFFF)


def widen(h: np.ndarray) -> np.ndarray:
    """``h.astype(np.float32)`` for a float16 array ``h`` (any shape, any strides)."""
    if h.size < _SMALL_WIDEN:
        return h.astype(np.float32)
    # int16 -> int32 repeats the sign in bits 16..31; shifted by 13, bit 31 is the sign and
    # bits 13..27 the exponent and mantissa: clear bits 28..30 and 0..12, and rescale.
    out = np.left_shift(h.view(np.int16), 13, dtype=np.int32)
    out &= _SIGN_AND_MAGNITUDE
    widened = out.view(np.float32)
    widened *= _REBIAS  # exponent bias 15 -> 127, exact; subnormals become normal
    magnitude = np.bitwise_and(h.view(np.uint16), _MAGNITUDE16)
    if magnitude.max() >= _EXPONENT16:  # infinity or NaN: NumPy's cast
        special = magnitude >= _EXPONENT16
        widened[special] = h[special].astype(np.float32)
    return widened


def round_float16(x: np.ndarray) -> np.ndarray:
    """A new float32 array holding ``x.astype(np.float16).astype(np.float32)`` for a float32
    array ``x``: each element rounded to the nearest float16 (ties to even)."""
    if x.size < _SMALL_ROUND:
        with np.errstate(over="ignore"):  # overflow to inf is the rounding asked for
            return x.astype(np.float16).astype(np.float32)
    x = np.ascontiguousarray(x)
    u = x.view(np.uint32)
    out = np.right_shift(u, 13)  # round half to even: add 0xFFF plus the kept last bit
    out &= 1
    out += _HALF_ULP
    out += u
    out &= _KEEP
    magnitude = np.bitwise_and(u, _ABS)
    magnitude -= _NORMAL_LO  # wraps below 2^-14: one unsigned compare tests both ends
    rounded = out.view(np.float32)
    if magnitude.max() >= _NORMAL_SPAN:  # some element is not rounded to a normal float16
        special = magnitude >= _NORMAL_SPAN
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
