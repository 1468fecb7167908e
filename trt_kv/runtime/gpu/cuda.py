"""The little of CUDA the runtime needs, through cuda-python's runtime API."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache

import numpy as np

from trt_kv.emulator.hooks import register_installer
from trt_kv.errors import (
    ArgumentError,
    ClosedError,
    DeviceMemoryError,
    GpuUnavailableError,
    mismatch,
)

CPU_BACKENDS = ("reference", "interpreter")


@cache
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device is usable, else why not, in words (:func:`count_failure`:
    no NVIDIA driver, one older than the CUDA runtime, no device...)."""
    try:
        from cuda.bindings import runtime as rt

        err, count = rt.cudaGetDeviceCount()
    except Exception as e:  # no driver library, no cuda-python...
        return f"no CUDA driver ({type(e).__name__}: {e})"
    if err != rt.cudaError_t.cudaSuccess:
        _, driver = rt.cudaDriverGetVersion()
        _, runtime = rt.cudaRuntimeGetVersion()
        return count_failure(err, driver, runtime)
    if count == 0:
        return "no CUDA device"
    return None


def _forget_gpu_probe() -> Callable[[], None]:
    """An emulator installer: :func:`gpu_unavailable_reason` is cached, so its answer is
    forgotten on entry to ``trt_kv.emulator.emulated_gpu()`` and on exit from it."""
    gpu_unavailable_reason.cache_clear()
    return gpu_unavailable_reason.cache_clear


register_installer(_forget_gpu_probe)  # the emulator's one door (trt_kv.emulator.hooks)


def cuda_version_text(version: int) -> str:
    """CUDA's integer version ``13040`` as ``"13.4"``."""
    return f"{version // 1000}.{version % 1000 // 10}"


def count_failure(err: object, driver: int, runtime: int) -> str:
    """Why ``cudaGetDeviceCount`` failed with ``err``, given ``cudaDriverGetVersion``'s
    ``driver`` (0: no driver library loaded) and the CUDA ``runtime`` version.
    ``cudaErrorInsufficientDriver`` is what the runtime answers both without a driver and
    with one older than itself: the first is said as "no NVIDIA driver found"."""
    from cuda.bindings import runtime as rt

    if err == rt.cudaError_t.cudaErrorInsufficientDriver and not driver:
        return "no NVIDIA driver found"
    if err == rt.cudaError_t.cudaErrorInsufficientDriver:
        return (
            f"the NVIDIA driver (CUDA {cuda_version_text(driver)}) is older than the CUDA "
            f"runtime ({cuda_version_text(runtime)}) needs"
        )
    if err == rt.cudaError_t.cudaErrorNoDevice:
        return "no CUDA device"
    return f"cudaGetDeviceCount failed: {rt.cudaGetErrorString(err)[1].decode()}"


def device_capability(index: int = 0) -> tuple[tuple[int, int], str]:
    """``((major, minor), name)`` of CUDA device ``index``: ``cudaDeviceGetAttribute`` with
    ``cudaDevAttrComputeCapabilityMajor``/``Minor``, the name from its properties.

    Raises:
        GpuUnavailableError: no usable device (see :func:`gpu_unavailable_reason`), or a
            query that fails, naming the call and CUDA's error.
    """
    require_gpu("reading the GPU's compute capability")
    from cuda.bindings import runtime as rt

    attr = rt.cudaDeviceAttr
    cc = []
    for which in (attr.cudaDevAttrComputeCapabilityMajor, attr.cudaDevAttrComputeCapabilityMinor):
        err, value = rt.cudaDeviceGetAttribute(which, index)
        if err != rt.cudaError_t.cudaSuccess:
            raise GpuUnavailableError(
                mismatch(f"cudaDeviceGetAttribute({which.name}, {index})", "success", "", err.name)
            )
        cc.append(int(value))
    err, props = rt.cudaGetDeviceProperties(index)
    name = (
        props.name.decode(errors="replace").rstrip("\0")
        if err == rt.cudaError_t.cudaSuccess
        else "?"
    )
    return (cc[0], cc[1]), name


def tensorrt_refusal(
    targets: tuple[tuple[int, int], ...] = (), engine: str | None = None
) -> str | None:
    """Why the installed TensorRT (and an engine built for ``targets``, ``()``: portable)
    cannot run on this machine's GPU, in one line (no GPU; a compute capability the module
    or the engine does not run, from :data:`trt_kv.gpu_targets.SUPPORT`); None when it can."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        return reason
    from trt_kv._trt import FEATURES
    from trt_kv.gpu_targets import refusal

    cc, name = device_capability()
    return refusal(cc, name, FEATURES.module, FEATURES.version, targets, engine)


def require_tensorrt_gpu(
    what: str, targets: tuple[tuple[int, int], ...] = (), engine: str | None = None
) -> None:
    """GpuUnavailableError for ``what`` when no GPU is usable (:func:`require_gpu`) or
    :func:`tensorrt_refusal` gives a reason (raised before anything is built or read),
    naming the CPU backends that run here."""
    require_gpu(what)
    reason = tensorrt_refusal(targets, engine)
    if reason is not None:
        raise GpuUnavailableError(
            f"{what}: expected a GPU the installed TensorRT runs, got {reason}; backends that "
            f"run here: {', '.join(CPU_BACKENDS)}"
        )


def require_gpu(what: str) -> None:
    """Raise GpuUnavailableError for ``what`` when no GPU is usable, naming the CPU backends."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise GpuUnavailableError(
            f"{what}: expected a CUDA GPU, got {reason}; backends that run here: "
            f"{', '.join(CPU_BACKENDS)}"
        )


def check(result: tuple) -> object:
    """Unwrap a cuda-python ``(err, *values)`` result; raise on error."""
    from cuda.bindings import runtime as rt

    err, *values = result
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA error: {rt.cudaGetErrorString(err)[1].decode()}")
    return values[0] if len(values) == 1 else tuple(values)


def free_device_bytes() -> int:
    """Free bytes of the current device (``cudaMemGetInfo``)."""
    from cuda.bindings import runtime as rt

    free, _ = check(rt.cudaMemGetInfo())
    return int(free)


class DeviceBuffer:
    """``nbytes`` of device memory (cudaMalloc), freed on :meth:`free` or collection.

    Raises:
        DeviceMemoryError: cudaMalloc failed for want of memory (``cudaErrorMemoryAllocation``,
            or a size past ``size_t``); the message names ``what``, the bytes asked for and
            the bytes free.
    """

    def __init__(self, nbytes: int, what: str = "device buffer") -> None:
        from cuda.bindings import runtime as rt

        self._rt = rt
        self.nbytes = nbytes
        self.ptr = 0  # until cudaMalloc succeeds: a failed allocation leaves nothing to free
        size = max(nbytes, 1)
        err, ptr = (
            rt.cudaMalloc(size)
            if size < 1 << 64
            else (rt.cudaError_t.cudaErrorMemoryAllocation, 0)  # past size_t
        )
        if err == rt.cudaError_t.cudaErrorMemoryAllocation:
            raise DeviceMemoryError(
                mismatch(
                    f"cudaMalloc of {what}",
                    "a size that fits device memory",
                    "",
                    f"{nbytes:,} bytes asked, {free_device_bytes():,} bytes free",
                )
            )
        self.ptr = int(check((err, ptr)))

    def address(self, offset: int = 0) -> int:
        """The device address ``offset`` bytes in.

        Raises:
            ClosedError: the buffer was freed (its backend closed).
        """
        if not self.ptr:
            raise ClosedError(
                mismatch("device buffer", "allocated memory", "", "freed (its backend closed)")
            )
        return self.ptr + offset

    def memset(self, value: int = 0, offset: int = 0, nbytes: int | None = None) -> None:
        check(
            self._rt.cudaMemset(
                self.address(offset), value, self.nbytes - offset if nbytes is None else nbytes
            )
        )

    def upload(self, host: np.ndarray, offset: int = 0, stream: int = 0) -> None:
        """Copy ``host`` to ``offset``. With ``stream`` (not 0) the copy is async: the caller
        keeps ``host`` alive and unchanged until that stream is synchronized (the copy may
        read it late). Without, it is ``cudaMemcpy``: ``host`` is read before this returns."""
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        if not stream:  # a temporary made here (contiguous copy) may be freed on return
            host = np.ascontiguousarray(host)
            check(self._rt.cudaMemcpy(self.address(offset), host.ctypes.data, host.nbytes, kind))
            return
        if not host.flags.c_contiguous:  # a contiguous copy made here would die on return
            raise ArgumentError(
                mismatch("upload host", "a C-contiguous array", "", "a strided one")
            )
        check(
            self._rt.cudaMemcpyAsync(
                self.address(offset), host.ctypes.data, host.nbytes, kind, stream
            )
        )

    def upload_2d(self, host: np.ndarray, offset: int, pitch: int) -> None:
        """Copy the rows of ``host [R, W]`` (C-contiguous, any dtype) to ``offset``, row
        ``r`` at ``offset + r * pitch`` bytes: one ``cudaMemcpy2D``, synchronous as
        :meth:`upload` without a stream (``host`` is read before this returns).

        Raises:
            ArgumentError: ``host`` not 2-D, or its rows wider than ``pitch`` bytes.
        """
        width = host.shape[-1] * host.itemsize if host.ndim == 2 else -1
        if not 0 <= width <= pitch:
            raise ArgumentError(
                mismatch("upload_2d host", f"2-D rows of at most {pitch} bytes", "", host.shape)
            )
        if host.size == 0:
            return
        host = np.ascontiguousarray(host)  # a temporary made here may be freed on return
        check(
            self._rt.cudaMemcpy2D(
                self.address(offset),
                pitch,
                host.ctypes.data,
                width,
                width,
                host.shape[0],
                self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
            )
        )

    def upload_from(self, pinned: PinnedBuffer, nbytes: int, stream: int) -> None:
        """Copy the first ``nbytes`` of ``pinned`` here, asynchronously on ``stream``."""
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        check(self._rt.cudaMemcpyAsync(self.address(), pinned.ptr, nbytes, kind, stream))

    def download_to(self, pinned: PinnedBuffer, nbytes: int, stream: int) -> None:
        """Copy the first ``nbytes`` here into ``pinned``, asynchronously on ``stream`` (the
        bytes are there once ``stream`` is synchronized)."""
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check(self._rt.cudaMemcpyAsync(pinned.ptr, self.address(), nbytes, kind, stream))

    def download(self, host: np.ndarray, offset: int = 0, stream: int = 0) -> np.ndarray:
        """Copy ``host.nbytes`` from ``offset`` into ``host`` on ``stream`` (0: the legacy
        stream) and synchronize that stream: ``host`` holds the bytes when this returns."""
        check(
            self._rt.cudaMemcpyAsync(
                host.ctypes.data,
                self.address(offset),
                host.nbytes,
                self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                stream,
            )
        )
        # An async copy to pageable memory "might be synchronous": only the synchronize
        # guarantees the bytes (stream 0 included; it waited for nothing before).
        check(self._rt.cudaStreamSynchronize(stream))
        return host

    def copy_to(self, target: DeviceBuffer, src_offset: int, dst_offset: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``src_offset`` here to ``dst_offset`` of ``target`` (this
        buffer or another): a device-to-device ``cudaMemcpy``, in order with the legacy
        stream's work, asynchronous to the host."""
        check(
            self._rt.cudaMemcpy(
                target.address(dst_offset),
                self.address(src_offset),
                nbytes,
                self._rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
            )
        )

    def free(self) -> None:
        if self.ptr:
            self._rt.cudaFree(self.ptr)
            self.ptr = 0

    def __del__(self) -> None:
        self.free()


class PinnedBuffer:
    """``nbytes`` of page-locked host memory (``cudaHostAlloc``): async copies from it are
    true DMA, read when the stream reaches them, so it must not change until then.
    Freed on :meth:`free` or collection.

    Raises:
        DeviceMemoryError: cudaHostAlloc found no memory to pin (naming ``what`` and the
            bytes asked for).
    """

    def __init__(self, nbytes: int, what: str = "pinned host buffer") -> None:
        from cuda.bindings import runtime as rt

        self._rt = rt
        self.nbytes = nbytes
        self.ptr = 0  # until cudaHostAlloc succeeds
        err, ptr = rt.cudaHostAlloc(max(nbytes, 1), rt.cudaHostAllocDefault)
        if err == rt.cudaError_t.cudaErrorMemoryAllocation:
            raise DeviceMemoryError(
                mismatch(f"cudaHostAlloc of {what}", "host memory to pin", "", f"{nbytes:,} bytes")
            )
        self.ptr = int(check((err, ptr)))

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A writable NumPy array ``shape`` of ``dtype`` over the bytes at ``offset``."""
        count = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if not self.ptr or offset + count > self.nbytes:
            raise ArgumentError(
                mismatch("pinned view", f"<= {self.nbytes} live bytes", "", offset + count)
            )
        raw = (ctypes.c_char * count).from_address(self.ptr + offset)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def free(self) -> None:
        if self.ptr:
            self._rt.cudaFreeHost(self.ptr)
            self.ptr = 0

    def __del__(self) -> None:
        self.free()


def create_stream() -> int:
    from cuda.bindings import runtime as rt

    return int(check(rt.cudaStreamCreate()))


def synchronize(stream: int) -> None:
    from cuda.bindings import runtime as rt

    check(rt.cudaStreamSynchronize(stream))
