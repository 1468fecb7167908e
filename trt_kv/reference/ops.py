"""NumPy reference implementations of every op trt_kv networks use.

Plain, slow, obviously-correct code: the yardstick for engines, for the interpreter and (via
the Hugging Face oracle tests) for itself. Compute happens in the input dtype unless a
function says otherwise; callers pass float32/float64 for reference numerics.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trt_kv.contract import FLOAT_DTYPES
from trt_kv.errors import CacheOverflowError, DTypeError, ShapeError, mismatch

CACHE_DTYPES = FLOAT_DTYPES  # what the cache-update layer takes
INDEX_DTYPES = ("int32", "int64")


def _dtype_name(a: np.ndarray) -> str:
    return "bfloat16" if a.dtype.name in ("bfloat16", "V2") else a.dtype.name


def _index_array(name: str, value: object) -> np.ndarray:
    """An int32/int64 array from an array or a list of Python ints (lists become int64)."""
    arr = np.asarray(value)
    if arr.dtype.name not in INDEX_DTYPES:
        raise DTypeError(mismatch(name, "dtype", INDEX_DTYPES, arr.dtype))
    return arr


def _check_update_args(
    cache: np.ndarray,
    update: np.ndarray,
    write_indices: np.ndarray,
    update_lengths: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Validate the KV-cache update operands; return ``(write_indices, update_lengths,
    counts)`` with index lists as arrays and the per-sequence new-token counts ``[B]``."""
    for name, arr in (("cache", cache), ("update", update)):
        if not isinstance(arr, np.ndarray):
            raise DTypeError(mismatch(name, "a NumPy array", "", type(arr).__name__))
    if _dtype_name(cache) not in CACHE_DTYPES:
        raise DTypeError(mismatch("cache", "dtype", CACHE_DTYPES, _dtype_name(cache)))
    if cache.ndim != 4:
        raise ShapeError(mismatch("cache", "rank", 4, cache.ndim))
    if _dtype_name(update) != _dtype_name(cache):
        raise DTypeError(mismatch("update", "dtype", _dtype_name(cache), _dtype_name(update)))
    write_indices = _index_array("write_indices", write_indices)
    b, n, _, h = cache.shape
    if write_indices.shape != (b,):
        raise ShapeError(mismatch("write_indices", "shape", (b,), write_indices.shape))
    if update_lengths is None:
        if update.ndim != 4 or update.shape[:2] != (b, n) or update.shape[3] != h:
            raise ShapeError(mismatch("update", "shape", (b, n, "S", h), update.shape))
        return write_indices, None, np.full(b, update.shape[2], dtype=np.int64)
    update_lengths = _index_array("update_lengths", update_lengths)
    if update.ndim != 3 or update.shape[1:] != (n, h):
        raise ShapeError(mismatch("update", "shape", ("T", n, h), update.shape))
    if update_lengths.shape != (b + 1,):
        raise ShapeError(mismatch("update_lengths", "shape", (b + 1,), update_lengths.shape))
    if update_lengths[0] != 0 or update_lengths[-1] != update.shape[0]:
        raise ShapeError(
            mismatch(
                "update_lengths",
                "first and last",
                (0, update.shape[0]),
                (int(update_lengths[0]), int(update_lengths[-1])),
            )
        )
    counts = np.diff(update_lengths.astype(np.int64))
    if (counts < 0).any():
        raise ShapeError(mismatch("update_lengths", "non-decreasing values", "", update_lengths))
    return write_indices, update_lengths, counts


def kv_cache_update_(
    cache: np.ndarray,
    update: np.ndarray,
    write_indices: np.ndarray,
    update_lengths: np.ndarray | None = None,
) -> np.ndarray:
    """In-place LINEAR KV-cache update; returns ``cache``. See :func:`kv_cache_update`."""
    write_indices, update_lengths, counts = _check_update_args(
        cache, update, write_indices, update_lengths
    )
    s_max = cache.shape[2]
    starts = write_indices.astype(np.int64)
    # Check every sequence before writing any: nothing half-written.
    for i, (start, count) in enumerate(zip(starts, counts)):
        if start < 0:
            raise CacheOverflowError(mismatch(f"write_indices[{i}]", "an index >= 0", "", start))
        if start + count > s_max:
            raise CacheOverflowError(
                f"write_indices[{i}]: expected write_indices + S <= S_max = {s_max}, "
                f"got {int(start)} + {int(count)} = {int(start + count)}"
            )
    for i, (start, count) in enumerate(zip(starts, counts)):
        if update_lengths is None:
            cache[i, :, start : start + count, :] = update[i]
        else:
            lo = int(update_lengths[i])
            cache[i, :, start : start + count, :] = update[lo : lo + count].transpose(1, 0, 2)
    return cache


def kv_cache_update(
    cache: np.ndarray,
    update: np.ndarray,
    write_indices: np.ndarray,
    update_lengths: np.ndarray | None = None,
) -> np.ndarray:
    """LINEAR KV-cache update: ``out[i, :, write_indices[i] + s, :] = update[i, :, s, :]``.

    Args:
        cache: ``[B, N, S_max, H]`` float32/float16/bfloat16; not modified.
        update: padded ``[B, N, S, H]``, or packed ``[T, N, H]`` when ``update_lengths`` is given;
            same dtype as ``cache``. ``cache`` and ``update`` must be NumPy arrays.
        write_indices: ``[B]`` int32/int64 (or a list of ints), first position written per
            sequence.
        update_lengths: ``[B + 1]`` int32/int64 (or a list of ints) cumulative token counts of
            the packed form (``update_lengths[0] == 0``, ``update_lengths[-1] == T``).

    Returns:
        The updated copy of ``cache``; only the written windows differ from the input.

    Raises:
        CacheOverflowError: a negative write index, or a write at or past ``S_max``
            (TensorRT's layer skips such writes silently; the reference refuses them, and so
            does the trt_kv runtime).
        ShapeError: malformed operands.
        DTypeError: a cache that is not float32/float16/bfloat16 (the layer's types), an update
            of another dtype, non-integer indices or lengths, a cache or update that is not a
            NumPy array.
    """
    copy = cache.copy() if isinstance(cache, np.ndarray) else cache  # a non-array is refused
    return kv_cache_update_(copy, update, write_indices, update_lengths)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * weight``. x: ``[..., D]``."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``."""
    return x / (1.0 + np.exp(-x))


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x W^T`` for ``x [..., In]`` and ``w [Out, In]`` (``nn.Linear`` layout) -> ``[..., Out]``,
    as one ``[rows, In] @ [In, Out]`` product (NumPy would run one per leading index); up to
    ``_FEW_ROWS`` rows (a decode step) as ``(W rows^T)^T``, which OpenBLAS runs ~18% faster
    against a weight read from memory (the same products; its own summation order)."""
    rows = x.reshape(-1, x.shape[-1])
    out = (w @ rows.T).T if len(rows) <= _FEW_ROWS else rows @ w.T
    return out.reshape(*x.shape[:-1], w.shape[0])


_FEW_ROWS = 16  # rows up to which linear multiplies as (W rows^T)^T


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (``gelu_pytorch_tanh``):
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, in the dtype of ``x``."""
    inner = np.asarray(np.sqrt(2.0 / np.pi), x.dtype) * (x + np.asarray(0.044715, x.dtype) * x**3)
    return np.asarray(0.5, x.dtype) * x * (1.0 + np.tanh(inner))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def gated_mlp(
    x: np.ndarray,
    w_gate: np.ndarray,
    w_up: np.ndarray,
    w_down: np.ndarray,
    activation: str = "silu",
) -> np.ndarray:
    """Gated MLP: ``(act(x W_gate^T) * x W_up^T) W_down^T``, act one of :data:`ACTIVATIONS`
    (SwiGLU for "silu", GeGLU-tanh for "gelu_tanh").

    x: ``[..., D]``; w_gate, w_up: ``[F, D]``; w_down: ``[D, F]`` (Hugging Face layout).
    """
    return linear(ACTIVATIONS[activation](linear(x, w_gate)) * linear(x, w_up), w_down)


def swiglu(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """Llama MLP: ``(silu(x W_gate^T) * x W_up^T) W_down^T`` (see :func:`gated_mlp`)."""
    return gated_mlp(x, w_gate, w_up, w_down, "silu")


def apply_rope(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    position_ids: np.ndarray,
    rotary_dim: int | None = None,
    interleaved: bool = False,
) -> np.ndarray:
    """Rotary position embedding.

    Args:
        x: ``[B, N, S, H]``.
        cos, sin: ``[P, R/2]`` tables indexed by position (R = rotary_dim).
        position_ids: ``[B, S]`` integer positions, each < P.
        rotary_dim: R, the leading part of H that rotates (default H); the rest passes through.
        interleaved: pairs are ``(x[2i], x[2i+1])`` (GPT-J) instead of ``(x[i], x[i + R/2])``
            (GPT-NeoX / Llama ``rotate_half``).

    Returns:
        ``[B, N, S, H]``.
    """
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    c = cos[position_ids][:, None, :, :]  # [B, 1, S, R/2]
    s = sin[position_ids][:, None, :, :]
    # Hugging Face's form on whole rows, x * [c, c] + rotate_half(x) * [-s, s] with
    # rotate_half(x) = [x2, x1]: each pair's x1 c - x2 s and x2 c + x1 s, bit for bit
    # (a + (-b) is a - b in IEEE arithmetic), in contiguous passes (~2x faster than on
    # strided half-rows). Interleaved, the pairs are the even and odd elements.
    dtype = np.result_type(x, c)
    one, two = (np.s_[..., 0::2], np.s_[..., 1::2]) if interleaved else _halves(r)
    rows = x[..., :r]  # [B, N, S, R]
    swapped = np.empty((*x.shape[:-1], r), dtype)  # rotate_half(rows)
    swapped[one], swapped[two] = rows[two], rows[one]
    cos_r = np.empty((*c.shape[:-1], r), c.dtype)  # [B, 1, S, R]
    sin_r = np.empty((*s.shape[:-1], r), s.dtype)
    cos_r[one], cos_r[two] = c, c
    sin_r[one], sin_r[two] = -s, s
    out = np.empty_like(x, dtype=dtype)
    np.multiply(rows, cos_r, out=out[..., :r])
    swapped *= sin_r
    out[..., :r] += swapped
    out[..., r:] = x[..., r:]
    return out


def _halves(r: int) -> tuple[tuple, tuple]:
    """Index expressions of the first and second halves of the leading ``r`` elements."""
    return np.s_[..., : r // 2], np.s_[..., r // 2 : r]


def causal_keep(
    s_q: int, s_kv: int, kind: str, kv_lengths: np.ndarray | None = None, batch: int = 1
) -> np.ndarray:
    """Boolean keep-mask ``[B, 1, S_q, S_kv]`` for a causal kind.

    ``upper_left``: query s sees keys j <= s. ``lower_right``: the diagonal is anchored at the
    bottom-right corner of the *valid* rectangle, query s sees j <= s + L_b - S_q with L_b =
    ``kv_lengths[b]`` (S_kv when absent). ``none``: every key. Keys at j >= L_b are dropped
    in every kind.
    """
    lengths = np.full(batch, s_kv) if kv_lengths is None else np.asarray(kv_lengths)
    q = np.arange(s_q)[None, :, None]
    j = np.arange(s_kv)[None, None, :]
    valid = j < lengths[:, None, None]
    if kind == "none":
        keep = valid
    elif kind == "upper_left":
        keep = valid & (j <= q)
    elif kind == "lower_right":
        keep = valid & (j <= q + lengths[:, None, None] - s_q)
    else:
        raise ValueError(
            mismatch("causal kind", "one of", ("none", "upper_left", "lower_right"), kind)
        )
    return keep[:, None, :, :]


_FEW_QUERY_ROWS = 16  # query rows per KV head up to which scores are computed as (K Q^T)^T
# rows [B, Nkv, R, H], k [B, Nkv, Skv, H] -> unscaled scores [B, Nkv, R, Skv], or None
ScoresProduct = Callable[[np.ndarray, np.ndarray], np.ndarray | None]


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: str = "none",
    kv_lengths: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    scores_product: ScoresProduct | None = None,
) -> np.ndarray:
    """Scaled dot-product attention with GQA, computed in the dtype of ``q``.

    Args:
        q: ``[B, Nq, Sq, H]``; k, v: ``[B, Nkv, Skv, H]`` with Nq a multiple of Nkv (query
            head i reads KV head ``i // (Nq / Nkv)``; the KV heads are broadcast, not copied).
        causal: "none", "upper_left" or "lower_right" (see :func:`causal_keep`).
        kv_lengths: ``[B]`` valid key count per sequence.
        mask: broadcastable to ``[B, Nq, Sq, Skv]``: bool (True keeps) or additive float.
        scale: score scale, default ``1/sqrt(H)`` (a Python float: it never widens the dtype).
        scores_product: computes the unscaled scores ``rows [B, Nkv, R, H] @ k^T`` ->
            ``[B, Nkv, R, Skv]`` (R = G * Sq) another way, or returns None to leave them to
            NumPy (the interpreter's fast plan passes one; the reference never does).

    Returns:
        ``[B, Nq, Sq, H]``. A query row with no visible key gives zeros; one whose visible
        scores hold NaN gives NaN (as a softmax does: it was zeros, hiding the NaN); keys no
        query sees (e.g. unwritten cache rows) never reach the output, whatever they hold.

    Raises:
        ShapeError: Nq is not a multiple of Nkv.
    """
    b, nq, sq, h = q.shape
    nkv, skv = k.shape[1], k.shape[2]
    if nq % nkv:
        raise ShapeError(mismatch("query heads", f"a multiple of {nkv} KV heads", "", nq))
    group = nq // nkv
    # The G query heads of one KV head as G * Sq rows: [B, Nkv, G * Sq, H] @ [B, Nkv, H, Skv];
    # with few rows (decode), as (K Q^T)^T: BLAS is ~4x faster with the keys as the long side.
    rows = q.reshape(b, nkv, group * sq, h)
    scores = None if scores_product is None else scores_product(rows, k)
    if scores is None and group * sq <= _FEW_QUERY_ROWS:
        scores = np.ascontiguousarray((k @ rows.swapaxes(-1, -2)).swapaxes(-1, -2))
    elif scores is None:
        scores = rows @ k.swapaxes(-1, -2)
    scores = scores.reshape(b, nq, sq, skv)
    scores *= h**-0.5 if scale is None else float(scale)  # in place: a fresh product
    keep = causal_keep(sq, skv, causal, kv_lengths, b)  # [B, 1, Sq, Skv]
    if mask is not None:
        if mask.dtype == np.bool_:
            keep = keep & mask
        else:
            scores += mask
    np.copyto(scores, -np.inf, where=~keep)
    # Keys no query may see contribute nothing, even if they hold NaN/Inf (unwritten cache
    # rows past key_value_lengths): their values are zeroed per query head, [B, Nkv, G|1, Skv, H]
    # (one copy per KV head when the keep mask is the same for every head).
    seen = keep.any(axis=-2)  # [B, 1 or Nq, Skv]
    if seen.all():  # every key reaches some query: nothing to zero, V is read as it is
        v = v[:, :, None]
    else:
        heads = (1, 1) if seen.shape[1] == 1 else (nkv, group)
        seen = seen.reshape(seen.shape[0], *heads, skv, 1)
        v = np.where(seen, v[:, :, None], 0).astype(v.dtype, copy=False)
    peak = np.max(scores, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    scores -= peak
    weights = np.exp(scores, out=scores)
    total = np.sum(weights, axis=-1, keepdims=True)
    # In place (a fresh array per call costs page faults on large scores). A row with no
    # visible key keeps its zeros (exp(-inf)), a row with a NaN score stays NaN: each is
    # divided by 1, the same as leaving it (a where= mask makes the division ~3x slower).
    weights = np.divide(weights, np.where(total > 0, total, 1), out=weights)
    if v.shape[2] == 1:  # [B, Nkv, G * Sq, Skv] @ [B, Nkv, Skv, H]
        out = weights.reshape(b, nkv, group * sq, skv) @ v[:, :, 0]
    else:  # per-head masks: [B, Nkv, G, Sq, Skv] @ [B, Nkv, G, Skv, H]
        out = weights.reshape(b, nkv, group, sq, skv) @ v
    return out.reshape(b, nq, sq, h)
