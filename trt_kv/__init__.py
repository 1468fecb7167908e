"""trt_kv: TensorRT networks with an in-place KV cache, and autoregressive decode on them.

Data path: ``builder`` (networks, engines) -> ``engine`` (engine file + sidecar, and the
store that names, reuses and builds them) -> ``runtime`` (cache buffers, decode loop);
``reference`` (NumPy) and ``interpreter`` (NumPy executor of built networks) are the two
independent checks beside it.
"""

from trt_kv import _trt  # cheap: points Polygraphy at our module; TensorRT loads lazily
from trt_kv.errors import (
    ArgumentError,
    CacheOverflowError,
    ConfigError,
    DTypeError,
    EngineFileError,
    FeedError,
    GpuUnavailableError,
    NetworkError,
    ShapeError,
    SlotError,
    TrtKvError,
    UnsupportedLayerError,
)

__version__ = "0.1.0"

__all__ = [
    "FEATURES",
    "ArgumentError",
    "CacheOverflowError",
    "ConfigError",
    "DTypeError",
    "EngineFileError",
    "FeedError",
    "GpuUnavailableError",
    "NetworkError",
    "ShapeError",
    "SlotError",
    "TrtKvError",
    "UnsupportedLayerError",
    "__version__",
    "trt",
]


def __getattr__(name: str) -> object:
    """``trt_kv.trt`` and ``trt_kv.FEATURES`` import TensorRT on first use (PEP 562)."""
    if name in ("trt", "FEATURES"):
        return getattr(_trt, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
