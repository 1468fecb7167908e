"""A weight matrix kept quantized: integer codes with one scale (and optionally one minimum)
per block of weights along a row, as GGUF stores them and TensorRT's ``IDequantizeLayer``
takes them.

``w[n, k] = scales[n, k // block] * (codes[n, k] + zero) + mins[n, k // block]``, computed in
float32 in exactly this order (``d * c``, plus ``zero * d``, plus ``m``), which for GGUF's
types with minimums (Q4_1's ``d * q + m`` with ``q = c + 8``, Q5_1, Q2_K, Q4_K, Q5_K) is
gguf's own float32 dequantization bit for bit: ``d`` has at most 17 significant bits (a
float16 times a 6-bit integer) and ``q`` at most 5, so ``d * c``, ``zero * d`` and their sum
``d * q`` are exact, and the one rounding is that of ``+ m``, as in gguf.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv.errors import ArgumentError, ShapeError, mismatch

BLOCK = 32  # weights per scale along a row: GGUF's Q8_0/Q4_0/Q4_1 block (the K-quants' 32 or 16)
_RANGE = {4: (-8, 7), 8: (-128, 127)}  # signed INT4 / INT8 codes


@dataclass(frozen=True)
class QuantizedMatrix:
    """``[N, K]`` weights as codes ``[N, K]`` (int8 holding ``bits``-bit signed values),
    ``scales [N, K / block]`` and ``mins [N, K / block]`` (or None), float32 arrays (GGUF's
    float16 fields, or a K-quant's exact float32 product of its super-block scale and a
    sub-block's integer one: a network rounds them once to its dtype); ``source`` names the
    stored form ("Q4_1", "int8", ...); ``exact``: the checkpoint's values as stored, else
    re-quantized, ``max_error`` the largest ``|w - stored value|``."""

    codes: np.ndarray
    scales: np.ndarray
    bits: int
    block: int = BLOCK
    mins: np.ndarray | None = None
    zero: int = 0  # added to every code (Q4_1's unsigned codes are stored as q - 8)
    source: str = ""
    max_error: float = 0.0
    exact: bool = True

    def __post_init__(self) -> None:
        if self.bits not in _RANGE:
            raise ArgumentError(mismatch("bits", "one of", sorted(_RANGE), self.bits))
        n, k = self.codes.shape
        expected = (n, k // self.block)
        if k % self.block or self.scales.shape != expected:
            raise ShapeError(mismatch("scales", "shape", expected, self.scales.shape))
        if self.mins is not None and self.mins.shape != expected:
            raise ShapeError(mismatch("mins", "shape", expected, self.mins.shape))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def kind(self) -> str:
        """How the engine holds it, e.g. ``"int4 block 32 + mins"``."""
        extra = " + mins" if self.mins is not None or self.zero else ""
        return f"int{self.bits} block {self.block}{extra}"

    def dequantize(self) -> np.ndarray:
        """The float32 weights ``[N, K]``."""
        d = np.repeat(self.scales.astype(np.float32), self.block, axis=1)
        w = d * self.codes.astype(np.float32)
        if self.zero:
            w = w + d * np.float32(self.zero)
        if self.mins is not None:
            w = w + np.repeat(self.mins.astype(np.float32), self.block, axis=1)
        return w

    def rows(self, lo: int, hi: int) -> QuantizedMatrix:
        """Rows ``lo:hi`` (a fused projection's part)."""
        return self.permuted(np.arange(lo, hi))

    def permuted(self, order: np.ndarray) -> QuantizedMatrix:
        """The rows in ``order`` (llama.cpp's Q/K row permutation undone, say)."""
        mins = None if self.mins is None else self.mins[order]
        return QuantizedMatrix(
            self.codes[order], self.scales[order], self.bits, self.block, mins,
            self.zero, self.source, self.max_error, self.exact,
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        """Bytes as the engine stores them: packed codes, float16 scales (and mins)."""
        scale_bytes = 2 * self.scales.size * (1 + (self.mins is not None or self.zero != 0))
        return self.codes.size * self.bits // 8 + scale_bytes


def block_extremes(q: QuantizedMatrix) -> float:
    """The largest ``|w|`` of ``q``'s dequantized weights (float32; inf when a scale or a
    minimum is not finite), from each block's smallest and largest code: ``w`` is linear
    in the code, so its extremes lie there. One pass over the codes."""
    n, k = q.shape
    blocks = q.codes.reshape(n, k // q.block, q.block)
    ends = [blocks.min(axis=2), blocks.max(axis=2)]  # [N, K / block] each
    d = q.scales.astype(np.float32)
    m = np.float32(0) if q.mins is None else q.mins.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        top = max(float(np.abs(d * (c + np.float32(q.zero)) + m).max(initial=0.0)) for c in ends)
    return top if np.isfinite(top) else float("inf")


def quantize_symmetric(w: np.ndarray, bits: int, source: str = "") -> QuantizedMatrix:
    """Symmetric per-block quantization of float ``w [N, K]`` (lossy): per block of
    :data:`BLOCK`, ``d = max|w| / (2^(bits-1) - 1)`` rounded to float16 and
    ``c = round(w / d)``; the largest error is recorded.

    Raises:
        ShapeError: ``w`` not 2-D or K not a multiple of the block.
        ArgumentError: ``bits`` not 4 or 8.
    """
    if bits not in _RANGE:
        raise ArgumentError(mismatch("bits", "one of", sorted(_RANGE), bits))
    w32 = _blocks(w)
    top = np.float32(_RANGE[bits][1])
    # a scale past float16 becomes inf (refused when a network would hold it:
    # trt_kv.quantization.storage.check_held_range), not a warning
    with np.errstate(over="ignore", invalid="ignore"):
        d = (np.abs(w32).max(axis=2) / top).astype(np.float16).astype(np.float32)
        safe = np.where(d == 0, np.float32(1), d)[..., None]
        codes = np.clip(np.rint(w32 / safe), -top, top).astype(np.int8)
        n, k = w.shape
        q = QuantizedMatrix(codes.reshape(n, k), d, bits, source=source or f"int{bits}")
        return _with_error(q, w)


def quantize_asymmetric4(w: np.ndarray, source: str) -> QuantizedMatrix:
    """Per block of :data:`BLOCK`, ``m = min w``, ``d = (max w - m) / 15`` (float16),
    ``q = round((w - m) / d)`` in [0, 15], stored as Q4_1 is (codes ``q - 8``, zero 8): the
    nearest INT4 form of a K-quant whose 4-bit (or fewer) codes share a 32-weight sub-block
    (exact up to the float16 rounding of d and m, which is recorded).

    Raises:
        ShapeError: ``w`` not 2-D or K not a multiple of the block.
    """
    w32 = _blocks(w)
    with np.errstate(over="ignore", invalid="ignore"):  # as quantize_symmetric's
        lo = w32.min(axis=2).astype(np.float16).astype(np.float32)
        d = ((w32.max(axis=2) - lo) / np.float32(15)).astype(np.float16).astype(np.float32)
        safe = np.where(d == 0, np.float32(1), d)[..., None]
        q = np.clip(np.rint((w32 - lo[..., None]) / safe), 0, 15).astype(np.int8)
        n, k = w.shape
        codes = (q - 8).reshape(n, k)
        return _with_error(QuantizedMatrix(codes, d, 4, mins=lo, zero=8, source=source), w)


def _blocks(w: np.ndarray) -> np.ndarray:
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ShapeError(mismatch("weights", f"[N, K] with K a multiple of {BLOCK}", "", w.shape))
    n, k = w.shape
    return np.asarray(w, dtype=np.float32).reshape(n, k // BLOCK, BLOCK)


def _with_error(q: QuantizedMatrix, w: np.ndarray) -> QuantizedMatrix:
    error = float(np.abs(q.dequantize() - np.asarray(w, dtype=np.float32)).max(initial=0.0))
    return QuantizedMatrix(
        q.codes, q.scales, q.bits, q.block, q.mins, q.zero, q.source, error, exact=False
    )  # fmt: skip


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """Signed 4-bit codes (int8 in [-8, 7]) as TensorRT's INT4 weights: two per byte, the
    first element in the low nibble. ``[N, K] -> [N * K / 2]`` uint8."""
    u = (codes.reshape(-1, 2).astype(np.uint8)) & np.uint8(0xF)
    return (u[:, 0] | (u[:, 1] << np.uint8(4))).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """The inverse of :func:`pack_int4`: ``count`` int8 values in [-8, 7]."""
    b = np.asarray(packed, dtype=np.uint8).reshape(-1)
    pair = np.stack([b & np.uint8(0xF), b >> np.uint8(4)], axis=1).reshape(-1)[:count]
    return (pair.astype(np.int8) ^ np.int8(8)) - np.int8(8)
