"""Exception classes callers can catch. Every message names the tensor (or slot, or file),
the expected value and the actual value."""

from __future__ import annotations

import math


class TrtKvError(Exception):
    """Base class of every error trt_kv raises on purpose."""


class ArgumentError(TrtKvError, ValueError):
    """An argument outside its domain: a count, a length, a temperature, a seed, an option."""


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


class EngineRunError(TrtKvError, RuntimeError):
    """TensorRT refused a binding or an enqueue of a deserialized engine (see its log)."""


class ClosedError(TrtKvError, RuntimeError):
    """A backend, or the device memory it held, used after its ``close()``."""


class ConcurrentUseError(TrtKvError, RuntimeError):
    """A session used by a second thread while an operation of another thread runs."""


class DeviceMemoryError(TrtKvError, MemoryError):
    """A device allocation (cudaMalloc) failed: the message names the allocation, its bytes
    and, for a backend's caches, the capacity that fits."""


class GpuUnavailableError(TrtKvError, RuntimeError):
    """The operation needs a CUDA GPU and a TensorRT runtime that can run engines."""


class LimitError(TrtKvError, ValueError):
    """A request past a server's limit: prompt plus new tokens beyond ``S_max``."""


class QueueFullError(TrtKvError, RuntimeError):
    """A server's bounded request queue is full: retry later."""


class DrainingError(TrtKvError, RuntimeError):
    """A server is draining (shutting down): it takes no new request."""


def mismatch(tensor: str, what: str, expected: object, actual: object) -> str:
    """``"<tensor>: expected <what> <expected>, got <actual>"``: the one message shape
    (``expected=""`` when ``what`` already says it)."""
    wanted = f"{what} {expected}" if expected != "" else what
    return f"{tensor}: expected {wanted.strip()}, got {actual}"


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an ``int`` in ``[lo, hi]`` (either bound optional).

    Python and NumPy integers pass; bools, floats (even ``2.0``), strings do not.

    Raises:
        ArgumentError: not an integer, or outside the bounds.
    """
    import numbers  # here, not at the top: ``trt-kv --help`` imports this module

    bounds = {
        (True, True): f" in [{lo}, {hi}]",
        (True, False): f" >= {lo}",
        (False, True): f" <= {hi}",
        (False, False): "",
    }[lo is not None, hi is not None]
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not integral or (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ArgumentError(mismatch(name, f"an integer{bounds}", "", repr(value)))
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` when it is a ``bool`` (not 0/1, not a string).

    Raises:
        ArgumentError: not a bool (the message names its type).
    """
    if not isinstance(value, bool):
        raise ArgumentError(mismatch(name, "a bool", "", type(value).__name__))
    return value


def check_real(name: str, value: object, lo: float, hi: float | None = None) -> float:
    """``value`` as a finite ``float`` >= ``lo`` (and <= ``hi`` if given; NaN and infinities
    refused).

    Raises:
        ArgumentError: not a real number, not finite, or outside the bounds.
    """
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(mismatch(name, "a real number", "", repr(value)))
    if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ArgumentError(mismatch(name, f"a finite number {bounds}", "", value))
    return float(value)
