"""Transformer layers: rotary embedding and KV-cache update (native layer and trt_kv's
plugin); attention is :mod:`trt_kv.interpreter.attention`. The arithmetic is
:mod:`trt_kv.reference.ops`; this module only maps TensorRT's layer inputs and attributes onto
it. Names only some TensorRT versions have (the layers, ``AttentionIOForm``) are read only
where :data:`trt_kv._trt.FEATURES` says the installed module has them, at the time a layer is
compiled."""

from __future__ import annotations

import numpy as np

from trt_kv import _trt
from trt_kv._trt import trt
from trt_kv.errors import ArgumentError, ShapeError, mismatch
from trt_kv.interpreter import half, native_rope
from trt_kv.interpreter.buffers import bounds
from trt_kv.interpreter.memo import Memo, frozen
from trt_kv.interpreter.registry import (
    Array,
    Context,
    Inputs,
    Kernel,
    arg,
    handles_optional,
    input_or_none,
)
from trt_kv.reference import ops


def packed_form(form: object) -> bool:
    """Whether an IAttention / IKVCacheUpdateLayer form is ``AttentionIOForm.PACKED_NHD`` (read
    only where the module has forms: callers check FEATURES first)."""
    return form == trt.AttentionIOForm.PACKED_NHD


@handles_optional("rotary_embedding", "ROTARY_EMBEDDING", "IRotaryEmbeddingLayer")
def rotary_embedding(layer: object, ctx: Context) -> object:
    """RoPE of ``x [B, N, S, H]`` on its leading ``R`` dims (``rotary_embedding_dim``, 0 = H);
    the rest passes through. With ``position_ids [B, S]`` (input 3), cos/sin are
    ``[P, R/2]`` tables; without, they are ``[B, S, R/2]``, one row per token.
    ``interleaved`` rotates pairs (x[2i], x[2i+1]); otherwise halves (x[i], x[i + R/2])."""
    interleaved = bool(layer.interleaved)
    dim = int(layer.rotary_embedding_dim) or None
    fast = ctx.fast

    def run(x: Inputs, rounded: bool = False) -> Array:
        data, cos, sin = x[0], x[1], x[2]
        positions = arg(x, 3)
        if positions is None:  # per-token rows: index them by a running position id
            b, _, s, _ = data.shape
            cos, sin = cos.reshape(b * s, -1), sin.reshape(b * s, -1)
            positions = np.arange(b * s).reshape(b, s)
        rows = native_rows(data, cos, sin, positions, dim) if fast else None
        if rows is not None:  # the same bits
            return native_rope.rope_at(data, cos, sin, *rows, interleaved, rounded)
        out = ops.apply_rope(data, cos, sin, positions, dim, interleaved)
        return half.round_any(out) if rounded else out

    return Kernel(run, halves=lambda x: run(x, rounded=True))


_ROWS = Memo()  # a step's table rows: the same for each of its RoPE layers (Q and K, each layer)


def native_rows(
    data: Array, cos: Array, sin: Array, positions: Array, dim: int | None
) -> tuple[Array, int] | None:
    """``(rows, R)`` where :func:`~trt_kv.interpreter.native_rope.rope_at` computes this RoPE
    (float32 rows ``[B, N, S, H]`` and tables, positions within the tables: ~5x faster than
    NumPy's passes, the same bits), derived once a step for its RoPE layers (read-only); None
    where it does not: the reference's RoPE then computes it, or raises its own error (an
    out-of-range position, say)."""
    if not (half.NATIVE and data.ndim == 4 and data.dtype == cos.dtype == sin.dtype == np.float32):
        return None
    shapes = (data.shape, cos.shape, sin.shape, dim)
    return _ROWS.get((positions,), shapes, lambda: _table_rows(shapes, cos, sin, positions))


def _table_rows(
    shapes: tuple, cos: Array, sin: Array, positions: Array
) -> tuple[Array, int] | None:
    """:func:`~trt_kv.interpreter.native_rope.rope_rows` for rows of ``shapes[0]`` (their rows
    read-only), or None where it refuses them."""
    try:
        rows, r = native_rope.rope_rows(shapes[0], cos, sin, positions, shapes[3])
    except ShapeError:
        return None
    return frozen(rows), r


def _cache_update(packed: bool, fast: bool) -> Kernel:
    """Write ``update`` into the caller's cache in place (reference checks first, so an
    overflowing write raises CacheOverflowError with nothing written); output 0 is input 0.

    The update is declared in the cache's dtype (see :func:`_check_dtypes`), so its values
    are values of that dtype, whatever array dtype holds them: written as they are into a
    float16 cache, or into one held as float32 (a plan compiled with
    ``wide_float16_caches``), whose elements stay float16 values.

    Fast path (``fast``, padded form): the same checks as a few whole-array tests, and a
    decode step's one row per sequence written with one indexed assignment; anything the
    tests do not pass goes to the reference, which raises its precise error."""

    def run(x: Inputs) -> Array:
        cache, update, write_indices = x[0], x[1], x[2]
        lengths = x[3] if packed else None
        if not cache.flags.writeable:
            raise ArgumentError(
                mismatch("cache", "a writeable array (updated in place)", "", "read-only")
            )
        update = update.astype(cache.dtype, copy=False)
        if fast and lengths is None and writes_within(cache, update, write_indices):
            return write_rows(cache, update, write_indices)
        return ops.kv_cache_update_(cache, update, write_indices, lengths)

    return Kernel(run, raw_inputs=frozenset({0}), aliases={0: 0})


def _check_dtypes(layer: object, ctx: Context) -> None:
    """A cache update's ``update`` (input 1) must be declared in the cache's dtype (input 0),
    as TensorRT requires; else unsupported."""
    cache, update = layer.get_input(0).dtype, layer.get_input(1).dtype
    if cache != update:
        raise ctx.unsupported(f"update dtype {update} differs from the cache dtype {cache}")


def writes_within(cache: Array, update: Array, write_indices: Array) -> bool:
    """True when a padded update ``[B, N, S, H]`` fits ``cache [B, N, S_max, H]`` at
    ``write_indices [B]`` (int32/int64): every check of the reference, on whole arrays."""
    b, n, s_max, h = cache.shape
    return (
        update.ndim == 4
        and update.shape[:2] == (b, n)
        and update.shape[3] == h
        and isinstance(write_indices, np.ndarray)
        and write_indices.dtype in _INDEX_DTYPES
        and write_indices.shape == (b,)
        and (b == 0 or _fits(write_indices, s_max - update.shape[2]))
    )


def _fits(starts: Array, last: int) -> bool:
    """Every start in ``[0, last]`` (one sequence: its element read, no reductions)."""
    low, high = bounds(starts)
    return low >= 0 and high <= last


_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def write_rows(cache: Array, update: Array, write_indices: Array) -> Array:
    """``cache[i, :, w_i : w_i + S] = update[i]`` for checked operands (``update`` in the
    cache array's dtype); returns ``cache``."""
    s = update.shape[2]
    if s == 1 and len(write_indices) == 1:  # one row: a view, no index arrays
        cache[0, :, int(write_indices[0])] = update[0, :, 0]
    elif s == 1:
        cache[np.arange(len(write_indices)), :, write_indices] = update[:, :, 0]
    else:
        for i, start in enumerate(write_indices.tolist()):
            cache[i, :, start : start + s] = update[i]
    return cache


@handles_optional("kv_cache_update_layer", "KV_CACHE_UPDATE", "IKVCacheUpdateLayer")
def kv_cache_update(layer: object, ctx: Context) -> Kernel:
    """LINEAR update of ``cache [B, N, S_max, H]`` from a padded ``[B, N, S, H]`` update, or a
    packed ``[T, N, H]`` one with ``update_lengths [B + 1]`` (input 3)."""
    if layer.cache_mode != trt.KVCacheMode.LINEAR:
        raise ctx.unsupported(f"cache mode {layer.cache_mode}")
    packed = _trt.FEATURES.packed_update_form and packed_form(layer.update_form)
    if packed and input_or_none(layer, 3) is None:
        raise ctx.unsupported("PACKED_NHD update form without update_lengths")
    _check_dtypes(layer, ctx)
    return _cache_update(packed, ctx.fast)


@handles_optional("python_plugins", "PLUGIN_V3", "IPluginV3Layer")
def plugin_v3(layer: object, ctx: Context) -> Kernel:
    """trt_kv's cache-update plugin (inputs cache, update, write_indices[, update_lengths]),
    executed like the native layer. Any other plugin is unsupported."""
    from trt_kv.plugin import is_plugin_cache_update  # lazy: the plugin package pulls in CUDA

    if not is_plugin_cache_update(layer):
        raise ctx.unsupported("a plugin other than trt_kv's KV-cache update")
    _check_dtypes(layer, ctx)
    return _cache_update(layer.num_inputs > 3 and layer.get_input(3) is not None, ctx.fast)
