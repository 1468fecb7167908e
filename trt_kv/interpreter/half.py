"""float16 <-> float32 conversions for the fast plan: the same bits as NumPy's casts, faster.

NumPy converts float16 one element at a time (~2-4 ns an element here), which made rounding
every tensor of a float16 network and widening its float16 caches the largest costs of a
decode step after the matrix products. These give bit-for-bit the results of
``x.astype(np.float16).astype(np.float32)`` and ``h.astype(np.float32)`` (tested on every
float16 value and on every boundary of the float32 ranges), at a fraction of the time:

- :func:`widen`: the float16 bits moved into float32 position and rescaled by 2^112 (exact);
  infinity and NaN take NumPy's cast;
- :func:`round_float16`: Veltkamp's split, ``t = x * 8193; t - (t - x)``: float32
  arithmetic (round to nearest even) keeps the top 11 significant bits of ``x``, rounded to
  nearest with ties to even (checked on every float32 whose float16 is normal); elements
  outside that range (zero, subnormal results, overflow to infinity, NaN) take NumPy's cast
  itself, so their bits match by construction.

Where the optional compiled helper ``_native`` was built (``setup.py``; x86-64 with AVX2,
FMA and F16C), both take the processor's own conversion instructions instead, through
:mod:`~trt_kv.interpreter.native`: the same bits again (NaN payloads included), ~0.2 ns an
element against the recipes' ~0.7-0.9. :data:`NATIVE` says which runs;
:data:`RECIPES` and :data:`COMPILED` are the two, side by side, for the tests. Each refuses
an array of another dtype or byte order (:class:`~trt_kv.errors.DTypeError`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np

from trt_kv.interpreter import native

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
# Below these sizes NumPy's casts win (the recipes below cost 6-10 calls of fixed overhead)
_SMALL_WIDEN, _SMALL_ROUND = 8192, 1024
# float16 bits, sign-extended to 32 and shifted left by 13: keep bit 31 and bits 13..27
_SIGN_AND_MAGNITUDE = np.uint32(0x8FFFE000).view(np.int32)
_REBIAS = np.float32(2.0**112)  # 2^(127 - 15)
_MAGNITUDE16, _EXPONENT16 = np.uint16(0x7FFF), np.uint16(0x7C00)  # 0x7C00..: inf or NaN
# |x| bit patterns whose nearest float16 is a normal number: [2^-14, 65520)
_NORMAL_LO = np.uint32(0x38800000)  # 2^-14, the smallest normal float16
_NORMAL_SPAN = np.uint32(0x477FF000 - 0x38800000)  # 65520 = 65504 + half an ulp: rounds to inf
# Veltkamp's split: hi = t - (t - x), t = x * (2^13 + 1), is x rounded to 24 - 13 = 11
# significant bits, ties to even (checked on every float32 with |x| in [2^-14, 65520))
_SPLIT = np.float32(2**13 + 1)
_TINY, _OVERFLOW = np.float32(2.0**-14), np.float32(65520.0)
_MAX = np.maximum.reduce
_QUIET = contextlib.nullcontext()  # nothing to silence: no element overflows


def _widen_recipe(h: np.ndarray) -> np.ndarray:
    """:func:`widen` in NumPy: the bits moved and rescaled."""
    native.expect_dtype("h", h, _F16)
    if h.size < _SMALL_WIDEN:
        return h.astype(np.float32)
    # int16 -> int32 repeats the sign in bits 16..31; shifted by 13, bit 31 is the sign and
    # bits 13..27 the exponent and mantissa: clear bits 28..30 and 0..12, and rescale.
    out = np.left_shift(h.view(np.int16), 13, dtype=np.int32)
    out &= _SIGN_AND_MAGNITUDE
    widened = out.view(np.float32)
    # exponent bias 15 -> 127, exact; subnormals become normal. (A float16 subnormal is a
    # float32 subnormal before this product: under DAZ, set by a library built with
    # -ffast-math, it would read as zero. NumPy and trt_kv leave MXCSR as it is.)
    widened *= _REBIAS
    magnitude = np.bitwise_and(h.view(np.uint16), _MAGNITUDE16)
    if magnitude.max() >= _EXPONENT16:  # infinity or NaN: NumPy's cast
        special = magnitude >= _EXPONENT16
        widened[special] = h[special].astype(np.float32)
    return widened


def _round_recipe(x: np.ndarray) -> np.ndarray:
    """:func:`round_float16` in NumPy: Veltkamp's split."""
    native.expect_dtype("x", x, _F32)
    if x.size < _SMALL_ROUND:
        with np.errstate(over="ignore"):  # overflow to inf is the rounding asked for
            return x.astype(np.float16).astype(np.float32)
    x = np.ascontiguousarray(x)
    magnitude = np.abs(x)
    flat = magnitude.reshape(-1)  # a view: the indices below are into the flattened arrays
    finite = _MAX(flat) < _OVERFLOW  # False when some element is NaN too
    if finite:  # the outliers are |x| < 2^-14: subnormal results and zeros (exact anyway)
        special = np.less(flat, _TINY).nonzero()[0]  # most large tensors hold a few
    else:  # and infinity, NaN, |x| >= 65520 (rounds to inf)
        bits = flat.view(np.uint32)
        bits -= _NORMAL_LO  # wraps below 2^-14: one unsigned compare tests both ends
        special = (bits >= _NORMAL_SPAN).nonzero()[0]
    # x * 8193 may overflow and inf - inf is NaN only where the cast takes over
    with _QUIET if finite else np.errstate(over="ignore", invalid="ignore"):
        rounded = np.multiply(x, _SPLIT)
        rounded -= np.subtract(rounded, x, out=magnitude)  # Veltkamp: the top 11 bits
        if special.size:
            outliers = x.reshape(-1)[special]
            rounded.reshape(-1)[special] = outliers.astype(np.float16).astype(np.float32)
    return rounded


Conversions = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]
RECIPES: Conversions = (_widen_recipe, _round_recipe)  # (widen, round_float16) in NumPy
COMPILED: Conversions | None = None if native.LIB is None else (native.widen, native.round_float16)
NATIVE = COMPILED is not None  # True: widen and round_float16 run the compiled helper
_WIDEN, _ROUND = COMPILED or RECIPES


def widen(h: np.ndarray) -> np.ndarray:
    """``h.astype(np.float32)`` for a float16 array ``h`` (any shape, any strides)."""
    return _WIDEN(h)


def round_float16(x: np.ndarray) -> np.ndarray:
    """A new float32 array holding ``x.astype(np.float16).astype(np.float32)`` for a float32
    array ``x``: each element rounded to the nearest float16 (ties to even)."""
    return _ROUND(x)


def round_any(a: object) -> np.ndarray:
    """:func:`round_float16` of ``np.asarray(a, dtype=np.float32)`` (a fast plan's float16
    output finisher: the compiled helper's shortest path where it is built)."""
    if _ROUND is native.round_float16:
        return native.round_any(a)
    return _ROUND(np.asarray(a, dtype=_F32))


def widen_to(a: np.ndarray, compute: np.dtype) -> np.ndarray:
    """``a`` in ``compute`` (float32 from float16 through :func:`widen`; else NumPy's cast)."""
    if a.dtype == compute:
        return a
    if a.dtype == _F16 and compute == _F32:
        return widen(a)
    return a.astype(compute)
