"""A quantized matrix in a TensorRT network: INT8/INT4 constants with block scales,
dequantized by an ``IDequantizeLayer`` right before their product.

TensorRT-RTX 1.7.1 keeps INT4 weights 4 bits wide only in this form: a 2-D constant
``[N, K]``, scales ``[N, K / 32]`` (or ``[N, K / 16]``, Q2_K's and Q3_K's block: it builds
and stays 4 bits wide too) in the output dtype (the block read from the scale's shape,
axis 1), no zero point, the dequantized matrix read by a 2-D matrix product (a reshape in
between, or a 3-D product, and the builder folds it into a float16 constant). Block INT8
weights are folded into float16 constants by the builder whatever the form; per-channel INT8
stays 8 bits. A minimum per block (``w = d c + m``, GGUF's Q4_1, whose unsigned codes are
held as ``c = q - 8``) is a second, small product:
``x W^T = x (d c)^T + (x summed per block) (8 d + m)^T``, with ``8 d + m`` rounded once to
the activation dtype (:func:`block_offsets`; Q5_1 and Q5_K: ``16 d + m``, Q4_K ``8 d + m``,
Q2_K ``m``). The scales, float32 in the :class:`QuantizedMatrix` (a K-quant's ``d * sc`` is
exact there), are rounded once to the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.quantization.blocks import QuantizedMatrix, pack_int4


@dataclass(frozen=True)
class QuantizedWeight:
    """A :class:`QuantizedMatrix` as a network weight: ``Graph.linear(x, weight)`` runs
    :func:`quantized_linear`."""

    matrix: QuantizedMatrix

    def apply(self, g: object, x: object) -> object:
        return quantized_linear(g, x, self.matrix)


def _codes(g: object, q: QuantizedMatrix) -> object:
    """The codes ``[N, K]`` as an INT8 or (packed) INT4 constant."""
    if q.bits == 4:
        data, kind = pack_int4(q.codes), trt.int4
    else:
        data, kind = np.ascontiguousarray(q.codes, dtype=np.int8), trt.int8
    g.keep.append(data)  # TensorRT reads the bytes at build time
    weights = trt.Weights(kind, data.ctypes.data, q.codes.size)
    return g.network.add_constant(q.shape, weights).get_output(0)


def dequantized(g: object, q: QuantizedMatrix) -> object:
    """``d * c`` ``[N, K]`` in ``g.dtype`` (an ``IDequantizeLayer`` over the constants)."""
    layer = g.network.add_dequantize(_codes(g, q), g.const(q.scales), dtypes.to_trt(g.dtype))
    layer.axis = 1
    return layer.get_output(0)


def quantized_linear(g: object, x: object, q: QuantizedMatrix) -> object:
    """``x [.., K] @ w^T -> [.., N]`` (rank 2 or 3) for ``w`` stored as ``q``."""
    n, k = q.shape
    rank = len(tuple(x.shape))
    flat = x if rank == 2 else g.shuffle(x, (-1, k))  # [M, K]
    y = g.matmul(flat, dequantized(g, q), transpose_b=True)  # [M, N]
    if q.mins is not None or q.zero:
        y = g.add(y, _offset_product(g, flat, q))
    if rank == 2:
        return y
    shape = g.network.add_shape(x).get_output(0)
    lead = g.network.add_slice(shape, (0,), (rank - 1,), (1,)).get_output(0)
    last = g.const(np.array([n], dtype=np.int64), "int64")
    target = g.network.add_concatenation([lead, last]).get_output(0)
    layer = g.network.add_shuffle(y)
    layer.set_input(1, target)
    return layer.get_output(0)


def block_offsets(q: QuantizedMatrix) -> np.ndarray:
    """``zero * d + m`` ``[N, K / block]`` in float32: what each block adds to every weight
    besides ``d * c`` (for Q4_1, ``8 d + m``: small where ``m`` is about ``-8 d``)."""
    offsets = q.scales * np.float32(q.zero)
    return offsets if q.mins is None else offsets + q.mins


def _offset_product(g: object, flat: object, q: QuantizedMatrix) -> object:
    """``(x summed per block) (zero d + m)^T`` ``[M, N]``: the sums in float32, each rounded
    once to ``g.dtype``, as are the offsets (:func:`block_offsets`; one rounding per block,
    as the weights of a ``g.dtype`` network have one per weight)."""
    blocks = q.shape[1] // q.block
    x32 = g.shuffle(g.cast(flat, "float32"), (-1, blocks, q.block))
    sums = g.network.add_reduce(x32, trt.ReduceOperation.SUM, 1 << 2, False).get_output(0)
    return g.matmul(g.cast(sums, g.dtype), g.const(block_offsets(q)), transpose_b=True)
