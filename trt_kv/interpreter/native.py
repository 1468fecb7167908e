"""The optional compiled helper ``_native`` (x86-64 with AVX2, FMA and F16C): float16
conversions, products of rows against a weight, and attention.

``setup.py`` compiles ``_native.c`` where a C compiler is; this module loads it with ctypes.
:data:`LIB` is None where it was not built, was built from another version of the C file,
or cannot run on this processor, and :mod:`trt_kv.interpreter.half` then keeps its NumPy
recipes. :func:`widen` and :func:`round_float16` (callable only when :data:`LIB` is not
None) give NumPy's bits exactly, NaN payloads included (~0.2 ns an element);
:func:`product` multiplies a few rows by a float16 or float32 weight read as it is stored,
:func:`panel_product` many rows (a prefill chunk), like a matrix product; :func:`attention`
computes a prefill chunk's or a decode step's attention, each query row only up to the last
key it sees (RoPE through the helper: :mod:`trt_kv.interpreter.native_rope`).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trt_kv.errors import ArgumentError, DTypeError, ShapeError, mismatch
from trt_kv.interpreter.buffers import address, contiguous_aligned, expect_dtype

SIGNATURES = 14  # the C file's SIGNATURES: the version of the functions' argument lists
SOURCE = Path(__file__).with_name("_native.c")  # absent where installed without it
_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)
# Below this, NumPy's two casts (~1.6 us + ~3.7 ns an element here) cost less than a call
# through ctypes (~2.3 us, most of it fixed)
_SMALL = 320
_MIN_RUN = 8  # shorter runs than this are copied first: one C loop beats many short ones


def built_files(folder: Path = SOURCE.parent) -> list[Path]:
    """The builds of ``_native`` in ``folder``, one per extension suffix this Python loads."""
    paths = (folder / f"_native{s}" for s in importlib.machinery.EXTENSION_SUFFIXES)
    return [p for p in paths if p.is_file()]


def source_digest(source: Path = SOURCE) -> str | None:
    """The sha256 of the C file, as ``setup.py`` compiles it into the library; None where
    the file is not installed (then any build of :data:`SIGNATURES` is taken)."""
    try:
        return hashlib.sha256(source.read_bytes()).hexdigest()
    except OSError:
        return None


def load(folder: Path = SOURCE.parent) -> ctypes.CDLL | None:
    """The first build in ``folder`` that loads, runs on this processor, has this module's
    :data:`SIGNATURES` and was compiled from the C file beside this module; None if none
    does (not built, another processor, a build left from an older checkout, a foreign
    library)."""
    digest = source_digest()
    for path in built_files(folder):
        try:
            lib = ctypes.CDLL(str(path))
            if lib.trt_kv_native_ready() != SIGNATURES:
                continue
            lib.trt_kv_native_source.restype = ctypes.c_char_p
            if digest is not None and lib.trt_kv_native_source() != digest.encode():
                continue
            size, pointer = ctypes.c_size_t, ctypes.c_void_p
            lib.trt_kv_round_float16.argtypes = [pointer, pointer, size]
            lib.trt_kv_widen_float16.argtypes = [pointer, size, size, size, pointer]
            products = (lib.trt_kv_product_float16, lib.trt_kv_product_float32)
            panels = (lib.trt_kv_panels_float16, lib.trt_kv_panels_float32)
            panels += (lib.trt_kv_panels_wide_float16, lib.trt_kv_panels_wide_float32)
            wide, attention = lib.trt_kv_native_wide, lib.trt_kv_attention_float32
            rope, sigmoid = lib.trt_kv_rope_float32, lib.trt_kv_sigmoid_float32
            heads = lib.trt_kv_decode_heads
            blocks = (lib.trt_kv_blocks_product, lib.trt_kv_blocks_panels)
            chains = (lib.trt_kv_rms_norm, lib.trt_kv_add_rms_norm, lib.trt_kv_swiglu)
        except (OSError, AttributeError):  # not loadable; a library without our symbols
            continue
        for fn in (*products, *panels):
            fn.argtypes = [pointer, size, size, pointer, size, pointer, size]
        attention.argtypes = [pointer, *[size] * 4, pointer, pointer, size, size, pointer]
        attention.argtypes += [pointer, size, ctypes.c_float, pointer, ctypes.c_int, size]
        rope.argtypes = [pointer, *[size] * 5, pointer, pointer, pointer, ctypes.c_int, pointer]
        rope.argtypes += [ctypes.c_int]
        # a decode_heads, q, k, v, their row strides, b, cos, sin, rows, q_out, caches, s_max, where
        heads.argtypes = [pointer] * 5 + [size] + [pointer] * 6 + [size, pointer]
        sigmoid.argtypes = [pointer, pointer, size]
        for fn in blocks:  # the weight (a _BlocksWeight), x, rows, out, threads, rounded
            fn.argtypes = [pointer, pointer, size, pointer, size, ctypes.c_int]
        flag, single = ctypes.c_int, ctypes.c_float  # the chains (trt_kv.interpreter.chains)
        chains[0].argtypes = [pointer, size, size, single, pointer, flag, flag, pointer, pointer]
        chains[1].argtypes = [pointer, pointer, size, size, flag, single, pointer, flag, flag]
        chains[1].argtypes += [pointer] * 3
        chains[2].argtypes = [pointer, pointer, size, flag, pointer]
        voids = (lib.trt_kv_round_float16, lib.trt_kv_widen_float16, *products, *chains)
        for fn in (*voids, rope, sigmoid, heads):
            fn.restype = None
        for fn in (*panels, wide, attention, *blocks):
            fn.restype = ctypes.c_int
        return lib
    return None


LIB = load()
# Whether this processor runs the AVX-512 panel product (the same bits as the AVX2 one)
WIDE = LIB is not None and LIB.trt_kv_native_wide() == 1


def strided_runs(a: np.ndarray) -> tuple[int, int, int] | None:
    """``(runs, stride, length)`` in elements when ``a``'s elements, in order, are ``runs``
    runs of ``length`` contiguous ones, ``stride`` apart (a window of a larger array, such
    as ``cache[:, :, :n]`` of ``[B, N, S_max, H]``); None for any other layout."""
    item, length, k = a.itemsize, 1, a.ndim
    while k and (a.shape[k - 1] == 1 or a.strides[k - 1] == length * item):
        length *= a.shape[k - 1]
        k -= 1
    outer = [(n, s) for n, s in zip(a.shape[:k], a.strides[:k]) if n != 1]
    if not outer:
        return 1, 0, length
    if any(s0 != s1 * n1 for (_, s0), (n1, s1) in itertools.pairwise(outer)):
        return None  # the leading axes do not step as one
    stride = outer[-1][1]
    if stride < 0 or stride % item:
        return None
    return int(np.prod([n for n, _ in outer])), stride // item, length


def widen(h: np.ndarray) -> np.ndarray:
    """``h.astype(np.float32)`` for a float16 array ``h``, any shape and strides (misaligned
    arrays and other layouts than :func:`strided_runs` reads are copied first)."""
    expect_dtype("h", h, _F16)
    if h.size < _SMALL:
        return h.astype(np.float32)
    runs = strided_runs(h) if h.flags.aligned else None
    if runs is None or runs[2] < _MIN_RUN:
        h = contiguous_aligned(h)
        runs = (1, 0, h.size)
    out = np.empty(h.shape, np.float32)
    LIB.trt_kv_widen_float16(address(h), *runs, address(out))
    return out


def round_float16(x: np.ndarray) -> np.ndarray:
    """A new float32 array: ``x.astype(np.float16).astype(np.float32)`` for float32 ``x``."""
    expect_dtype("x", x, _F32)
    if x.size < _SMALL:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    x = contiguous_aligned(x)
    out = np.empty(x.shape, np.float32)
    LIB.trt_kv_round_float16(address(x), address(out), x.size)
    return out


def round_any(a: object) -> np.ndarray:
    """``round_float16(np.asarray(a, dtype=np.float32))``: a layer output rounded at its
    float16 boundary, the usual one (a C-contiguous float32 array, not small) with no more
    checks than it needs (one of these a decode step runs ~600 times)."""
    if (
        type(a) is np.ndarray
        and a.dtype == _F32
        and a.size >= _SMALL
        and a.flags.c_contiguous
        and a.flags.aligned
    ):
        out = np.empty(a.shape, _F32)
        LIB.trt_kv_round_float16(address(a), address(out), a.size)
        return out
    return round_float16(np.asarray(a, dtype=_F32))


def _operands(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x`` and ``w`` checked and made contiguous, and the ``[M, N]`` float32 result."""
    expect_dtype("x", x, _F32)
    if w.dtype not in _PRODUCTS:
        raise DTypeError(mismatch("w", "dtype", "float16 or float32", w.dtype.str))
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ShapeError(mismatch("x, w", "[M, K] and [N, K]", "", f"{x.shape} and {w.shape}"))
    return contiguous_aligned(x), contiguous_aligned(w), np.empty((x.shape[0], w.shape[0]), _F32)


def product(x: np.ndarray, w: np.ndarray, threads: int = 1) -> np.ndarray:
    """``x [M, K] @ w^T`` -> float32 ``[M, N]`` for float32 rows ``x`` and a float16 or
    float32 weight ``w [N, K]`` (``nn.Linear`` layout), each weight element read once as
    stored (float16 widened exactly); sums in float32, each element's in an order that does
    not depend on ``M`` or on the other rows of ``w`` (so a product of stacked weights gives
    each one's bits). Meant for a few rows: up to 4, one weight row at a time in one stream
    through memory (~0.09 us a float32 row of 576 at one row, on an AMD EPYC here, against
    BLAS's ~0.19); more, in tiles of four weight rows. The weight rows are split across
    ``threads`` (the same bits for any count)."""
    x, w, out = _operands(x, w)
    if out.size:
        fn = getattr(LIB, _PRODUCTS[w.dtype])
        fn(address(w), *w.shape, address(x), x.shape[0], address(out), max(1, threads))
    return out


def panel_product(x: np.ndarray, w: np.ndarray, wide: bool = WIDE, threads: int = 1) -> np.ndarray:
    """``x [M, K] @ w^T`` as :func:`product` (same operands, same result within float32
    rounding) for many rows, a prefill chunk: ``x`` copied into transposed panels of 16 rows,
    each tile of weight rows (float16 widened first) multiplied against every panel, as a
    matrix product does: 6 rows against one panel with AVX2, or with ``wide`` (AVX-512, the
    default where :data:`WIDE`) 12 rows against two. Each element is one float32 sum over K in
    order, the same bits either way (another order than :func:`product`'s, again whatever
    else is computed with it). At 128 rows on one AMD EPYC (Zen 4) core here ~10% (AVX2) and
    ~20% (AVX-512) faster than OpenBLAS; slower from ~256 (the plan keeps BLAS there). The
    weight rows are split across ``threads`` (the same bits for any count).

    Raises:
        MemoryError: no memory for the panels (a copy of ``x``); nothing is computed.
        ArgumentError: ``wide`` on a processor without AVX-512.
    """
    if wide and not WIDE:
        raise ArgumentError(mismatch("wide", "value", "False (no AVX-512 here)", wide))
    x, w, out = _operands(x, w)
    if out.size:
        fn = getattr(LIB, (_WIDE_PANELS if wide else _PANELS)[w.dtype])
        if fn(address(w), *w.shape, address(x), x.shape[0], address(out), max(1, threads)):
            raise MemoryError(f"panels of x {x.shape}: no memory for a copy of x")
    return out


_PRODUCTS = {_F16: "trt_kv_product_float16", _F32: "trt_kv_product_float32"}
_PANELS = {_F16: "trt_kv_panels_float16", _F32: "trt_kv_panels_float32"}
_WIDE_PANELS = {_F16: "trt_kv_panels_wide_float16", _F32: "trt_kv_panels_wide_float32"}


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    keep: np.ndarray,
    scale: float,
    keys: int | None = None,
    rounded: bool = False,
    threads: int = 1,
) -> np.ndarray:
    """Softmax attention of float32 ``q [B, Nq, Sq, H]`` against ``k``, ``v [B, Nkv, n, H]``
    (GQA: Nq a multiple of Nkv; windows of a cache are read where they lie) with ``keep``
    (bool, broadcastable to ``[B, 1 or Nq, Sq, n]``: which keys each query row sees) ->
    float32 ``[B, Nq, Sq, H]``, as :func:`trt_kv.reference.ops.attention` with that mask and
    ``scale``, within float32 rounding (its own ``exp``: ~1 ulp; other summation orders). A
    row that sees no key gives zeros, one whose seen scores hold NaN or +inf gives NaN. Rows
    go in blocks of 4: a key no row of a block sees (an unwritten cache row) is never read for
    it, one another row of the block sees is read with weight 0. ~2x faster than NumPy's
    passes for a 128-token prefill chunk, much of it by computing scores only up to the last
    key a block's rows see. Up to 4 query rows a KV head (a decode step: Nq / Nkv x Sq), each
    key row is read where it lies instead of transposed first (~1.1-1.9x faster than NumPy's
    passes, 32 to 4096 keys). A row's result does not depend on the other sequences of B.
    ``keys``: only the first ``keys`` of k's and v's n are read (default all: a cache read
    in place, not sliced); ``rounded``: the result rounded to float16 values in the call;
    ``threads``: the (sequence, KV head) pairs split across them (the same bits for any
    count).

    Raises:
        DTypeError: q, k or v not float32, or keep not bool.
        ShapeError: shapes that do not fit (see above).
        MemoryError: no memory for its scratch (scores, keys transposed); no result.
    """
    if q.dtype != _F32 or k.dtype != _F32 or v.dtype != _F32 or keep.dtype != _BOOL:
        for name, a in (("q", q), ("k", k), ("v", v)):
            expect_dtype(name, a, _F32)
        expect_dtype("keep", keep, _BOOL)
    b, nq, sq, h = q.shape if q.ndim == 4 else (0, 0, 0, -1)
    nkv = k.shape[1] if k.ndim == 4 else 0
    if h < 0 or k.shape != v.shape or k.shape[::3] != (b, h) or not nkv or nq % nkv:
        raise ShapeError(
            mismatch(
                "q, k, v", "[B, Nq, Sq, H], [B, Nkv, n, H] x 2", "", (q.shape, k.shape, v.shape)
            )
        )
    n = k.shape[2] if keys is None else keys
    if not 0 <= n <= k.shape[2]:
        raise ShapeError(mismatch("keys", "in", f"[0, {k.shape[2]}]", keys))
    heads = nq if keep.ndim == 4 and keep.shape[1] == nq > 1 else 1
    if keep.shape != (b, heads, sq, n):  # (broadcast_to costs ~4 us: a decode step's tenth)
        try:
            keep = np.broadcast_to(keep, (b, heads, sq, n))
        except ValueError:
            raise ShapeError(
                mismatch("keep", "broadcastable to", (b, heads, sq, n), keep.shape)
            ) from None
    q = contiguous_aligned(q)
    keep = keep if keep.flags.c_contiguous else np.ascontiguousarray(keep)  # a byte, 0 or 1
    if (
        k.strides != v.strides
        or k.strides[3] != k.itemsize
        or not (k.flags.aligned and v.flags.aligned)
    ):
        k, v = contiguous_aligned(k), contiguous_aligned(v)
    strides = _STRIDES.get(k.strides) or _STRIDES.setdefault(
        k.strides, (ctypes.c_size_t * 3)(*[s // k.itemsize for s in k.strides[:3]])
    )
    out = np.empty(q.shape, _F32)
    if out.size and LIB.trt_kv_attention_float32(
        address(q), b, nq, sq, h, address(k), address(v), nkv, n, strides,
        address(keep), heads, float(scale), address(out), int(rounded), max(1, threads),
    ):  # fmt: skip
        raise MemoryError(f"attention of q {q.shape}: no memory for the keys transposed")
    return out


_STRIDES: dict[tuple[int, ...], ctypes.Array] = {}  # k's strides -> the helper's (~2 us each)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """A new float32 array ``1 / (1 + exp(-x))`` of float32 ``x``, within ~3 ulps (the
    helper's ``exp``, then one rounded addition and one division; NumPy's form is within 4):
    one pass instead of four. NaN stays NaN; ``x < -88`` gives the limit 0."""
    expect_dtype("x", x, _F32)
    x = contiguous_aligned(x)
    out = np.empty(x.shape, _F32)
    if out.size:
        LIB.trt_kv_sigmoid_float32(address(x), address(out), x.size)
    return out


def block_product(
    codes: np.ndarray,
    bits: int,
    block: int,
    scales: np.ndarray,
    offsets: np.ndarray | None,
    x: np.ndarray,
    threads: int = 1,
    panels: bool = False,
    wide: bool = WIDE,
    rounded: bool = False,
) -> np.ndarray:
    """``x [M, K] @ w^T`` -> float32 ``[M, N]`` for a weight held in blocks
    (:class:`~trt_kv.interpreter.blocks.BlockWeight`: ``codes`` uint8 ``[N, K / 2]`` for
    ``bits`` 4 or int8 ``[N, K]`` for 8, float16 ``scales`` and ``offsets`` ``[N, K / block]``),
    read where it lies: ``w = d * code + o``. ``panels``: many rows (a prefill chunk), each
    weight tile dequantized then multiplied as :func:`panel_product`; else each element
    ``d . (codes . x)`` per block plus ``o . (x summed per block)``. The weight rows are split
    across ``threads`` (never K: the same bits for any count); ``wide``: AVX-512;
    ``rounded``: the result rounded to float16 values (:func:`round_float16`'s bits) in the
    same call.

    Raises:
        MemoryError: no memory for the call's scratch; nothing is computed.
    """
    expect_dtype("x", x, _F32)
    call = blocks_call(codes, bits, block, scales, offsets, panels, wide)
    return call(contiguous_aligned(x), max(1, threads), int(rounded))


def blocks_call(
    codes: np.ndarray,
    bits: int,
    block: int,
    scales: np.ndarray,
    offsets: np.ndarray | None,
    panels: bool = False,
    wide: bool = WIDE,
) -> Callable[[np.ndarray, int, int], np.ndarray]:
    """:func:`block_product` of one weight with its own arguments taken once (addresses,
    dims): ``call(x, threads, rounded)`` for a C-contiguous, aligned float32 ``x [M, K]``
    (dtype and layout the caller's to ensure; K checked), ~1-1.5 us a call less. The arrays must
    outlive ``call`` (a :class:`~trt_kv.interpreter.blocks.BlockWeight` holds both).

    Raises (from ``call``):
        ShapeError: x's K is not the weight's.
        MemoryError: no memory for the call's scratch; nothing is computed.
    """
    fn = LIB.trt_kv_blocks_panels if panels else LIB.trt_kv_blocks_product
    n, k = scales.shape[0], scales.shape[1] * block
    at = 0 if offsets is None else address(offsets)
    held = _BlocksWeight(address(codes), address(scales), at, n, k, block, bits, int(wide and WIDE))
    weight = ctypes.addressof(held)

    def call(x: np.ndarray, threads: int, rounded: int, _held: _BlocksWeight = held) -> np.ndarray:
        if x.shape[1] != k:
            raise ShapeError(mismatch("x", "K", k, x.shape[1]))
        out = np.empty((x.shape[0], n), _F32)
        if out.size and fn(weight, address(x), x.shape[0], address(out), threads, rounded):
            raise MemoryError(f"block product of x {x.shape}: no memory for its scratch")
        return out

    call.raw = fn, weight  # type: ignore[attr-defined]  # a bound step's call (products.py)
    return call


class _BlocksWeight(ctypes.Structure):
    """The C file's ``blocks_weight``: a weight held in blocks as the block products take it
    (its arrays' addresses and dims, one argument instead of eight on every call)."""

    _fields_ = [
        ("codes", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("n", ctypes.c_size_t),
        ("k", ctypes.c_size_t),
        ("block", ctypes.c_size_t),
        ("bits", ctypes.c_int),
        ("wide", ctypes.c_int),
    ]
