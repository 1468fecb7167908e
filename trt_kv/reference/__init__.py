"""NumPy reference implementations of every op (each model's NumPy forward lives with the
model: :mod:`trt_kv.models.llama.reference`, :mod:`trt_kv.models.gpt2.reference`)."""

from trt_kv.reference.ops import (
    apply_rope,
    attention,
    causal_keep,
    kv_cache_update,
    kv_cache_update_,
    linear,
    rms_norm,
    silu,
    swiglu,
)

__all__ = [
    "apply_rope",
    "attention",
    "causal_keep",
    "kv_cache_update",
    "kv_cache_update_",
    "linear",
    "rms_norm",
    "silu",
    "swiglu",
]
