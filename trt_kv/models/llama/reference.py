"""NumPy decoder forward with a KV cache: the independent check of the network builder.

Same block structure and the same family switches (biases, q/k norm, norm offset,
activation, embedding scale, partial rotary, sliding window: see
:mod:`trt_kv.models.family`) as ``trt_kv.models.llama.network`` so the two read side by
side, but plain NumPy on arrays. Pass float32 (or float64) weights for reference numerics.
"""

from __future__ import annotations

import numpy as np

from trt_kv.errors import ArgumentError, DTypeError, ShapeError, mismatch
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.rope import rope_row_ids, rope_rows
from trt_kv.models.llama.weights import LayerWeights, LlamaWeights
from trt_kv.reference.ops import (
    apply_rope,
    attention,
    gated_mlp,
    kv_cache_update_,
    linear,
    rms_norm,
)

Caches = list[tuple[np.ndarray, np.ndarray]]  # per layer (K, V), each [B, N_kv, S_max, H]


def empty_caches(
    config: LlamaConfig, batch: int, max_seq_len: int, dtype: np.dtype = np.float32
) -> Caches:
    """Zeroed caches ``[B, N_kv, S_max, H]`` for every layer."""
    shape = (batch, config.num_key_value_heads, max_seq_len, config.head_dim)
    return [
        (np.zeros(shape, dtype), np.zeros(shape, dtype)) for _ in range(config.num_hidden_layers)
    ]


def _norm(cfg: LlamaConfig, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """RMSNorm over the last axis, scaled by ``norm_offset + weight`` (Gemma: 1 + w)."""
    return rms_norm(x, weight + weight.dtype.type(cfg.norm_offset), cfg.rms_norm_eps)


def _project(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``x [..., In] @ w[Out, In]^T (+ bias [Out])``."""
    y = linear(x, w)
    return y if bias is None else y + bias


def _heads(cfg: LlamaConfig, x: np.ndarray, n: int, norm: np.ndarray | None = None) -> np.ndarray:
    """``[B, S, N * H] -> [B, N, S, H]``, each head RMS-normalized first when ``norm [H]``."""
    b, s, _ = x.shape
    x = x.reshape(b, s, n, cfg.head_dim)
    if norm is not None:
        x = _norm(cfg, x, norm)
    return x.transpose(0, 2, 1, 3)


def _attention_block(
    cfg: LlamaConfig,
    layer: int,
    lw: LayerWeights,
    x: np.ndarray,
    positions: np.ndarray,
    rope: tuple[np.ndarray, np.ndarray, np.ndarray],
    cache: tuple[np.ndarray, np.ndarray],
    write_indices: np.ndarray,
    kv_lengths: np.ndarray,
) -> np.ndarray:
    """``x [B, S, D]`` -> ``[B, S, D]``; writes this step's K/V into ``cache`` in place.
    ``rope``: the (cos, sin) tables ``[T, R/2]`` of :func:`rope_rows` and each token's row
    ``[B, S]``."""
    b, s, _ = x.shape
    nq, nkv, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = _heads(cfg, _project(x, lw.wq, lw.bq), nq, lw.q_norm)  # [B, Nq, S, H]
    k = _heads(cfg, _project(x, lw.wk, lw.bk), nkv, lw.k_norm)  # [B, Nkv, S, H]
    v = _heads(cfg, _project(x, lw.wv, lw.bv), nkv)
    q = apply_rope(q, *rope, rotary_dim=cfg.rotary_dim)
    k = apply_rope(k, *rope, rotary_dim=cfg.rotary_dim)
    k_all = kv_cache_update_(cache[0], k.astype(cache[0].dtype), write_indices)
    v_all = kv_cache_update_(cache[1], v.astype(cache[1].dtype), write_indices)
    n = int(kv_lengths.max())  # keys past every sequence's length are never seen
    j = np.arange(n)
    keep = j[None, None, :] <= positions[:, :, None]  # [B, S, n]
    window = cfg.window(layer)
    if window is not None:  # position - window < j <= position, over the linear cache
        keep &= j[None, None, :] > positions[:, :, None] - window
    k_all, v_all = (c[:, :, :n].astype(q.dtype, copy=False) for c in (k_all, v_all))
    out = attention(q, k_all, v_all, mask=keep[:, None], kv_lengths=kv_lengths)
    return _project(out.transpose(0, 2, 1, 3).reshape(b, s, nq * h), lw.wo, lw.bo)


def _check_rope_lengths(rope_lengths: np.ndarray, batch: int) -> None:
    """Refuse ``rope_lengths`` that is not ``[B]`` non-negative integers, by name."""
    if rope_lengths.shape != (batch,):
        raise ShapeError(mismatch("rope_lengths", "shape", [batch], list(rope_lengths.shape)))
    if not np.issubdtype(rope_lengths.dtype, np.integer):
        raise DTypeError(mismatch("rope_lengths", "an integer dtype", "", rope_lengths.dtype))
    if (rope_lengths < 0).any():
        raise ArgumentError(mismatch("rope_lengths", "values >= 0", "", rope_lengths.tolist()))


def forward(
    cfg: LlamaConfig,
    w: LlamaWeights,
    input_ids: np.ndarray,
    positions: np.ndarray,
    caches: Caches,
    write_indices: np.ndarray,
    kv_lengths: np.ndarray,
    rope_lengths: np.ndarray | None = None,
) -> np.ndarray:
    """One prefill or decode step.

    Args:
        input_ids: ``[B, S]`` new tokens (right-padded when sequences differ).
        positions: ``[B, S]`` position of each new token (its cache row).
        caches: per-layer ``(K, V)`` ``[B, N_kv, S_max, H]``, updated in place.
        write_indices: ``[B]`` first cache row written per sequence.
        kv_lengths: ``[B]`` valid keys per sequence after this step.
        rope_lengths: ``[B]`` each sequence's length after the request this step belongs to
            (default ``kv_lengths``; a chunked prefill's chunks pass the last chunk's): with
            longrope, the long table where it exceeds ``original_max_position_embeddings``
            (:mod:`trt_kv.models.llama.rope`).

    Returns:
        logits ``[B, S, V]`` in the weights' dtype.

    Raises:
        ShapeError: ``rope_lengths`` not ``[B]``.
        DTypeError: ``rope_lengths`` not integers.
        ArgumentError: a negative ``rope_lengths`` entry (all checked before the caches change).
    """
    if rope_lengths is not None:
        _check_rope_lengths(np.asarray(rope_lengths), input_ids.shape[0])
    x = w.embed[input_ids]  # [B, S, D]
    if cfg.embed_scale:  # sqrt(D) rounded to the compute dtype first, as Hugging Face does
        x = x * np.asarray(cfg.hidden_size**0.5, x.dtype)
    s_max = caches[0][0].shape[2]
    rows = rope_row_ids(cfg, positions, kv_lengths if rope_lengths is None else rope_lengths, s_max)
    rope = (*rope_rows(cfg, s_max), rows)  # computed once per step, not per layer
    for i, (lw, cache) in enumerate(zip(w.layers, caches)):
        x = x + _attention_block(
            cfg,
            i,
            lw,
            _norm(cfg, x, lw.attn_norm),
            positions,
            rope,
            cache,
            write_indices,
            kv_lengths,
        )
        mlp_in = _norm(cfg, x, lw.mlp_norm)
        x = x + gated_mlp(mlp_in, lw.w_gate, lw.w_up, lw.w_down, cfg.activation)
    return linear(_norm(cfg, x, w.final_norm), w.head)
