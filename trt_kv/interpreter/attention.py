"""Attention layers (``add_attention`` / ``add_attention_v2``: IAttention's input and output
boundary layers). The arithmetic is :func:`trt_kv.reference.ops.attention`; a fast plan runs
the compiled helper's (:func:`~trt_kv.interpreter.native.attention`) where it pays, each
step's keys and keep mask derived once for all its layers (:mod:`trt_kv.interpreter.memo`).
``CausalMaskKind`` and ``AttentionIOForm`` are read only where
:data:`trt_kv._trt.FEATURES` says the installed module has them."""

from __future__ import annotations

import itertools

import numpy as np

from trt_kv import _trt
from trt_kv._trt import trt
from trt_kv.errors import ShapeError, mismatch
from trt_kv.interpreter import half, native, products, registry
from trt_kv.interpreter.half import widen_to
from trt_kv.interpreter.memo import Memo, frozen
from trt_kv.interpreter.products import Route, Weight
from trt_kv.interpreter.registry import Array, Context, Inputs, Kernel, arg
from trt_kv.interpreter.transformer import packed_form
from trt_kv.reference import ops


def causal_kind(att: object) -> str:
    """The causal kind ("none", "upper_left", "lower_right"): ``IAttention.causal_kind``
    (TensorRT 11, RTX), else the boolean ``causal`` of TensorRT 10.14/10.15 (True is
    UPPER_LEFT, the legacy meaning TensorRT 11 documents for ``causal=true``)."""
    if not _trt.FEATURES.causal_mask_kind:
        return "upper_left" if att.causal else "none"
    kinds = {
        trt.CausalMaskKind.NONE: "none",
        trt.CausalMaskKind.UPPER_LEFT: "upper_left",
        trt.CausalMaskKind.LOWER_RIGHT: "lower_right",
    }
    return kinds[att.causal_kind]


def _unpack(x: Array, cumulative: Array) -> list[Array]:
    """``[T, N, H]`` packed rows -> per-sequence ``[1, N, L_b, H]``."""
    bounds = cumulative.astype(np.int64)
    return [x[lo:hi].transpose(1, 0, 2)[None] for lo, hi in itertools.pairwise(bounds)]


def _keys_seen(skv: int, mask: Array | None, kv_len: Array | None, causal: str) -> int:
    """How many leading keys of ``skv`` attention may read: none at or past every
    key_value_length is seen, nor any past the last column a bool mask keeps anywhere. At
    least 1 (a row that sees nothing gives zeros either way). The mask bound is not used for
    LOWER_RIGHT without lengths, whose diagonal is anchored at ``skv`` itself."""
    n = skv
    if kv_len is not None and len(kv_len):
        n = min(n, int(kv_len.max()))
    elif causal == "lower_right":
        return skv
    if mask is not None and mask.dtype == np.bool_ and mask.shape[-1] == skv > 0:
        cols = mask.reshape(-1, skv).any(axis=0)
        n = min(n, skv - int(np.argmax(cols[::-1])) if cols.any() else 0)
    return min(skv, max(1, n))


@registry.handles_optional("attention", "ATTENTION_INPUT", "IAttentionBoundaryLayer")
def attention_input(layer: object, ctx: Context) -> Kernel:
    """IAttention (``add_attention`` or ``add_attention_v2``; computed here, ATTENTION_OUTPUT
    passes the result on).

    Inputs: 0 query ``[B, Nq, Sq, H]``, 1 key, 2 value ``[B, Nkv, Skv, H]`` (Nq a multiple of
    Nkv: GQA), 3 mask (bool, True keeps; or additive float) broadcastable to
    ``[B, Nq, Sq, Skv]``, 5 query_lengths, 6 key_value_lengths. PACKED_NHD forms ``[T, N, H]``
    are split per sequence with the cumulative lengths. No 1/sqrt(H) scaling: TensorRT expects
    Q (or K) pre-scaled (docs: transformers fused-attention guide), open question (a).
    LOWER_RIGHT with key_value_lengths anchors the diagonal at each sequence's valid length
    L_b, as :func:`trt_kv.reference.ops.causal_keep` does, open question (b).

    Fast path (``ctx.fast``): K/V arrive uncast and only the keys up to the last one any
    query may see are read (and cast to the compute dtype), see :func:`_keys_seen`: a decode
    step costs the context, not S_max. Keys below that bound that a query may not see are
    dropped by the mask and lengths as before, whatever they hold (NaN in unwritten rows).
    """
    att = layer.attention
    if att.norm_op != trt.AttentionNormalizationOp.SOFTMAX:
        raise ctx.unsupported(f"norm_op {att.norm_op}")
    if att.normalization_quantize_scale is not None:
        raise ctx.unsupported("normalization_quantize_scale")
    causal = causal_kind(att)
    forms = _trt.FEATURES.attention_io_forms
    q_packed = forms and packed_form(att.query_form)
    kv_packed = forms and packed_form(att.key_value_form)
    if (q_packed or kv_packed) and registry.input_or_none(layer, 3) is not None:
        raise ctx.unsupported("a mask with PACKED_NHD query or key/value form")

    compute = ctx.compute
    scores = _few_row_scores if ctx.fast else None

    def attend(q: Array, k: Array, v: Array, **kw: object) -> Array:
        k, v = widen_to(k, compute), widen_to(v, compute)
        return ops.attention(q, k, v, causal=causal, scale=1.0, scores_product=scores, **kw)

    def run(x: Inputs, rounded: bool = False) -> Array:
        q, k, v = x[0], x[1], x[2]
        mask, q_len, kv_len = arg(x, 3), arg(x, 5), arg(x, 6)
        if ctx.fast and not (q_packed or kv_packed):
            n, out = native_attend(q, k, v, mask, kv_len, causal, compute, rounded)
            if out is not None:
                return out
            k, v = k[:, :, :n], v[:, :, :n]
            mask = mask if mask is None or mask.shape[-1] == 1 else mask[..., :n]
        out = rest(q, k, v, mask, q_len, kv_len)
        return half.round_any(out) if rounded else out

    def rest(q: Array, k: Array, v: Array, mask: Array | None, q_len: Array | None,
             kv_len: Array | None) -> Array:  # fmt: skip
        if not (q_packed or kv_packed):
            large = ctx.fast and q.size // q.shape[-1] * k.shape[2] > _LARGE_SCORES
            if large and q.shape[1] % k.shape[1] == 0:
                return _per_sequence_and_head(attend, q, k, v, mask, kv_len)
            return attend(q, k, v, mask=mask, kv_lengths=kv_len)
        batch = len(kv_len) - 1 if kv_packed else k.shape[0]
        qs = _unpack(q, q_len) if q_packed else [q[b : b + 1] for b in range(batch)]
        if kv_packed:
            ks, vs = _unpack(k, kv_len), _unpack(v, kv_len)
        else:
            lengths = np.full(batch, k.shape[2]) if kv_len is None else kv_len
            ks = [k[b : b + 1, :, : lengths[b]] for b in range(batch)]
            vs = [v[b : b + 1, :, : lengths[b]] for b in range(batch)]
        if len(qs) != batch:
            raise ShapeError(mismatch(f"{ctx.layer_name}: query_lengths", "batch", batch, len(qs)))
        outs = [attend(qb, kb, vb) for qb, kb, vb in zip(qs, ks, vs)]
        if q_packed:  # back to [T, Nq, H]
            return np.concatenate([o[0].transpose(1, 0, 2) for o in outs], axis=0)
        return np.concatenate(outs, axis=0)

    raw = frozenset({1, 2}) if ctx.fast else frozenset()
    return Kernel(run, raw_inputs=raw, halves=lambda x: run(x, rounded=True))


_SEEN = Memo()  # a step's (keys read, keep mask): the same for each of its attention layers


def native_attend(
    q: Array, k: Array, v: Array, mask: Array | None, kv_len: Array | None, causal: str,
    compute: np.dtype, rounded: bool,
) -> tuple[int, Array | None]:  # fmt: skip
    """``(n, out)`` of a fast plan's (unpacked) attention call: the keys it reads and, where
    the helper's attention takes the call (:func:`native_attention_pays`), its result
    (``rounded``: to float16 values in the call; K and V widened to ``compute`` in the window
    read where they are not in it), else None. ``n`` and the keep mask are derived once a step
    for all its attention layers (:func:`_seen`)."""
    n, keep = seen(mask, kv_len, k.shape[2], q.shape[0], q.shape[2], causal)
    if keep is None or not native_attention_pays(q, k, v, mask, compute, n):
        return n, None
    if k.dtype != compute:  # the window widened, not the whole cache
        k, v = widen_to(k[:, :, :n], compute), widen_to(v[:, :, :n], compute)
    threads = products.threads()
    return n, native.attention(q, k, v, keep, 1.0, keys=n, rounded=rounded, threads=threads)


def seen(
    mask: Array | None, kv_len: Array | None, skv: int, b: int, sq: int, causal: str
) -> tuple[int, Array | None]:
    """:func:`_seen`, derived once a step for its attention layers (a memo's: read-only)."""
    shape = (skv, b, sq, causal)
    return _SEEN.get((mask, kv_len), shape, lambda: _seen(*shape, mask, kv_len))


def _seen(
    skv: int, b: int, sq: int, causal: str, mask: Array | None, kv_len: Array | None
) -> tuple[int, Array | None]:
    """``(n, keep)``: the keys attention reads (:func:`_keys_seen`) and, for a bool mask or
    none, the bool keep mask ``[B, 1 or Nq, Sq, n]`` of the native attention (the causal kind
    and lengths, and the mask); None for an additive mask."""
    n = _keys_seen(skv, mask, kv_len, causal)
    if mask is not None and mask.dtype != np.bool_:
        return n, None
    keep = mask if mask is None or mask.shape[-1] == 1 else mask[..., :n]
    if causal != "none" or kv_len is not None or mask is None:  # else the mask keeps what it says
        kept = ops.causal_keep(sq, n, causal, kv_len, b)
        keep = kept if keep is None else kept & keep
    return n, frozen(keep)


def native_attention_pays(
    q: Array, k: Array, v: Array, mask: Array | None, compute: np.dtype, n: int | None = None
) -> bool:
    """Whether the native helper's attention (:func:`~trt_kv.interpreter.native.attention`)
    runs this call: float32, a bool mask or none, K and V of q's batch and H (no broadcast
    batch), GQA heads that divide, and a shape where it is faster than NumPy's passes:

    - decode-shaped, up to :data:`_NATIVE_DECODE_ROWS` query rows per KV head (a decode
      step's group of query heads), any number of keys: each score a dot product of a query
      row with a key row read where it lies, ~1.1-1.9x faster than NumPy's passes from 32 to
      4096 keys (``scripts/bench_decode_attention.py``; as fast at 8192-16384);
    - prefill-like, :data:`_NATIVE_ATTENTION_ROWS` or more query rows against up to twice
      as many keys (or :data:`_NATIVE_ATTENTION_KEYS`): 1.2-2x faster (each row's scores only
      up to its last key: a causal chunk's first half reads half the keys).

    Anything between (a few rows per KV head more than a decode step's, chunks deep into a
    long context) keeps NumPy's products, which are faster there (~1.4-1.8x at 2048 keys).
    ``n``: the keys it reads (default all of k's)."""
    sq, n = q.shape[2], k.shape[2] if n is None else n
    return (
        half.NATIVE
        and compute == np.float32
        and q.dtype == compute
        and (mask is None or mask.dtype == np.bool_)
        and k.shape == v.shape
        and (k.shape[0], k.shape[3]) == (q.shape[0], q.shape[3])
        and q.shape[1] % k.shape[1] == 0
        and (
            q.shape[1] // k.shape[1] * sq <= _NATIVE_DECODE_ROWS
            or (sq >= _NATIVE_ATTENTION_ROWS and n <= max(2 * sq, _NATIVE_ATTENTION_KEYS))
        )
    )


_NATIVE_ATTENTION_ROWS = 8  # query rows from which the native attention runs
_NATIVE_ATTENTION_KEYS = 128  # keys it takes whatever the rows (more: up to 2 a query row)
# query rows per KV head (Nq / Nkv x Sq) up to which it runs whatever the keys: the helper's
# decode path (its ATT_ROWS), keys read where they lie
_NATIVE_DECODE_ROWS = 4


def _few_row_scores(rows: Array, k: Array) -> Array | None:
    """A few query rows' scores (a decode step the native attention does not take, see
    :func:`native_attention_pays`) ``rows [B, Nkv, R, H] @ k^T`` -> ``[B, Nkv, R, Skv]`` as one
    native product per sequence and KV head (the keys as the weight: each read once, in the
    orientation the scores need): the scores take half the time of NumPy's batched product of
    so few rows at 2048 keys, the whole attention layer ~12-15% less from 1024 keys. None
    (NumPy computes them) where :func:`~trt_kv.interpreter.products.choose` gives the KEYS
    product another route than NATIVE: more rows than the helper takes, without it, or too
    few keys for its per-call cost to be repaid."""
    b, nkv, r, _ = rows.shape
    if products.choose(Weight.KEYS, r, *k.shape[2:], k.dtype, rows.dtype) is not Route.NATIVE:
        return None
    out = np.empty((b, nkv, r, k.shape[2]), k.dtype)
    for i in range(b):
        for n in range(nkv):
            out[i, n] = products.multiply(Route.NATIVE, rows[i, n], k[i, n])
    return out


_LARGE_SCORES = 1 << 20  # score elements (4 MiB in float32) above which attention is split


def _per_sequence_and_head(
    attend: object, q: Array, k: Array, v: Array, mask: Array | None, kv_len: Array | None
) -> Array:
    """Attention one sequence and one KV head (its group of query heads) at a time, for a
    prefill chunk over a long context: each piece's scores ``[1, G, Sq, Skv]`` stay in the
    processor's caches instead of one ``[B, Nq, Sq, Skv]`` array going through memory once
    per pass (~20% faster at B = 8, 2048 keys). Every row is computed by the same operations
    as in one call (a matrix product per sequence and KV head either way, softmax per row),
    so the result is the same, bit for bit."""
    b_count, nq = q.shape[:2]
    nkv = k.shape[1]
    group = nq // nkv
    out = np.empty(q.shape, q.dtype)
    for b in range(b_count):
        lengths = None if kv_len is None else kv_len[b : b + 1]
        for h in range(nkv):
            heads = slice(h * group, (h + 1) * group)
            m = mask
            if m is not None:
                m = m[b : b + 1] if m.shape[0] > 1 else m
                m = m[:, heads] if m.shape[1] > 1 else m
            out[b : b + 1, heads] = attend(
                q[b : b + 1, heads], k[b : b + 1, h : h + 1], v[b : b + 1, h : h + 1],
                mask=m, kv_lengths=lengths,
            )  # fmt: skip
    return out


@registry.handles_optional("attention", "ATTENTION_OUTPUT", "IAttentionBoundaryLayer")
def attention_output(layer: object, ctx: Context) -> object:
    """The attention result computed by the matching ATTENTION_INPUT layer."""
    return Kernel(lambda x: x[0], moves=True)
