"""RoPE through the compiled helper (:mod:`trt_kv.interpreter.native`): Hugging Face's
rotate-half (or interleaved) form of :func:`trt_kv.reference.ops.apply_rope`, bit for bit, in
one pass over the rows; the checks (:func:`rope_rows`) apart from the call (:func:`rope_at`),
so that a plan's RoPE layers check once a step. :func:`decode_heads`: a decode step's Q and K
rotated, Q scaled and K and V written into their caches, in one call (an attention block's)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from trt_kv.errors import ShapeError, mismatch
from trt_kv.interpreter.buffers import address, bounds, contiguous_aligned, expect_dtype
from trt_kv.interpreter.native import LIB

_F32 = np.dtype(np.float32)


def rope(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    positions: np.ndarray,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    rounded: bool = False,
) -> np.ndarray:
    """:func:`trt_kv.reference.ops.apply_rope` of float32 ``x [B, N, S, H]`` with float32
    tables ``cos``, ``sin [P, R/2]`` at ``positions [B, S]`` (each in ``[-P, P)``, negative
    from the end as NumPy indexes), bit for bit: each product rounded, then their sum, in one
    pass over x instead of six; ``rounded``: the result rounded to float16 values in the call.

    Raises:
        DTypeError: x, cos or sin not float32.
        ShapeError: shapes that do not fit, or a position outside ``[-P, P)``.
    """
    for name, a in (("x", x), ("cos", cos), ("sin", sin)):
        expect_dtype(name, a, _F32)
    rows, r = rope_rows(x.shape, cos, sin, positions, rotary_dim)
    return rope_at(x, cos, sin, rows, r, interleaved, rounded)


def rope_rows(
    shape: tuple[int, ...],
    cos: np.ndarray,
    sin: np.ndarray,
    positions: np.ndarray,
    rotary_dim: int | None = None,
) -> tuple[np.ndarray, int]:
    """``(rows, R)``: the table rows a :func:`rope` of ``x`` of ``shape`` reads (int64,
    ``[B, S]``, in ``[0, P)``) and its rotary dim, the shapes and positions checked.

    Raises:
        ShapeError: as :func:`rope`.
    """
    h = shape[-1] if len(shape) == 4 else -1
    r = h if rotary_dim is None else rotary_dim
    p = cos.shape[0] if cos.ndim == 2 else 0
    positions = np.asarray(positions)
    if h < 0 or cos.shape != sin.shape or cos.shape[1:] != (r // 2,) or r % 2 or not 0 <= r <= h:
        shapes = (shape, cos.shape, sin.shape, r)
        raise ShapeError(mismatch("x, cos, sin", "[B, N, S, H], [P, R/2] x 2", "", shapes))
    if positions.shape != (shape[0], shape[2]) or positions.dtype.kind not in "iu":
        raise ShapeError(mismatch("positions", "[B, S] integers", "", positions.shape))
    low, high = bounds(positions) if positions.size else (0, 0)
    if positions.size and not -p <= low <= high < p:
        raise ShapeError(mismatch("positions", "in", f"[-{p}, {p})", (low, high)))
    rows = positions if low >= 0 else np.where(positions < 0, positions + p, positions)
    return np.ascontiguousarray(rows, np.int64), r


def rope_at(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    rows: np.ndarray,
    r: int,
    interleaved: bool = False,
    rounded: bool = False,
) -> np.ndarray:
    """:func:`rope` at the ``rows`` and rotary dim :func:`rope_rows` gave for float32 ``x``,
    ``cos`` and ``sin`` of these shapes (checked there, not again: a plan's RoPE layers
    check once a step)."""
    x, cos, sin = contiguous_aligned(x), contiguous_aligned(cos), contiguous_aligned(sin)
    out = np.empty(x.shape, _F32)
    if out.size:
        LIB.trt_kv_rope_float32(
            address(x), *x.shape, r, address(cos), address(sin), address(rows),
            int(interleaved), address(out), int(rounded),
        )  # fmt: skip
    return out


class _DecodeHeads(ctypes.Structure):
    """The C file's ``decode_heads``: an attention block's dims and flags, built once."""

    _fields_ = [
        ("nq", ctypes.c_size_t),
        ("nkv", ctypes.c_size_t),
        ("h", ctypes.c_size_t),
        ("r", ctypes.c_size_t),
        ("interleaved", ctypes.c_int),
        ("round_q", ctypes.c_int),
        ("round_k", ctypes.c_int),
        ("round_scaled", ctypes.c_int),
        ("factor", ctypes.c_float),
    ]


Heads = Callable[..., np.ndarray]


def decode_heads(
    widths: tuple[int, int, int],
    r: int,
    interleaved: bool,
    rounded: tuple[bool, bool],
    factor: np.float32,
    round_scaled: bool,
) -> Heads:
    """``call(q, k, v, cos, sin, rows, keys, values, where) -> q_out [B, Nq, 1, H]``: what an
    attention block does to a decode step's rows (one token a sequence) before attention, in
    one call. For ``widths`` ``(Nq, Nkv, H)``: RoPE of ``q [B, 1, Nq*H]`` (:func:`rope_at`, rotary
    dim ``r``, rounded to float16 values where ``rounded[0]``) times ``factor`` (rounded where
    ``round_scaled``) as ``q_out``; RoPE of ``k [B, 1, Nkv*H]`` (``rounded[1]``) and ``v`` as
    they are written into ``keys`` and ``values [B, Nkv, S_max, H]`` at row ``where[b]``, as
    the cache update writes them. The bits of :func:`rope_at`, ``np.multiply`` and
    :func:`~trt_kv.interpreter.half.round_any` one by one.

    Nothing is checked here; the caller ensures: q, k and v float32 with their last axis
    contiguous, aligned, their row strides whole elements; cos and sin float32 ``[P,
    r/2]``, C-contiguous; ``rows`` int64 ``[B, 1]`` in ``[0, P)`` (:func:`rope_rows`); the
    caches float32, C-contiguous, writeable; ``where`` int64 ``[B]``, C-contiguous, each row
    within the caches (:func:`~trt_kv.interpreter.transformer.writes_within`)."""
    nq, nkv, h = widths
    flags = (int(interleaved), int(rounded[0]), int(rounded[1]), int(round_scaled))
    spec = _DecodeHeads(nq, nkv, h, r, *flags, float(factor))
    at, fn = ctypes.addressof(spec), LIB.trt_kv_decode_heads

    def call(
        q: np.ndarray, k: np.ndarray, v: np.ndarray, cos: np.ndarray, sin: np.ndarray,
        rows: np.ndarray, keys: np.ndarray, values: np.ndarray, where: np.ndarray,
        _spec: _DecodeHeads = spec,
    ) -> np.ndarray:  # fmt: skip
        b = q.shape[0]
        out = np.empty((b, nq, 1, h), _F32)
        fn(
            at, address(q), address(k), address(v), apart(q, k, v), b,
            address(cos), address(sin), address(rows), address(out), address(keys),
            address(values), keys.shape[2], address(where),
        )  # fmt: skip
        return out

    call.raw = fn, at  # type: ignore[attr-defined]  # a bound block's call (attention_bound)
    return call


_ONE = (ctypes.c_size_t * 3)()  # one sequence: no stride between sequences is read
_APART: dict[tuple[int, ...], ctypes.Array] = {}  # row strides in elements -> their C array


def apart(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> ctypes.Array:
    """The row strides of float32 ``q``, ``k``, ``v [B, 1, N*H]`` in elements, as the C array
    :func:`decode_heads`'s call reads (none read for one sequence)."""
    if q.shape[0] == 1:
        return _ONE
    xs = q, k, v
    key = tuple(a.strides[0] // 4 for a in xs)
    held = _APART.get(key)
    if held is None:
        held = _APART[key] = (ctypes.c_size_t * len(key))(*key)
    return held
