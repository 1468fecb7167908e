"""Layers that contract or reduce axes: matrix multiply, reduce, softmax, normalization."""

from __future__ import annotations

import numpy as np

from trt_kv._trt import trt
from trt_kv.interpreter.registry import (
    Array,
    Context,
    Inputs,
    Kernel,
    axes_of,
    handles,
    rank_of,
)

_M = trt.MatrixOperation
_R = trt.ReduceOperation


def _operand(a: Array, op: object) -> Array:
    return np.swapaxes(a, -1, -2) if op == _M.TRANSPOSE else a


def _shared_matrix(a: Array, b: Array) -> Array:
    """``a [..., M, K] @ b [1, .., 1, K, N]`` as one ``[(..) M, K] @ [K, N]`` product (NumPy
    would run one small product per leading index, re-reading ``b`` each time)."""
    rows = a.reshape(-1, a.shape[-1]) @ b.reshape(b.shape[-2:])
    return rows.reshape(*a.shape[:-1], b.shape[-1])


def _column_major(b: Array) -> bool:
    """``b [K, N]`` is the transposed view of a row-major ``[N, K]`` array (a weight stored
    ``nn.Linear``-style and read transposed), large enough for the layout to matter."""
    return b.flags.f_contiguous and not b.flags.c_contiguous and b.size >= 1 << 20


@handles(trt.LayerType.MATRIX_MULTIPLY, trt.IMatrixMultiplyLayer)
def matrix_multiply(layer: object, ctx: Context) -> Kernel:
    """``op0(A) @ op1(B)`` over the last two axes, leading axes broadcast. VECTOR treats the
    last axis as a vector: matrix x vector -> vector, vector x vector -> scalar."""
    op0, op1 = layer.op0, layer.op1
    fast = ctx.fast

    def run(x: Inputs) -> Array:
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
        if fast and a.ndim == b.ndim == 2 and a.shape[0] > 1 and _column_major(b):
            return (b.T @ a.T).T  # [N, K] @ [K, M]: BLAS ~1.4x faster for a few rows, wide N
        return np.matmul(a, b)

    transposed = {j for j, op in enumerate((op0, op1)) if op == _M.TRANSPOSE}
    linear = op0 == _M.NONE and op1 == _M.TRANSPOSE
    return Kernel(run, transposed_inputs=frozenset(transposed), linear=linear)


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
    return lambda x: fn(x[0], axis=axes, keepdims=keep)


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
