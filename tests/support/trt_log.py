"""A TensorRT logger for tests that read what the runtime (or its emulated stand-in) said."""

from __future__ import annotations

from trt_kv._trt import trt


class Log(trt.ILogger):
    """A TensorRT logger that keeps every error message (``errors``)."""

    def __init__(self) -> None:
        trt.ILogger.__init__(self)
        self.errors: list[str] = []

    def log(self, severity: object, msg: str) -> None:
        if severity == trt.ILogger.Severity.ERROR:
            self.errors.append(msg)
