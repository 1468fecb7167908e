"""Network layers every architecture in trt_kv.models builds with (no model of its own)."""
