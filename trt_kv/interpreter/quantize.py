"""``IDequantizeLayer``: INT8 / INT4 codes times their scales, as NumPy dequantizes.

A scalar scale is per tensor, a 1-D scale ``[input.shape[axis]]`` per channel along
``axis``, and a scale of the input's rank a block scale: each of its elements covers
``input.shape[d] / scale.shape[d]`` elements along every axis ``d`` (TensorRT's block
quantization, the block read from the scale's shape). The output is ``codes * scale``
computed in the compute dtype (exact for float16 scales and 8-bit codes), then rounded to the
declared dtype like every layer output. INT4 constants arrive unpacked, one value per int8
(:func:`~trt_kv.interpreter.weights.constant_array`).
"""

from __future__ import annotations

import numpy as np

from trt_kv._trt import trt
from trt_kv.interpreter.registry import Context, Inputs, Kernel, handles, input_or_none, rank_of


def expand_scale(scale: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """``scale`` broadcast to ``shape``: per tensor (a scalar), per channel along ``axis``
    (1-D) or per block (the input's rank; each element repeated over its block)."""
    if scale.ndim == 0 or (scale.size == 1 and scale.ndim != len(shape)):
        return scale.reshape(())
    if scale.ndim == 1:
        view = [1] * len(shape)
        view[axis] = scale.shape[0]
        return scale.reshape(view)
    for d, (n, s) in enumerate(zip(shape, scale.shape)):
        if s != n:
            scale = np.repeat(scale, n // s, axis=d)
    return scale


@handles(trt.LayerType.DEQUANTIZE, trt.IDequantizeLayer)
def dequantize(layer: object, ctx: Context) -> Kernel:
    """``codes * scale`` (see the module); a zero point other than 0 is refused."""
    rank = rank_of(layer.get_input(0))
    axis = layer.axis % rank if rank else 0
    has_zero = input_or_none(layer, 2) is not None
    compute = ctx.compute

    def run(x: Inputs) -> np.ndarray:
        codes, scale = x[0], np.asarray(x[1], dtype=compute)
        if has_zero and np.any(x[2]):
            raise ctx.unsupported("a zero point other than 0")
        return codes.astype(compute) * expand_scale(scale, codes.shape, axis)

    return Kernel(run)
