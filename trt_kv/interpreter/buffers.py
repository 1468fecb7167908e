"""Arrays as the compiled helper reads them: their dtype checked, contiguous and aligned, the
address of their first element (the helper's functions take raw pointers), and the bounds of
an index array (checked before C reads past a table)."""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from trt_kv.errors import DTypeError, mismatch


def expect_dtype(name: str, a: np.ndarray, dtype: np.dtype) -> None:
    """DTypeError unless ``a`` holds ``dtype`` in this machine's byte order (the C code reads
    raw memory: another type would be read as garbage, or past its end)."""
    if a.dtype != dtype:
        raise DTypeError(mismatch(name, "dtype", dtype.str, a.dtype.str))


def contiguous_aligned(a: np.ndarray) -> np.ndarray:
    """``a`` itself when C-contiguous and aligned (the usual case), else an aligned copy
    (``np.require(a, requirements="CA")`` does the same at ~25x the cost of this check)."""
    a = np.ascontiguousarray(a)
    return a if a.flags.aligned else a.copy()


_BYTE = ctypes.c_char
# id -> (the read-only array, weakly; its address): an entry leaves with its array
_HELD: dict[int, tuple[weakref.ref, int]] = {}


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element. Through the buffer protocol (~0.3 us) where ``a``
    exports one (writeable, C-contiguous); a read-only array's (a plan's constants and
    weights, read on every step) is remembered while the array lives; else ``a.ctypes.data``
    (~3 us, ~5 after the failed export: what each constant cost on every call before)."""
    flags = a.flags
    if flags.writeable:
        if not flags.c_contiguous:  # no buffer to export (a window of a cache, say)
            return a.ctypes.data
        try:
            return ctypes.addressof(_BYTE.from_buffer(a))
        except (TypeError, ValueError, BufferError):  # another reason: the general way
            return a.ctypes.data
    held = _HELD.get(id(a))
    if held is not None and held[0]() is a:
        return held[1]
    at = a.ctypes.data
    _HELD[id(a)] = (weakref.ref(a, _forget(id(a))), at)
    return at


def _forget(key: int) -> object:
    """The weak reference's callback: the entry of ``key`` goes with its array."""
    return lambda _: _HELD.pop(key, None)


def bounds(a: np.ndarray) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer array as Python ints (one element, a decode
    step's position: read, not reduced twice)."""
    if a.size == 1:
        value = int(a.reshape(-1)[0])
        return value, value
    return int(a.min()), int(a.max())
