"""Weights kept quantized in an engine: INT8/INT4 codes with block scales
(:mod:`.blocks`), their place in a network (:mod:`.network`)."""

from trt_kv.quantization.blocks import (
    BLOCK,
    QuantizedMatrix,
    quantize_asymmetric4,
    quantize_symmetric,
)

__all__ = ["BLOCK", "QuantizedMatrix", "quantize_asymmetric4", "quantize_symmetric"]
