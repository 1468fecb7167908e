"""Llama-family configuration: one dataclass, a SmolLM2-135M preset, ``from_hf``.

Which ``config.json`` keys matter was read off transformers' ``LlamaConfig``,
``PreTrainedConfig`` and ``modeling_llama.py`` (5.x): ``ACCEPTED`` keys do not change the
network (bookkeeping, token ids, training-only settings); ``IMPLEMENTED`` ones are read into
:class:`LlamaConfig`; ``REFUSED_UNLESS`` keys change the network, and only the value built here
is accepted. Any other key is refused, so nothing that could change the network passes
unread.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from trt_kv.errors import ConfigError, mismatch

# model_type -> architecture built for it (a family added later is one more entry).
MODEL_TYPES = {"llama": "LlamaForCausalLM"}

# Keys that do not change the network. Bookkeeping written by save_pretrained and the hub;
# token ids (generation reads EOS from generation_config.json / config.json); settings used
# only in training (dropout, initializer_range, gradient checkpointing); output switches;
# generation defaults older transformers stored in config.json; and keys modeling_llama.py
# never reads: pretraining_tp (transformers < 4.45 split each matmul into that many slices
# and summed them, the same product), rope_interleaved and is_llama_config (nanotron's).
ACCEPTED = frozenset(
    {
        "_name_or_path",
        "_model_name_or_path",
        "_commit_hash",
        "_attn_implementation_autoset",
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "use_cache",
        "initializer_range",
        "attention_dropout",
        "hidden_dropout",
        "gradient_checkpointing",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "id2label",
        "label2id",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "chunk_size_feed_forward",
        "pruned_heads",
        "tf_legacy_loss",
        "is_decoder",
        "is_encoder_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "cross_attention_hidden_size",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "pretraining_tp",
        "rope_interleaved",
        "is_llama_config",
    }
)

_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
# Sizes that must be integers > 0.
_SIZES = (*_REQUIRED, "num_key_value_heads", "head_dim", "max_position_embeddings")
# Keys read into LlamaConfig (their values are checked).
IMPLEMENTED = frozenset(
    {
        *_SIZES,
        "rms_norm_eps",
        "rope_theta",
        "rope_parameters",
        "rope_scaling",
        "tie_word_embeddings",
    }
)


def _full_attention_only(v: object) -> bool:
    # transformers renames the legacy "attention" to "full_attention"
    return v is None or (
        isinstance(v, list) and all(t in ("full_attention", "attention") for t in v)
    )


# Keys that change the network: key -> (is the value the one built here?, what is built).
REFUSED_UNLESS = {
    "hidden_act": (lambda v: v in ("silu", "swish"), "'silu' (SwiGLU)"),
    "attention_bias": (lambda v: v is False, "false (no attention biases)"),
    "mlp_bias": (lambda v: v is False, "false (no MLP biases)"),
    "sliding_window": (lambda v: v is None, "null (no sliding window)"),
    "attention_chunk_size": (lambda v: v is None, "null (no chunked attention)"),
    "layer_types": (_full_attention_only, "only 'full_attention' layers"),
    "quantization_config": (lambda v: False, "no quantization (float weights)"),
}

_LLAMA3_FIELDS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
_ROPE_KEYS = {"default": {"rope_type", "type", "rope_theta"}}
_ROPE_KEYS["llama3"] = _ROPE_KEYS["default"] | set(_LLAMA3_FIELDS)


@dataclass(frozen=True)
class RopeScaling:
    """``rope_scaling`` of type "llama3" (Llama 3.1+ frequency smoothing)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(mismatch(name, "an integer > 0", "", repr(value)))


def _positive_number(name: str, value: object) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ConfigError(mismatch(name, "a finite number > 0", "", repr(value)))


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-family decoder. Defaults are HuggingFaceTB/SmolLM2-135M.

    Raises:
        ConfigError: a size that is not a positive integer, heads not a multiple of KV
            heads, an odd head size, a non-positive eps or theta.
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
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        for name in _SIZES:
            _positive_int(name, getattr(self, name))
        _positive_number("rms_norm_eps", self.rms_norm_eps)
        _positive_number("rope_theta", self.rope_theta)
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigError(
                mismatch("tie_word_embeddings", "true or false", "", repr(self.tie_word_embeddings))
            )
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
            ConfigError: a model type not in ``MODEL_TYPES``; a ``REFUSED_UNLESS`` key with
                a value not built here; a rope type other than default/llama3; a key in no
                list; a missing required key; a value of the wrong type or range. Each
                message names the key and the value.
        """
        if not isinstance(source, dict):
            from trt_kv.checkpoints.hf import read_json

            path = Path(source)
            source = read_json(path / "config.json" if path.is_dir() else path)
        d = source
        model_type = d.get("model_type", "llama")
        if model_type not in MODEL_TYPES:
            raise ConfigError(
                mismatch("config.model_type", "one of", sorted(MODEL_TYPES), repr(model_type))
            )
        for key, (built, what) in REFUSED_UNLESS.items():
            if key in d and not built(d[key]):
                raise ConfigError(mismatch(f"config.{key}", what, "", json.dumps(d[key])))
        unknown = sorted(k for k in d if k not in ACCEPTED | IMPLEMENTED | set(REFUSED_UNLESS))
        if unknown:
            raise ConfigError(
                mismatch("config.json", "only keys trt_kv knows", "", f"unknown {unknown}")
            )
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ConfigError(
                mismatch("config.json", "the keys", list(_REQUIRED), f"missing {missing}")
            )
        theta, scaling = _rope(d)
        heads = d["num_attention_heads"]
        _positive_int("num_attention_heads", heads)
        _positive_int("hidden_size", d["hidden_size"])
        kv_heads = d.get("num_key_value_heads")
        head_dim = d.get("head_dim")
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
        )

    def to_hf(self) -> dict:
        """The ``config.json`` transformers would write for this shape (``from_hf``'s inverse)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("rope_theta", "rope_scaling")}
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope = {**rope, "rope_type": "llama3", **asdict(self.rope_scaling)}
        return {
            "architectures": [MODEL_TYPES["llama"]],
            "model_type": "llama",
            **d,
            "rope_parameters": rope,
        }

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> LlamaConfig:
        d = dict(d)
        if d.get("rope_scaling"):
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        return cls(**d)


def _rope(d: dict) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, llama3 scaling or None)`` from ``rope_parameters`` (transformers >= 5)
    or a legacy ``rope_scaling``, which replaces them whole (as transformers does), with theta
    from the top level."""
    rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
    key = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    if not isinstance(rope, dict):
        raise ConfigError(mismatch(f"config.{key}", "an object or null", "", json.dumps(rope)))
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    _positive_number(f"config.{key}.rope_theta", theta)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in _ROPE_KEYS:
        raise ConfigError(
            mismatch(f"config.{key}.rope_type", "one of", sorted(_ROPE_KEYS), repr(kind))
        )
    extra = sorted(set(rope) - _ROPE_KEYS[kind])
    if extra:
        raise ConfigError(
            mismatch(f"config.{key} ({kind})", "no other keys", "", f"unknown {extra}")
        )
    if kind == "default":
        return float(theta), None
    absent = [k for k in _LLAMA3_FIELDS if k not in rope]
    if absent:
        raise ConfigError(
            mismatch(
                f"config.{key} (llama3)", "the keys", list(_LLAMA3_FIELDS), f"missing {absent}"
            )
        )
    for k in _LLAMA3_FIELDS:
        _positive_number(f"config.{key}.{k}", rope[k])
    scaling = RopeScaling(
        float(rope["factor"]),
        float(rope["low_freq_factor"]),
        float(rope["high_freq_factor"]),
        int(rope["original_max_position_embeddings"]),
    )
    return float(theta), scaling
