"""A fast plan's products ``x @ W^T``: which route runs each one, chosen in one place.

Rows ``x [M, K]`` times a weight ``W [N, K]`` stored ``nn.Linear``-style (read transposed)
come up in four places of a fast plan, each a :class:`Weight` kind: a MatrixMultiply layer
against a float32/float64 weight (:attr:`Weight.STORED`) or against a float16 one the plan
keeps as stored (:attr:`Weight.NARROW`,
:func:`~trt_kv.interpreter.layout.keep_float16_weights`), the products of one input stacked
into one call (:attr:`Weight.STACKED`, :func:`~trt_kv.interpreter.layout.fuse_shared_products`:
Q/K/V, gate/up) and a decode step's attention scores, the cached keys as the weight
(:attr:`Weight.KEYS`). :func:`choose` picks the :class:`Route` of each from ``M``, the
weight's shape and dtype, the rows' dtype and whether the compiled helper is built; the
thresholds it compares against are the constants below, and nothing else in the interpreter
compares against them. :func:`multiply` runs a route. The plain plan (``fast=False``) takes
none of this: NumPy's product everywhere, the yardstick of these routes.

Every route computes the same products, each within float32 rounding of the float64 product
(summation orders differ: BLAS's, the helper's); NATIVE and ROW_DOTS sum each element in an
order that does not depend on the other rows of ``W`` (so a stacked product gives each
member's bits).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import numpy as np

from trt_kv.build_defaults import default_threads
from trt_kv.errors import ArgumentError, mismatch
from trt_kv.interpreter import blocks, half, native
from trt_kv.interpreter.buffers import address, contiguous_aligned, expect_dtype
from trt_kv.interpreter.registry import Binder, Bound

Array = np.ndarray
_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)

# -- the thresholds ----------------------------------------------------------------------------
# Rows up to which a product runs through the helper's product, per weight dtype. Measured
# against OpenBLAS one thread, weights from memory, float32: ~2x faster at 1-2 rows, ~1.6x at
# 4, ~1.2x at 8 (AMD EPYC; on an Intel Xeon 1.1-1.6x); float16 up to 16 rows (the alternative
# widens the weight first).
NATIVE_ROWS = {_F16: 16, _F32: 8}
# Rows up to which a product runs through the helper's panels. Measured against OpenBLAS
# 0.3.31 one thread (AVX-512 kernels) on an AMD EPYC, SmolLM2-135M's weights from memory: 2x
# faster at 9-16 rows, 1.05-1.3x at 64-128 (a whole prefill chunk of 128 rows ~8% faster);
# alone even at 256 but ~10% slower within a prefill of 256 rows, 0.85-0.97x at 1024
# (float16: against the weight widened for the call, alike).
PANEL_ROWS = 128
# Weight elements (256 KB of float32) from which a STORED weight is "large enough for the
# layout to matter" and leaves BLAS's one call. No measurement of this value is recorded:
# commit 17e1edb lowered it from 1 << 20 when the row-major routes came in.
STORED_SIZE = 1 << 16
# Rows up to which a float32 STORED product runs in blocks of weight rows without the helper
# (FEW_ROWS, under OpenBLAS 0.3.31's small-matrix bound): 1.1-1.5x faster than one BLAS call
# from memory at 2..8 rows, ~1.4x at batch 8 (commit 17e1edb); more rows: one BLAS call.
FEW_ROWS = 16
# Keys from which a decode step's scores run through the helper's product, one call per
# sequence and KV head: its per-call cost is not repaid below (measured: slower at 300 keys,
# ~12% faster at 1024).
NATIVE_KEYS = 1024
# Rows up to which a product against a weight kept in blocks (Weight.BLOCKS) runs as the
# helper's block product (codes widened in registers once for up to 4 rows), and up to which
# as its block panels (tiles of weight rows dequantized, then the panel product); more rows,
# or no helper: blocks of weight rows dequantized for the call, one BLAS product each. Not
# measured for the block routes: NATIVE_ROWS's float32 bound and PANEL_ROWS taken over.
BLOCK_ROWS = 8
BLOCK_PANEL_ROWS = PANEL_ROWS
# Threads the helper's products split their weight rows across (never K: the same bits for
# any count), and its attention its (sequence, KV head) pairs: set_threads, else
# build_defaults.default_threads() ($TRT_KV_THREADS or the cores this process may run on)
_threads = [default_threads()]


def threads() -> int:
    """Threads the helper's products and attention run on."""
    return _threads[0]


def set_threads(count: int) -> None:
    """Run the helper's products and attention on ``count`` threads from now on.

    Raises:
        ArgumentError: ``count`` not a positive integer.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ArgumentError(mismatch("threads", "a positive integer", "", count))
    _threads[0] = count


class Weight(str, Enum):
    """What ``W`` is in ``x @ W^T``, which decides the routes open to the product."""

    STORED = "stored"  # a MatrixMultiply layer's float32/float64 W [N, K], read transposed
    NARROW = "narrow"  # a float16 W [N, K] a fast float32 plan keeps as stored
    STACKED = "stacked"  # the W of the products of one input, one above the other
    KEYS = "keys"  # a sequence's cached keys [Skv, H] for one KV head: attention scores
    OTHER = "other"  # any other second operand (not read transposed from row-major memory)
    BLOCKS = "blocks"  # a blocks.BlockWeight: INT4/INT8 codes, block scales and offsets


class Route(str, Enum):
    """How ``x [M, K] @ W^T`` runs (:func:`multiply`)."""

    NATIVE = "native"  # native.product: each weight element read once, as stored (a decode step)
    PANELS = "panels"  # native.panel_product: a matrix product in panels (a prefill chunk)
    ROW_DOTS = "row_dots"  # one row, one dot product per row of W: row_dots
    FEW_ROWS = "few_rows"  # 2..16 rows, one BLAS call per block of W's rows fetched into L2
    WIDENED = "widened"  # a float16 W widened for the call (in blocks), one BLAS call a block
    BLAS = "blas"  # one NumPy product (for KEYS: the reference attention's own products)
    BLOCK_NATIVE = "block_native"  # native.block_product: a decode step against BLOCKS
    BLOCK_PANELS = "block_panels"  # native.block_product(panels=True): a prefill chunk
    BLOCK_NUMPY = "block_numpy"  # blocks.numpy_product: weight rows dequantized per call


# The members as module names for the functions below, which run for every product: reading
# one through its Enum class costs ~0.1-0.3 us (Python 3.11), as much as the rest of choose
_STORED, _NARROW, _STACKED, _KEYS, _OTHER, _BLOCKS = Weight
_NATIVE, _PANELS, _ROW_DOTS, _FEW_ROWS, _WIDENED, _BLAS, *_BLOCK_ROUTES = Route
_BLOCK_NATIVE, _BLOCK_PANELS, _BLOCK_NUMPY = _BLOCK_ROUTES


def native_rows(dtype: np.dtype, built: bool | None = None) -> int:
    """Rows up to which a product against a weight of ``dtype`` runs through the helper's
    product (:data:`NATIVE_ROWS`; 0: never, where it is not built or for another dtype).
    ``built``: whether the helper is (default :data:`~trt_kv.interpreter.half.NATIVE`)."""
    built = half.NATIVE if built is None else built
    return NATIVE_ROWS.get(np.dtype(dtype), 0) if built else 0


def panel_rows(dtype: np.dtype, built: bool | None = None) -> int:
    """Rows up to which a product against a weight of ``dtype`` runs through the helper's
    panels (:data:`PANEL_ROWS` where its product takes the dtype, float16 and float32; 0:
    never)."""
    return PANEL_ROWS if native_rows(dtype, built) else 0


def choose(
    weight: Weight,
    rows: int,
    n: int,
    k: int,
    dtype: np.dtype,
    rows_dtype: np.dtype,
    built: bool | None = None,
) -> Route | None:
    """The route of ``x [rows, k] @ W^T`` for ``W [n, k]`` of ``dtype`` and kind ``weight``,
    ``x`` of ``rows_dtype`` (both ``np.dtype``), with the compiled helper built or not
    (``built``, default :data:`~trt_kv.interpreter.half.NATIVE`). The helper takes rows in the
    weight's dtype, float32 rows for a float16 weight; rows of another dtype take BLAS.

    - NARROW: NATIVE up to :data:`NATIVE_ROWS`, PANELS up to :data:`PANEL_ROWS`, else WIDENED.
    - STORED of :data:`STORED_SIZE` elements or more: NATIVE, PANELS as NARROW; without them
      (no helper, or float64) ROW_DOTS for one row, FEW_ROWS for 2..:data:`FEW_ROWS` float32
      rows; else BLAS. A smaller STORED weight, and OTHER, take BLAS.
    - STACKED: NATIVE up to :data:`NATIVE_ROWS`, or ROW_DOTS for one row where the helper
      does not take the dtype; None for more rows (each product then chooses its own).
    - KEYS: NATIVE up to :data:`NATIVE_ROWS` against :data:`NATIVE_KEYS` keys or more, else
      BLAS.
    - BLOCKS (float32 rows): BLOCK_NATIVE up to :data:`BLOCK_ROWS`, BLOCK_PANELS up to
      :data:`BLOCK_PANEL_ROWS`, else (or without the helper) BLOCK_NUMPY.
    """
    if weight is _BLOCKS:
        if not (half.NATIVE if built is None else built) or rows > BLOCK_PANEL_ROWS:
            return _BLOCK_NUMPY
        return _BLOCK_NATIVE if rows <= BLOCK_ROWS else _BLOCK_PANELS
    if weight is _OTHER or (weight is _STORED and n * k < STORED_SIZE):
        return _BLAS
    if rows_dtype != (_F32 if dtype == _F16 else dtype):  # rows the helper does not take
        return None if weight is _STACKED else _WIDENED if weight is _NARROW else _BLAS
    few = NATIVE_ROWS.get(dtype, 0) if (half.NATIVE if built is None else built) else 0
    if weight is _STACKED:
        return (_NATIVE if few else _ROW_DOTS) if rows <= (few or 1) else None
    if weight is _KEYS:
        return _NATIVE if rows <= few and n >= NATIVE_KEYS else _BLAS
    if rows <= few:
        return _NATIVE
    if few and rows <= PANEL_ROWS:  # the panels take the dtypes the product takes
        return _PANELS
    if weight is _NARROW:
        return _WIDENED
    if rows == 1:
        return _ROW_DOTS
    return _FEW_ROWS if rows <= FEW_ROWS and dtype == _F32 else _BLAS


def multiply(route: Route, x: Array, w: Array | blocks.BlockWeight, rounded: bool = False) -> Array:
    """``x [M, K] @ w^T`` -> ``[M, N]`` for ``w [N, K]`` by ``route`` (ROW_DOTS: one row; the
    BLOCK routes: ``w`` a :class:`~trt_kv.interpreter.blocks.BlockWeight`, ``x`` float32,
    and ``rounded``: the result rounded to float16 values, in the helper's call)."""
    if route in _BLOCK_ROUTES:
        blocks.COUNTS[route.value] += 1
        if route is _BLOCK_NUMPY:
            y = blocks.numpy_product(x, w)
            return half.round_any(y) if rounded else y
        expect_dtype("x", x, _F32)
        call = w.native_calls[route is _BLOCK_PANELS]  # the weight's arguments bound once
        return call(contiguous_aligned(x), _threads[0], int(rounded))
    if route is _NATIVE:
        return native.product(x, w, threads=_threads[0])
    if route is _PANELS:
        return native.panel_product(x, w, threads=_threads[0])
    if route is _ROW_DOTS:
        return row_dots(w, x[0])[None]
    if route is _FEW_ROWS:
        return _few_rows(x, w)
    if route is _WIDENED:
        return _widened(x, w)
    return x @ w.T


def block_product(x: Array, w: blocks.BlockWeight, rounded: bool = False) -> Array:
    """``x [..., K] @ w^T`` -> float32 ``[..., N]`` for a weight kept in blocks, float32 (or
    float16) rows, by the BLOCKS routes (:func:`choose`); ``rounded``: rounded to float16
    values (a float16 network's product: :func:`~trt_kv.interpreter.half.round_any`'s bits)."""
    rows = np.asarray(x, dtype=_F32).reshape(-1, x.shape[-1])
    route = choose(_BLOCKS, rows.shape[0], *w.shape, _F32, _F32)
    return multiply(route, rows, w, rounded).reshape(*x.shape[:-1], w.shape[0])


def block_caller(w: blocks.BlockWeight, rounded: bool = False) -> Callable[[Array], Array]:
    """:func:`block_product` of one weight as ``call(x)``, for a plan's step that multiplies
    by ``w`` on every run: float32 rows, C-contiguous and aligned, for which :func:`choose`
    gives BLOCK_NATIVE (a decode step's) go straight to that route's bound call
    (:attr:`~trt_kv.interpreter.blocks.BlockWeight.native_calls`), without
    :func:`block_product`'s conversions and reshapes or :func:`multiply`'s dispatch (~1.5 us
    a call when warm, ~0.5 ms a decode step of the default model inside a step); anything
    else through :func:`block_product`. The same route, count and bits either way."""
    (n, k), flag = w.shape, int(rounded)
    counts, name = blocks.COUNTS, _BLOCK_NATIVE.value

    def call(x: Array) -> Array:
        if (
            x.dtype == _F32
            and x.shape[-1:] == (k,)
            and x.flags.c_contiguous
            and x.flags.aligned
            and choose(_BLOCKS, x.size // k, n, k, _F32, _F32) is _BLOCK_NATIVE
        ):
            counts[name] += 1
            y = w.native_calls[0](x.reshape(-1, k), _threads[0], flag)
            return y.reshape(*x.shape[:-1], n)
        return block_product(x, w, rounded)

    return call


def block_binder(
    w: blocks.BlockWeight, rounded: bool = False, bounds: list[tuple[int, int]] | None = None
) -> Binder:
    """:func:`block_caller`'s step bound to its input (a
    :data:`~trt_kv.interpreter.registry.Binder`): where that call takes BLOCK_NATIVE, the
    helper's call with its addresses and dims taken once, into an output it holds (``bounds``:
    each member's columns of it, as views). The same call, count and bits."""
    (n, k), flag = w.shape, int(rounded)
    counts, name = blocks.COUNTS, _BLOCK_NATIVE.value

    def bind(args: list) -> Bound | None:
        x = args[0]
        if not (
            type(x) is np.ndarray
            and x.dtype == _F32
            and x.shape[-1:] == (k,)
            and x.flags.c_contiguous
            and x.flags.aligned
            and choose(_BLOCKS, x.size // k, n, k, _F32, _F32) is _BLOCK_NATIVE
        ):
            return None
        fn, weight = w.native_calls[0].raw
        out = np.empty((*x.shape[:-1], n), _F32)
        operands = weight, address(x), x.size // k, address(out)

        def call() -> bool:
            counts[name] += 1
            if fn(*operands, _threads[0], flag):
                raise MemoryError(f"block product of x {x.shape}: no memory for its scratch")
            return True

        return (out if bounds is None else tuple(out[..., a:b] for a, b in bounds)), call

    return bind


def stored_product(a: Array, b: Array) -> Array:
    """``a [M, K] @ b [K, N]`` for a fast plan: a STORED weight where ``b`` is the transposed
    view of a row-major ``W [N, K]`` (``nn.Linear`` layout), else OTHER (:func:`choose`)."""
    kind = _STORED if b.flags.f_contiguous and not b.flags.c_contiguous else _OTHER
    route = choose(kind, a.shape[0], b.shape[1], b.shape[0], b.dtype, a.dtype)
    return a @ b if route is _BLAS else multiply(route, a, b.T)  # b.T: W [N, K] as stored


def narrow_weight_product(a: Array, w: Array) -> Array:
    """``a [..., M, K] @ w^T`` for a float16 weight ``w [1.., N, K]`` that a fast plan keeps
    narrow (:func:`~trt_kv.interpreter.layout.keep_float16_weights`), ``a`` float32, by the
    NARROW routes (:func:`choose`): a decode step through the helper's product, which reads
    each weight element once as its 2 bytes (half the memory traffic of a float32 copy, the
    bound of a decode step); a prefill chunk through its panels, which widen 6 weight rows at
    a time; more rows against ``w`` widened for the call. Results agree with the product
    against ``w`` widened once within float32 rounding (summation order)."""
    k, n = w.shape[-1], w.shape[-2]
    matrix = w.reshape(n, k)
    rows = a.reshape(-1, k)
    route = choose(_NARROW, rows.shape[0], n, k, matrix.dtype, rows.dtype)
    out = multiply(route, rows, matrix)
    lead = np.broadcast_shapes(a.shape[:-2], w.shape[:-2])
    return out.reshape(*lead, a.shape[-2], n)


# -- routes without the helper -----------------------------------------------------------------
def row_dots(w: Array, x: Array) -> Array:
    """``w [N, K] @ x [K]`` -> ``[N]`` as one dot product per row of ``w`` (NumPy's einsum
    loop): it streams a row-major ``w`` ~2x faster than BLAS's matrix-vector product on that
    layout (~15-25 GB/s here, as fast as BLAS on ``w^T``), and each row's sum is the same
    whichever rows are computed together."""
    return np.einsum("nk,k->n", w, x)


# Blocks of FEW_ROWS, sized for OpenBLAS 0.3.31 (AVX-512)
_BLOCK = 1_000_000  # M * rows * K of one block: OpenBLAS's small-matrix bound (100^3)
_L2_FLOATS = 1 << 17  # weights of one block: 512 KB of float32, half of one core's L2
_FETCH = np.bitwise_or.reduce  # one streaming pass over a block's bits (result unused)
_FETCH_ROWS = 8  # up to which a block is fetched first (at 12-16 rows it does not pay)


def _few_rows(a: Array, w: Array) -> Array:
    """``a [M, K] @ w^T`` for a C-contiguous float32 weight ``w [N, K]`` and 2..16 rows: one
    BLAS call per block of ``w``'s rows, ``w[lo:hi] @ a^T`` into a ``[N, M]`` buffer, sized so
    that ``M * rows * K <= 100^3`` and the block fits in L2. Below 100^3 OpenBLAS (0.3.31,
    AVX-512) multiplies the operands where they lie instead of packing them first; from
    memory its kernel streams the weight at only 7-9 GB/s (one thread, 8 rows), from L2 at
    ~25 GB/s. So each block is first read once in order (an OR over its bits, ~23 GB/s,
    which leaves it in L2), then multiplied: 1.1-1.5x faster from memory at 2..8 rows (not
    at 12-16, where the blocks are small and the product itself dominates). The products are
    the same BLAS calls either way; results agree with one call within float32 rounding (BLAS
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


_WIDE_BLOCK = 1 << 22  # elements of a float16 weight widened at once (16 MB widened)


def _widened(x: Array, w: Array) -> Array:
    """``x [M, K] @ w^T`` for a float16 weight ``w [N, K]``: one BLAS product against ``w``
    widened for the call (exact), in blocks of weight rows for a matrix over 16 MB widened."""
    m, (n, k) = x.shape[0], w.shape
    step = max(1, _WIDE_BLOCK // max(k, 1))
    out = np.empty((m, n), np.float32)
    for lo in range(0, n, step):
        np.matmul(x, half.widen(w[lo : lo + step]).T, out=out[:, lo : lo + step])
    return out
