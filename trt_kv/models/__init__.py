"""Model architectures trt_kv builds networks for."""
