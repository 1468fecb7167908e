"""GPT-2 (``GPT2LMHeadModel``): config, weights from a Hugging Face folder, network builder,
NumPy reference forward and its backend."""

from trt_kv.models.gpt2.config import GPT2Config
from trt_kv.models.gpt2.network import GPT2Network, build_gpt2_network
from trt_kv.models.gpt2.reference import GPT2ReferenceBackend, forward
from trt_kv.models.gpt2.weights import GPT2Layer, GPT2Weights, gpt2_weights

__all__ = [
    "GPT2Config",
    "GPT2Layer",
    "GPT2Network",
    "GPT2ReferenceBackend",
    "GPT2Weights",
    "build_gpt2_network",
    "forward",
    "gpt2_weights",
]
