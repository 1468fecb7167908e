"""Constant weights of a network as NumPy arrays, read once at compile time."""

from __future__ import annotations

import ctypes

import numpy as np

from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.errors import UnsupportedLayerError
from trt_kv.quantization.blocks import unpack_int4


def _raw_weights(
    weights: object, np_dtype: np.dtype, name: str, nbytes: int | None = None
) -> np.ndarray:
    """Copy the bytes behind a ``trt.Weights`` whose ``numpy()`` gives up (bfloat16).

    TensorRT's Python bindings expose no data pointer and no buffer for bfloat16 weights, so
    this reads the C++ ``nvinfer1::Weights {DataType type; void const* values; int64 count}``
    behind the pybind11 instance (its value pointer sits right after the object header).
    The type and count read there must match the binding's own ``dtype`` and ``size``, or
    nothing is read: a layout change raises UnsupportedLayerError instead of reading garbage.
    ``nbytes``: the bytes to read when they are not ``count`` items of ``np_dtype`` (INT4).
    """
    holder = ctypes.c_void_p.from_address(id(weights) + object.__basicsize__).value
    if holder:
        kind = ctypes.c_int32.from_address(holder).value
        ptr = ctypes.c_void_p.from_address(holder + 8).value
        count = ctypes.c_int64.from_address(holder + 16).value
        if kind == int(weights.dtype) and count == weights.size and (ptr or count == 0):
            nbytes = count * np_dtype.itemsize if nbytes is None else nbytes
            buffer = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else b""
            return np.frombuffer(bytes(buffer), dtype=np_dtype).copy()
    raise UnsupportedLayerError(
        f"layer {name!r} (CONSTANT): cannot read {weights.dtype} weights from this TensorRT build"
    )


def constant_array(layer: object, compute: np.dtype, keep_float16: bool = False) -> np.ndarray:
    """The value of an ``IConstantLayer`` with its declared shape, read-only.

    Float weights (float32/float16/bfloat16) come back in ``compute`` (exact: every such value
    is representable), float16 ones as float16 with ``keep_float16`` (a fast plan decides
    later which to widen, see :func:`~trt_kv.interpreter.layout.keep_float16_weights`);
    integer and bool weights keep their dtype; INT4 weights come back unpacked, one value in
    [-8, 7] per int8.

    Raises:
        UnsupportedLayerError: weights of a dtype trt_kv has no NumPy type for (int4, fp8...).
    """
    weights = layer.weights
    shape = tuple(layer.shape)
    declared = layer.get_output(0).dtype
    if declared == trt.int4:  # two values a byte, held unpacked here: one per int8
        count = int(np.prod(shape))
        packed = _raw_weights(weights, np.dtype(np.uint8), layer.name, (count + 1) // 2)
        out = unpack_int4(packed, count).reshape(shape)
        out.flags.writeable = False
        return out
    try:
        np_dtype = dtypes.to_numpy(declared)
    except (TypeError, KeyError) as err:
        raise UnsupportedLayerError(
            f"layer {layer.name!r} (CONSTANT): unsupported weights dtype {declared}"
        ) from err
    raw = weights if isinstance(weights, np.ndarray) else weights.numpy()
    if not isinstance(raw, np.ndarray):
        raw = _raw_weights(weights, np_dtype, layer.name)
    elif raw.dtype != np_dtype:  # e.g. bool weights exposed as uint8
        raw = raw.view(np_dtype) if raw.dtype.itemsize == np_dtype.itemsize else raw
    out = raw.reshape(shape)
    if keep_float16 and declared == trt.float16:
        out = np.array(out, dtype=np.float16, copy=True)
    elif declared in (trt.float32, trt.float16, trt.bfloat16):
        out = out.astype(compute)
    else:
        out = np.array(out, dtype=np_dtype, copy=True)
    out.flags.writeable = False
    return out
