"""NumPy reference implementations: every op, and the whole Llama model."""

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
