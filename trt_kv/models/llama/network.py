"""Llama decoder as one TensorRT network for prefill and decode.

Inputs (B sequences, S new tokens each, padded on the right):
    input_ids [B, S] int32, position_ids [B, S] int64, write_indices [B] int32,
    last_token_rows [B] int32 (row of each sequence's last new token in the flattened
    [B * S] tokens; absent with ``all_logits``), key_value_lengths [B] int32 (only with the
    ``key_value_lengths`` route option), rope_lengths [B] int32 (only for longrope with
    S_max past ``original_max_position_embeddings``: each sequence's length after the
    request, which picks the short or long table), past_key.{i} / past_value.{i}
    [B, N_kv, S_max, H].
Outputs: logits [B, V] float32 (or [B, S, V] with ``all_logits``), present_key.{i} /
    present_value.{i} aliasing the cache inputs.

Each part (attention, RoPE, cache update) is built by the route
:func:`trt_kv.builder.resolve_routes` picks from the installed TensorRT's features; the
choice is in :meth:`LlamaNetwork.metadata`, hence in the sidecar. Q is scaled by 1/sqrt(H) in
float32 after RoPE (TensorRT's attention does not scale scores). The causal mask is explicit
(key j visible to query s iff j <= position_ids[s]), which is right for ragged right-padded
prefill where a LOWER_RIGHT causal kind is not.

Every input names its batch dimension ``B`` (and ``input_ids`` / ``position_ids`` their step
dimension ``S``) where TensorRT has ``ITensor.set_dimension_name``: dimensions named alike are
equal at run time, so the builder knows the caches of every layer have the batch of
``input_ids`` and compiles the kernels that read them once, not once per layer (float16
SmolLM2-135M on TensorRT-RTX 1.7.1: 1.083x instead of 1.122x the parameter bytes).

Two optimization profiles share the one engine (weights stored once): ``decode`` (S = 1) and
``prefill`` (S = 1..max_step_tokens); the runtime picks one per step
(:func:`trt_kv.runtime.profiles.select_profile`). An engine with quantized weights
(``weight_format``) has one, ``steps`` (S = 1..max_step_tokens, optimized for S = 1): TensorRT-RTX
1.7.1 stores INT4 weights once per profile, in each profile's kernel layout (default model:
175 MB with two profiles, 161 MB with one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv import build_defaults as defaults
from trt_kv._trt import trt
from trt_kv.builder import Profile, create_network
from trt_kv.builder.contract import (
    decoder_profiles,
    decoder_roles,
    name_dimensions,
)
from trt_kv.builder.model_caches import ModelCaches
from trt_kv.builder.routes import Routes, resolve_routes
from trt_kv.contract import DecoderRoles
from trt_kv.errors import ArgumentError, mismatch
from trt_kv.models.layers.attention import Masks, attend, scale_queries
from trt_kv.models.layers.graph import Graph, check_device_top_k
from trt_kv.models.layers.network import add_step_inputs, check_step_sizes
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.norm_mlp import gated_mlp, rms_norm
from trt_kv.models.llama.rope import long_rope_after
from trt_kv.models.llama.rope_layers import Rope, add_rope, apply_rope, check_table_memory
from trt_kv.models.llama.weights import (
    EMBED,
    LayerWeights,
    LlamaWeights,
    check_weights,
    layer_name,
    quantized_matrices,
    to_hf_tensors,
)
from trt_kv.models.llama.window import window_masks
from trt_kv.progress import track
from trt_kv.quantization import QuantizedMatrix
from trt_kv.quantization.network import QuantizedWeight, dequantized
from trt_kv.quantization.storage import check_held_range, check_weight_format, weight_storage

LOGITS = "logits"
ROPE_LENGTHS = "rope_lengths"


def _weight(g: Graph, sh: _Shared, name: str, w: np.ndarray) -> object:
    """A ``[Out, In]`` weight as a ``[1, Out, In]`` constant for ``[B, S, In]`` inputs, or
    its quantized form where the build keeps one (``sh.quantized``, by Hugging Face name)."""
    if name in sh.quantized:
        return QuantizedWeight(sh.quantized[name])
    return g.const(w[None])


def _heads(g: Graph, x: object, n: int, h: int) -> object:
    """``[B, S, N * H] -> [B, N, S, H]``."""
    return g.shuffle(x, (0, 0, n, h), second=(0, 2, 1, 3))


def _project(
    g: Graph, sh: _Shared, i: int, key: str, lw: LayerWeights, bias: np.ndarray | None, x: object
) -> object:
    """``x [B, S, In] @ w[Out, In]^T (+ bias [Out])``, ``w`` layer ``i``'s ``key``."""
    y = g.linear(x, _weight(g, sh, layer_name(i, key), getattr(lw, key)))
    return y if bias is None else g.add(y, g.const(bias[None, None]))


@dataclass(frozen=True)
class _Shared:
    """Per-network tensors every block reads."""

    routes: Routes
    rope: Rope
    masks: Masks
    window: Masks | None  # the masks of sliding-window layers (config.window(i) set)
    caches: ModelCaches
    quantized: dict[str, QuantizedMatrix]  # Hugging Face name -> the form the engine holds


def _attention(
    g: Graph, cfg: LlamaConfig, i: int, lw: LayerWeights, x: object, sh: _Shared
) -> object:
    """Self-attention of block ``i`` on ``x [B, S, D]`` -> ``[B, S, D]``."""
    nq, nkv, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = _heads(g, _project(g, sh, i, "wq", lw, lw.bq, x), nq, h)  # [B, Nq, S, H]
    k = _heads(g, _project(g, sh, i, "wk", lw, lw.bk, x), nkv, h)  # [B, Nkv, S, H]
    v = _heads(g, _project(g, sh, i, "wv", lw, lw.bv, x), nkv, h)
    if cfg.qk_norm:  # per head, over H, before RoPE
        q = rms_norm(g, q, lw.q_norm, cfg.rms_norm_eps, cfg.norm_offset)
        k = rms_norm(g, k, lw.k_norm, cfg.rms_norm_eps, cfg.norm_offset)
    q = scale_queries(g, apply_rope(g, sh.rope, q), h)
    k = apply_rope(g, sh.rope, k)
    k_all, v_all = sh.caches.update(i, k, v)  # [B, Nkv, S_max, H]
    masks = sh.masks if cfg.window(i) is None else sh.window
    out = attend(g, sh.routes.attention, q, k_all, v_all, masks, nkv)  # [B, Nq, S, H]
    out = g.shuffle(out, (0, 0, nq * h), first=(0, 2, 1, 3))  # [B, S, Nq*H]
    return _project(g, sh, i, "wo", lw, lw.bo, out)


def _norm(g: Graph, cfg: LlamaConfig, x: object, weight: np.ndarray) -> object:
    return rms_norm(g, x, weight, cfg.rms_norm_eps, cfg.norm_offset)


def _block(g: Graph, cfg: LlamaConfig, i: int, lw: LayerWeights, x: object, sh: _Shared) -> object:
    x = g.add(x, _attention(g, cfg, i, lw, _norm(g, cfg, x, lw.attn_norm), sh))
    keys = ("w_gate", "w_up", "w_down")
    weights = (_weight(g, sh, layer_name(i, k), getattr(lw, k)) for k in keys)
    return g.add(x, gated_mlp(g, _norm(g, cfg, x, lw.mlp_norm), *weights, cfg.activation))


@dataclass
class LlamaNetwork:
    """A built (not yet compiled) Llama network and what is needed to compile and run it."""

    builder: object
    network: object
    config: LlamaConfig
    # [decode (S = 1), prefill (S = 1..max_step_tokens)]; [steps] with quantized weights
    profiles: list[Profile]
    max_seq_len: int
    max_batch: int
    max_step_tokens: int
    dtype: str
    all_logits: bool
    routes: Routes  # resolved: no "auto" left
    keep: list[np.ndarray]  # arrays the constants point at (held as long as the network is)
    roles: DecoderRoles  # the decoder contract (trt_kv.contract): what a runtime reads
    weight_format: str | None = None  # None: every weight in ``dtype``
    weight_storage: dict | None = None  # how each weight is held (see weight_storage())

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
            "routes": self.routes.to_json(),
            "weights": self.weight_storage,
        }


def build_llama_network(
    config: LlamaConfig,
    weights: LlamaWeights,
    *,
    max_seq_len: int = defaults.MAX_SEQ_LEN,
    max_batch: int = defaults.MAX_BATCH,
    max_step_tokens: int | None = None,
    dtype: str = defaults.DTYPE,
    all_logits: bool = False,
    routes: Routes | None = None,
    weight_format: str | None = None,
    device_top_k: int | None = None,
) -> LlamaNetwork:
    """Build the decoder network: prefill (S up to ``max_step_tokens``) and decode (S = 1).

    Args:
        max_seq_len: S_max of every cache (static).
        max_batch: B upper bound of the optimization profiles.
        max_step_tokens: S upper bound of one step (longer prompts are prefilled in chunks;
            None: :func:`trt_kv.build_defaults.default_step_tokens`).
        dtype: "float16", "bfloat16" or "float32" for weights and activations.
        all_logits: output logits of every position ``[B, S, V]`` instead of the last ``[B, V]``.
        routes: the route of each part; "auto" (the default) takes the best the installed
            TensorRT has.
        weight_format: None (or ``dtype``): every weight in ``dtype``; ``"int8"`` /
            ``"int4"``: each product's matrix quantized at build time (symmetric per 32
            weights: lossy); ``"keep"``: each matrix the checkpoint stores quantized (GGUF)
            kept so, as INT8/INT4 with its block scales (see
            :func:`~trt_kv.models.llama.weights.quantized_matrices`). The norms stay in
            ``dtype``, and so does the embedding unless a tied head reads its quantized
            blocks; the metadata's ``weights`` says how each is held.
        device_top_k: 0: logits only; k >= 1: the network also picks the next token's k
            best candidates (:meth:`~trt_kv.models.layers.graph.Graph.logits`); None (the
            default): 1, or 0 with ``all_logits``
            (:func:`~trt_kv.build_defaults.default_device_top_k`).

    Raises:
        ArgumentError: ``config``, ``routes`` of the wrong type; ``max_seq_len``,
            ``max_batch`` or ``max_step_tokens`` not an integer >= 1; ``max_seq_len`` past
            2^31 - 1 (int32 write indices) or with RoPE tables that do not fit host memory;
            ``weight_format`` not one of None, ``dtype``, "int8", "int4", "keep";
            ``device_top_k`` not in ``[0, min(V, 3840)]`` or >= 1 with ``all_logits``.
        ShapeError: ``max_step_tokens > max_seq_len``.
        ConfigError, ShapeError, DTypeError: ``weights`` that do not fit ``config``
            (:func:`~trt_kv.models.llama.weights.check_weights`); ConfigError: a weight
            past what ``dtype`` holds, as a float or as its quantized form
            (:func:`~trt_kv.quantization.storage.check_held_range`).
        RouteError: a requested route is missing, or a part has none (with the reasons).
    """
    if not isinstance(config, LlamaConfig):
        raise ArgumentError(mismatch("config", "a LlamaConfig", "", type(config).__name__))
    max_step_tokens = check_step_sizes(max_seq_len, max_batch, max_step_tokens)
    device_top_k = check_device_top_k(device_top_k, config.vocab_size, all_logits)
    check_table_memory(config, max_seq_len)
    if routes is not None and not isinstance(routes, Routes):
        raise ArgumentError(mismatch("routes", "a Routes or None", "", repr(routes)))
    weight_format = check_weight_format(weight_format, dtype)
    check_weights(weights, config)
    quantized = quantized_matrices(weights, weight_format, dtype)
    tensors = to_hf_tensors(weights)
    check_held_range(tensors.items(), quantized, dtype)
    chosen = resolve_routes(routes)
    cfg = config
    builder, network = create_network()
    g = Graph(network, dtype)
    step = add_step_inputs(
        g,
        chosen,
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_seq_len=max_seq_len,
        dtype=dtype,
    )
    window = None
    if any(cfg.window(i) is not None for i in range(cfg.num_hidden_layers)):
        window = window_masks(g, step.masks, step.position_ids, cfg.sliding_window, max_seq_len)
    rope_lengths = None
    if long_rope_after(cfg, max_seq_len) is not None:
        rope_lengths = network.add_input(ROPE_LENGTHS, trt.int32, (-1,))
    rope = add_rope(g, chosen.rope, cfg, step.position_ids, max_seq_len, rope_lengths)
    shared = _Shared(chosen, rope, step.masks, window, step.caches, quantized)

    # [V, D]: kept quantized only with a tied head, which then multiplies the blocks
    embed = dequantized(g, quantized[EMBED]) if EMBED in quantized else g.const(weights.embed)
    x = g.gather(embed, step.input_ids, 0)  # [B, S, D]
    if cfg.embed_scale:  # sqrt(D) rounded to the compute dtype first, as Hugging Face does
        x = g.mul(x, g.const(np.full((1, 1, 1), cfg.hidden_size**0.5)))
    for i, lw in enumerate(track(weights.layers, "network", unit="layer")):
        x = _block(g, cfg, i, lw, x, shared)
    x = _norm(g, cfg, x, weights.final_norm)
    head = embed if weights.lm_head is None else g.const(weights.lm_head)
    if "lm_head.weight" in quantized:
        head = QuantizedWeight(quantized["lm_head.weight"])
    g.logits(x, head, all_logits, device_top_k)
    name_dimensions(network)
    # one profile for quantized weights: TensorRT lays INT4 weights out per profile
    profiles = decoder_profiles(
        network,
        max_batch=max_batch,
        max_step_tokens=max_step_tokens,
        one_profile=bool(quantized),
    )
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
        chosen,
        g.keep,
        decoder_roles(network, profiles, long_rope_after=long_rope_after(cfg, max_seq_len)),
        weight_format,
        weight_storage(tensors, quantized, weight_format, dtype),
    )
