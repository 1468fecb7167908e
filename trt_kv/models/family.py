"""Decoder families as data: what each Llama variant switches, read from ``config.json``.

One decoder (:class:`trt_kv.models.llama.LlamaConfig`, its network builder and the NumPy
reference) has every switch; a family is one row of :data:`FAMILIES` saying which switches a
``model_type`` turns and which ``config.json`` keys it reads for them:

============  ==================================================================
llama         the base: no biases, SwiGLU, RMSNorm ``x * w``, full RoPE
qwen2         bias on q/k/v (not o); sliding-window layers (``use_sliding_window``,
              ``max_window_layers``, ``layer_types``)
qwen3         per-head RMSNorm on q and k before RoPE; ``attention_bias`` (q/k/v/o);
              sliding-window layers as qwen2
mistral       ``sliding_window`` on every layer
gemma         embeddings times sqrt(D) in the compute dtype; RMSNorm ``x * (1 + w)`` in
              float32; GELU-tanh gated MLP; ``attention_bias``
phi3          fused ``qkv_proj`` / ``gate_up_proj`` (split when loading); partial rotary;
              ``sliding_window`` on every layer; ``longrope`` scaling
============  ==================================================================

A ``model_type`` not in the table is refused by name (``ConfigError``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trt_kv.errors import ConfigError, mismatch

FULL, SLIDING = "full_attention", "sliding_attention"

# config.json hidden_act -> the activation of the gated MLP we build.
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}


@dataclass(frozen=True)
class Family:
    """What one ``model_type`` switches (see the module table)."""

    architecture: str  # the Hugging Face class
    qkv_bias: bool = False  # q/k/v projections always carry biases (Qwen2)
    attention_bias: bool = False  # reads ``attention_bias``: biases on q, k, v and o
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w); 1.0: Gemma's, in float32
    embed_scale: bool = False  # embeddings times sqrt(D), rounded to the compute dtype
    window: str = "none"  # "none", "all" (every layer), "layers" (use_sliding_window...)
    fused: bool = False  # fused qkv_proj / gate_up_proj in the checkpoint (Phi-3)
    keys: frozenset[str] = frozenset()  # config.json keys this family reads besides Llama's


FAMILIES = {
    "llama": Family("LlamaForCausalLM"),
    "qwen2": Family(
        "Qwen2ForCausalLM",
        qkv_bias=True,
        window="layers",
        keys=frozenset({"use_sliding_window", "sliding_window", "max_window_layers"}),
    ),
    "qwen3": Family(
        "Qwen3ForCausalLM",
        attention_bias=True,
        qk_norm=True,
        window="layers",
        keys=frozenset({"use_sliding_window", "sliding_window", "max_window_layers"}),
    ),
    "mistral": Family("MistralForCausalLM", window="all", keys=frozenset({"sliding_window"})),
    "gemma": Family(
        "GemmaForCausalLM",
        attention_bias=True,
        norm_offset=1.0,
        embed_scale=True,
        keys=frozenset({"hidden_activation", "use_bidirectional_attention"}),
    ),
    "phi3": Family(
        "Phi3ForCausalLM",
        window="all",
        fused=True,
        keys=frozenset(
            {
                "sliding_window",
                "original_max_position_embeddings",
                "partial_rotary_factor",
                "resid_pdrop",
                "embd_pdrop",
            }
        ),
    ),
}


def family_of(model_type: object) -> Family:
    """The family row of a ``config.json`` ``model_type``.

    Raises:
        ConfigError: a model type trt_kv does not build (named in the message).
    """
    if model_type not in FAMILIES:
        raise ConfigError(
            mismatch("config.model_type", "one of", sorted(FAMILIES), repr(model_type))
        )
    return FAMILIES[model_type]


def _refuse(key: str, what: str, value: object) -> ConfigError:
    return ConfigError(mismatch(f"config.{key}", what, "", json.dumps(value)))


def _window_layers(family: Family, d: dict, layers: int) -> tuple[int | None, tuple | None]:
    """``(sliding_window, layer_types)``: the window size and which layers use it (None:
    every layer, when a window is set)."""
    types = d.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise _refuse("layer_types", f"a list of {layers} layer types", types)
        unknown = sorted({t for t in types if t not in (FULL, SLIDING, "attention")})
        if unknown:
            raise _refuse("layer_types", f"only {FULL!r} and {SLIDING!r} layers", unknown)
        types = tuple(FULL if t == "attention" else t for t in types)
    window = d.get("sliding_window")
    if family.window == "none":
        if window is not None:
            raise _refuse("sliding_window", "null (no sliding window in this family)", window)
        if types and SLIDING in types:
            raise _refuse("layer_types", f"only {FULL!r} layers in this family", list(types))
        return None, None
    if family.window == "layers":
        if not d.get("use_sliding_window", False):
            window = None
        if window is not None and types is None:  # transformers' rule for Qwen2/Qwen3
            first = d.get("max_window_layers", 28)
            types = tuple(SLIDING if i >= first else FULL for i in range(layers))
    if window is None:
        if types and SLIDING in types:
            raise _refuse("layer_types", "no sliding layers without a sliding_window", types)
        return None, None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise _refuse("sliding_window", "an integer > 0 or null", window)
    if types is not None and SLIDING not in types:
        return None, None
    return window, types


def family_switches(d: dict, layers: int) -> dict:
    """The switches of ``config.json`` ``d`` (a decoder of ``layers`` layers) as
    ``LlamaConfig`` keyword arguments.

    Raises:
        ConfigError: an unknown model type; an activation, bias, window or layer type this
            family does not build (each named with its value).
    """
    model_type = d.get("model_type", "llama")
    family = family_of(model_type)
    act = d.get("hidden_act", "silu")
    old = d.get("hidden_activation")  # transformers 4's Gemma key; 5 reads hidden_act only
    if old is not None and old != act:
        raise _refuse("hidden_activation", f"null or hidden_act ({act!r})", old)
    if act not in ACTIVATIONS:
        raise _refuse("hidden_act", f"one of {sorted(ACTIVATIONS)}", act)
    if d.get("mlp_bias", False):
        raise _refuse("mlp_bias", "false (no MLP biases)", d["mlp_bias"])
    bias = d.get("attention_bias", False)
    if bias and not family.attention_bias:
        raise _refuse("attention_bias", f"false (no attention biases in {model_type})", bias)
    if d.get("use_bidirectional_attention"):
        raise _refuse("use_bidirectional_attention", "null (causal)", True)
    window, types = _window_layers(family, d, layers)
    return {
        "model_type": model_type,
        "qkv_bias": family.qkv_bias or bool(bias),
        "o_bias": bool(bias),
        "qk_norm": family.qk_norm,
        "norm_offset": family.norm_offset,
        "activation": ACTIVATIONS[act],
        "embed_scale": family.embed_scale,
        "sliding_window": window,
        "layer_types": types,
    }
