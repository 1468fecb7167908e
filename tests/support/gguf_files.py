"""Writing small GGUF files for tests with the ``gguf`` package's own writer (as llama.cpp's
converter does), so the reader is checked against files it did not make."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter


def llama_cpp_permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf ``LlamaModel.permute``: per head, the rows of the two
    rotary halves are interleaved (written out here from the converter, not from trt_kv)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(path: Path, arch: str, metadata: dict, tensors: dict) -> Path:
    """``metadata``: key -> value (int -> uint32, float -> float32, str, bool, list of str
    or int). ``tensors``: name -> float array (stored as is) or ``(uint8 bytes [rows, nbytes],
    GGMLQuantizationType)``."""
    writer = GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif value and isinstance(value[0], (str, float)):
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, list(value), GGUFValueType.ARRAY, GGUFValueType.INT32)
    for name, value in tensors.items():
        if isinstance(value, tuple):
            data, qtype = value
            writer.add_tensor(name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def patch_tensor_info(path: Path, name: str, qtype=None, offset: int | None = None) -> int:
    """Rewrite tensor ``name``'s info in the header of the GGUF file at ``path``, in place:
    its type to ``qtype``, its data offset to ``offset`` (either may stay). The info is GGUF's
    ``u64 name length, name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset``. Returns
    the offset it had."""
    data = bytearray(path.read_bytes())
    key = len(name).to_bytes(8, "little") + name.encode()
    at = data.index(key) + len(key)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    at += 4 + 8 * n_dims
    if qtype is not None:
        data[at : at + 4] = int(qtype).to_bytes(4, "little")
    old = int.from_bytes(data[at + 4 : at + 12], "little")
    if offset is not None:
        data[at + 4 : at + 12] = offset.to_bytes(8, "little")
    path.write_bytes(bytes(data))
    return old


def llama_metadata(hf_config, arch: str = "llama") -> dict:
    """The ``{arch}.*`` keys llama.cpp writes for a transformers ``LlamaConfig``."""
    return {
        f"{arch}.block_count": hf_config.num_hidden_layers,
        f"{arch}.context_length": hf_config.max_position_embeddings,
        f"{arch}.embedding_length": hf_config.hidden_size,
        f"{arch}.feed_forward_length": hf_config.intermediate_size,
        f"{arch}.attention.head_count": hf_config.num_attention_heads,
        f"{arch}.attention.head_count_kv": hf_config.num_key_value_heads,
        f"{arch}.rope.freq_base": float(hf_config.rope_parameters["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(hf_config.rms_norm_eps),
        f"{arch}.rope.dimension_count": hf_config.head_dim,
        f"{arch}.vocab_size": hf_config.vocab_size,
    }


# Hugging Face name inside model.layers.{i}. -> GGUF name inside blk.{i}. (llama.cpp's table)
GGUF_BLOCK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GGUF_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def llama_gguf_tensors(hf_tensors: dict, hf_config) -> dict:
    """A transformers Llama state dict under llama.cpp's names, Q/K rows permuted."""
    out = {}
    for name, array in hf_tensors.items():
        if name in GGUF_TOP_NAMES:
            out[GGUF_TOP_NAMES[name]] = array
            continue
        _, _, i, rest = name.split(".", 3)
        if rest == "self_attn.q_proj.weight":
            array = llama_cpp_permute(array, hf_config.num_attention_heads)
        elif rest == "self_attn.k_proj.weight":
            array = llama_cpp_permute(array, hf_config.num_key_value_heads)
        out[f"blk.{i}.{GGUF_BLOCK_NAMES[rest]}"] = array
    return out


# -- any family, as llama.cpp's convert_hf_to_gguf.py writes it ------------------------------

# Hugging Face name inside model.layers.{i}. -> GGUF name, beyond the Llama ones (gguf's
# MODEL_TENSORS of qwen3 and phi3).
FAMILY_BLOCK_NAMES = {
    **GGUF_BLOCK_NAMES,
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}


def llama3_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """``LlamaModel.generate_extra_tensors``: the divisor of each frequency under llama3
    scaling (written out here from the converter; its ``original_max_position_embeddings``
    is the top-level key, 8192 when absent, as in Meta's configs)."""
    base = rope["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high, old = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], 8192
    out = []
    for freq in freqs.astype(np.float32):
        wavelen = 2 * np.pi / float(freq)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def family_metadata(hf_config, arch: str, window: int | None = None) -> dict:
    """The ``{arch}.*`` keys the converter writes for ``hf_config`` (``TextModel`` base, then
    ``LlamaModel`` / ``GemmaModel`` / ``Phi3MiniModel``), and a vocabulary of placeholder
    tokens (transformers reads the vocabulary size from it)."""
    c, a = hf_config, arch
    rope = c.rope_parameters
    head_dim = getattr(c, "head_dim", None)
    meta = {
        f"{a}.block_count": c.num_hidden_layers,
        f"{a}.context_length": c.max_position_embeddings,
        f"{a}.embedding_length": c.hidden_size,
        f"{a}.feed_forward_length": c.intermediate_size,
        f"{a}.attention.head_count": c.num_attention_heads,
        f"{a}.attention.head_count_kv": c.num_key_value_heads,
        f"{a}.rope.freq_base": float(rope["rope_theta"]),
        f"{a}.attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(c.vocab_size)],
    }
    for key, name in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        token = getattr(c, f"{key}_token_id", None)
        if isinstance(token, int) and 0 <= token < c.vocab_size:  # SpecialVocab's ids
            meta[f"tokenizer.ggml.{name}_token_id"] = token
    if head_dim is not None:
        meta[f"{a}.attention.key_length"] = meta[f"{a}.attention.value_length"] = head_dim
    if a in ("llama", "mistral3"):
        meta[f"{a}.vocab_size"] = c.vocab_size
        meta[f"{a}.rope.dimension_count"] = head_dim or c.hidden_size // c.num_attention_heads
    if a == "gemma":
        del meta[f"{a}.rope.freq_base"]
    if a == "phi3":
        rot = rope.get("partial_rotary_factor", 1.0)
        meta[f"{a}.rope.scaling.original_context_length"] = c.original_max_position_embeddings
        meta[f"{a}.rope.dimension_count"] = int(rot * c.hidden_size) // c.num_attention_heads
        meta[f"{a}.attention.sliding_window"] = c.sliding_window or 0
        if rope.get("rope_type") == "longrope":  # Phi3MiniModel.generate_extra_tensors
            scale = c.max_position_embeddings / c.original_max_position_embeddings
            log = np.log(scale) / np.log(c.original_max_position_embeddings)
            meta[f"{a}.rope.scaling.attn_factor"] = float(np.sqrt(1 + log)) if scale > 1 else 1.0
    if window is not None:
        meta[f"{a}.attention.sliding_window"] = window
    return meta


def family_gguf_tensors(model, arch: str, dtype=np.float32) -> dict:
    """The model's tensors under llama.cpp's names, transformed as its converter does: Q/K
    rows permuted (llama, mistral3), Gemma norms stored as 1 + w, llama3 RoPE as
    ``rope_freqs``, longrope factors as ``rope_factors_short/long``. Matrices in ``dtype``,
    vectors in float32 (the converter's rule)."""
    c = model.config
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if c.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    out = {}
    for name, array in state.items():
        if name in GGUF_TOP_NAMES:
            gguf_name = GGUF_TOP_NAMES[name]
        else:
            _, _, i, rest = name.split(".", 3)
            gguf_name = f"blk.{i}.{FAMILY_BLOCK_NAMES[rest]}"
            if arch in ("llama", "mistral3") and rest.startswith("self_attn.q_proj."):
                array = llama_cpp_permute(array, c.num_attention_heads)
            elif arch in ("llama", "mistral3") and rest.startswith("self_attn.k_proj."):
                array = llama_cpp_permute(array, c.num_key_value_heads)
        if arch == "gemma" and name.endswith("norm.weight"):
            array = array + 1
        out[gguf_name] = array.astype(dtype if array.ndim == 2 else np.float32)
    rope = c.rope_parameters
    if rope.get("rope_type") == "llama3":
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        out["rope_freqs.weight"] = llama3_rope_freqs(rope, head_dim)
    if rope.get("rope_type") == "longrope":
        out["rope_factors_long.weight"] = np.asarray(rope["long_factor"], np.float32)
        out["rope_factors_short.weight"] = np.asarray(rope["short_factor"], np.float32)
    return out


def write_family_gguf(path: Path, model, arch: str, dtype=np.float32, **meta) -> Path:
    """``model`` (a transformers causal LM) written to ``path`` as llama.cpp would, with
    ``meta`` (``general.name``, a ``window``) on top."""
    window = meta.pop("window", None)
    metadata = {**family_metadata(model.config, arch, window), **meta}
    return write_gguf(path, arch, metadata, family_gguf_tensors(model, arch, dtype))


def trained_vocabulary(corpus, pre_tokenizer, vocab_size, special=(), alphabet=True):
    """``(tokens by id, merges as "a b")`` of a BPE the ``tokenizers`` trainer learns on
    ``corpus`` (repeated 10 times) split by ``pre_tokenizer``; ``alphabet``: start from the
    256 byte-level characters."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if alphabet else [],
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) * 10, trainer)
    model = json.loads(tok.to_str())["model"]
    return sorted(model["vocab"], key=model["vocab"].get), [" ".join(m) for m in model["merges"]]


__all__ = [
    "GGMLQuantizationType",
    "llama_gguf_tensors",
    "llama_metadata",
    "trained_vocabulary",
    "write_family_gguf",
    "write_gguf",
]
