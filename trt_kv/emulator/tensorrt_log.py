"""How the emulated TensorRT reports an error: on the caller's logger, as TensorRT does.

Its own module so that the runtime (:mod:`.tensorrt_runtime`), the execution context
(:mod:`.tensorrt_context`) and the engine inspector (:mod:`.tensorrt_inspector`) share it
without importing one another in a circle.
"""

from __future__ import annotations

from trt_kv._trt import trt


def log_error(logger: object, message: str) -> None:
    """Send ``message`` to a TensorRT logger at ERROR severity, as TensorRT does."""
    logger.log(trt.ILogger.Severity.ERROR, f"[emulated TensorRT] {message}")
