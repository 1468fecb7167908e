"""Attention in the network, by route (see :mod:`trt_kv.builder.routes`).

Every route takes Q ``[B, Nq, S, H]`` already scaled by ``1/sqrt(H)`` (TensorRT's attention
does not scale scores), the updated caches K, V ``[B, Nkv, S_max, H]`` and the explicit
causal keep-mask ``[B, 1, S, S_max]`` (key j visible to query s iff j <= position_ids[s]),
and returns ``[B, Nq, S, H]``:

- ``attention_v2``: ``add_attention_v2`` with causal kind NONE and the mask (plus
  ``key_value_lengths [B]`` when that option is on);
- ``attention``: ``add_attention`` (causal False) with the mask;
- ``primitive``: ``Q K^T`` per KV-head group, the mask as a select, softmax in float32, times
  V. Keys no query may see are zeroed in V first, so unwritten cache rows (even NaN) never
  reach the output, as in the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv._trt import trt
from trt_kv.builder.routes import Routes
from trt_kv.models.layers.graph import Graph


@dataclass(frozen=True)
class Masks:
    """Per-network tensors every attention reads."""

    keep: object  # [B, 1, S, S_max] bool: key j visible to query s
    seen: object | None  # primitive route: [B, 1, 1, S_max, 1] bool, key j visible to any s
    kv_lengths: object | None  # [B] int32, when the key_value_lengths option is on


def add_masks(
    g: Graph, routes: Routes, position_ids: object, kv_lengths: object | None, max_seq_len: int
) -> Masks:
    """The causal keep-mask ``keep[b, 0, s, j] = j <= position_ids[b, s]`` (and, for the
    primitive route, which keys any query sees) from ``position_ids [B, S]`` int64."""
    j = g.const(np.arange(max_seq_len).reshape(1, 1, 1, -1), "int64")
    pos = g.shuffle(position_ids, (0, 1, -1, 1))  # [B, 1, S, 1]
    later = g.eltwise(j, pos, trt.ElementWiseOperation.GREATER)
    keep = g.network.add_unary(later, trt.UnaryOperation.NOT).get_output(0)
    seen = None
    if routes.attention == "primitive":
        last = g.network.add_reduce(position_ids, trt.ReduceOperation.MAX, 1 << 1, True)
        last = g.shuffle(last.get_output(0), (-1, 1, 1, 1, 1))  # [B, 1, 1, 1, 1]
        j5 = g.const(np.arange(max_seq_len).reshape(1, 1, 1, -1, 1), "int64")
        unseen = g.eltwise(j5, last, trt.ElementWiseOperation.GREATER)
        seen = g.network.add_unary(unseen, trt.UnaryOperation.NOT).get_output(0)
    return Masks(keep, seen, kv_lengths)


def scale_queries(g: Graph, q: object, head_dim: int) -> object:
    """``q * 1/sqrt(H)`` computed in float32 and rounded back once (1/sqrt(128) is not
    exact in float16/bfloat16)."""
    scale = g.const(np.full((1, 1, 1, 1), head_dim**-0.5), "float32")
    return g.cast(g.mul(g.cast(q, "float32"), scale), g.dtype)


def attend(g: Graph, route: str, q: object, k: object, v: object, masks: Masks, nkv: int) -> object:
    """Attention of pre-scaled ``q [B, Nq, S, H]`` over ``k, v [B, Nkv, S_max, H]``."""
    if route == "primitive":
        return _primitive(g, q, k, v, masks, nkv)
    norm = trt.AttentionNormalizationOp.SOFTMAX
    if route == "attention_v2":
        attn = g.network.add_attention_v2(q, k, v, norm, trt.CausalMaskKind.NONE)
    else:
        attn = g.network.add_attention(q, k, v, norm, False)
    attn.mask = masks.keep
    if masks.kv_lengths is not None:
        attn.key_value_lengths = masks.kv_lengths
    attn.decomposable = True
    return attn.get_output(0)


def _primitive(g: Graph, q: object, k: object, v: object, masks: Masks, nkv: int) -> object:
    _, nq, _, h = tuple(q.shape)
    s_max = tuple(k.shape)[2]
    group = nq // nkv
    q5 = g.shuffle(q, (0, nkv, group, -1, h))  # [B, Nkv, G, S, H]
    k5 = g.shuffle(k, (0, nkv, 1, s_max, h))  # [B, Nkv, 1, S_max, H]
    v5 = g.shuffle(v, (0, nkv, 1, s_max, h))
    zero = g.const(np.zeros((1, 1, 1, 1, 1)))
    v5 = g.network.add_select(masks.seen, v5, zero).get_output(0)
    scores = g.cast(g.matmul(q5, k5, transpose_b=True), "float32")  # [B, Nkv, G, S, S_max]
    keep = g.shuffle(masks.keep, (0, 1, 1, -1, s_max))  # [B, 1, 1, S, S_max]
    lowest = g.const(np.full((1, 1, 1, 1, 1), np.finfo(np.float32).min), "float32")
    masked = g.network.add_select(keep, scores, lowest).get_output(0)
    softmax = g.network.add_softmax(masked)
    softmax.axes = 1 << 4
    probs = g.cast(softmax.get_output(0), g.dtype)
    out = g.matmul(probs, v5)  # [B, Nkv, G, S, H]
    return g.shuffle(out, (0, nq, -1, h))
