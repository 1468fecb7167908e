"""GGUF architectures as data: how each ``general.architecture`` that llama.cpp's converter
(``convert_hf_to_gguf.py``) writes maps back to a Hugging Face ``config.json`` and tensor names.

============  ===========  ===================================================================
GGUF arch     model_type   what the converter did, undone here
============  ===========  ===================================================================
llama         llama        Q/K rows permuted (``LlamaModel.permute``); Llama 3.1+ RoPE scaling
                           written as per-frequency factors (``rope_freqs.weight``). Mistral
                           (``MistralForCausalLM``) is written as ``llama`` too; a
                           ``sliding_window`` in the file makes it ``mistral``.
mistral3      mistral      as llama (newer converters; YaRN / attention temperature refused)
qwen2         qwen2        nothing (q/k/v biases stored as is)
qwen3         qwen3        nothing; per-head ``attn_q_norm`` / ``attn_k_norm``
gemma         gemma        RMSNorm weights stored as ``1 + w`` (``GemmaModel.modify_tensors``);
                           no activation key (GELU-tanh), no RoPE base (10000), tied head;
                           vocabulary pieces of only spaces written with real spaces
phi3          phi3         fused ``attn_qkv`` and ``ffn_up`` (gate rows, then up) kept fused;
                           partial rotary as ``rope.dimension_count``; ``sliding_window`` 0 =
                           none; longrope factors as ``rope_factors_short/long`` tensors
============  ===========  ===================================================================

An architecture not in :data:`ARCHITECTURES`, or a metadata key in :data:`REFUSED_KEYS` that
changes the network, is refused by name (``ConfigError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from trt_kv.errors import ConfigError, mismatch

# "{arch}.<key>" -> config.json key, the same for every architecture here.
METADATA = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}

# "{arch}.<key>" that change the network and no architecture here builds -> (is the value
# the one built?, what is built).
REFUSED_KEYS: dict[str, tuple[Callable[[object], bool], str]] = {
    "attention.layer_norm_epsilon": (lambda v: False, "RMSNorm only (no LayerNorm epsilon)"),
    "expert_count": (lambda v: not v, "no experts (dense MLP)"),
    "attn_logit_softcapping": (lambda v: not v, "no attention logit soft-capping"),
    "final_logit_softcapping": (lambda v: not v, "no final logit soft-capping"),
    "attention.temperature_scale": (lambda v: not v, "no attention temperature scaling"),
    "attention.sliding_window_pattern": (lambda v: False, "no per-layer window pattern"),
    "rope.freq_base_swa": (lambda v: False, "one RoPE base for every layer"),
}

TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# "blk.{i}.<name>" -> "model.layers.{i}.<name>": llama.cpp's block names of a Llama.
LLAMA_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}


@dataclass(frozen=True)
class GgufArchitecture:
    """How one ``general.architecture`` maps to Hugging Face (see the module table)."""

    model_type: str
    block_tensors: Mapping[str, str] = field(default_factory=lambda: LLAMA_BLOCK)
    permuted: bool = False  # Q/K rows permuted by the converter (undone on load)
    norm_offset: float = 0.0  # RMSNorm weights stored as norm_offset + w
    window_model_type: str | None = None  # model_type a sliding window makes; None: refused
    partial_rotary: bool = False  # rope.dimension_count < head size is partial rotary
    defaults: Mapping[str, object] = field(default_factory=dict)  # keys the file never states
    space_pieces: bool = False  # vocabulary pieces of only spaces stored with real spaces
    # attention projections whose biases the model always has, with no ``attention_bias``
    # key in config.json (Qwen2's q/k/v): bias tensors beyond these set ``attention_bias``
    implied_biases: frozenset[str] = frozenset()


ARCHITECTURES: dict[str, GgufArchitecture] = {
    "llama": GgufArchitecture("llama", permuted=True, window_model_type="mistral"),
    "mistral3": GgufArchitecture("mistral", permuted=True, window_model_type="mistral"),
    "qwen2": GgufArchitecture("qwen2", implied_biases=frozenset({"q_proj", "k_proj", "v_proj"})),
    "qwen3": GgufArchitecture(
        "qwen3",
        block_tensors={
            **LLAMA_BLOCK,
            "attn_q_norm.weight": "self_attn.q_norm.weight",
            "attn_k_norm.weight": "self_attn.k_norm.weight",
        },
    ),
    "gemma": GgufArchitecture(
        "gemma",
        norm_offset=1.0,
        defaults={"hidden_act": "gelu_pytorch_tanh"},
        space_pieces=True,
    ),
    "phi3": GgufArchitecture(
        "phi3",
        block_tensors={
            "attn_norm.weight": "input_layernorm.weight",
            "attn_qkv.weight": "self_attn.qkv_proj.weight",
            "attn_output.weight": "self_attn.o_proj.weight",
            "ffn_norm.weight": "post_attention_layernorm.weight",
            "ffn_up.weight": "mlp.gate_up_proj.weight",  # gate rows, then up rows
            "ffn_down.weight": "mlp.down_proj.weight",
        },
        window_model_type="phi3",
        partial_rotary=True,
    ),
}

# Tensors that carry RoPE settings, not weights: read into the config.
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")

# GGUF rope scaling kind -> Hugging Face rope_type (LlamaConfig refuses the ones not built).
_ROPE_TYPES = {"linear": "linear", "yarn": "yarn", "longrope": "longrope"}

# Meta's Llama 3.1-3.3 settings, the ones whose factors llama.cpp writes as rope_freqs.
_LLAMA3 = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def architecture(name: object, where: str) -> GgufArchitecture:
    """The row of ``general.architecture`` ``name``.

    Raises:
        ConfigError: an architecture not in :data:`ARCHITECTURES` (named in the message).
    """
    if name not in ARCHITECTURES:
        raise ConfigError(
            mismatch(f"{where}: general.architecture", "one of", sorted(ARCHITECTURES), repr(name))
        )
    return ARCHITECTURES[name]


def llama3_rope(factors: np.ndarray, theta: float, head_dim: int) -> dict:
    """The ``rope_parameters`` (type "llama3") whose per-frequency divisors llama.cpp wrote as
    ``rope_freqs.weight`` ``[H/2]``: factor = the largest divisor; the other settings Meta's,
    checked by recomputing every divisor as the converter does (float32 frequencies).

    Raises:
        ConfigError: divisors other than those of llama3 scaling with Meta's settings.
    """
    factors = np.asarray(factors, np.float64)
    if factors.shape != (head_dim // 2,) or not head_dim:
        raise ConfigError(mismatch("rope_freqs.weight", "shape", (head_dim // 2,), factors.shape))
    factor = float(factors.max())
    freqs = 1.0 / np.power(np.float32(theta), np.arange(0, head_dim, 2, np.float32) / head_dim)
    wavelen = 2 * math.pi / freqs.astype(np.float32).astype(np.float64)
    old, low, high = (
        _LLAMA3[k]
        for k in ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor")
    )
    smooth = (old / wavelen - low) / (high - low)
    expected = np.where(
        wavelen < old / high,
        1.0,
        np.where(wavelen > old / low, factor, 1 / ((1 - smooth) / factor + smooth)),
    )
    if not np.allclose(factors, expected, rtol=1e-5, atol=0):
        raise ConfigError(
            mismatch(
                "rope_freqs.weight",
                f"Llama 3 RoPE factors (factor {factor}, low 1, high 4, original 8192)",
                "",
                np.round(factors, 4).tolist()[:8],
            )
        )
    return {"rope_type": "llama3", "rope_theta": float(theta), "factor": factor, **_LLAMA3}


def _refuse(key: str, what: str, value: object) -> ConfigError:
    return ConfigError(mismatch(key, what, "", repr(value)))


def _rotary(arch_name: str, arch: GgufArchitecture, rope_dim: object, head_dim: int) -> float:
    """``partial_rotary_factor`` of ``rope.dimension_count`` (1.0 when absent)."""
    if rope_dim is None or rope_dim == head_dim:
        return 1.0
    key = f"{arch_name}.rope.dimension_count"
    if not arch.partial_rotary:
        raise ConfigError(mismatch(key, "the head size", head_dim, rope_dim))
    factor = int(rope_dim) / head_dim
    if rope_dim % 2 or not 0 < rope_dim < head_dim or int(head_dim * factor) != rope_dim:
        raise _refuse(key, f"an even rotary size below the head size {head_dim}", rope_dim)
    return factor


def _rope(
    meta: Callable[..., object], arch_name: str, rope: Mapping[str, np.ndarray], head_dim: int
) -> dict:
    """``rope_parameters`` from ``rope.*`` metadata and the RoPE tensors (``ROPE_TENSORS``)."""
    theta = float(meta(f"{arch_name}.rope.freq_base", 10000.0))
    params: dict = {"rope_type": "default", "rope_theta": theta}
    kind = meta(f"{arch_name}.rope.scaling.type", "none")
    if "rope_freqs.weight" in rope:
        if kind != "none":
            raise _refuse(f"{arch_name}.rope.scaling.type", "none beside rope_freqs.weight", kind)
        return llama3_rope(rope["rope_freqs.weight"], theta, head_dim)
    factors = [n for n in ("rope_factors_short.weight", "rope_factors_long.weight") if n in rope]
    if factors:
        if len(factors) == 1:  # longrope needs both tables
            other = ({"rope_factors_short.weight", "rope_factors_long.weight"} - {*factors}).pop()
            raise _refuse(other, f"a tensor beside {factors[0]}", "no such tensor")
        original = meta(f"{arch_name}.rope.scaling.original_context_length")
        params.update(
            rope_type="longrope",
            short_factor=rope["rope_factors_short.weight"].tolist(),
            long_factor=rope["rope_factors_long.weight"].tolist(),
        )
        if original is not None:
            params["original_max_position_embeddings"] = int(original)
            scale = meta(f"{arch_name}.context_length", original) / original
            default = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
            attention = meta(f"{arch_name}.rope.scaling.attn_factor")
            if attention is not None and not math.isclose(attention, default, rel_tol=1e-6):
                params["attention_factor"] = float(attention)
        return params
    if kind != "none":  # LlamaConfig refuses the kinds it does not build, by name
        factor = meta(f"{arch_name}.rope.scaling.factor")
        params.update(rope_type=_ROPE_TYPES.get(kind, kind), factor=factor)
    return params


def hf_config(
    meta: Callable[..., object],
    arch_name: str,
    hf_names: set[str],
    rope: Mapping[str, np.ndarray],
) -> dict:
    """The Hugging Face ``config.json`` keys of a GGUF file: ``meta(key, default)`` reads its
    metadata, ``hf_names`` are its tensors under Hugging Face names, ``rope`` its RoPE
    tensors (``ROPE_TENSORS``) as arrays.

    Raises:
        ConfigError: an architecture not in :data:`ARCHITECTURES`, a metadata key in
            ``REFUSED_KEYS`` at a value not built, a sliding window
            in an architecture without one, a value length other than the key length, a
            rotary size other than the head size (partial only in phi3), RoPE factors that
            are not llama3's, a head count below 1, a special token id that is not an
            integer. Each message names the key and the value.
    """
    arch = architecture(arch_name, "hf_config")
    config: dict = {"model_type": arch.model_type, **arch.defaults}
    for key, hf_key in METADATA.items():
        value = meta(f"{arch_name}.{key}")
        if value is not None:
            config[hf_key] = value
    for key, (built, what) in REFUSED_KEYS.items():
        value = meta(f"{arch_name}.{key}")
        if value is not None and not built(value):
            raise _refuse(f"{arch_name}.{key}", what, value)
    if "vocab_size" not in config and meta("tokenizer.ggml.tokens") is not None:
        config["vocab_size"] = len(meta("tokenizer.ggml.tokens"))
    for key in ("attention.head_count", "attention.head_count_kv"):
        count = meta(f"{arch_name}.{key}")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise _refuse(f"{arch_name}.{key}", "an integer >= 1", count)
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    value_length = meta(f"{arch_name}.attention.value_length")
    if value_length is not None and value_length != head_dim:
        raise ConfigError(
            mismatch(
                f"{arch_name}.attention.value_length", "the key length", head_dim, value_length
            )
        )
    window = meta(f"{arch_name}.attention.sliding_window")
    if window:  # absent or 0: full attention
        if arch.window_model_type is None:
            raise _refuse(f"{arch_name}.attention.sliding_window", "0 (no sliding window)", window)
        config.update(model_type=arch.window_model_type, sliding_window=int(window))
    rope_params = _rope(meta, arch_name, rope, head_dim or 0)
    partial = _rotary(arch_name, arch, meta(f"{arch_name}.rope.dimension_count"), head_dim)
    if partial != 1.0:
        rope_params["partial_rotary_factor"] = partial
    config["rope_parameters"] = rope_params
    config["tie_word_embeddings"] = "lm_head.weight" not in hf_names
    biased = {n.split(".")[-2] for n in hf_names if ".self_attn." in n and n.endswith(".bias")}
    if biased - arch.implied_biases:
        config["attention_bias"] = True  # the family check refuses it where not built
    if any(".mlp." in n and n.endswith(".bias") for n in hf_names):
        config["mlp_bias"] = True
    for name in ("bos", "eos", "padding"):
        token = token_id(meta, f"tokenizer.ggml.{name}_token_id")
        if token is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = token
    return config


def token_id(meta: Callable[..., object], key: str) -> int | None:
    """The token id metadata ``key`` holds, or None when absent.

    Raises:
        ConfigError: a value that is not an integer >= 0 (a string, a float...), naming
            ``key``.
    """
    value = meta(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise _refuse(key, "a token id (an integer >= 0)", value)
    return value
