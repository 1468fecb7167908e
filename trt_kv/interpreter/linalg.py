"""Layers that contract or reduce axes: matrix multiply, reduce, softmax, normalization."""

from __future__ import annotations

import numpy as np

from trt_kv._trt import trt

# native_rows, panel_rows and row_dots lived here before products.py: still importable here
from trt_kv.interpreter.products import (  # noqa: F401
    narrow_weight_product,
    native_rows,
    panel_rows,
    row_dots,
    stored_product,
)
from trt_kv.interpreter.registry import (
    Array,
    Context,
    Inputs,
    Kernel,
    axes_of,
    handles,
    input_or_none,
    rank_of,
)

_M = trt.MatrixOperation
_R = trt.ReduceOperation


def _operand(a: Array, op: object) -> Array:
    return np.swapaxes(a, -1, -2) if op == _M.TRANSPOSE else a


def _shared_matrix(a: Array, b: Array) -> Array:
    """``a [..., M, K] @ b [1, .., 1, K, N]`` as one ``[(..) M, K] @ [K, N]`` product (NumPy
    would run one small product per leading index, re-reading ``b`` each time)."""
    rows = stored_product(a.reshape(-1, a.shape[-1]), b.reshape(b.shape[-2:]))
    return rows.reshape(*a.shape[:-1], b.shape[-1])


_F16 = np.dtype(np.float16)


@handles(trt.LayerType.MATRIX_MULTIPLY, trt.IMatrixMultiplyLayer)
def matrix_multiply(layer: object, ctx: Context) -> Kernel:
    """``op0(A) @ op1(B)`` over the last two axes, leading axes broadcast. VECTOR treats the
    last axis as a vector: matrix x vector -> vector, vector x vector -> scalar."""
    op0, op1 = layer.op0, layer.op1
    fast = ctx.fast

    def run(x: Inputs) -> Array:
        if x[1].dtype == _F16:  # a weight read transposed, kept narrow by a fast plan
            return narrow_weight_product(x[0], x[1])
        a, b = _operand(x[0], op0), _operand(x[1], op1)
        vec_a, vec_b = op0 == _M.VECTOR, op1 == _M.VECTOR
        if vec_a and vec_b:
            return np.sum(a * b, axis=-1)
        if vec_b:
            return np.matmul(a, b[..., None])[..., 0]
        if vec_a:
            return np.matmul(a[..., None, :], b)[..., 0, :]
        if fast and a.ndim == b.ndim > 2 and all(d == 1 for d in b.shape[:-2]):
            return _shared_matrix(a, b)
        if fast and a.ndim == b.ndim == 2:
            return stored_product(a, b)
        return np.matmul(a, b)

    return Kernel(run, linear=op0 == _M.NONE and op1 == _M.TRANSPOSE)


_REDUCE = {
    _R.SUM: np.sum,
    _R.PROD: np.prod,
    _R.MAX: np.max,
    _R.MIN: np.min,
    _R.AVG: np.mean,
}


@handles(trt.LayerType.REDUCE, trt.IReduceLayer)
def reduce(layer: object, ctx: Context) -> object:
    """SUM/PROD/MAX/MIN/AVG over the axes bitmask, keeping reduced axes when ``keep_dims``."""
    fn = ctx.pick(_REDUCE, layer.op, "reduce op")
    axes = axes_of(layer.axes, rank_of(layer.get_input(0)))
    keep = layer.keep_dims
    if ctx.fast and fn is np.mean:
        return lambda x: _mean(x[0], axes, keep)
    return lambda x: fn(x[0], axis=axes, keepdims=keep)


def _mean(a: Array, axes: tuple[int, ...], keep: bool) -> Array:
    """``np.mean(a, axis=axes, keepdims=keep)`` by its own two operations (the sum, then an
    in-place division by the count as an ``intp``, so the same bits) without ~3 us of its
    dispatch, for a float32 array reduced to an array over a non-empty count (the RMSNorm of
    a decode step); anything else is ``np.mean`` itself."""
    if type(a) is np.ndarray and a.dtype == np.float32:
        count = 1
        for axis in axes:
            count *= a.shape[axis]
        if count:
            total = np.add.reduce(a, axis=axes, keepdims=keep)
            if type(total) is np.ndarray:
                return np.true_divide(total, np.intp(count), out=total, casting="unsafe")
    return np.mean(a, axis=axes, keepdims=keep)


@handles(trt.LayerType.TOPK, trt.ITopKLayer)
def top_k(layer: object, ctx: Context) -> object:
    """The ``k`` largest (MAX) or smallest (MIN) values along the one axis of the bitmask,
    best first, and their indices (int32). Ties go to the lowest index, as NumPy's
    ``argmax`` (TensorRT does not document an order among equal values). k is the layer's,
    or input 1 (a 0-d int tensor: ONNX TopK's K).
    A NaN (logits that are already wrong) comes first for k = 1 (``argmax``) and last for
    k > 1 (``argsort``): TensorRT documents neither."""
    axes = axes_of(layer.axes, rank_of(layer.get_input(0)))
    if len(axes) != 1:
        raise ctx.unsupported(f"top-k axes bitmask {layer.axes} (expected one axis)")
    largest = ctx.pick({trt.TopKOperation.MAX: True, trt.TopKOperation.MIN: False}, layer.op, "op")
    static_k = None if input_or_none(layer, 1) is not None else layer.k
    axis = axes[0]

    def run(x: Inputs) -> tuple[Array, Array]:
        a = x[0]
        k = static_k if static_k is not None else int(np.asarray(x[1]).reshape(()))
        if k == 1:  # argmax / argmin: the first of equal values
            ids = (np.argmax if largest else np.argmin)(a, axis=axis, keepdims=True)
        else:  # a stable sort keeps equal values in index order
            order = np.argsort(-a if largest else a, axis=axis, kind="stable")
            ids = np.take(order, np.arange(k), axis=axis)
        return np.take_along_axis(a, ids, axis), ids.astype(np.int32)

    return run


@handles(trt.LayerType.SOFTMAX, trt.ISoftMaxLayer)
def softmax(layer: object, ctx: Context) -> object:
    """``exp(x - max) / sum(exp(x - max))`` along the one axis set in the bitmask."""
    axes = axes_of(layer.axes, rank_of(layer.get_input(0)))
    if len(axes) != 1:
        raise ctx.unsupported(f"softmax axes bitmask {layer.axes} (expected one axis)")
    axis = axes[0]

    def run(x: Inputs) -> Array:
        e = np.exp(x[0] - np.max(x[0], axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)

    return run


@handles(trt.LayerType.NORMALIZATION, trt.INormalizationLayer)
def normalization(layer: object, ctx: Context) -> object:
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the axes bitmask (biased variance).
    Only ``num_groups == 1`` (layer and instance norm)."""
    if layer.num_groups != 1:
        raise ctx.unsupported(f"num_groups {layer.num_groups} (group normalization)")
    axes = axes_of(layer.axes, rank_of(layer.get_input(0)))
    eps = ctx.compute.type(layer.epsilon)

    def run(x: Inputs) -> Array:
        a, scale, bias = x
        centered = a - np.mean(a, axis=axes, keepdims=True)
        var = np.mean(centered * centered, axis=axes, keepdims=True)
        return centered / np.sqrt(var + eps) * scale + bias

    return run


@handles(trt.LayerType.EINSUM, trt.IEinsumLayer)
def einsum(layer: object, ctx: Context) -> object:
    """``np.einsum(equation, *inputs)``: TensorRT's equations (lower-case letters, ``->``,
    no ellipsis) are NumPy's."""
    equation = layer.equation
    return lambda x: np.einsum(equation, *x)
