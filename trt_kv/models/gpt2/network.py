"""GPT-2 as one TensorRT network for prefill and decode, with the public builder API.

Inputs follow the decoder contract (:mod:`trt_kv.contract`): ``input_ids [B, S]``
int32, ``position_ids [B, S]`` int64, ``write_indices [B]`` int32, ``last_token_rows [B]``
int32 (absent with ``all_logits``), ``key_value_lengths [B]`` (with that route option),
``past_key.{i}`` / ``past_value.{i}`` ``[B, N, S_max, H]``. Outputs: ``logits [B, V]``
float32 (``[B, S, V]`` with ``all_logits``) and the ``present_*`` caches aliasing the inputs.

Per block, as :func:`trt_kv.models.gpt2.reference.forward` reads: ``x += attn(ln_1(x))``,
``x += mlp(ln_2(x))``; embeddings are ``wte[ids] + wpe[positions]`` (learned positions, so
S_max may not pass ``n_positions``); the head is ``wte`` (tied). Attention, masks and the
cache update take the routes :func:`~trt_kv.builder.resolve_routes` picks (no RoPE).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv import build_defaults as defaults
from trt_kv._trt import trt
from trt_kv.builder import Profile, create_network
from trt_kv.builder.contract import decoder_profiles, decoder_roles, name_dimensions
from trt_kv.builder.routes import Routes, resolve_routes
from trt_kv.contract import DecoderRoles
from trt_kv.errors import ArgumentError, mismatch
from trt_kv.models.gpt2.config import GPT2Config
from trt_kv.models.gpt2.weights import GPT2Layer, GPT2Weights
from trt_kv.models.layers.attention import attend, scale_queries
from trt_kv.models.layers.graph import Graph, check_device_top_k
from trt_kv.models.layers.network import StepInputs, add_step_inputs, check_step_sizes
from trt_kv.quantization.storage import check_held_range, check_weight_format


def _linear(g: Graph, x: object, w: np.ndarray, bias: np.ndarray) -> object:
    """``x [B, S, In] @ w[Out, In]^T + bias [Out]``."""
    return g.add(g.linear(x, g.const(w[None])), g.const(bias[None, None]))


def _layer_norm(g: Graph, x: object, norm: tuple[np.ndarray, np.ndarray], eps: float) -> object:
    """LayerNorm over the last axis of ``x [B, S, D]`` (INormalizationLayer), in float32."""
    shape = (1, 1, -1)
    scale = g.const(norm[0].reshape(shape), "float32")
    bias = g.const(norm[1].reshape(shape), "float32")
    layer = g.network.add_normalization(g.cast(x, "float32"), scale, bias, 1 << 2)
    layer.epsilon = eps
    return g.cast(layer.get_output(0), g.dtype)


def _heads(g: Graph, x: object, n: int, h: int) -> object:
    """``[B, S, N * H] -> [B, N, S, H]``."""
    return g.shuffle(x, (0, 0, n, h), second=(0, 2, 1, 3))


def _attention(
    g: Graph,
    cfg: GPT2Config,
    lw: GPT2Layer,
    x: object,
    i: int,
    step: StepInputs,
    route: str,
) -> object:
    """Multi-head self-attention of block ``i``, ``[B, S, D] -> [B, S, D]``, over the step's
    caches and masks."""
    n, h = cfg.n_head, cfg.head_dim
    q = scale_queries(g, _heads(g, _linear(g, x, lw.wq, lw.bq), n, h), h)  # [B, N, S, H]
    k = _heads(g, _linear(g, x, lw.wk, lw.bk), n, h)
    v = _heads(g, _linear(g, x, lw.wv, lw.bv), n, h)
    k_all, v_all = step.caches.update(i, k, v)  # [B, N, S_max, H]
    out = attend(g, route, q, k_all, v_all, step.masks, n)  # [B, N, S, H]
    return _linear(g, g.shuffle(out, (0, 0, n * h), first=(0, 2, 1, 3)), lw.wo, lw.bo)


def _mlp(g: Graph, lw: GPT2Layer, x: object) -> object:
    """``gelu_new(x W_fc^T + b_fc) W_proj^T + b_proj``."""
    hidden = _linear(g, x, lw.w_fc, lw.b_fc)
    act = g.network.add_activation(hidden, trt.ActivationType.GELU_TANH).get_output(0)
    return _linear(g, act, lw.w_proj, lw.b_proj)


@dataclass
class GPT2Network:
    """A built (not yet compiled) GPT-2 network, its profiles and its decoder roles."""

    builder: object
    network: object
    config: GPT2Config
    profiles: list[Profile]  # [decode (S = 1), prefill (S = 1..max_step_tokens)]
    roles: DecoderRoles
    routes: Routes
    dtype: str
    keep: list[np.ndarray]

    def metadata(self) -> dict:
        """What the sidecar records beside the roles (the model, for the CLI and the reader)."""
        return {
            "model": "gpt2",
            "config": self.config.to_json(),
            "dtype": self.dtype,
            "routes": self.routes.to_json(),
        }


def build_gpt2_network(
    config: GPT2Config,
    weights: GPT2Weights,
    *,
    max_seq_len: int | None = None,
    max_batch: int = defaults.MAX_BATCH,
    max_step_tokens: int | None = None,
    dtype: str = defaults.DTYPE,
    all_logits: bool = False,
    routes: Routes | None = None,
    weight_format: str | None = None,
    device_top_k: int | None = None,
) -> GPT2Network:
    """The GPT-2 decoder network (keywords as ``build_llama_network``'s; weights are held in
    the activation dtype only; ``max_seq_len`` None: :meth:`GPT2Config.default_max_seq_len`,
    at most ``n_positions``).

    Raises:
        ArgumentError: ``config`` not a GPT2Config; a size not an integer >= 1;
            ``weight_format`` other than None or ``dtype``; ``device_top_k`` as
            ``build_llama_network``'s.
        ShapeError: ``max_seq_len`` past ``n_positions``; ``max_step_tokens > max_seq_len``.
        ConfigError: a weight past what ``dtype`` holds (1e5 in float16), named
            (:func:`~trt_kv.quantization.storage.check_held_range`).
        RouteError: a requested route is missing.
    """
    if not isinstance(config, GPT2Config):
        raise ArgumentError(mismatch("config", "a GPT2Config", "", type(config).__name__))
    if max_seq_len is None:
        max_seq_len = config.default_max_seq_len()
    max_step_tokens = check_step_sizes(max_seq_len, max_batch, max_step_tokens)
    device_top_k = check_device_top_k(device_top_k, config.vocab_size, all_logits)
    config.check_max_seq_len(max_seq_len)
    if check_weight_format(weight_format, dtype) is not None:
        raise ArgumentError(
            mismatch(
                "weights", f"GPT-2 weights in the activation dtype {dtype!r}", "", weight_format
            )
        )
    check_held_range(weights.named(), {}, dtype)
    chosen = resolve_routes(routes)
    builder, network = create_network()
    g = Graph(network, dtype)
    step = add_step_inputs(
        g,
        chosen,
        num_layers=config.n_layer,
        num_kv_heads=config.n_head,
        head_dim=config.head_dim,
        max_seq_len=max_seq_len,
        dtype=dtype,
    )
    wte = g.const(weights.wte)  # [V, D]
    wpe = g.const(weights.wpe)  # [S_max, D]
    x = g.add(g.gather(wte, step.input_ids, 0), g.gather(wpe, step.position_ids, 0))
    eps = config.layer_norm_epsilon
    for i, lw in enumerate(weights.layers):
        x = g.add(
            x,
            _attention(g, config, lw, _layer_norm(g, x, lw.ln_1, eps), i, step, chosen.attention),
        )
        x = g.add(x, _mlp(g, lw, _layer_norm(g, x, lw.ln_2, eps)))
    g.logits(_layer_norm(g, x, weights.ln_f, eps), wte, all_logits, device_top_k)  # tied head
    name_dimensions(network)
    profiles = decoder_profiles(network, max_batch=max_batch, max_step_tokens=max_step_tokens)
    roles = decoder_roles(network, profiles)
    return GPT2Network(builder, network, config, profiles, roles, chosen, dtype, g.keep)
