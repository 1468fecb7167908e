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
        elif value and isinstance(value[0], str):
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


__all__ = ["GGMLQuantizationType", "llama_gguf_tensors", "llama_metadata", "write_gguf"]
