"""Llama-family decoder: config, weights, network builder, NumPy reference forward
(:mod:`~trt_kv.models.llama.reference`) and its backend (``reference_backend``)."""

from trt_kv.models.llama.config import LlamaConfig, RopeScaling
from trt_kv.models.llama.network import LlamaNetwork, build_llama_network
from trt_kv.models.llama.rope import inv_freq, rope_tables
from trt_kv.models.llama.weights import (
    LayerWeights,
    LlamaWeights,
    llama_weights,
    load_hf_weights,
    random_weights,
    to_hf_tensors,
)

__all__ = [
    "LayerWeights",
    "LlamaConfig",
    "LlamaNetwork",
    "LlamaWeights",
    "RopeScaling",
    "build_llama_network",
    "inv_freq",
    "llama_weights",
    "load_hf_weights",
    "random_weights",
    "rope_tables",
    "to_hf_tensors",
]
