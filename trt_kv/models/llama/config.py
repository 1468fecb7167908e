"""Llama-family configuration: one dataclass, a SmolLM2-135M preset, ``from_hf``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trt_kv.errors import ConfigError, mismatch

# Keys of a Hugging Face config.json that do not change the forward pass we build.
_IGNORED = {
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "use_cache",
    "pretraining_tp",
    "attention_dropout",
    "is_llama_config",
    "rope_interleaved",
    "_name_or_path",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "tie_word_embeddings",
    "head_dim",
    "rope_scaling",
    "rope_theta",
    "rope_parameters",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "max_position_embeddings",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "layer_types",
    "id2label",
    "label2id",
    "problem_type",
    "chunk_size_feed_forward",
    "tokenizer_class",
    "bad_words_ids",
}


_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_LLAMA3_FIELDS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)


@dataclass(frozen=True)
class RopeScaling:
    """``rope_scaling`` of type "llama3" (Llama 3.1+ frequency smoothing)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-family decoder. Defaults are HuggingFaceTB/SmolLM2-135M."""

    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                mismatch(
                    "num_attention_heads",
                    f"a multiple of num_key_value_heads={self.num_key_value_heads}",
                    "",
                    self.num_attention_heads,
                )
            )
        if self.head_dim % 2:
            raise ConfigError(mismatch("head_dim", "an even number", "", self.head_dim))

    @classmethod
    def smollm2_135m(cls) -> LlamaConfig:
        return cls()

    @classmethod
    def from_hf(cls, source: dict | str | Path) -> LlamaConfig:
        """Read a Hugging Face ``config.json`` (a dict, the file, or its folder).

        Raises:
            ConfigError: a model type other than llama, an activation other than silu,
                biases, a rope_scaling type other than llama3, or unknown fields.
        """
        if not isinstance(source, dict):
            path = Path(source)
            path = path / "config.json" if path.is_dir() else path
            source = json.loads(path.read_text())
        d = source
        if d.get("model_type", "llama") != "llama":
            raise ConfigError(mismatch("config.model_type", "", "llama", d.get("model_type")))
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(mismatch("config.hidden_act", "", "silu", d.get("hidden_act")))
        for key in ("attention_bias", "mlp_bias"):
            if d.get(key, False):
                raise ConfigError(mismatch(f"config.{key}", "", False, d[key]))
        unknown = sorted(k for k in d if k not in _IGNORED)
        if unknown:
            raise ConfigError(mismatch("config.json", "only supported fields, extra", [], unknown))
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ConfigError(mismatch("config.json", "required fields, missing", "", missing))
        # transformers >= 5 nests rope settings in rope_parameters; a legacy rope_scaling
        # replaces them whole (as transformers does), with theta from the top level.
        rope = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        kind = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if kind == "llama3":
            absent = [k for k in _LLAMA3_FIELDS if k not in rope]
            if absent:
                raise ConfigError(
                    mismatch("config.rope_scaling (llama3)", "fields, missing", "", absent)
                )
            scaling = RopeScaling(
                float(rope["factor"]),
                float(rope["low_freq_factor"]),
                float(rope["high_freq_factor"]),
                int(rope["original_max_position_embeddings"]),
            )
        elif kind != "default":
            raise ConfigError(
                mismatch("config.rope_scaling.rope_type", "one of", ("default", "llama3"), kind)
            )
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> LlamaConfig:
        d = dict(d)
        if d.get("rope_scaling"):
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        return cls(**d)
