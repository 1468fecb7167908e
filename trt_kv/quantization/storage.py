"""The ``weight_format`` build option, the range check of what a network holds, and the
record of how an engine holds each weight (the sidecar's ``weights``, shown by
``trt-kv inspect``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

from trt_kv.errors import ArgumentError, ConfigError, mismatch
from trt_kv.quantization.blocks import QuantizedMatrix, block_extremes

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


def largest_finite(dtype: str | np.dtype) -> float:
    """The largest value a float dtype (a name or a NumPy dtype) holds: float16 65504,
    bfloat16 ~3.39e38."""
    import ml_dtypes

    from trt_kv import dtypes

    return float(ml_dtypes.finfo(dtypes.to_numpy(dtype) if isinstance(dtype, str) else dtype).max)


def check_held_range(
    named: Iterable[tuple[str, np.ndarray]], quantized: Mapping[str, QuantizedMatrix], dtype: str
) -> None:
    """Refuse, before a network is built, a finite weight that overflows where the network
    holds it: a float array cast to ``dtype`` (1e5 in float16), or a quantized matrix
    (``quantized[name]``, in place of its float values) whose scales, block offsets or
    dequantized weights (``IDequantizeLayer``'s output, in ``dtype``) pass ``dtype``'s
    largest value, or whose float16 block scale overflowed when it was quantized at build
    time (int8 of 1e7): each would run as inf or NaN and give ids ``[0, 0, ...]``.

    A float array whose own dtype holds no larger value than ``dtype`` (float16 into
    float16, anything into float32 but float64) is not read: the check costs one pass over
    the arrays that narrow (and over the codes of quantized matrices).

    Args:
        named: ``(checkpoint name, float array)`` of every weight the network holds.
        quantized: checkpoint name -> the matrix held quantized instead.
        dtype: the network's activation dtype.

    Raises:
        ConfigError: naming the tensor, the largest value ``dtype`` holds and the largest
            magnitude the tensor would hold.
    """
    limit = largest_finite(dtype)
    for name, array in named:
        q = quantized.get(name)
        if q is not None:
            scale = float(np.abs(q.scales).max(initial=0.0))
            mins = 0.0 if q.mins is None else float(np.abs(q.mins).max(initial=0.0))
            # a bound from the scales alone (codes in [-2^(bits-1), 2^(bits-1))), else the
            # exact largest weight from the codes (a pass over them)
            largest = scale * (2 ** (q.bits - 1) + abs(q.zero)) + mins
            if not largest <= limit:
                largest = max(block_extremes(q), scale)
            held = f" as {q.kind} (from {q.source})"
            if not np.isfinite(largest):
                source = float(np.abs(array).max(initial=0.0))
                got = f"a block scale past float16's range (float |w| up to {source:.4g})"
            else:
                got = f"|w| up to {largest:.4g}"
        elif array.dtype.kind == "f" and largest_finite(array.dtype) > limit:
            largest = max(float(array.max(initial=0.0)), -float(array.min(initial=0.0)))
            held, got = "", f"|w| up to {largest:.4g}"
        else:
            continue
        if not largest <= limit:
            raise ConfigError(
                mismatch(name, f"values {dtype} holds (|w| <= {limit:.6g}){held}", "", got)
            )


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
