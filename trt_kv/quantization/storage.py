"""The ``weight_format`` build option, and the record of how an engine holds each weight
(the sidecar's ``weights``, shown by ``trt-kv inspect``)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from trt_kv.errors import ArgumentError, mismatch
from trt_kv.quantization.blocks import QuantizedMatrix

# What ``weight_format`` may be besides the activation dtype: INT8 / INT4 quantized at build
# time (symmetric per 32, lossy), or each matrix as the checkpoint stores it.
WEIGHT_FORMATS = ("int8", "int4", "keep")


def check_weight_format(weight_format: str | None, dtype: str) -> str | None:
    """``weight_format`` normalized: None for the activation dtype (None or ``dtype``).

    Raises:
        ArgumentError: anything but None, ``dtype`` or one of :data:`WEIGHT_FORMATS` (a float
            dtype other than the activation dtype included: weights are held in it).
    """
    if weight_format is None or weight_format == dtype:
        return None
    if weight_format not in WEIGHT_FORMATS:
        expected = f"the activation dtype {dtype!r} or one of {WEIGHT_FORMATS}"
        raise ArgumentError(mismatch("weights", expected, "", repr(weight_format)))
    return weight_format


def weight_storage(
    tensors: dict[str, np.ndarray],
    quantized: dict[str, QuantizedMatrix],
    weight_format: str | None,
    dtype: str,
) -> dict:
    """How the network holds each weight: ``format``; ``quantized``, a count per stored form
    ("Q4_1 -> int4 block 32 + mins"); ``exact``, the source types held as stored;
    ``requantized``, the count and largest error of the matrices that were re-quantized
    (build-time quantization, GGUF types with no exact form), and that error per source type;
    ``activation_dtype``, the names of the matrices held in ``dtype`` and the count of the
    vectors (norms, biases)."""
    counts = Counter(f"{q.source} -> {q.kind}" for q in quantized.values())
    errors = {k: q.max_error for k, q in quantized.items() if not q.exact}
    by_type: dict[str, float] = {}
    for q in quantized.values():
        if not q.exact:
            by_type[q.source] = max(by_type.get(q.source, 0.0), q.max_error)
    plain = sorted(k for k, a in tensors.items() if a.ndim >= 2 and k not in quantized)
    vectors = sum(a.ndim < 2 for a in tensors.values())
    return {
        "format": weight_format or dtype,
        "dtype": dtype,
        "quantized": dict(sorted(counts.items())),
        "exact": sorted({q.source for q in quantized.values() if q.exact}),
        "requantized": {
            "count": len(errors),
            "max_error": max(errors.values(), default=0.0),
            "by_type": dict(sorted(by_type.items())),
        },
        "activation_dtype": {"matrices": plain, "vectors": vectors},
    }
