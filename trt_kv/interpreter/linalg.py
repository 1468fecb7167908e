"""Layers that contract or reduce axes: matrix multiply, reduce, softmax, normalization."""

from __future__ import annotations

import numpy as np

from trt_kv._trt import trt
from trt_kv.interpreter import half, native
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
    rows = _product(a.reshape(-1, a.shape[-1]), b.reshape(b.shape[-2:]))
    return rows.reshape(*a.shape[:-1], b.shape[-1])


def _product(a: Array, b: Array) -> Array:
    """``a [M, K] @ b [K, N]`` for a fast plan. Against the transposed view of a large
    row-major matrix ``W [N, K]`` (a weight stored ``nn.Linear``-style, read transposed),
    where the native helper is built: up to 8 float32 rows through its product
    (:func:`~trt_kv.interpreter.native.product`: ``W`` read once, at memory speed), up to 128
    through its panels (:func:`~trt_kv.interpreter.native.panel_product`, a prefill chunk).
    Without it, one row as :func:`row_dots`, 2..16 float32 rows in blocks of ``W``'s rows
    (:func:`_few_rows`). Else one BLAS call."""
    m = a.shape[0]
    if (
        b.flags.f_contiguous
        and not b.flags.c_contiguous
        and b.size >= 1 << 16
        and a.dtype == b.dtype
    ):
        out = _native_product(a, b.T)
        if out is not None:
            return out
        if m == 1:
            return row_dots(b.T, a[0])[None]
        if 1 < m <= _FEW_ROWS and a.dtype == _F32:
            return _few_rows(a, b.T)
    return a @ b


def _native_product(rows: Array, w: Array) -> Array | None:
    """``rows [M, K] @ w^T`` for a weight ``w [N, K]`` through the native helper: its product
    up to :func:`native_rows` rows, its panels up to :func:`panel_rows`; None for more rows,
    or where it is not built."""
    m = rows.shape[0]
    if m <= native_rows(w.dtype):
        return native.product(rows, w)
    if m <= panel_rows(w.dtype):
        return native.panel_product(rows, w)
    return None


def native_rows(dtype: np.dtype) -> int:
    """Rows up to which a product against a weight of ``dtype`` runs through the native
    helper (0: never; it is not built, or the dtype is not one it multiplies). Measured
    against OpenBLAS one thread, weights from memory, float32: ~2x faster at 1-2 rows, ~1.6x
    at 4, ~1.2x at 8 (AMD EPYC; on an Intel Xeon 1.1-1.6x); float16 up to 16 rows (the
    alternative widens the weight first). More rows: :func:`panel_rows`."""
    if not half.NATIVE:
        return 0
    return {_F16: 16, _F32: 8}.get(np.dtype(dtype), 0)


def panel_rows(dtype: np.dtype) -> int:
    """Rows up to which a product against a weight of ``dtype`` runs through the native
    helper's panels (0: never). Measured against OpenBLAS 0.3.31 one thread (AVX-512
    kernels) on an AMD EPYC, this model's weights from memory: 2x faster at 9-16 rows,
    1.05-1.3x at 64-128 (a whole prefill chunk of 128 rows ~8% faster); alone even at 256 but
    ~10% slower within a prefill of 256 rows, 0.85-0.97x at 1024 (float16: against the
    weight widened for the call, alike)."""
    if not half.NATIVE:
        return 0
    return _PANEL_ROWS if np.dtype(dtype) in (_F16, _F32) else 0


_PANEL_ROWS = 128


def row_dots(w: Array, x: Array) -> Array:
    """``w [N, K] @ x [K]`` -> ``[N]`` as one dot product per row of ``w`` (NumPy's einsum
    loop): it streams a row-major ``w`` ~2x faster than BLAS's matrix-vector product on that
    layout (~15-25 GB/s here, as fast as BLAS on ``w^T``), and each row's sum is the same
    whichever rows are computed together."""
    return np.einsum("nk,k->n", w, x)


_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
_FEW_ROWS = 16  # rows up to which a product runs in blocks of weight rows
_BLOCK = 1_000_000  # M * rows * K of one block: OpenBLAS's small-matrix bound (100^3)
_L2_FLOATS = 1 << 17  # weights of one block: 512 KB of float32, half of one core's L2
_FETCH = np.bitwise_or.reduce  # one streaming pass over a block's bits (result unused)
_FETCH_ROWS = 8  # up to which a block is fetched first (at 12-16 rows it does not pay)


def _few_rows(a: Array, w: Array) -> Array:
    """``a [M, K] @ w^T`` for a C-contiguous weight ``w [N, K]`` and 2..16 rows: one BLAS
    call per block of ``w``'s rows, ``w[lo:hi] @ a^T`` into a ``[N, M]`` buffer, sized so
    that ``M * rows * K <= 100^3`` and the block fits in L2. Below 100^3 OpenBLAS (0.3.31,
    AVX-512) multiplies the operands where they lie instead of packing them first; from
    memory its kernel streams the weight at only 7-9 GB/s (one thread, 8 rows), from L2 at
    ~25 GB/s. So each block is first read once in order (an OR over its bits, ~23 GB/s,
    which leaves it in L2), then multiplied: 1.1-1.5x faster from memory at 2..8 rows (not
    at 12-16, where the blocks are small and the product itself dominates). The products are the
    same BLAS calls either way; results agree with one call within float32 rounding (BLAS
    summation order)."""
    m, k = a.shape
    step = max(16, min(_BLOCK // (m * k), _L2_FLOATS // k) // 16 * 16)
    at = np.ascontiguousarray(a.T)  # [K, M]
    out = np.empty((w.shape[0], m), np.float32)
    bits = w.view(np.uint32) if m <= _FETCH_ROWS else None
    for lo in range(0, w.shape[0], step):
        if bits is not None:
            _FETCH(bits[lo : lo + step], axis=None)
        np.matmul(w[lo : lo + step], at, out=out[lo : lo + step])
    return np.ascontiguousarray(out.T)


_WIDE_BLOCK = 1 << 22  # elements of a float16 weight widened at once for more rows (16 MB)


def narrow_weight_product(a: Array, w: Array) -> Array:
    """``a [..., M, K] @ w^T`` for a float16 weight ``w [1.., N, K]`` that a fast plan keeps
    narrow (:func:`~trt_kv.interpreter.layout.keep_float16_weights`), ``a`` float32. Up to
    16 rows in all (a decode step): the compiled product, which reads each weight element
    once as its 2 bytes (half the memory traffic of a float32 copy, the bound of a decode
    step); up to 128 (a prefill chunk), its panels, which widen 6 weight rows at a time.
    More rows: one BLAS product against ``w`` widened for the call (exact; in blocks of
    weight rows for a matrix over 16 MB widened). Results agree with the product against
    ``w`` widened once within float32 rounding (summation order)."""
    k, n = w.shape[-1], w.shape[-2]
    matrix = w.reshape(n, k)
    rows = a.reshape(-1, k)
    out = _native_product(rows, matrix)
    if out is None:
        step = max(1, _WIDE_BLOCK // max(k, 1))
        out = np.empty((rows.shape[0], n), np.float32)
        for lo in range(0, n, step):
            np.matmul(rows, half.widen(matrix[lo : lo + step]).T, out=out[:, lo : lo + step])
    lead = np.broadcast_shapes(a.shape[:-2], w.shape[:-2])
    return out.reshape(*lead, a.shape[-2], n)


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
            return _product(a, b)
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
    return lambda x: fn(x[0], axis=axes, keepdims=keep)


@handles(trt.LayerType.TOPK, trt.ITopKLayer)
def top_k(layer: object, ctx: Context) -> object:
    """The ``k`` largest (MAX) or smallest (MIN) values along the one axis of the bitmask,
    best first, and their indices (int32). Ties go to the lowest index, as NumPy's
    ``argmax`` (TensorRT does not document an order among equal values). Only a static k.
    A NaN (logits that are already wrong) comes first for k = 1 (``argmax``) and last for
    k > 1 (``argsort``): TensorRT documents neither."""
    axes = axes_of(layer.axes, rank_of(layer.get_input(0)))
    if len(axes) != 1:
        raise ctx.unsupported(f"top-k axes bitmask {layer.axes} (expected one axis)")
    if layer.num_inputs > 1 and layer.get_input(1) is not None:
        raise ctx.unsupported("a k given as a tensor")
    largest = ctx.pick({trt.TopKOperation.MAX: True, trt.TopKOperation.MIN: False}, layer.op, "op")
    axis, k = axes[0], layer.k

    def run(x: Inputs) -> tuple[Array, Array]:
        a = x[0]
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
