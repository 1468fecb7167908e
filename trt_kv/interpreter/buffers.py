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


_POINTER = ctypes.c_void_p


def _data_field() -> int | None:
    """Where an ndarray object holds the address of its first element: NumPy's array struct
    (``PyArrayObject_fields``, its C ABI) has it first after the object's header. Taken only
    where probes of several layouts find there what NumPy gives (``a.ctypes.data``); else None
    (another build of Python or NumPy: the general way then)."""
    at = object.__basicsize__
    probes = (np.zeros(3), np.zeros((4, 6), np.float32)[1:, ::2], np.zeros((2, 3))[::-1].T)
    found = all(_POINTER.from_address(id(p) + at).value == p.ctypes.data for p in probes)
    return at if found else None


_DATA = _data_field()


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element, as NumPy's ``a.ctypes.data`` gives it: read from
    the array object itself (~0.5 us, where :func:`_data_field` found it), else (an ndarray
    subclass, another build) ``a.ctypes.data`` (~1.7 us)."""
    if _DATA is not None and type(a) is np.ndarray:
        return _POINTER.from_address(id(a) + _DATA).value or 0
    return a.ctypes.data


def bounds(a: np.ndarray) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer array as Python ints (one element, a decode
    step's position: read, not reduced twice)."""
    if a.size == 1:
        value = int(a.reshape(-1)[0])
        return value, value
    return int(a.min()), int(a.max())
