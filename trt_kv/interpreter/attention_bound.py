"""An attention block's decode path bound to its arrays, for a decode step bound once
(:mod:`~trt_kv.interpreter.bound`).

For one token a sequence, :mod:`~trt_kv.interpreter.attention_step`'s block step derives,
in each of a step's layers alike, the table rows RoPE reads, the write rows' test, the keys
attention reads and its keep mask (memos: their inputs' bytes compared each layer), then
calls the helper twice through wrappers that check and convert their arguments. Bound to
arrays held between runs (:func:`binder`), a block derives those once a run for every block
of the plan (``shared``, keyed by the bytes of the arrays they come from) and makes the same
two calls (:func:`~trt_kv.interpreter.native_rope.decode_heads`', then the helper's
attention) with their other arguments taken once: the calls the block's ``run`` makes, the
same bits. Where a derivation fails (a write past the cache, a position outside the tables,
a mask the helper's attention does not take), the block's ``run`` runs instead.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass

import numpy as np

from trt_kv.interpreter import bound, native, products
from trt_kv.interpreter.attention import native_attention_pays, seen
from trt_kv.interpreter.buffers import address
from trt_kv.interpreter.native_rope import Heads, apart
from trt_kv.interpreter.registry import Binder, Bound
from trt_kv.interpreter.transformer import native_rows, writes_within

_F32, _I64 = np.dtype(np.float32), np.dtype(np.int64)


@dataclass(frozen=True)
class Form:
    """A block's heads ``(Nq, Nkv, H)``, RoPE's rotary dim (None: H), attention's causal kind
    and whether its output is rounded to float16 values in the call."""

    widths: tuple[int, int, int]
    rotary_dim: int | None
    causal: str
    rounded: bool


@dataclass(frozen=True)
class Slots:
    """Where the block step's inputs are, by position: the Q, K, V columns ``[B, 1, N*H]``,
    RoPE's tables and positions, the caches and write indices, attention's mask and lengths
    (None: none)."""

    q: int
    k: int
    v: int
    cos: int
    sin: int
    positions: int
    keys: int
    values: int
    where: int
    mask: int | None
    lengths: int | None


def rows_apart(*columns: np.ndarray) -> bool:
    """Whether Q's, K's and V's ``[B, 1, N*H]`` are rows as
    :func:`~trt_kv.interpreter.native_rope.decode_heads` reads them: each row contiguous and
    aligned, its start a whole number of elements from the one before (columns of one
    product's rows, say)."""
    return all(a.strides[2] == 4 and a.strides[0] % 4 == 0 and a.flags.aligned for a in columns)


def writable(keys: np.ndarray, values: np.ndarray) -> bool:
    """Float32 caches of one shape (a float32 plan's, or float16 ones held wide), C-contiguous,
    aligned and writeable."""
    return (
        keys.dtype == values.dtype == _F32
        and keys.shape == values.shape
        and all(
            a.flags.writeable and a.flags.c_contiguous and a.flags.aligned for a in (keys, values)
        )
    )


def binder(form: Form, at: Slots, heads: Heads, shared: dict, counts: Counter[str]) -> Binder:
    """The block's decode path as a :data:`~trt_kv.interpreter.registry.Binder` (see the
    module; each run counted as ``counts["decode"]``, as the block's ``run`` counts it): None
    for arrays it does not take as they are (the block's ``run`` then runs)."""
    nq, nkv, h = form.widths

    def bind(x: list) -> Bound | None:
        qc, kc, vc, c, s = x[at.q], x[at.k], x[at.v], x[at.cos], x[at.sin]
        if not bound.usual([c, s]) or kc.ndim != 3:
            return None
        b, keys, values = kc.shape[0], x[at.keys], x[at.values]
        if qc.shape != (b, 1, nq * h) or not kc.shape == vc.shape == (b, 1, nkv * h):
            return None
        if not (qc.dtype == kc.dtype == vc.dtype == _F32 and rows_apart(qc, kc, vc)):
            return None
        if not writable(keys, values):
            return None
        q4, update = qc.reshape(b, nq, 1, h), vc.reshape(b, nkv, 1, h)
        q, out = np.empty(q4.shape, _F32), np.empty(qc.shape, _F32)
        sources = [x[i] for i in (at.positions, at.where, at.mask, at.lengths) if i is not None]
        # blocks alike (the same sources, tables, caches' shape and form): one derivation a run
        key = (*map(id, sources), id(c), id(s), keys.shape, form)
        strides = (ctypes.c_size_t * 3)(*[n // 4 for n in keys.strides[:3]])
        fn, spec = heads.raw  # type: ignore[attr-defined]
        first = spec, address(qc), address(kc), address(vc), apart(qc, kc, vc), b
        first += address(c), address(s)
        then = address(q), address(keys), address(values), keys.shape[2]
        attention = native.LIB.trt_kv_attention_float32
        operands = address(q), b, nq, 1, h, address(keys), address(values), nkv
        result = address(out)

        def derive() -> tuple | None:
            """The run's table rows, write rows, keys read and keep mask, with addresses."""
            rows, where = native_rows(q4, c, s, x[at.positions], form.rotary_dim), x[at.where]
            if rows is None or not writes_within(keys, update, where):
                return None
            mask = None if at.mask is None else x[at.mask]
            lengths = None if at.lengths is None else x[at.lengths]
            n, keep = seen(mask, lengths, keys.shape[2], b, 1, form.causal)
            if keep is None or not native_attention_pays(q4, keys, values, mask, _F32, n):
                return None
            heads_k = nq if keep.ndim == 4 and keep.shape[1] == nq > 1 else 1
            if keep.shape != (b, heads_k, 1, n):
                return None
            where = np.ascontiguousarray(where, _I64)
            keep = keep if keep.flags.c_contiguous else np.ascontiguousarray(keep)
            held = rows[0], where, keep
            return held, address(rows[0]), address(where), n, address(keep), heads_k

        def call(_held: tuple = (x, q, out, strides)) -> bool:  # every array it has addresses of
            token = tuple(a.tobytes() for a in sources)
            done = shared.get(key)
            if done is None or done[0] != token:
                done = shared[key] = token, derive()
            d = done[1]
            if d is None:
                return False
            counts["decode"] += 1
            fn(*first, d[1], *then, d[2])
            if attention(*operands, d[3], strides, d[4], d[5], 1.0, result, form.rounded,
                         products.threads()):  # fmt: skip
                raise MemoryError(f"attention of q {q.shape}: no memory for its scratch")
            return True

        return (out, keys, values), call

    return bind
