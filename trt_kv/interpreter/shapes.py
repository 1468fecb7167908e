"""Layers that make, move or pick elements: constant, shape, fill, shuffle, slice,
concatenation, gather, squeeze, unsqueeze."""

from __future__ import annotations

import math

import numpy as np

from trt_kv._trt import trt
from trt_kv.errors import ShapeError, mismatch
from trt_kv.interpreter.registry import (
    Array,
    Context,
    Inputs,
    Kernel,
    arg,
    handles,
    handles_optional,
    input_or_none,
    rank_of,
)
from trt_kv.interpreter.weights import constant_array

_F32 = np.dtype(np.float32)
_S = trt.SampleMode
_G = trt.GatherMode


@handles(trt.LayerType.CONSTANT, trt.IConstantLayer)
def constant(layer: object, ctx: Context) -> Kernel:
    """The weights, converted once here (floats to the compute dtype; a fast float32 plan keeps
    float16 ones for its layout pass to place) and never copied again."""
    value = constant_array(layer, ctx.compute, keep_float16=ctx.fast and ctx.compute == _F32)
    return Kernel(lambda x: value, rounded=True)


@handles(trt.LayerType.SHAPE, trt.IShapeLayer)
def shape(layer: object, ctx: Context) -> object:
    """The input's runtime shape as an int64 vector."""
    return lambda x: np.array(x[0].shape, dtype=np.int64)


@handles(trt.LayerType.FILL, trt.IFillLayer)
def fill(layer: object, ctx: Context) -> object:
    """LINSPACE: ``out[i_0, ..., i_k] = alpha + sum_d beta[d] * i_d``; shape, alpha (start) and
    beta (delta per axis) from the layer or from inputs 0, 1, 2. A static beta b means [b]."""
    if layer.operation != trt.FillOperation.LINSPACE:
        raise ctx.unsupported(f"fill operation {layer.operation}")
    static_shape = None if input_or_none(layer, 0) is not None else tuple(layer.shape)
    # read only where static: TensorRT warns on reading a start/delta given as an input
    alpha = layer.alpha if input_or_none(layer, 1) is None else None
    beta = layer.beta if input_or_none(layer, 2) is None else None
    integer = layer.to_type in (trt.int32, trt.int64)
    acc = np.int64 if integer else ctx.compute

    def run(x: Inputs) -> Array:
        shape_in, start_in, delta_in = arg(x, 0), arg(x, 1), arg(x, 2)
        dims = static_shape if shape_in is None else tuple(int(d) for d in shape_in)
        start = np.asarray(alpha if start_in is None else start_in, dtype=acc)
        delta = np.asarray([beta] if delta_in is None else delta_in, dtype=acc)
        if delta.shape != (len(dims),):
            raise ShapeError(
                mismatch(f"{ctx.layer_name}: fill delta", "shape", (len(dims),), delta.shape)
            )
        out = np.full(dims, start, dtype=acc)
        for axis, step in enumerate(delta):
            ramp = np.arange(dims[axis], dtype=acc) * step
            out = out + ramp.reshape((-1,) + (1,) * (len(dims) - axis - 1))
        return out

    return run


def _resolve_reshape(dims: tuple[int, ...], shape: tuple[int, ...], zero_copies: bool) -> list:
    out = [shape[i] if d == 0 and zero_copies else d for i, d in enumerate(dims)]
    if -1 in out:  # math.prod: ~0.2 us where np.prod's array costs ~3 (a decode step: ~120)
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(shape) // known if known else 0
    return out


@handles(trt.LayerType.SHUFFLE, trt.IShuffleLayer)
def shuffle(layer: object, ctx: Context) -> object:
    """First transpose, reshape (static dims, or input 1; 0 copies the input dim when
    ``zero_is_placeholder``, -1 is inferred), second transpose."""
    rank = rank_of(layer.get_input(0))
    first = tuple(layer.first_transpose)[:rank]
    dynamic = input_or_none(layer, 1) is not None
    dims = None if dynamic else layer.reshape_dims
    dims = None if dims is None else tuple(dims)
    out_rank = rank_of(layer.get_output(0))
    second = tuple(layer.second_transpose)[:out_rank]
    zero_copies = layer.zero_is_placeholder
    identity_first = first == tuple(range(rank))
    identity_second = second == tuple(range(out_rank))

    def run(x: Inputs) -> Array:
        a = x[0] if identity_first else np.transpose(x[0], first)
        target = tuple(np.asarray(x[1]).tolist()) if dynamic else dims  # Python ints
        if target is not None:
            a = a.reshape(_resolve_reshape(target, a.shape, zero_copies))
        return a if identity_second else np.transpose(a, second)

    return Kernel(run, moves=True)


def _sample(index: Array, size: int, mode: object) -> tuple[Array, Array | None]:
    """Map raw slice coordinates into ``[0, size)``; return (indices, in-bounds mask or None)."""
    if mode == _S.WRAP:
        return np.mod(index, size) if size else index, None
    if mode == _S.CLAMP:
        return np.clip(index, 0, max(size - 1, 0)), None
    if mode == _S.REFLECT:
        # Mirror without repeating the edge (..., 2, 1, 0, 1, 2, ...): the docs say only
        # "coordinates reflect"; open question in docs/gpu-results.md.
        if size <= 1:
            return np.zeros_like(index), None
        period = 2 * (size - 1)
        m = np.mod(index, period)
        return np.where(m < size, m, period - m), None
    valid = (index >= 0) & (index < size)
    return np.clip(index, 0, max(size - 1, 0)), valid


def _within(
    start: tuple[int, ...], size: tuple[int, ...], stride: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[slice, ...] | None:
    """The NumPy slices of a slice layer whose coordinates all lie inside ``shape`` (then no
    SampleMode acts; a stride-0 axis, ONNX Expand's, reads one element: broadcast it), or None.
    A view instead of fancy indexing: the shape subgraphs of an ONNX network slice small
    vectors on every run, and Expand repeats a whole cache's KV heads (GQA), where fancy
    indexing was most of the cost."""
    out = []
    for first, n, step, dim in zip(start, size, stride, shape):
        last = first + (n - 1) * step
        if n == 0:
            out.append(slice(0, 0))
        elif not (0 <= first < dim and 0 <= last < dim):
            return None
        else:
            stop = last + (1 if step > 0 else -1)
            out.append(
                slice(first, first + 1)
                if step == 0
                else slice(first, stop if stop >= 0 else None, step)
            )
    return tuple(out) if len(out) == len(shape) and out else None


@handles(trt.LayerType.SLICE, trt.ISliceLayer)
def slice_(layer: object, ctx: Context) -> object:
    """``out[i] = in[start + i * stride]`` per axis; start/size/stride/fill/axes from the layer
    or from inputs 1/2/3/4/5; out-of-bounds coordinates per the layer's SampleMode."""
    rank = rank_of(layer.get_input(0))
    present = [input_or_none(layer, i) is not None for i in range(6)]
    static = {
        "start": None if present[1] else tuple(layer.start),
        "shape": None if present[2] else tuple(layer.shape),
        "stride": None if present[3] else tuple(layer.stride),
        "axes": None if present[5] else layer.axes,
    }
    mode = layer.mode
    if mode not in (_S.STRICT_BOUNDS, _S.WRAP, _S.CLAMP, _S.FILL, _S.REFLECT):
        raise ctx.unsupported(f"sample mode {mode}")

    def vec(x: Inputs, i: int, key: str) -> tuple[int, ...] | None:
        value = x[i] if present[i] else static[key]
        return None if value is None else tuple(int(v) for v in np.asarray(value).ravel())

    def run(x: Inputs) -> Array:
        data = x[0]
        start, size, stride = vec(x, 1, "start"), vec(x, 2, "shape"), vec(x, 3, "stride")
        axes = vec(x, 5, "axes")
        if axes is not None:
            full = [(0, n, 1) for n in data.shape]
            for k, axis in enumerate(axes):
                full[axis % rank] = (start[k], size[k], stride[k])
            start, size, stride = zip(*full) if full else ((), (), ())
        within = _within(start, size, stride, data.shape)
        if within is not None:  # every mode reads the same elements: a basic slice (copied)
            part = data[within]
            return part.copy() if part.shape == tuple(size) else np.broadcast_to(part, size).copy()
        index, valid = [], None
        for axis in range(rank):
            raw = start[axis] + np.arange(size[axis], dtype=np.int64) * stride[axis]
            n = data.shape[axis]
            if mode == _S.STRICT_BOUNDS and raw.size and (raw.min() < 0 or raw.max() >= n):
                raise ShapeError(
                    mismatch(
                        f"{ctx.layer_name}: slice axis {axis}",
                        f"coordinates within [0, {n})",
                        "",
                        f"[{raw.min()}, {raw.max()}]",
                    )
                )
            idx, ok = _sample(raw, n, mode)
            index.append(idx)
            if ok is not None and not ok.all():
                shape = [1] * rank
                shape[axis] = -1
                ok = ok.reshape(shape)
                valid = ok if valid is None else valid & ok
        out = data[np.ix_(*index)] if rank else data
        if valid is not None:
            fill_value = x[4] if present[4] else np.zeros((), dtype=data.dtype)
            out = np.where(valid, out, fill_value)
        return out

    return run


@handles(trt.LayerType.CONCATENATION, trt.IConcatenationLayer)
def concatenation(layer: object, ctx: Context) -> object:
    """Inputs joined along ``axis``."""
    axis = layer.axis
    return Kernel(lambda x: np.concatenate(list(x), axis=axis), moves=True)


def _gather_default(data: Array, idx: Array, axis: int, batched: bool) -> Array:
    if not batched:
        return np.take(data, idx, axis=axis)
    # num_elementwise_dims = 1: axis 0 of data and indices is shared (broadcast) batch.
    b = max(data.shape[0], idx.shape[0])
    data = np.broadcast_to(data, (b, *data.shape[1:]))
    idx = np.broadcast_to(idx, (b, *idx.shape[1:]))
    return np.stack([np.take(data[i], idx[i], axis=axis - 1) for i in range(b)])


def _gather_nd(data: Array, idx: Array, batch_dims: int) -> Array:
    """ONNX GatherND: ``idx[..., :k]`` addresses the leading k non-batch axes of ``data``."""
    batch = data.shape[:batch_dims]
    flat_data = data.reshape((-1, *data.shape[batch_dims:]))
    flat_idx = idx.reshape((-1, *idx.shape[batch_dims:]))
    k = idx.shape[-1]
    rows = []
    for d, i in zip(flat_data, flat_idx):
        coords = tuple(np.moveaxis(i, -1, 0)[:k])
        rows.append(d[coords])
    out = np.stack(rows)
    return out.reshape((*batch, *out.shape[1:]))


@handles(trt.LayerType.GATHER, trt.IGatherLayer)
def gather(layer: object, ctx: Context) -> object:
    """DEFAULT (ONNX Gather, optionally batched on axis 0), ELEMENT (GatherElements),
    ND (GatherND with ``num_elementwise_dims`` batch axes). Negative indices wrap."""
    axis, mode, batch = layer.axis, layer.mode, layer.num_elementwise_dims
    if mode == _G.DEFAULT:
        if batch not in (0, 1):
            raise ctx.unsupported(f"num_elementwise_dims {batch} with DEFAULT mode")
        run = lambda x: _gather_default(x[0], x[1].astype(np.int64), axis, batch == 1)  # noqa: E731
        return Kernel(run, moves=True)
    if mode == _G.ELEMENT:
        return lambda x: np.take_along_axis(x[0], _wrap(x[1], x[0].shape[axis]), axis=axis)
    if mode == _G.ND:
        return lambda x: _gather_nd(x[0], x[1].astype(np.int64), batch)
    raise ctx.unsupported(f"gather mode {mode}")


def _wrap(idx: Array, n: int) -> Array:
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + n, idx)


def _axes(value: Array | None, rank: int) -> tuple[int, ...]:
    return tuple(sorted(int(a) % rank for a in np.asarray(value).ravel()))


@handles_optional("squeeze_layers", "SQUEEZE", "ISqueezeLayer")
def squeeze(layer: object, ctx: Context) -> object:
    """Drop the axes in input 1; without it, every axis declared with static size 1."""
    rank = rank_of(layer.get_input(0))
    if input_or_none(layer, 1) is None:
        static = tuple(i for i, d in enumerate(tuple(layer.get_input(0).shape)) if d == 1)
        return Kernel(lambda x: np.squeeze(x[0], axis=static), moves=True)

    def run(x: Inputs) -> Array:
        try:
            return np.squeeze(x[0], axis=_axes(x[1], rank))
        except ValueError:  # an axis of size > 1 (TensorRT refuses it at run time too)
            axes = _axes(x[1], rank)
            dims = tuple(x[0].shape[a] for a in axes)
            raise ShapeError(
                mismatch(f"layer {ctx.label}: squeezed axes {axes}", "sizes 1", "", dims)
            ) from None

    return Kernel(run, moves=True)


@handles_optional("squeeze_layers", "UNSQUEEZE", "IUnsqueezeLayer")
def unsqueeze(layer: object, ctx: Context) -> object:
    """Insert size-1 axes at the output positions in input 1 (negative counts from the end)."""
    out_rank = rank_of(layer.get_output(0))
    return Kernel(lambda x: np.expand_dims(x[0], axis=_axes(x[1], out_rank)), moves=True)
