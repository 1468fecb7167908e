"""GGUF files (llama.cpp's format) into a :class:`Checkpoint`, read with the ``gguf`` package.

Every tensor type the package can dequantize (F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants,
the I-quants...) becomes a float array of the requested dtype. llama.cpp's converter permutes
the rows of the Q and K projections for its RoPE layout; that is undone here, so the arrays
are Hugging Face's. The config comes from the ``{arch}.*`` metadata, translated to
``config.json`` keys; the tokenizer from the ``tokenizer.ggml.*`` vocabulary and merges.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from trt_kv.checkpoints.checkpoint import Checkpoint
from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.errors import ConfigError, mismatch
from trt_kv.progress import track


@dataclass(frozen=True)
class GgufArchitecture:
    """How one ``general.architecture`` maps to Hugging Face: its ``model_type``, metadata
    keys (``{arch}.<key>`` -> config key), and tensor names."""

    model_type: str
    hf_architecture: str  # config.json "architectures"
    metadata: dict[str, str]
    tensors: dict[str, str]  # GGUF name -> HF name
    block_tensors: dict[str, str]  # "blk.{i}.<name>" -> "model.layers.{i}.<name>"


_LLAMA = GgufArchitecture(
    model_type="llama",
    hf_architecture="LlamaForCausalLM",
    metadata={
        "block_count": "num_hidden_layers",
        "context_length": "max_position_embeddings",
        "embedding_length": "hidden_size",
        "feed_forward_length": "intermediate_size",
        "attention.head_count": "num_attention_heads",
        "attention.head_count_kv": "num_key_value_heads",
        "attention.key_length": "head_dim",
        "attention.layer_norm_rms_epsilon": "rms_norm_eps",
        "vocab_size": "vocab_size",
    },
    tensors={
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    },
    block_tensors={
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
    },
)

# general.architecture -> mapping; a family added later is one more entry.
ARCHITECTURES: dict[str, GgufArchitecture] = {"llama": _LLAMA}

# GGUF rope scaling kind -> Hugging Face rope_type (LlamaConfig refuses the ones not built).
_ROPE_TYPES = {"none": "default", "linear": "linear", "yarn": "yarn", "longrope": "longrope"}


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K permutation: per head, its converter interleaves the two halves
    of the rotary dimension (rows ``[0, H/2, 1, H/2 + 1, ...]``); this restores Hugging
    Face's half-split order. ``w [n_head * H, D]`` (a bias ``[n_head * H]`` too)."""
    rows = w.shape[0]
    h = rows // n_head
    return w.reshape(n_head, h // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Fields:
    """``GGUFReader.fields`` as plain values, with messages naming the key."""

    def __init__(self, reader: object, path: Path) -> None:
        self.fields = reader.fields
        self.path = path

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: object = None) -> object:
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> object:
        if key not in self.fields:
            raise ConfigError(mismatch(f"{self.path.name}: {key}", "a metadata key", "", "missing"))
        return self.get(key)


def _open(path: Path) -> object:
    from gguf import GGUFReader

    if not path.is_file():
        raise ConfigError(mismatch(str(path), "a GGUF file", "", "missing"))
    try:
        return GGUFReader(str(path))
    except Exception as err:  # gguf raises ValueError, struct.error, IndexError... on bad bytes
        raise ConfigError(
            mismatch(str(path), "a GGUF file", "", f"{type(err).__name__}: {err}")
        ) from err


def _config(fields: _Fields, arch_name: str, arch: GgufArchitecture, has_head: bool) -> dict:
    """Hugging Face ``config.json`` keys from the ``{arch}.*`` metadata."""
    config: dict = {"model_type": arch.model_type, "architectures": [arch.hf_architecture]}
    for key, hf_key in arch.metadata.items():
        value = fields.get(f"{arch_name}.{key}")
        if value is not None:
            config[hf_key] = value
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in fields:
        config["vocab_size"] = len(fields.get("tokenizer.ggml.tokens"))
    heads = config.get("num_attention_heads")
    rope_dim = fields.get(f"{arch_name}.rope.dimension_count")
    head_dim = config.get("head_dim") or (
        config["hidden_size"] // heads if heads and "hidden_size" in config else None
    )
    if rope_dim is not None and head_dim is not None and rope_dim != head_dim:
        raise ConfigError(
            mismatch(f"{arch_name}.rope.dimension_count", "the head size", head_dim, rope_dim)
        )
    rope = {"rope_type": "default", "rope_theta": fields.get(f"{arch_name}.rope.freq_base", 1e4)}
    kind = fields.get(f"{arch_name}.rope.scaling.type", "none")
    if kind != "none":
        rope = {
            **rope,
            "rope_type": _ROPE_TYPES.get(kind, kind),
            "factor": fields.get(f"{arch_name}.rope.scaling.factor"),
        }
    config["rope_parameters"] = rope
    config["tie_word_embeddings"] = not has_head
    for name in ("bos", "eos", "padding"):
        token = fields.get(f"tokenizer.ggml.{name}_token_id")
        if token is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token)
    return config


def _tensor_name(name: str, arch: GgufArchitecture) -> str | None:
    if name in arch.tensors:
        return arch.tensors[name]
    parts = name.split(".", 2)
    if (
        len(parts) == 3
        and parts[0] == "blk"
        and parts[1].isdigit()
        and parts[2] in arch.block_tensors
    ):
        return f"model.layers.{parts[1]}.{arch.block_tensors[parts[2]]}"
    return None


def _dequantize(tensor: object, dtype: np.dtype, path: Path) -> np.ndarray:
    from gguf import quants

    try:
        array = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as err:
        raise ConfigError(
            mismatch(
                f"{path.name}: {tensor.name}",
                "a tensor type gguf can dequantize",
                "",
                tensor.tensor_type.name,
            )
        ) from err
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists ne0 (columns) first
    return np.asarray(array, dtype=dtype).reshape(shape)


def _tokenizer(fields: _Fields) -> TextTokenizer:
    ids = {
        "bos_token": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token": fields.get("tokenizer.ggml.eos_token_id"),
        "unk_token": fields.get("tokenizer.ggml.unknown_token_id"),
        "pad_token": fields.get("tokenizer.ggml.padding_token_id"),
    }
    return TextTokenizer.from_gguf_vocab(
        model=fields.require("tokenizer.ggml.model"),
        pre=fields.get("tokenizer.ggml.pre", "default"),
        tokens=fields.require("tokenizer.ggml.tokens"),
        merges=fields.get("tokenizer.ggml.merges", []),
        token_types=fields.get("tokenizer.ggml.token_type", []),
        special_ids={k: (None if v is None else int(v)) for k, v in ids.items()},
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=fields.get("tokenizer.chat_template"),
    )


def read_gguf(path: str | Path, dtype: str | np.dtype = np.float32) -> Checkpoint:
    """Read a GGUF file: config from metadata, every tensor dequantized to ``dtype`` under its
    Hugging Face name (Q/K rows back in Hugging Face order), EOS ids, the tokenizer. A
    progress bar counts the tensors dequantized (see :mod:`trt_kv.progress`).

    Raises:
        ConfigError: a missing or malformed file, an architecture not in ``ARCHITECTURES``,
            a tensor name or type not known, missing metadata.
    """
    path = Path(path)
    reader = _open(path)
    fields = _Fields(reader, path)
    arch_name = fields.require("general.architecture")
    if arch_name not in ARCHITECTURES:
        raise ConfigError(
            mismatch(
                f"{path.name}: general.architecture",
                "one of",
                sorted(ARCHITECTURES),
                repr(arch_name),
            )
        )
    arch = ARCHITECTURES[arch_name]
    names = {t.name: _tensor_name(t.name, arch) for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ConfigError(
            mismatch(
                f"{path.name}: rope_freqs.weight",
                "no per-frequency RoPE factors (Llama 3.1 scaling from GGUF is not implemented)",
                "",
                "present",
            )
        )
    unknown = sorted(k for k, v in names.items() if v is None)
    if unknown:
        raise ConfigError(
            mismatch(f"{path.name}: tensors", "only known names", "", f"unknown {unknown[:8]}")
        )
    config = _config(fields, arch_name, arch, has_head="output.weight" in names)
    if any(v.endswith(".bias") and "self_attn" in v for v in names.values()):
        config["attention_bias"] = True  # the config check refuses it, naming the key
    if any(v.endswith(".bias") and ".mlp." in v for v in names.values()):
        config["mlp_bias"] = True
    permuted = {"self_attn.q_proj": config.get("num_attention_heads")}
    permuted["self_attn.k_proj"] = config.get("num_key_value_heads") or permuted["self_attn.q_proj"]
    tensors: dict[str, np.ndarray] = {}
    for tensor in track(reader.tensors, f"dequantize {path.name}", unit="tensor"):
        hf_name = names[tensor.name]
        array = _dequantize(tensor, np.dtype(dtype), path)
        for proj, n_head in permuted.items():
            if f".{proj}." in hf_name and n_head:
                array = unpermute_rows(array, int(n_head))
        tensors[hf_name] = array
    eos = [fields.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
    return Checkpoint(
        name=path.stem,
        config=config,
        tensors=tensors,
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos if e is not None)),
        source=str(path),
        tokenizer_loader=partial(_tokenizer, fields) if "tokenizer.ggml.model" in fields else None,
    )
