"""Arrays as the compiled helper reads them: their dtype checked, contiguous and aligned, the
address of their first element (the helper's functions take raw pointers), and the bounds of
an index array (checked before C reads past a table)."""

from __future__ import annotations

import ctypes

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


# Every 8-byte word of the address space as one ctypes array: a view from address 0 (no memory
# of its own). Its element i is the word at 8 * i, read without making a ctypes object for it
# (~0.2 us; ``c_void_p.from_address(at).value`` reads the same word in ~0.5).
_WORDS = (ctypes.c_uint64 * (1 << (8 * ctypes.sizeof(ctypes.c_void_p) - 5))).from_address(0)


def _data_field() -> int | None:
    """Where an ndarray object holds the address of its first element: NumPy's array struct
    (``PyArrayObject_fields``, its C ABI) has it first after the object's header. Taken only
    where probes of several layouts find there what NumPy gives (``a.ctypes.data``); else None
    (another build of Python or NumPy: the general way then)."""
    at = object.__basicsize__
    probes = (np.zeros(3), np.zeros((4, 6), np.float32)[1:, ::2], np.zeros((2, 3))[::-1].T)
    try:
        found = all(_WORDS[(id(p) + at) >> 3] == p.ctypes.data for p in probes)
    except IndexError:  # an address past the view (no 64-bit process)
        return None
    return at if found and at % 8 == 0 else None


_DATA = _data_field()


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element, as NumPy's ``a.ctypes.data`` gives it: read from
    the array object itself (~0.3 us, where :func:`_data_field` found it), else (an ndarray
    subclass, another build) ``a.ctypes.data`` (~1.7 us)."""
    if _DATA is not None and type(a) is np.ndarray:
        return _WORDS[(id(a) + _DATA) >> 3]
    return a.ctypes.data


def bounds(a: np.ndarray) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer array as Python ints (one element, a decode
    step's position: read, not reduced twice)."""
    if a.size == 1:
        value = int(a.reshape(-1)[0])
        return value, value
    return int(a.min()), int(a.max())
