"""Layers that write or count along an axis, which TensorRT's ONNX parser emits for
``ScatterND`` / ``ScatterElements`` (SCATTER), ``CumSum`` (CUMULATIVE) and ``OneHot``
(ONE_HOT). trt_kv's own builder uses none of them."""

from __future__ import annotations

import numpy as np

from trt_kv._trt import trt
from trt_kv.errors import ShapeError, mismatch
from trt_kv.interpreter.registry import Array, Context, Inputs, Kernel, handles

_SM = trt.ScatterMode


def _wrapped(idx: Array, n: int | Array) -> Array:
    """Indices with negative ones counted from the end (ONNX allows ``[-n, n)``)."""
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + n, idx)


def _checked(ctx: Context, idx: Array, n: int | Array, what: str) -> Array:
    """:func:`_wrapped`, or ShapeError naming the layer for an index outside ``[-n, n)``."""
    out = _wrapped(idx, n)
    bad = (out < 0) | (out >= n)
    if bad.any():
        raise ShapeError(
            mismatch(f"layer {ctx.label}: {what}", "indices within [-n, n)", "", idx[bad][:4])
        )
    return out


def _scatter_elements(ctx: Context, axis: int) -> Kernel:
    """``out = data; out[..., idx[i], ...] = updates[i]`` along ``axis`` (ScatterElements
    without reduction: a repeated index keeps the last write, as NumPy's assignment)."""

    def run(x: Inputs) -> Array:
        data, idx, updates = x
        out = data.copy()
        ax = axis % data.ndim
        idx = _checked(ctx, idx, data.shape[ax], "scatter indices")
        np.put_along_axis(out, idx, updates.astype(out.dtype, copy=False), ax)
        return out

    return Kernel(run, moves=True)


def _scatter_nd(ctx: Context) -> Kernel:
    """ONNX ScatterND: ``idx [..., k]`` addresses the leading k axes of ``data``; each
    ``updates[...]`` (the rest of data's axes) is written there, in order."""

    def run(x: Inputs) -> Array:
        data, idx, updates = x
        out = data.copy()
        k = idx.shape[-1]
        dims = np.array(data.shape[:k], dtype=np.int64)
        coords = _checked(ctx, idx.reshape(-1, k), dims, "scatter indices")
        rows = updates.reshape(-1, *data.shape[k:]).astype(out.dtype, copy=False)
        out[tuple(coords.T)] = rows
        return out

    return Kernel(run, moves=True)


@handles(trt.LayerType.SCATTER, trt.IScatterLayer)
def scatter(layer: object, ctx: Context) -> Kernel:
    """ELEMENT (ScatterElements on ``axis``) or ND (ScatterND); inputs data, indices
    (negative ones count from the end), updates. The output is a new array."""
    if layer.mode == _SM.ELEMENT:
        return _scatter_elements(ctx, layer.axis)
    if layer.mode == _SM.ND:
        return _scatter_nd(ctx)
    raise ctx.unsupported(f"scatter mode {layer.mode}")


@handles(trt.LayerType.CUMULATIVE, trt.ICumulativeLayer)
def cumulative(layer: object, ctx: Context) -> object:
    """SUM along the axis in input 1 (a 0-d int tensor; negative counts from the end);
    ``exclusive`` shifts by one (the first element is 0), ``reverse`` sums from the end."""
    if layer.op != trt.CumulativeOperation.SUM:
        raise ctx.unsupported(f"cumulative op {layer.op}")
    exclusive, reverse = bool(layer.exclusive), bool(layer.reverse)

    def run(x: Inputs) -> Array:
        a = x[0]
        axis = int(np.asarray(x[1]).reshape(())) % max(a.ndim, 1)
        if reverse:
            a = np.flip(a, axis)
        out = np.cumsum(a, axis=axis, dtype=a.dtype)
        if exclusive:  # [0, s_0, s_0 + a_1, ...]: the sums shifted by one
            out = np.concatenate([np.zeros_like(np.take(out, [0], axis)), out], axis)
            out = np.delete(out, -1, axis) if out.shape[axis] else out
        return np.flip(out, axis) if reverse else out

    return run


@handles(trt.LayerType.ONE_HOT, trt.IOneHotLayer)
def one_hot(layer: object, ctx: Context) -> object:
    """``values[1]`` where the new axis ``axis`` equals the index, ``values[0]`` elsewhere;
    inputs indices, values ``[off, on]``, depth (0-d). Indices in ``[-depth, depth)``,
    negative ones counted from the end (ONNX); any other index gives a row of ``off``."""
    axis = layer.axis

    def run(x: Inputs) -> Array:
        idx, values, depth = x[0], x[1], int(np.asarray(x[2]).reshape(()))
        idx = _wrapped(idx, depth)
        ax = axis % (idx.ndim + 1)
        shape = [1] * (idx.ndim + 1)
        shape[ax] = depth
        hot = np.expand_dims(idx, ax) == np.arange(depth).reshape(shape)
        return np.where(hot, values[1], values[0])

    return run
