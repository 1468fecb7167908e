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

Where the optional compiled helper ``_float16`` was built (``setup.py``; x86-64 with F16C),
both take the processor's own conversion instructions instead: the same bits again (NaN
payloads included), ~0.2 ns an element against the recipes' ~0.7-0.9. :data:`NATIVE` says
which runs; :data:`RECIPES` and :data:`COMPILED` are the two, side by side, for the tests.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

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


def _round_recipe(x: np.ndarray) -> np.ndarray:
    """:func:`round_float16` in NumPy: Veltkamp's split."""
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


_SIGNATURES = 1  # the C file's SIGNATURES: the version of the functions' argument lists


def _compiled_library() -> ctypes.CDLL | None:
    """The compiled helper ``_float16`` beside this file, when it was built and this
    processor runs it; else None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = Path(__file__).with_name("_float16" + suffix)
        if path.is_file():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                return None
            if lib.trt_kv_float16_ready() != _SIGNATURES:  # another processor; a stale build
                return None
            size, pointer = ctypes.c_size_t, ctypes.c_void_p
            lib.trt_kv_round_float16.argtypes = [pointer, pointer, size]
            lib.trt_kv_widen_float16.argtypes = [pointer, size, size, size, pointer]
            lib.trt_kv_round_float16.restype = lib.trt_kv_widen_float16.restype = None
            return lib
    return None


_LIB = _compiled_library()
_SMALL_COMPILED = 256  # below this, one NumPy cast costs less than a call through ctypes


def _rows(a: np.ndarray) -> tuple[int, int, int] | None:
    """``(rows, stride, length)`` in elements when ``a``'s elements, in order, are ``rows``
    runs of ``length`` contiguous ones, ``stride`` apart (a window of a larger array, such
    as ``cache[:, :, :n]``); None for any other layout."""
    item, length, k = a.itemsize, 1, a.ndim
    while k and (a.shape[k - 1] == 1 or a.strides[k - 1] == length * item):
        length *= a.shape[k - 1]
        k -= 1
    outer = [(n, s) for n, s in zip(a.shape[:k], a.strides[:k]) if n != 1]
    if not outer:
        return 1, 0, length
    if any(s0 != s1 * n1 for (_, s0), (n1, s1) in itertools.pairwise(outer)):
        return None  # the leading axes do not step as one
    stride = outer[-1][1]
    if stride < 0 or stride % item:
        return None
    return int(np.prod([n for n, _ in outer])), stride // item, length


def _widen_compiled(h: np.ndarray) -> np.ndarray:
    """:func:`widen` with the processor's conversion instructions."""
    if h.size < _SMALL_COMPILED:
        return h.astype(np.float32)
    rows = _rows(h)
    if rows is None:
        h = np.ascontiguousarray(h)
        rows = (1, 0, h.size)
    out = np.empty(h.shape, np.float32)
    _LIB.trt_kv_widen_float16(h.ctypes.data, *rows, out.ctypes.data)
    return out


def _round_compiled(x: np.ndarray) -> np.ndarray:
    """:func:`round_float16` with the processor's conversion instructions."""
    if x.size < _SMALL_COMPILED:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, np.float32)
    _LIB.trt_kv_round_float16(x.ctypes.data, out.ctypes.data, x.size)
    return out


Conversions = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]
RECIPES: Conversions = (_widen_recipe, _round_recipe)  # (widen, round_float16) in NumPy
COMPILED: Conversions | None = None if _LIB is None else (_widen_compiled, _round_compiled)
NATIVE = COMPILED is not None  # True: widen and round_float16 run the compiled helper
_WIDEN, _ROUND = COMPILED or RECIPES


def widen(h: np.ndarray) -> np.ndarray:
    """``h.astype(np.float32)`` for a float16 array ``h`` (any shape, any strides)."""
    return _WIDEN(h)


def round_float16(x: np.ndarray) -> np.ndarray:
    """A new float32 array holding ``x.astype(np.float16).astype(np.float32)`` for a float32
    array ``x``: each element rounded to the nearest float16 (ties to even)."""
    return _ROUND(x)


def widen_to(a: np.ndarray, compute: np.dtype) -> np.ndarray:
    """``a`` in ``compute`` (float32 from float16 through :func:`widen`; else NumPy's cast)."""
    if a.dtype == compute:
        return a
    if a.dtype == _F16 and compute == _F32:
        return widen(a)
    return a.astype(compute)
