"""Exception classes callers can catch. Every message names the tensor (or slot, or file),
the expected value and the actual value."""

from __future__ import annotations

from typing import Any


class TrtKvError(Exception):
    """Base class of every error trt_kv raises on purpose."""


class NetworkError(TrtKvError, ValueError):
    """The network is not fit for the operation (not strongly typed, cache not an input...)."""


class RouteError(NetworkError):
    """No route of a network part (attention, RoPE, cache update) fits the installed TensorRT,
    or the requested one is missing; the message gives each route's reason."""


class ShapeError(TrtKvError, ValueError):
    """A tensor has the wrong rank or dimension."""


class DTypeError(TrtKvError, TypeError):
    """A tensor has the wrong data type."""


class CacheOverflowError(TrtKvError, IndexError):
    """A write would land at or past ``S_max``."""


class SlotError(TrtKvError, LookupError):
    """An unknown slot, or more sequences than the cache has slots."""


class EngineFileError(TrtKvError):
    """An engine file or its sidecar is missing, tampered with, or from another TensorRT."""


class FeedError(TrtKvError, LookupError):
    """A feed misses a network input, or names a tensor that is not one."""


class ConfigError(TrtKvError, ValueError):
    """A model configuration or checkpoint trt_kv cannot build."""


class DownloadError(TrtKvError, RuntimeError):
    """A file trt_kv fetches (the default model) cannot be obtained, or fails its checksum."""


class UnsupportedLayerError(TrtKvError, NotImplementedError):
    """The interpreter met a layer type (or layer setting) it does not execute."""


class GpuUnavailableError(TrtKvError, RuntimeError):
    """The operation needs a CUDA GPU and a TensorRT runtime that can run engines."""


def mismatch(tensor: str, what: str, expected: Any, actual: Any) -> str:
    """``"<tensor>: expected <what> <expected>, got <actual>"``: the one message shape
    (``expected=""`` when ``what`` already says it)."""
    wanted = f"{what} {expected}" if expected != "" else what
    return f"{tensor}: expected {wanted.strip()}, got {actual}"
