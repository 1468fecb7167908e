"""Data types by name: one table between TensorRT, NumPy and the JSON sidecar."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from trt_kv._trt import trt
from trt_kv.errors import DTypeError, mismatch

# name -> (TensorRT dtype, NumPy dtype)
_TABLE: dict[str, tuple[object, np.dtype]] = {
    "float32": (trt.float32, np.dtype(np.float32)),
    "float16": (trt.float16, np.dtype(np.float16)),
    "bfloat16": (trt.bfloat16, np.dtype(ml_dtypes.bfloat16)),
    "int32": (trt.int32, np.dtype(np.int32)),
    "int64": (trt.int64, np.dtype(np.int64)),
    "int8": (trt.int8, np.dtype(np.int8)),
    "bool": (trt.bool, np.dtype(np.bool_)),
}
_BY_TRT = {v[0]: k for k, v in _TABLE.items()}
NAMES = tuple(_TABLE)  # every dtype name a sidecar may hold


def name_of(dtype: object) -> str:
    """Canonical name of a TensorRT or NumPy dtype (``"float16"``...); DTypeError for any
    other type."""
    if dtype in _BY_TRT:
        return _BY_TRT[dtype]
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as err:
        raise DTypeError(mismatch("dtype", "one of", sorted(_TABLE), dtype)) from err
    for key, (_, value) in _TABLE.items():
        if value == np_dtype:
            return key
    raise DTypeError(mismatch("dtype", "one of", sorted(_TABLE), dtype))


def to_trt(dtype: object) -> object:
    """TensorRT dtype for a name, NumPy dtype or TensorRT dtype."""
    return _TABLE[_key(dtype)][0]


def to_numpy(dtype: object) -> np.dtype:
    """NumPy dtype for a name, NumPy dtype or TensorRT dtype (bfloat16 via ml_dtypes)."""
    return _TABLE[_key(dtype)][1]


def _key(dtype: object) -> str:
    if isinstance(dtype, str):
        if dtype not in _TABLE:
            raise DTypeError(mismatch("dtype", "one of", sorted(_TABLE), repr(dtype)))
        return dtype
    return name_of(dtype)
