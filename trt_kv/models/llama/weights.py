"""Llama weights in Hugging Face layout, taken from a checkpoint or made up from a seed.

Hugging Face names are mapped here and nowhere else (the readers in ``trt_kv.checkpoints``
keep them as stored). Layouts are Hugging Face's
(``nn.Linear``: ``[out_features, in_features]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trt_kv.errors import (
    ArgumentError,
    ConfigError,
    DTypeError,
    ShapeError,
    check_int,
    check_real,
    mismatch,
)
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.tied_head import check_tied_head
from trt_kv.progress import track
from trt_kv.quantization import QuantizedMatrix, quantize_symmetric


@dataclass
class LayerWeights:
    """One decoder block. D = hidden, F = intermediate, Nq/Nkv heads of size H."""

    attn_norm: np.ndarray  # [D]
    wq: np.ndarray  # [Nq * H, D]
    wk: np.ndarray  # [Nkv * H, D]
    wv: np.ndarray  # [Nkv * H, D]
    wo: np.ndarray  # [D, Nq * H]
    mlp_norm: np.ndarray  # [D]
    w_gate: np.ndarray  # [F, D]
    w_up: np.ndarray  # [F, D]
    w_down: np.ndarray  # [D, F]
    bq: np.ndarray | None = None  # [Nq * H] (config.qkv_bias)
    bk: np.ndarray | None = None  # [Nkv * H]
    bv: np.ndarray | None = None  # [Nkv * H]
    bo: np.ndarray | None = None  # [D] (config.o_bias)
    q_norm: np.ndarray | None = None  # [H] (config.qk_norm)
    k_norm: np.ndarray | None = None  # [H]


@dataclass
class LlamaWeights:
    embed: np.ndarray  # [V, D]
    layers: list[LayerWeights]
    final_norm: np.ndarray  # [D]
    lm_head: np.ndarray | None  # [V, D]; None when tied to ``embed``
    # Hugging Face name -> the matrix as the checkpoint stores it quantized (GGUF), beside
    # its float values above; what an engine built with weights="keep" holds
    quantized: dict[str, QuantizedMatrix] = field(default_factory=dict, repr=False)

    @property
    def head(self) -> np.ndarray:
        """The LM head ``[V, D]`` (the embedding when tied)."""
        return self.embed if self.lm_head is None else self.lm_head

    def astype(self, dtype: np.dtype) -> LlamaWeights:
        cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
        return LlamaWeights(
            cast(self.embed),
            [LayerWeights(**{k: cast(v) for k, v in vars(lw).items()}) for lw in self.layers],
            cast(self.final_norm),
            cast(self.lm_head),
            self.quantized,
        )


_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
    "bo": "self_attn.o_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
}
# Phi-3's fused projections: fused name -> the names it splits into, in order.
_FUSED = {
    "self_attn.qkv_proj.weight": ("wq", "wk", "wv"),
    "mlp.gate_up_proj.weight": ("w_gate", "w_up"),
}


def _switched_off(config: LlamaConfig) -> set[str]:
    """Layer weights the config's switches leave out."""
    off = set()
    if not config.qkv_bias:
        off |= {"bq", "bk", "bv"}
    if not config.o_bias:
        off.add("bo")
    if not config.qk_norm:
        off |= {"q_norm", "k_norm"}
    return off


def split_fused(tensors: dict[str, np.ndarray], config: LlamaConfig) -> dict[str, np.ndarray]:
    """Phi-3's fused ``qkv_proj`` ``[(Nq + 2 Nkv) H, D]`` and ``gate_up_proj`` ``[2F, D]``
    as the separate Llama names (q, k, v rows in order; gate rows, then up); other tensors
    pass through.

    Raises:
        ShapeError: a fused tensor whose rows are not the parts' sum.
    """
    h = config.head_dim
    rows = {
        "wq": config.num_attention_heads * h,
        "wk": config.num_key_value_heads * h,
        "wv": config.num_key_value_heads * h,
        "w_gate": config.intermediate_size,
        "w_up": config.intermediate_size,
    }
    out = {}
    for name, array in tensors.items():
        prefix, _, rest = name.partition(".layers.")
        index, _, suffix = rest.partition(".")
        if suffix not in _FUSED:
            out[name] = array
            continue
        parts = _FUSED[suffix]
        expected = (sum(rows[p] for p in parts), config.hidden_size)
        if tuple(array.shape) != expected:
            raise ShapeError(mismatch(name, "shape", expected, array.shape))
        start = 0
        for part in parts:
            end = start + rows[part]
            quantized = isinstance(array, QuantizedMatrix)
            piece = array.rows(start, end) if quantized else array[start:end]
            out[f"{prefix}.layers.{index}.{_LAYER_NAMES[part]}"] = piece
            start = end
    return out


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape, for every tensor the model needs."""
    c = config
    d, f, h = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_attention_heads * h, c.num_key_value_heads * h
    per_layer = {
        "attn_norm": (d,),
        "wq": (q, d),
        "wk": (kv, d),
        "wv": (kv, d),
        "wo": (d, q),
        "mlp_norm": (d,),
        "w_gate": (f, d),
        "w_up": (f, d),
        "w_down": (d, f),
        "bq": (q,),
        "bk": (kv,),
        "bv": (kv,),
        "bo": (d,),
        "q_norm": (h,),
        "k_norm": (h,),
    }
    for key in _switched_off(c):
        del per_layer[key]
    shapes = {"model.embed_tokens.weight": (c.vocab_size, d), "model.norm.weight": (d,)}
    for i in range(c.num_hidden_layers):
        for key, shape in per_layer.items():
            shapes[f"model.layers.{i}.{_LAYER_NAMES[key]}"] = shape
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, d)
    return shapes


# Floating dtypes a checkpoint may store (bfloat16 arrives as ml_dtypes' bfloat16).
_FLOAT_KINDS = ("float16", "bfloat16", "float32", "float64")


def _ignored(name: str, config: LlamaConfig) -> bool:
    """Tensors Hugging Face itself drops on load: RoPE tables older versions saved, and a
    head that is tied to the embedding."""
    return name.endswith(".rotary_emb.inv_freq") or (
        name == "lm_head.weight" and config.tie_word_embeddings
    )


def llama_weights(
    tensors: dict[str, np.ndarray],
    config: LlamaConfig,
    quantized: dict[str, QuantizedMatrix] | None = None,
) -> LlamaWeights:
    """The model's arrays from a checkpoint's Hugging Face names (the only place the names
    are mapped; fused Phi-3 projections split), checked against ``config``; arrays keep their
    dtype. ``quantized``: the checkpoint's matrices as stored quantized
    (``Checkpoint.quantized``), kept for the names the model has, fused ones split too.

    Raises:
        ConfigError: a tensor missing, or one the model has no place for (extra layers,
            biases the config does not switch on); a tied config with a stored
            ``lm_head.weight`` other than the embedding (:mod:`trt_kv.models.tied_head`).
            ShapeError: a tensor of the wrong shape.
            DTypeError: a non-float tensor.
    """
    tensors = split_fused(tensors, config)
    if config.tie_word_embeddings:
        check_tied_head(tensors, "model.embed_tokens.weight")
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        raise ConfigError(
            mismatch("checkpoint", f"all {len(shapes)} tensors", "", f"missing {missing[:5]}")
        )
    extra = sorted(k for k in tensors if k not in shapes and not _ignored(k, config))
    if extra:
        raise ConfigError(
            mismatch(
                "checkpoint", "only tensors the config has a place for", "", f"extra {extra[:5]}"
            )
        )
    for name, shape in shapes.items():
        array = tensors[name]
        if str(array.dtype) not in _FLOAT_KINDS:
            raise DTypeError(mismatch(name, "dtype one of", list(_FLOAT_KINDS), array.dtype))
        if array.shape != shape:
            raise ShapeError(mismatch(name, "shape", shape, array.shape))
    weights = _from_named(tensors, config)
    stored = split_fused(quantized or {}, config)
    weights.quantized = {k: q for k, q in stored.items() if shapes.get(k) == q.shape}
    return weights


def check_weights(weights: object, config: LlamaConfig) -> LlamaWeights:
    """``weights`` once every array is where ``config`` wants it, with its shape and a float
    dtype (the checks of :func:`llama_weights`, on the arrays' Hugging Face names).

    Raises:
        ArgumentError: ``weights`` not a :class:`LlamaWeights`. ConfigError, ShapeError,
            DTypeError: as :func:`llama_weights` (weights of another config, say).
    """
    if not isinstance(weights, LlamaWeights):
        raise ArgumentError(mismatch("weights", "a LlamaWeights", "", type(weights).__name__))
    llama_weights(to_hf_tensors(weights), config)
    return weights


def load_hf_weights(folder: str | Path, config: LlamaConfig) -> LlamaWeights:
    """Read a Hugging Face checkpoint folder (single or sharded safetensors) into NumPy.

    Raises:
        ConfigError: missing or malformed files, missing or extra tensors. ShapeError,
            DTypeError: as :func:`llama_weights`.
    """
    from trt_kv.checkpoints.hf import read_safetensors, safetensors_files

    folder = Path(folder)
    return llama_weights(read_safetensors(safetensors_files(folder)), config)


def _from_named(t: dict[str, np.ndarray], config: LlamaConfig) -> LlamaWeights:
    off = _switched_off(config)
    names = {k: n for k, n in _LAYER_NAMES.items() if k not in off}
    layers = [
        LayerWeights(**{k: t[f"model.layers.{i}.{n}"] for k, n in names.items()})
        for i in range(config.num_hidden_layers)
    ]
    head = None if config.tie_word_embeddings else t["lm_head.weight"]
    return LlamaWeights(t["model.embed_tokens.weight"], layers, t["model.norm.weight"], head)


def random_weights(config: LlamaConfig, seed: int = 0, std: float = 0.02) -> LlamaWeights:
    """Seeded random float32 weights (normal(0, std) matrices, norms around 1).

    Raises:
        ArgumentError: ``config`` not a LlamaConfig, ``seed`` not an integer >= 0, ``std``
            not a finite number >= 0.
    """
    if not isinstance(config, LlamaConfig):
        raise ArgumentError(mismatch("config", "a LlamaConfig", "", type(config).__name__))
    rng = np.random.default_rng(check_int("seed", seed, 0))
    std = check_real("std", std, 0.0)
    tensors = {}
    for name, shape in track(expected_shapes(config).items(), "random weights", unit="tensor"):
        if name.endswith("norm.weight"):
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            tensors[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return _from_named(tensors, config)


def to_hf_tensors(weights: LlamaWeights) -> dict[str, np.ndarray]:
    """The inverse of loading: Hugging Face name -> array (for ``save_file``)."""
    out = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.final_norm}
    for i, lw in enumerate(weights.layers):
        for key, name in _LAYER_NAMES.items():
            if getattr(lw, key) is not None:
                out[f"model.layers.{i}.{name}"] = getattr(lw, key)
    if weights.lm_head is not None:
        out["lm_head.weight"] = weights.lm_head
    return out


def layer_name(i: int, key: str) -> str:
    """The Hugging Face name of layer ``i``'s ``key`` (a :class:`LayerWeights` field)."""
    return f"model.layers.{i}.{_LAYER_NAMES[key]}"


EMBED = "model.embed_tokens.weight"


def quantized_matrices(
    weights: LlamaWeights, fmt: str | None, dtype: str = "float16"
) -> dict[str, QuantizedMatrix]:
    """Hugging Face name -> the quantized form an engine holds for each product's matrix
    (the projections and an untied LM head): ``"keep"`` the checkpoint's own
    (``weights.quantized``; float matrices stay float), ``"int8"`` / ``"int4"`` every matrix
    quantized symmetric per 32 (from its float values: lossy), None none. Matrices whose K
    is not a multiple of 32 stay float. The embedding only with ``"keep"``, a head tied to
    it and ``dtype`` float16 or float32 (which hold a GGUF block scale exactly): the network
    gathers from its dequantized table, the same values as the float one, and the head
    multiplies its blocks as stored, as llama.cpp reads a tied Q8_0 head."""
    if fmt is None:
        return {}
    matrices = {k: a for k, a in to_hf_tensors(weights).items() if a.ndim == 2 and k != EMBED}
    if fmt == "keep":
        tied = weights.lm_head is None and dtype in ("float16", "float32")
        names = [*matrices, *([EMBED] if tied else [])]
        return {k: weights.quantized[k] for k in names if k in weights.quantized}
    bits = int(fmt.removeprefix("int"))
    return {
        k: quantize_symmetric(a, bits)
        for k, a in track(matrices.items(), f"quantize {fmt}", unit="matrix")
        if a.shape[1] % 32 == 0
    }
