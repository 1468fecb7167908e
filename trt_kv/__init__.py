"""trt_kv: TensorRT networks with an in-place KV cache, and autoregressive decode on them.

Data path: ``builder`` (networks, engines) -> ``engine_file`` (engine + sidecar) ->
``runtime`` (cache buffers, decode loop); ``reference`` (NumPy) and ``interpreter`` (NumPy
executor of built networks) are the two independent checks beside it.
"""

from trt_kv._trt import FEATURES, trt
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
