"""GGUF's quantized matrices kept quantized (:class:`~trt_kv.quantization.QuantizedMatrix`),
for engines that store them as INT8/INT4 (``weights="keep"``).

Mapped exactly, the codes read from the blocks' bytes, each (sub-)block's scale ``d`` and
minimum ``m`` as float32 products of the stored fields (``w = d * (c + zero) + m``):

====== ============================== ========================================
type   stored                          held as
====== ============================== ========================================
Q8_0   ``d q``, q int8, per 32         INT8 block 32
Q4_0   ``d (q - 8)``, per 32           INT4 block 32
Q4_1   ``d q + m``, q in [0, 15]       INT4 ``q - 8`` block 32, zero 8, mins
Q5_0   ``d (q - 16)``, per 32          INT8 block 32
Q5_1   ``d q + m``, q in [0, 31]       INT8 ``q - 16`` block 32, zero 16, mins
Q4_K   ``d sc q - dmin m`` per 32      INT4 ``q - 8`` block 32, zero 8, mins
Q5_K   as Q4_K, q in [0, 31]           INT8 ``q - 16`` block 32, zero 16, mins
Q6_K   ``d sc (q - 32)`` per 16        INT8 block 16
Q3_K   ``d (sc - 32) q``, q in [-4, 3] INT4 block 16
Q2_K   ``d sc q - dmin m`` per 16      INT4 block 16 (q in [0, 3]), mins
IQ4_NL ``d L[i]``, per 32              INT8 block 32 (the int8 level ``L[i]``)
IQ4_XS ``d (sc - 32) L[i]`` per 32     INT8 block 32
TQ2_0  ``d (q - 1)``, per 256          INT4 block 32 (``d`` repeated)
MXFP4  ``2^(e - 128) F[i]``, per 32    INT8 block 32 (``F``: FP4 values doubled)
====== ============================== ========================================

(the K-quants' ``sc`` and ``m`` are 4- or 6-bit integers of each sub-block, ``d``/``dmin``
the float16 scales of its 256-weight super-block). The other quantized types (TQ1_0's
base-3 packing, NVFP4, the lattice I-quants IQ1-IQ3) are re-quantized from gguf's own
dequantization to INT4 with a minimum per 32 (as Q4_1), an unknown one to symmetric INT8 per
32; the largest error is recorded in the matrix (and the engine's sidecar).
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

_FLOAT = {"F32", "F16", "BF16", "F64"}
# types of at most 4 bits per code: re-quantized to INT4 with minimums; others to INT8
_FOUR_BITS = {"IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M", "TQ1_0"}
_FOUR_BITS |= {"NVFP4"}

# A decoded block: codes [R, n_sub, sub] (int8), scales and mins [R, n_sub] (float32)
_Decoded = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 field at byte ``at`` of each block ``[R, bytes]`` as float32 ``[R, 1]``."""
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _fields(b: np.ndarray, width: int) -> np.ndarray:
    """The ``width``-bit fields of bytes ``[..., L]`` as ``[..., 8 / width * L]``: the lowest
    field of every byte first, then the next (nibbles: all low ones, then all high ones)."""
    shifts = np.arange(0, 8, width, dtype=np.uint8).reshape(-1, 1)
    mask = np.uint8((1 << width) - 1)
    return ((b[..., None, :] >> shifts) & mask).reshape(*b.shape[:-1], -1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's fifth bits: 4 bytes ``[R, 4]``, weight j's bit j of the little-endian
    uint32 -> ``[R, 32]``."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q8_0(b: np.ndarray) -> _Decoded:
    return b[:, 2:].copy().view(np.int8)[:, None], _f16(b, 0), None


def _q4_0(b: np.ndarray) -> _Decoded:
    return (_fields(b[:, 2:], 4).astype(np.int8) - 8)[:, None], _f16(b, 0), None


def _q4_1(b: np.ndarray) -> _Decoded:
    return (_fields(b[:, 4:], 4).astype(np.int8) - 8)[:, None], _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray) -> _Decoded:
    q = _fields(b[:, 6:], 4) | (_high_bits(b[:, 2:6]) << np.uint8(4))
    return (q.astype(np.int8) - 16)[:, None], _f16(b, 0), None


def _q5_1(b: np.ndarray) -> _Decoded:
    q = _fields(b[:, 8:], 4) | (_high_bits(b[:, 4:8]) << np.uint8(4))
    return (q.astype(np.int8) - 16)[:, None], _f16(b, 0), _f16(b, 2)


def _scales_mins_6bit(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes ``[R, 12]`` -> eight 6-bit scales and minimums ``[R, 8]``:
    bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 minimums 0-3; scales and
    minimums 4-7 take their low 4 bits from bytes 8-11 (low / high nibble) and their top 2
    bits from the top 2 bits of bytes 0-3 / 4-7."""
    lo, mid, top = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 63, (top & 15) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _q4_k(b: np.ndarray) -> _Decoded:
    sc, m = _scales_mins_6bit(b[:, 4:16])
    q = _fields(b[:, 16:].reshape(-1, 4, 32), 4).reshape(-1, 8, 32)
    return q.astype(np.int8) - 8, _f16(b, 0) * sc, -(_f16(b, 2) * m)


def _q5_k(b: np.ndarray) -> _Decoded:
    sc, m = _scales_mins_6bit(b[:, 4:16])
    low = _fields(b[:, 48:].reshape(-1, 4, 32), 4).reshape(-1, 8, 32)
    q = low | (_fields(b[:, 16:48], 1).reshape(-1, 8, 32) << np.uint8(4))
    return q.astype(np.int8) - 16, _f16(b, 0) * sc, -(_f16(b, 2) * m)


def _q6_k(b: np.ndarray) -> _Decoded:
    low = _fields(b[:, 0:128].reshape(-1, 2, 64), 4)
    high = _fields(b[:, 128:192].reshape(-1, 2, 32), 2)
    q = (low | (high << np.uint8(4))).reshape(-1, 16, 16)
    sc = b[:, 192:208].copy().view(np.int8).astype(np.float32)
    return q.astype(np.int8) - 32, _f16(b, 208) * sc, None


def _q3_k(b: np.ndarray) -> _Decoded:
    low = _fields(b[:, 32:96].reshape(-1, 2, 32), 2).reshape(-1, 16, 16).astype(np.int8)
    set_bit = _fields(b[:, 0:32], 1).reshape(-1, 16, 16).astype(np.int8)
    s = _fields(b[:, 96:104], 4) | (_fields(b[:, 104:108], 2) << np.uint8(4))
    sc = s.astype(np.float32) - 32
    return low - 4 * (1 - set_bit), _f16(b, 108) * sc, None


def _q2_k(b: np.ndarray) -> _Decoded:
    q = _fields(b[:, 16:80].reshape(-1, 2, 32), 2).reshape(-1, 16, 16).astype(np.int8)
    s = b[:, 0:16]
    sc, m = (s & 15).astype(np.float32), (s >> 4).astype(np.float32)
    return q, _f16(b, 80) * sc, -(_f16(b, 82) * m)


# IQ4_NL's and IQ4_XS's codebook: a 4-bit index -> an int8 level (the format's own table)
_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
_NL_LEVELS = _NL_LEVELS.astype(np.int8)
# MXFP4's levels (FP4 E2M1 values doubled): a 4-bit code -> an int8
_FP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def _iq4_nl(b: np.ndarray) -> _Decoded:
    return _NL_LEVELS[_fields(b[:, 2:], 4)][:, None], _f16(b, 0), None


def _iq4_xs(b: np.ndarray) -> _Decoded:
    low = _fields(b[:, 4:8, None], 4).reshape(-1, 8)  # sub-block j: byte j // 2, nibble j % 2
    high = _fields(b[:, 2:4], 2)  # 2 bits each, sub-block j at bits 2j of the uint16
    high = high.reshape(-1, 4, 2).transpose(0, 2, 1).reshape(-1, 8)
    sc = (low | (high << np.uint8(4))).astype(np.float32) - 32
    codes = _NL_LEVELS[_fields(b[:, 8:].reshape(-1, 8, 16), 4)]
    return codes, _f16(b, 0) * sc, None


def _tq2_0(b: np.ndarray) -> _Decoded:
    q = _fields(b[:, 0:64].reshape(-1, 2, 32), 2).reshape(-1, 8, 32).astype(np.int8)
    return q - 1, np.repeat(_f16(b, 64), 8, axis=1), None


def _mxfp4(b: np.ndarray) -> _Decoded:
    # the E8M0 byte e: 2^(e - 127), halved for the doubled levels
    scale = np.ldexp(np.float32(1), b[:, 0:1].astype(np.int32) - 128).astype(np.float32)
    return _FP4_LEVELS[_fields(b[:, 1:], 4)][:, None], scale, None


# GGUF type -> (bytes and weights per block, decoder, bits of the held codes, zero)
_EXACT: dict[str, tuple[int, int, Callable[[np.ndarray], _Decoded], int, int]] = {
    "Q8_0": (34, 32, _q8_0, 8, 0),
    "Q4_0": (18, 32, _q4_0, 4, 0),
    "Q4_1": (20, 32, _q4_1, 4, 8),
    "Q5_0": (22, 32, _q5_0, 8, 0),
    "Q5_1": (24, 32, _q5_1, 8, 16),
    "Q4_K": (144, 256, _q4_k, 4, 8),
    "Q5_K": (176, 256, _q5_k, 8, 16),
    "Q6_K": (210, 256, _q6_k, 8, 0),
    "Q3_K": (110, 256, _q3_k, 4, 0),
    "Q2_K": (84, 256, _q2_k, 4, 0),
    "IQ4_NL": (18, 32, _iq4_nl, 8, 0),
    "IQ4_XS": (136, 256, _iq4_xs, 8, 0),
    "TQ2_0": (66, 256, _tq2_0, 4, 0),
    "MXFP4": (17, 32, _mxfp4, 8, 0),
}


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
    size, weights, decode, bits, zero = _EXACT[type_name]
    blocks = np.ascontiguousarray(raw).reshape(n * (k // weights), size)
    codes, scales, mins = decode(blocks)
    sub = codes.shape[-1]
    per_block = (n, k // sub)
    mins = None if mins is None else mins.reshape(per_block)
    return QuantizedMatrix(
        codes.reshape(n, k), scales.reshape(per_block), bits, sub, mins, zero, type_name
    )
