"""Llama decoder as one TensorRT network for prefill and decode.

Inputs (B sequences, S new tokens each, padded on the right):
    input_ids [B, S] int32, position_ids [B, S] int64, write_indices [B] int32,
    key_value_lengths [B] int32, last_token_rows [B] int32 (row of each sequence's last new
    token in the flattened [B * S] tokens; absent with ``all_logits``),
    past_key.{i} / past_value.{i} [B, N_kv, S_max, H].
Outputs: logits [B, V] float32 (or [B, S, V] with ``all_logits``), present_key.{i} /
    present_value.{i} aliasing the cache inputs.

Attention: TensorRT's attention does not scale scores, so Q is multiplied by 1/sqrt(H) after
RoPE. The causal mask is explicit (key j visible to query s iff j <= position_ids[s]), which is
right for ragged right-padded prefill where a LOWER_RIGHT causal kind is not, and
``key_value_lengths`` tells the kernel where each cache's valid keys end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.builder import Profile, add_model_caches, create_network
from trt_kv.builder.kv_cache import Method
from trt_kv.builder.model_caches import ModelCaches, cache_names
from trt_kv.errors import ShapeError, mismatch
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.rope import rope_tables
from trt_kv.models.llama.weights import LayerWeights, LlamaWeights
from trt_kv.progress import track

INPUT_IDS, POSITION_IDS = "input_ids", "position_ids"
KV_LENGTHS, LAST_TOKEN_ROWS, LOGITS = "key_value_lengths", "last_token_rows", "logits"


@dataclass
class _Ctx:
    """What every block function needs: the network, the compute dtype, live weight arrays."""

    network: object
    dtype: str
    keep: list[np.ndarray] = field(default_factory=list)

    def const(self, array: np.ndarray, dtype: str | None = None) -> object:
        a = np.ascontiguousarray(array, dtype=dtypes.to_numpy(dtype or self.dtype))
        self.keep.append(a)  # TensorRT reads the bytes at build time
        w = trt.Weights(dtypes.to_trt(dtype or self.dtype), a.ctypes.data, a.size)
        return self.network.add_constant(a.shape, w).get_output(0)

    def eltwise(self, a: object, b: object, op: object) -> object:
        return self.network.add_elementwise(a, b, op).get_output(0)

    def shuffle(
        self,
        x: object,
        reshape: tuple[int, ...],
        first: tuple[int, ...] | None = None,
        second: tuple[int, ...] | None = None,
    ) -> object:
        layer = self.network.add_shuffle(x)
        if first is not None:
            layer.first_transpose = first
        layer.reshape_dims = reshape
        if second is not None:
            layer.second_transpose = second
        return layer.get_output(0)

    def cast(self, x: object, dtype: str) -> object:
        if dtypes.name_of(x.dtype) == dtype:
            return x
        return self.network.add_cast(x, dtypes.to_trt(dtype)).get_output(0)


def _linear(ctx: _Ctx, x: object, w: object) -> object:
    """``x [.., In] @ w[Out, In]^T -> [.., Out]``; ``w`` a constant of matching rank."""
    mm = ctx.network.add_matrix_multiply(
        x, trt.MatrixOperation.NONE, w, trt.MatrixOperation.TRANSPOSE
    )
    return mm.get_output(0)


def _weight(ctx: _Ctx, w: np.ndarray) -> object:
    """A ``[Out, In]`` weight as a ``[1, Out, In]`` constant for ``[B, S, In]`` inputs."""
    return ctx.const(w[None])


def _rms_norm(ctx: _Ctx, x: object, weight: np.ndarray, eps: float) -> object:
    """``x [B, S, D]``: normalized in float32 (as Hugging Face does), scaled in ``ctx.dtype``."""
    x32 = ctx.cast(x, "float32")
    sq = ctx.eltwise(x32, x32, trt.ElementWiseOperation.PROD)
    mean = ctx.network.add_reduce(sq, trt.ReduceOperation.AVG, 1 << 2, True).get_output(0)
    var = ctx.eltwise(
        mean, ctx.const(np.full((1, 1, 1), eps), "float32"), trt.ElementWiseOperation.SUM
    )
    rms = ctx.network.add_unary(var, trt.UnaryOperation.SQRT).get_output(0)
    normed = ctx.cast(ctx.eltwise(x32, rms, trt.ElementWiseOperation.DIV), ctx.dtype)
    return ctx.eltwise(normed, ctx.const(weight[None, None]), trt.ElementWiseOperation.PROD)


def _heads(ctx: _Ctx, x: object, n: int, h: int) -> object:
    """``[B, S, N * H] -> [B, N, S, H]``."""
    return ctx.shuffle(x, (0, 0, n, h), second=(0, 2, 1, 3))


def _rope(ctx: _Ctx, x: object, cos: object, sin: object, position_ids: object) -> object:
    """Rotary embedding of ``x [B, N, S, H]`` (rotate-half pairs, the whole head)."""
    layer = ctx.network.add_rotary_embedding(x, cos, sin, False, 0)
    layer.set_input(3, position_ids)
    return layer.get_output(0)


@dataclass(frozen=True)
class _Shared:
    """Per-network tensors every layer reads."""

    position_ids: object  # [B, S] int64
    cos: object  # [S_max, H/2]
    sin: object
    keep: object  # [B, 1, S, S_max] bool
    kv_lengths: object  # [B] int32
    caches: ModelCaches


def _attention(
    ctx: _Ctx, cfg: LlamaConfig, i: int, lw: LayerWeights, x: object, sh: _Shared
) -> object:
    """Self-attention of block ``i`` on ``x [B, S, D]`` -> ``[B, S, D]``."""
    nq, nkv, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = _heads(ctx, _linear(ctx, x, _weight(ctx, lw.wq)), nq, h)  # [B, Nq, S, H]
    k = _heads(ctx, _linear(ctx, x, _weight(ctx, lw.wk)), nkv, h)  # [B, Nkv, S, H]
    v = _heads(ctx, _linear(ctx, x, _weight(ctx, lw.wv)), nkv, h)
    q = _rope(ctx, q, sh.cos, sh.sin, sh.position_ids)
    k = _rope(ctx, k, sh.cos, sh.sin, sh.position_ids)
    q = ctx.eltwise(q, ctx.const(np.full((1, 1, 1, 1), h**-0.5)), trt.ElementWiseOperation.PROD)
    k_all, v_all = sh.caches.update(i, k, v)  # [B, Nkv, S_max, H]
    attn = ctx.network.add_attention_v2(
        q, k_all, v_all, trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.NONE
    )
    attn.mask = sh.keep
    attn.key_value_lengths = sh.kv_lengths
    attn.decomposable = True
    out = ctx.shuffle(attn.get_output(0), (0, 0, nq * h), first=(0, 2, 1, 3))  # [B, S, Nq*H]
    return _linear(ctx, out, _weight(ctx, lw.wo))


def _mlp(ctx: _Ctx, lw: LayerWeights, x: object) -> object:
    """SwiGLU: ``(silu(x Wg^T) * x Wu^T) Wd^T``, ``[B, S, D] -> [B, S, D]``."""
    gate = _linear(ctx, x, _weight(ctx, lw.w_gate))
    up = _linear(ctx, x, _weight(ctx, lw.w_up))
    sig = ctx.network.add_activation(gate, trt.ActivationType.SIGMOID).get_output(0)
    act = ctx.eltwise(
        ctx.eltwise(gate, sig, trt.ElementWiseOperation.PROD), up, trt.ElementWiseOperation.PROD
    )
    return _linear(ctx, act, _weight(ctx, lw.w_down))


def _block(ctx: _Ctx, cfg: LlamaConfig, i: int, lw: LayerWeights, x: object, sh: _Shared) -> object:
    add = trt.ElementWiseOperation.SUM
    x = ctx.eltwise(
        x, _attention(ctx, cfg, i, lw, _rms_norm(ctx, x, lw.attn_norm, cfg.rms_norm_eps), sh), add
    )
    return ctx.eltwise(x, _mlp(ctx, lw, _rms_norm(ctx, x, lw.mlp_norm, cfg.rms_norm_eps)), add)


def _causal_keep(ctx: _Ctx, position_ids: object, max_seq_len: int) -> object:
    """``keep[b, 0, s, j] = j <= position_ids[b, s]`` as ``[B, 1, S, S_max]`` bool."""
    j = ctx.const(np.arange(max_seq_len).reshape(1, 1, 1, -1), "int64")
    pos = ctx.shuffle(position_ids, (0, 1, -1, 1))  # [B, 1, S, 1]
    later = ctx.eltwise(j, pos, trt.ElementWiseOperation.GREATER)
    return ctx.network.add_unary(later, trt.UnaryOperation.NOT).get_output(0)


@dataclass
class LlamaNetwork:
    """A built (not yet compiled) Llama network and what is needed to compile and run it."""

    builder: object
    network: object
    config: LlamaConfig
    profiles: list[Profile]
    max_seq_len: int
    max_batch: int
    max_step_tokens: int
    dtype: str
    all_logits: bool
    keep: list[np.ndarray]  # weight arrays TensorRT reads at build time

    def metadata(self) -> dict:
        """What the sidecar records so a runtime can drive the engine."""
        return {
            "model": "llama",
            "config": self.config.to_json(),
            "max_seq_len": self.max_seq_len,
            "max_batch": self.max_batch,
            "max_step_tokens": self.max_step_tokens,
            "dtype": self.dtype,
            "all_logits": self.all_logits,
        }


def build_llama_network(
    config: LlamaConfig,
    weights: LlamaWeights,
    *,
    max_seq_len: int = 512,
    max_batch: int = 8,
    max_step_tokens: int = 128,
    dtype: str = "float16",
    all_logits: bool = False,
    method: Method = "auto",
) -> LlamaNetwork:
    """Build the decoder network: prefill (S up to ``max_step_tokens``) and decode (S = 1).

    Args:
        max_seq_len: S_max of every cache (static).
        max_batch: B upper bound of the optimization profile.
        max_step_tokens: S upper bound (the longest prompt prefilled in one step).
        dtype: "float16", "bfloat16" or "float32" for weights and activations.
        all_logits: output logits of every position ``[B, S, V]`` instead of the last ``[B, V]``.
    """
    if max_step_tokens > max_seq_len:
        raise ShapeError(
            mismatch("max_step_tokens", f"<= max_seq_len = {max_seq_len}", "", max_step_tokens)
        )
    cfg = config
    builder, network = create_network()
    ctx = _Ctx(network, dtype)
    input_ids = network.add_input(INPUT_IDS, trt.int32, (-1, -1))
    position_ids = network.add_input(POSITION_IDS, trt.int64, (-1, -1))
    caches = add_model_caches(
        network,
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_seq_len=max_seq_len,
        dtype=dtype,
        method=method,
    )
    kv_lengths = network.add_input(KV_LENGTHS, trt.int32, (-1,))
    cos, sin = rope_tables(cfg, max_seq_len)
    shared = _Shared(
        position_ids,
        ctx.const(cos),
        ctx.const(sin),
        _causal_keep(ctx, position_ids, max_seq_len),
        kv_lengths,
        caches,
    )

    embed = ctx.const(weights.embed)  # [V, D]
    x = network.add_gather(embed, input_ids, 0).get_output(0)  # [B, S, D]
    for i, lw in enumerate(track(weights.layers, "network", unit="layer")):
        x = _block(ctx, cfg, i, lw, x, shared)
    x = _rms_norm(ctx, x, weights.final_norm, cfg.rms_norm_eps)
    head = embed if weights.lm_head is None else ctx.const(weights.lm_head)
    if all_logits:
        logits = _linear(
            ctx, x, ctx.shuffle(head, (1, cfg.vocab_size, cfg.hidden_size))
        )  # [B, S, V]
    else:
        rows = network.add_input(LAST_TOKEN_ROWS, trt.int32, (-1,))
        flat = ctx.shuffle(x, (-1, cfg.hidden_size))  # [B * S, D]
        last = network.add_gather(flat, rows, 0).get_output(0)  # [B, D]
        logits = _linear(ctx, last, head)  # [B, V]
    logits = ctx.cast(logits, "float32")
    logits.name = LOGITS
    network.mark_output(logits)
    profiles = [_profile(cfg, max_seq_len, max_batch, max_step_tokens, all_logits)]
    return LlamaNetwork(
        builder,
        network,
        cfg,
        profiles,
        max_seq_len,
        max_batch,
        max_step_tokens,
        dtype,
        all_logits,
        ctx.keep,
    )


def _profile(cfg: LlamaConfig, s_max: int, b: int, s: int, all_logits: bool) -> Profile:
    """One profile for prefill and decode: B in [1, b], S in [1, s], optimized for decode."""
    tokens = ((1, 1), (b, 1), (b, s))
    per_seq = ((1,), (b,), (b,))
    shapes = {
        INPUT_IDS: tokens,
        POSITION_IDS: tokens,
        "write_indices": per_seq,
        KV_LENGTHS: per_seq,
    }
    if not all_logits:
        shapes[LAST_TOKEN_ROWS] = per_seq
    cache = lambda n: ((n, cfg.num_key_value_heads, s_max, cfg.head_dim),)  # noqa: E731
    for i in range(cfg.num_hidden_layers):
        for name in cache_names(i)[:2]:
            shapes[name] = cache(1) + cache(b) + cache(b)
    return Profile("prefill_and_decode", shapes)
