"""Weights kept quantized in a fast plan: a matrix as its INT4/INT8 codes, block scales and
block offsets, multiplied as stored.

A network holds a quantized matrix as an ``IDequantizeLayer`` over constant codes and block
scales, read by a matrix product, plus (for a type with a minimum, Q4_1) a second product of
the rows summed per block against constant offsets
(:func:`~trt_kv.quantization.network.quantized_linear`). A fast plan runs the two as one
product over a :class:`BlockWeight` (:mod:`~trt_kv.interpreter.fused` finds them):
``w[n, k] = d[n, k / block] * code[n, k] + o[n, k / block]``, the codes packed as stored
(4 bits: two a byte), ``d`` and ``o`` float16, no float copy of the weight. :func:`multiply`
runs it through the compiled helper (:func:`~trt_kv.interpreter.native.block_product`) or,
without it, NumPy on blocks of weight rows dequantized for the call; :data:`COUNTS` counts
the calls by route.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trt_kv.errors import ArgumentError, ShapeError, mismatch

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
GROUP = 32  # codes a group: 16 bytes at 4 bits (low nibbles the first 16, high the next 16)
COUNTS: Counter[str] = Counter()  # fused products run, by route ("native", "panels", "numpy")


@dataclass(frozen=True)
class BlockWeight:
    """``W [N, K]`` as ``codes`` (bits 4: uint8 ``[N, K / 2]``, each 32 codes of a row as 16
    bytes, code ``j`` plus 8 in the low nibble of byte ``j`` and code ``16 + j`` plus 8 in its
    high nibble, GGUF's Q4 order; bits 8: int8 ``[N, K]``), ``scales`` and ``offsets``
    (float16 ``[N, K / block]``; offsets None: none), ``block`` 16 or 32."""

    codes: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray | None
    bits: int
    block: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * self.block

    @cached_property
    def native_calls(self) -> tuple[Callable[[np.ndarray, int, int], np.ndarray], ...]:
        """The compiled helper's products of this weight, its arguments taken once
        (:func:`~trt_kv.interpreter.native.blocks_call`): few rows (a decode step), then
        panels (a prefill chunk). The helper must be built."""
        from trt_kv.interpreter import native  # the format does not need the helper

        args = (self.codes, self.bits, self.block, self.scales, self.offsets)
        return tuple(native.blocks_call(*args, panels) for panels in (False, True))

    @property
    def nbytes(self) -> int:
        """Bytes held: codes, scales and offsets."""
        held = self.codes.nbytes + self.scales.nbytes
        return held + (0 if self.offsets is None else self.offsets.nbytes)

    @classmethod
    def from_codes(
        cls, codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None, bits: int
    ) -> BlockWeight:
        """From signed codes int8 ``[N, K]`` (in ``[-8, 7]`` for 4 bits) and float16 (or
        float16-valued) ``scales``, ``offsets`` ``[N, K / block]``.

        Raises:
            ArgumentError: ``bits`` not 4 or 8, or a scale or offset that is not a float16.
            ShapeError: K not a multiple of 32, or a block other than 16 or 32.
        """
        if bits not in (4, 8):
            raise ArgumentError(mismatch("bits", "one of", (4, 8), bits))
        n, k = codes.shape
        blocks = scales.shape[-1] if scales.ndim == 2 else 0
        if k % GROUP or not blocks or k % blocks or k // blocks not in (16, 32):
            raise ShapeError(mismatch("codes, scales", "[N, K], [N, K / 16 or 32]", "", (
                codes.shape, scales.shape)))  # fmt: skip
        held = [_float16(name, a) for name, a in (("scales", scales), ("offsets", offsets))]
        if bits == 4:
            u = (codes.astype(np.int16) + 8).astype(np.uint8).reshape(n, k // GROUP, 2, 16)
            packed = (u[:, :, 0] | (u[:, :, 1] << np.uint8(4))).reshape(n, k // 2)
        else:
            packed = np.ascontiguousarray(codes, dtype=np.int8)
        return cls(_read_only(packed), held[0], held[1], bits, k // blocks)

    def signed_codes(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The codes of rows ``lo:hi`` as int8 ``[rows, K]``."""
        c = self.codes[lo:hi]
        if self.bits == 8:
            return c
        g = c.reshape(c.shape[0], -1, 1, 16)
        u = np.concatenate([g & np.uint8(15), g >> np.uint8(4)], axis=2)
        return (u.astype(np.int8) - np.int8(8)).reshape(c.shape[0], -1)

    def dequantize(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``lo:hi`` of ``W`` in float32: ``d * code + o``, one rounding (``d * code``
        is exact)."""
        w = np.repeat(self.scales[lo:hi].astype(_F32), self.block, axis=1)
        w *= self.signed_codes(lo, hi)
        if self.offsets is not None:
            w += np.repeat(self.offsets[lo:hi].astype(_F32), self.block, axis=1)
        return w

    def stacked(self, others: list[BlockWeight]) -> BlockWeight:
        """This matrix with ``others`` below it (same K, bits, block and offsets or not)."""
        every = [self, *others]
        offsets = None
        if self.offsets is not None:
            offsets = _read_only(np.concatenate([w.offsets for w in every]))
        codes = _read_only(np.concatenate([w.codes for w in every]))
        scales = _read_only(np.concatenate([w.scales for w in every]))
        return BlockWeight(codes, scales, offsets, self.bits, self.block)

    def joins(self, other: BlockWeight) -> bool:
        """Whether :meth:`stacked` takes ``other``."""
        same = (self.shape[1], self.bits, self.block) == (other.shape[1], other.bits, other.block)
        return same and (self.offsets is None) == (other.offsets is None)


def _float16(name: str, a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    held = np.asarray(a).astype(_F16)
    with np.errstate(invalid="ignore"):
        exact = np.array_equal(held.astype(a.dtype), a, equal_nan=True)
    if not exact:
        raise ArgumentError(mismatch(name, "float16 values", "", "values float16 rounds"))
    return _read_only(np.ascontiguousarray(held))


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_ROWS_A_BLOCK = 1 << 18  # weight elements dequantized at once without the helper (1 MB)


def numpy_product(x: np.ndarray, w: BlockWeight) -> np.ndarray:
    """``x [M, K] @ W^T`` -> float32 ``[M, N]`` without the helper: blocks of weight rows
    (about 1 MB of float32) dequantized for the call, one BLAS product each; no copy of the
    whole weight is made."""
    n, k = w.shape
    out = np.empty((x.shape[0], n), _F32)
    step = max(1, _ROWS_A_BLOCK // k)
    for lo in range(0, n, step):
        np.matmul(x, w.dequantize(lo, lo + step).T, out=out[:, lo : lo + step])
    return out
