"""Polygraphy's CUDA wrapper on the emulated device.

Polygraphy's ``Stream``, ``DeviceView`` and ``DeviceArray`` (``polygraphy.cuda``) do all their
CUDA work through one object, ``polygraphy.cuda.wrapper()`` (a ``Cuda`` that calls
``libcudart`` through ctypes). :class:`EmulatedCuda` has the same methods on the emulated
runtime, and :func:`install` makes ``wrapper()`` return it, so Polygraphy's own classes and the
real ``TrtRunner`` run unchanged (and keep their real behaviour, e.g. ``DeviceView`` has no
``view()``). A copy given a stream (``copy_from``/``copy_to(..., stream)``) is
``cudaMemcpyAsync``: deferred until ``Stream.synchronize()`` (``cudaStreamSynchronize``) or
another synchronizing call; without a stream it is ``cudaMemcpy``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from trt_kv.emulator import cuda_runtime as rt


class EmulatedCuda:
    """``polygraphy.cuda.Cuda`` (``wrapper()``) on the emulated runtime."""

    def check(self, status: object) -> None:
        """Polygraphy's error (``G_LOGGER.critical``) on a non-zero status, as ``Cuda.check``."""
        if int(status) != 0:
            from polygraphy.logger import G_LOGGER

            G_LOGGER.critical(f"CUDA Error: {int(status)} ({rt.cudaError_t(int(status)).name})")

    def create_stream(self) -> int:
        err, stream = rt.cudaStreamCreate()
        self.check(err)
        return int(stream)

    def stream_synchronize(self, ptr: int) -> None:
        self.check(rt.cudaStreamSynchronize(ptr or 0)[0])

    def destroy_stream(self, ptr: int) -> None:
        self.check(rt.cudaStreamDestroy(ptr or 0)[0])

    def malloc(self, nbytes: int) -> int:
        err, ptr = rt.cudaMalloc(nbytes)
        self.check(err)
        return int(ptr)

    def free(self, ptr: int) -> None:
        self.check(rt.cudaFree(ptr or 0)[0])

    def memcpy(
        self, dst: int, src: int, nbytes: int, kind: object, stream_ptr: int | None = None
    ) -> None:
        # Polygraphy passes MemcpyKind members (ctypes.c_int) with the cudaMemcpyKind values.
        kind = rt.cudaMemcpyKind(kind.value if isinstance(kind, ctypes.c_int) else int(kind))
        if stream_ptr is not None:
            self.check(rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream_ptr)[0])
        else:
            self.check(rt.cudaMemcpy(dst, src, nbytes, kind)[0])


def install() -> Callable[[], None]:
    """Make ``polygraphy.cuda.wrapper()`` return an :class:`EmulatedCuda`; returns the undo."""
    from polygraphy.cuda import cuda as pg_cuda

    saved = pg_cuda.G_CUDA
    pg_cuda.G_CUDA = EmulatedCuda()

    def undo() -> None:
        pg_cuda.G_CUDA = saved

    return undo
