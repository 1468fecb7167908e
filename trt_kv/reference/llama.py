"""NumPy Llama forward with a KV cache: the independent check of the network builder.

Same block structure as ``trt_kv.models.llama.network`` so the two read side by side, but
plain NumPy on arrays. Pass float32 (or float64) weights for reference numerics.
"""

from __future__ import annotations

import numpy as np

from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.rope import rope_tables
from trt_kv.models.llama.weights import LayerWeights, LlamaWeights
from trt_kv.reference.ops import apply_rope, attention, kv_cache_update_, rms_norm, swiglu

Caches = list[tuple[np.ndarray, np.ndarray]]  # per layer (K, V), each [B, N_kv, S_max, H]


def empty_caches(
    config: LlamaConfig, batch: int, max_seq_len: int, dtype: np.dtype = np.float32
) -> Caches:
    """Zeroed caches ``[B, N_kv, S_max, H]`` for every layer."""
    shape = (batch, config.num_key_value_heads, max_seq_len, config.head_dim)
    return [
        (np.zeros(shape, dtype), np.zeros(shape, dtype)) for _ in range(config.num_hidden_layers)
    ]


def _attention_block(
    cfg: LlamaConfig,
    lw: LayerWeights,
    x: np.ndarray,
    positions: np.ndarray,
    rope: tuple[np.ndarray, np.ndarray],
    cache: tuple[np.ndarray, np.ndarray],
    write_indices: np.ndarray,
    kv_lengths: np.ndarray,
) -> np.ndarray:
    """``x [B, S, D]`` -> ``[B, S, D]``; writes this step's K/V into ``cache`` in place.
    ``rope``: the (cos, sin) tables ``[S_max, H/2]``."""
    b, s, _ = x.shape
    nq, nkv, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = (x @ lw.wq.T).reshape(b, s, nq, h).transpose(0, 2, 1, 3)  # [B, Nq, S, H]
    k = (x @ lw.wk.T).reshape(b, s, nkv, h).transpose(0, 2, 1, 3)  # [B, Nkv, S, H]
    v = (x @ lw.wv.T).reshape(b, s, nkv, h).transpose(0, 2, 1, 3)
    q = apply_rope(q, *rope, positions)
    k = apply_rope(k, *rope, positions)
    k_all = kv_cache_update_(cache[0], k.astype(cache[0].dtype), write_indices)
    v_all = kv_cache_update_(cache[1], v.astype(cache[1].dtype), write_indices)
    n = int(kv_lengths.max())  # keys past every sequence's length are never seen
    j = np.arange(n)
    keep = (j[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, S, n]
    k_all, v_all = (c[:, :, :n].astype(q.dtype, copy=False) for c in (k_all, v_all))
    out = attention(q, k_all, v_all, mask=keep, kv_lengths=kv_lengths)
    return out.transpose(0, 2, 1, 3).reshape(b, s, nq * h) @ lw.wo.T


def forward(
    cfg: LlamaConfig,
    w: LlamaWeights,
    input_ids: np.ndarray,
    positions: np.ndarray,
    caches: Caches,
    write_indices: np.ndarray,
    kv_lengths: np.ndarray,
) -> np.ndarray:
    """One prefill or decode step.

    Args:
        input_ids: ``[B, S]`` new tokens (right-padded when sequences differ).
        positions: ``[B, S]`` position of each new token (its cache row).
        caches: per-layer ``(K, V)`` ``[B, N_kv, S_max, H]``, updated in place.
        write_indices: ``[B]`` first cache row written per sequence.
        kv_lengths: ``[B]`` valid keys per sequence after this step.

    Returns:
        logits ``[B, S, V]`` in the weights' dtype.
    """
    x = w.embed[input_ids]  # [B, S, D]
    rope = rope_tables(cfg, caches[0][0].shape[2])  # computed once per step, not per layer
    for lw, cache in zip(w.layers, caches):
        x = x + _attention_block(
            cfg,
            lw,
            rms_norm(x, lw.attn_norm, cfg.rms_norm_eps),
            positions,
            rope,
            cache,
            write_indices,
            kv_lengths,
        )
        x = x + swiglu(rms_norm(x, lw.mlp_norm, cfg.rms_norm_eps), lw.w_gate, lw.w_up, lw.w_down)
    return rms_norm(x, w.final_norm, cfg.rms_norm_eps) @ w.head.T
