"""NumPy GPT-2 forward with a KV cache (the oracle of the GPT-2 network), and its backend.

Reads like :mod:`trt_kv.models.gpt2.network`: learned positions, pre-LayerNorm blocks with
bias, multi-head attention over the cache, a ``gelu_new`` MLP, the tied head. Pass float32
(or float64) weights for reference numerics.
"""

from __future__ import annotations

import numpy as np

from trt_kv.builder.model_caches import model_cache_aliases
from trt_kv.errors import check_int
from trt_kv.models.gpt2.config import GPT2Config
from trt_kv.models.gpt2.weights import GPT2Layer, GPT2Weights
from trt_kv.models.host_reference import HostReference
from trt_kv.reference.ops import attention, gelu_tanh, kv_cache_update_, linear
from trt_kv.runtime.cache_state import StepPlan

Caches = list[tuple[np.ndarray, np.ndarray]]  # per layer (K, V), each [B, N, S_max, H]


def layer_norm(x: np.ndarray, norm: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
    """LayerNorm over the last axis of ``x [..., D]`` (biased variance), ``* weight + bias``."""
    centered = x - x.mean(axis=-1, keepdims=True)
    var = (centered * centered).mean(axis=-1, keepdims=True)
    return centered / np.sqrt(var + np.asarray(eps, x.dtype)) * norm[0] + norm[1]


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    """``[B, S, N * H] -> [B, N, S, H]``."""
    b, s, d = x.shape
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _attention(
    cfg: GPT2Config,
    lw: GPT2Layer,
    x: np.ndarray,
    positions: np.ndarray,
    cache: tuple[np.ndarray, np.ndarray],
    write_indices: np.ndarray,
    kv_lengths: np.ndarray,
) -> np.ndarray:
    """``x [B, S, D] -> [B, S, D]``; writes this step's K/V into ``cache`` in place."""
    b, s, d = x.shape
    q = _heads(linear(x, lw.wq) + lw.bq, cfg.n_head)  # [B, N, S, H]
    k = _heads(linear(x, lw.wk) + lw.bk, cfg.n_head)
    v = _heads(linear(x, lw.wv) + lw.bv, cfg.n_head)
    k_all = kv_cache_update_(cache[0], k.astype(cache[0].dtype), write_indices)
    v_all = kv_cache_update_(cache[1], v.astype(cache[1].dtype), write_indices)
    n = int(kv_lengths.max())  # keys past every sequence's length are never seen
    keep = np.arange(n)[None, None, :] <= positions[:, :, None]  # [B, S, n]
    k_all, v_all = (c[:, :, :n].astype(q.dtype, copy=False) for c in (k_all, v_all))
    out = attention(q, k_all, v_all, mask=keep[:, None], kv_lengths=kv_lengths)
    return linear(out.transpose(0, 2, 1, 3).reshape(b, s, d), lw.wo) + lw.bo


def forward(
    cfg: GPT2Config,
    w: GPT2Weights,
    input_ids: np.ndarray,
    positions: np.ndarray,
    caches: Caches,
    write_indices: np.ndarray,
    kv_lengths: np.ndarray,
) -> np.ndarray:
    """One prefill or decode step.

    Args:
        input_ids, positions: ``[B, S]`` new tokens and their positions (cache rows).
        caches: per-layer ``(K, V)`` ``[B, N, S_max, H]``, updated in place.
        write_indices: ``[B]`` first cache row written; kv_lengths: ``[B]`` valid keys after.

    Returns:
        logits ``[B, S, V]`` in the weights' dtype.
    """
    eps = cfg.layer_norm_epsilon
    x = w.wte[input_ids] + w.wpe[positions]  # [B, S, D]
    for lw, cache in zip(w.layers, caches):
        x = x + _attention(
            cfg, lw, layer_norm(x, lw.ln_1, eps), positions, cache, write_indices, kv_lengths
        )
        hidden = gelu_tanh(linear(layer_norm(x, lw.ln_2, eps), lw.w_fc) + lw.b_fc)
        x = x + linear(hidden, lw.w_proj) + lw.b_proj
    return linear(layer_norm(x, w.ln_f, eps), w.wte)


class GPT2ReferenceBackend(HostReference):
    """Runs :func:`forward` in float32 on host caches (a session backend)."""

    def __init__(
        self,
        config: GPT2Config,
        weights: GPT2Weights,
        *,
        capacity: int,
        max_seq_len: int,
        max_step_tokens: int | None = None,
    ) -> None:
        """Raises as :class:`~trt_kv.models.host_reference.HostReference`, or ShapeError
        (``max_seq_len`` past ``n_positions``)."""
        check_int("max_seq_len", max_seq_len, 1)
        config.check_max_seq_len(max_seq_len)
        aliases = model_cache_aliases(
            config.n_layer, config.n_head, max_seq_len, config.head_dim, "float32"
        )
        super().__init__(
            aliases,
            num_layers=config.n_layer,
            vocab_size=config.vocab_size,
            capacity=capacity,
            max_seq_len=max_seq_len,
            max_step_tokens=max_step_tokens,
        )
        self.config = config
        self.weights = weights.astype(np.float32)

    def forward(self, plan: StepPlan, caches: list) -> np.ndarray:
        return forward(
            self.config,
            self.weights,
            plan.input_ids,
            plan.position_ids,
            caches,
            plan.write_indices,
            plan.kv_lengths,
        )
