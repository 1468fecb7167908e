"""Decoder configuration: one dataclass for every family, a SmolLM2-135M preset, ``from_hf``.

The family switches (biases, q/k norm, norm offset, activation, embedding scale, partial
rotary, sliding window) default to Llama; :mod:`trt_kv.models.family` reads them from
``config.json``.

Which other ``config.json`` keys are accepted, read or refused: :mod:`.config_keys`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from trt_kv.errors import ArgumentError, ConfigError, mismatch
from trt_kv.models.config_values import positive_int, positive_number
from trt_kv.models.family import SLIDING, family_of, family_switches
from trt_kv.models.llama.config_keys import ACCEPTED, IMPLEMENTED, REFUSED_UNLESS, REQUIRED, SIZES

_LONGROPE_FIELDS = ("short_factor", "long_factor")
_LLAMA3_FIELDS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
# rope type -> the keys its rope_parameters / rope_scaling may hold
_ROPE_KEYS = {"default": {"rope_type", "type", "rope_theta", "partial_rotary_factor"}}
_ROPE_KEYS["llama3"] = _ROPE_KEYS["default"] | set(_LLAMA3_FIELDS)
_ROPE_KEYS["longrope"] = _ROPE_KEYS["default"] | {
    *_LONGROPE_FIELDS,
    "factor",
    "attention_factor",
    "original_max_position_embeddings",
}
# LlamaConfig fields that are family switches (written by to_json only when not Llama's).
_SWITCHES = (
    "model_type",
    "qkv_bias",
    "o_bias",
    "qk_norm",
    "norm_offset",
    "activation",
    "embed_scale",
    "partial_rotary_factor",
    "sliding_window",
    "layer_types",
)


@dataclass(frozen=True)
class RopeScaling:
    """``rope_scaling`` of type "llama3" (Llama 3.1+ frequency smoothing)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LongRope:
    """``rope_scaling`` of type "longrope" (Phi-3): per-frequency divisors ``[R/2]`` (short
    up to ``original_max_position_embeddings`` positions, long beyond) and a cos/sin
    multiplier."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    attention_factor: float


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and switches of a decoder (every family: see :mod:`trt_kv.models.family`).
    Defaults are HuggingFaceTB/SmolLM2-135M (Llama switches).

    Raises:
        ConfigError: a size that is not a positive integer, heads not a multiple of KV
            heads, an odd head size, a non-positive eps or theta, an unknown family or
            activation, a rotary size that is not even.
    """

    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    rope_scaling: RopeScaling | LongRope | None = None
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192
    model_type: str = "llama"
    qkv_bias: bool = False  # biases on the q/k/v projections
    o_bias: bool = False  # a bias on the output projection
    qk_norm: bool = False  # per-head RMSNorm [H] of q and k before RoPE
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w), in float32 when nonzero
    activation: str = "silu"  # gated MLP activation: "silu" or "gelu_tanh"
    embed_scale: bool = False  # embeddings times sqrt(D) in the compute dtype
    partial_rotary_factor: float = 1.0  # RoPE rotates the first int(H * factor) dims
    sliding_window: int | None = None  # keys j with position - window < j <= position
    layer_types: tuple[str, ...] | None = None  # per layer; None: every layer (if windowed)

    @property
    def rotary_dim(self) -> int:
        """R, the leading dims of each head that RoPE rotates (HF: ``int(H * factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    def __post_init__(self) -> None:
        for name in SIZES:
            positive_int(name, getattr(self, name))
        positive_number("rms_norm_eps", self.rms_norm_eps)
        positive_number("rope_theta", self.rope_theta)
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigError(
                mismatch("tie_word_embeddings", "true or false", "", repr(self.tie_word_embeddings))
            )
        if self.head_dim % 2:
            raise ConfigError(mismatch("head_dim", "an even number", "", self.head_dim))
        family_of(self.model_type)
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                mismatch("layer_types", "length", self.num_hidden_layers, len(self.layer_types))
            )
        if self.activation not in ("silu", "gelu_tanh"):
            raise ConfigError(mismatch("activation", "one of", ("silu", "gelu_tanh"), ""))
        if self.rotary_dim % 2 or self.rotary_dim <= 0:
            raise ConfigError(mismatch("rotary_dim", "an even number > 0", "", self.rotary_dim))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                mismatch(
                    "num_attention_heads",
                    f"a multiple of num_key_value_heads={self.num_key_value_heads}",
                    "",
                    self.num_attention_heads,
                )
            )

    @classmethod
    def smollm2_135m(cls) -> LlamaConfig:
        return cls()

    @classmethod
    def from_hf(cls, source: dict | str | Path) -> LlamaConfig:
        """Read a Hugging Face ``config.json`` (a dict, the file, or its folder).

        Raises:
            ConfigError: a model type not in ``trt_kv.models.family.FAMILIES``; a switch that
                family does not build (activation, biases, window); a ``REFUSED_UNLESS`` key
                at a value not built here; a rope type other than default/llama3/longrope
                (Phi-3); a key in no list; a missing required key; a value of the wrong type
                or range. Each message names the key and the value.
            ArgumentError: ``source`` is none of a dict, a str or a path.
        """
        if not isinstance(source, (dict, str, os.PathLike)):
            raise ArgumentError(
                mismatch(
                    "source",
                    "a config dict, or a config.json file or its folder",
                    "",
                    type(source).__name__,
                )
            )
        if not isinstance(source, dict):
            from trt_kv.checkpoints.hf import read_json

            path = Path(source)
            source = read_json(path / "config.json" if path.is_dir() else path)
        d = source
        family = family_of(d.get("model_type", "llama"))
        for key, (built, what) in REFUSED_UNLESS.items():
            if key in d and not built(d[key]):
                raise ConfigError(mismatch(f"config.{key}", what, "", json.dumps(d[key])))
        known = ACCEPTED | IMPLEMENTED | set(REFUSED_UNLESS) | family.keys
        unknown = sorted(k for k in d if k not in known)
        if unknown:
            raise ConfigError(
                mismatch("config.json", "only keys trt_kv knows", "", f"unknown {unknown}")
            )
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise ConfigError(
                mismatch("config.json", "the keys", list(REQUIRED), f"missing {missing}")
            )
        for key in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
            positive_int(key, d[key])
        switches = family_switches(d, d["num_hidden_layers"])
        theta, scaling, partial = _rope(d)
        model_type = switches["model_type"]
        if partial != 1.0 and "partial_rotary_factor" not in family_of(model_type).keys:
            # transformers' default RoPE for these families rotates the whole head whatever
            # the factor says; building a partial rotation would differ from it, and
            # ignoring the key would hide a config that may mean it: refuse.
            raise ConfigError(
                mismatch(
                    "config.partial_rotary_factor",
                    f"1.0 ({model_type} rotates the whole head)",
                    "",
                    partial,
                )
            )
        heads = d["num_attention_heads"]
        kv_heads, head_dim = d.get("num_key_value_heads"), d.get("head_dim")
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else kv_heads,
            head_dim=d["hidden_size"] // heads if head_dim is None else head_dim,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            partial_rotary_factor=partial,
            **switches,
        )

    def to_hf(self) -> dict:
        """The ``config.json`` transformers would write for a Llama of this shape
        (``from_hf``'s inverse; llama3 RoPE scaling kept, family switches not written).

        Raises:
            ConfigError: a config with another family's switches.
        """
        switched = [
            f.name
            for f in fields(self)
            if f.name in _SWITCHES and getattr(self, f.name) != f.default
        ]
        if switched:
            raise ConfigError(mismatch("to_hf", "Llama switches only", "", f"switched {switched}"))
        skip = ("rope_theta", "rope_scaling", *_SWITCHES)
        d = {k: v for k, v in asdict(self).items() if k not in skip}
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if isinstance(self.rope_scaling, RopeScaling):
            rope = {**rope, "rope_type": "llama3", **asdict(self.rope_scaling)}
        return {
            "architectures": [family_of("llama").architecture],
            "model_type": "llama",
            **d,
            "rope_parameters": rope,
        }

    def to_json(self) -> dict:
        """The fields as JSON values; family switches only where they differ from Llama's
        (a Llama config reads as it always did)."""
        d = asdict(self)
        for f in fields(self):
            if f.name in _SWITCHES and d[f.name] == f.default:
                del d[f.name]
        if d.get("layer_types") is not None:
            d["layer_types"] = list(d["layer_types"])
        if isinstance(self.rope_scaling, LongRope):
            d["rope_scaling"] = {
                k: list(v) if isinstance(v, tuple) else v for k, v in d["rope_scaling"].items()
            }
        return d

    @classmethod
    def from_json(cls, d: dict) -> LlamaConfig:
        d = dict(d)
        rope = d.get("rope_scaling")
        if rope and "short_factor" in rope:
            rope = {**rope, **{k: tuple(rope[k]) for k in _LONGROPE_FIELDS}}
            d["rope_scaling"] = LongRope(**rope)
        elif rope:
            d["rope_scaling"] = RopeScaling(**rope)
        if d.get("layer_types") is not None:
            d["layer_types"] = tuple(d["layer_types"])
        return cls(**d)


def _longrope(d: dict, rope: dict, rotary_dim: int) -> LongRope:
    """Phi-3's longrope fields, with transformers' default attention factor
    ``sqrt(1 + ln(factor) / ln(original))``, factor = max / original positions."""
    original = rope.get(
        "original_max_position_embeddings", d.get("original_max_position_embeddings")
    )
    absent = [k for k in _LONGROPE_FIELDS if k not in rope] + (
        ["original_max_position_embeddings"] if original is None else []
    )
    if absent:
        raise ConfigError(
            mismatch(
                "config.rope_scaling (longrope)",
                "the keys",
                list(_LONGROPE_FIELDS),
                f"missing {absent}",
            )
        )
    for key in _LONGROPE_FIELDS:
        if len(rope[key]) != rotary_dim // 2:
            raise ConfigError(
                mismatch(f"config.rope_scaling.{key}", "length", rotary_dim // 2, len(rope[key]))
            )
    factor = rope.get("factor") or d.get("max_position_embeddings", 2048) / original
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return LongRope(
        tuple(float(f) for f in rope["short_factor"]),
        tuple(float(f) for f in rope["long_factor"]),
        int(original),
        float(attention),
    )


def _rope(d: dict) -> tuple[float, RopeScaling | LongRope | None, float]:
    """``(rope_theta, scaling or None, partial_rotary_factor)`` from ``rope_parameters``
    (transformers >= 5) or a legacy ``rope_scaling``, which replaces them whole (as
    transformers does), with theta from the top level.

    Raises:
        ConfigError: a rope type other than default/llama3/longrope, keys that type does not
            have, missing fields, values of the wrong type.
    """
    key = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    rope = d.get(key) or {}
    if not isinstance(rope, dict):
        raise ConfigError(mismatch(f"config.{key}", "an object or null", "", json.dumps(rope)))
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    positive_number(f"config.{key}.rope_theta", theta)
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    positive_number(f"config.{key}.partial_rotary_factor", partial)
    kind = rope.get("rope_type", rope.get("type", "default"))
    kinds = ("default", "llama3", "longrope")
    if kind not in kinds or (kind == "longrope" and d.get("model_type") != "phi3"):
        raise ConfigError(mismatch(f"config.{key}.rope_type", "one of", list(kinds), repr(kind)))
    extra = sorted(set(rope) - _ROPE_KEYS[kind])
    if extra:
        raise ConfigError(
            mismatch(f"config.{key} ({kind})", "no other keys", "", f"unknown {extra}")
        )
    if kind == "default":
        return float(theta), None, float(partial)
    if kind == "longrope":
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        return float(theta), _longrope(d, rope, int(head_dim * partial)), float(partial)
    absent = [k for k in _LLAMA3_FIELDS if k not in rope]
    if absent:
        raise ConfigError(
            mismatch(
                f"config.{key} (llama3)", "the keys", list(_LLAMA3_FIELDS), f"missing {absent}"
            )
        )
    for k in _LLAMA3_FIELDS:
        positive_number(f"config.{key}.{k}", rope[k])
    scaling = RopeScaling(
        float(rope["factor"]),
        float(rope["low_freq_factor"]),
        float(rope["high_freq_factor"]),
        int(rope["original_max_position_embeddings"]),
    )
    return float(theta), scaling, float(partial)
