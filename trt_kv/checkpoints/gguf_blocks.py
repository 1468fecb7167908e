"""GGUF's quantized matrices kept quantized (:class:`~trt_kv.quantization.QuantizedMatrix`),
for engines that store them as INT8/INT4 (``weights="keep"``).

Q8_0 (``d * q``, int8 q), Q4_0 (``d * (q - 8)``) and Q4_1 (``d * q + m``, q in [0, 15]) map
exactly: one float16 scale (and minimum) per 32 weights, read from the blocks' bytes. Every
other quantized type (the K-quants' two-level scales, Q5_*, the I-quants) is re-quantized from
gguf's own dequantization to the nearest form TensorRT takes: types of at most 4 bits per
weight to INT4 with a minimum per 32 (as Q4_1), the others to symmetric INT8 per 32; the
largest error is recorded in the matrix (and the engine's sidecar).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trt_kv.quantization.blocks import (
    BLOCK,
    QuantizedMatrix,
    quantize_asymmetric4,
    quantize_symmetric,
)

# GGUF type -> bytes per 32-weight block; the float16 scale (and minimum) lead each block
_EXACT = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
_FLOAT = {"F32", "F16", "BF16", "F64"}
# types of at most 4 bits per code: re-quantized to INT4 with minimums; others to INT8
_FOUR_BITS = {"Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S"}
_FOUR_BITS |= {"IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"}


def keep_quantized(
    type_name: str,
    raw: np.ndarray,
    shape: tuple[int, int],
    dequantized: Callable[[], np.ndarray],
) -> QuantizedMatrix | None:
    """The quantized form of a 2-D GGUF matrix ``shape = [N, K]`` of type ``type_name``
    (``raw``: its bytes ``[N, bytes per row]``; ``dequantized()``: gguf's float32 values,
    called only for a re-quantized type), or None for a float type or a K that is not a
    multiple of 32 (then the matrix stays float)."""
    n, k = shape
    if type_name in _FLOAT or k % BLOCK:
        return None
    if type_name not in _EXACT:
        w = dequantized()
        if type_name in _FOUR_BITS:
            return quantize_asymmetric4(w, type_name)
        return quantize_symmetric(w, 8, type_name)
    blocks = np.ascontiguousarray(raw).reshape(n, k // BLOCK, _EXACT[type_name])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if type_name == "Q8_0":
        codes = blocks[..., 2:].copy().view(np.int8).reshape(n, k)
        return QuantizedMatrix(codes, d, 8, source=type_name)
    qs = blocks[..., -16:]
    # 16 bytes per block: low nibbles are weights 0..15, high nibbles weights 16..31
    q = np.concatenate([qs & np.uint8(0xF), qs >> np.uint8(4)], axis=2).astype(np.int8)
    codes = (q - np.int8(8)).reshape(n, k)
    if type_name == "Q4_0":
        return QuantizedMatrix(codes, d, 4, source=type_name)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return QuantizedMatrix(codes, d, 4, mins=m, zero=8, source=type_name)
