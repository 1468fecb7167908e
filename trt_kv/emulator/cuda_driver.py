"""Stand-in for ``cuda.bindings.driver``: what ``trt_kv.plugin.launch`` (and its tests) call.

Same names, signatures and ``(CUresult, *values)`` returns as cuda-python, on the memory and
streams of :func:`trt_kv.emulator.device.device`; stream work (copies, launches) is deferred
until a synchronizing call (``cuStreamSynchronize``, ``cuCtxSynchronize``, a synchronous copy
to or from the host) needs it, as in :mod:`.cuda_runtime`. A kernel launch runs the HOST build
of the very source NVRTC compiled (``plugins/kv_cache_update.cu`` with
``-DTRT_KV_HOST_EMULATION``: the same element functions in a one-thread loop):
``cuModuleLoadData`` takes the NVRTC image, and each entry point the image names is bound to
the host function of the same kernel. Before a launch runs, every pointer argument must hold
its whole tensor inside one live allocation (the extents follow the kernel contract in the
source's header).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from cuda.bindings import driver as _dr

from trt_kv.emulator import cuda_runtime as _crt
from trt_kv.emulator.device import CudaCallFailed, device, returning
from trt_kv.emulator.memory import EmulatorError
from trt_kv.emulator.streams import Checked
from trt_kv.plugin import kernels

CUresult = _dr.CUresult
CUdevice = _dr.CUdevice
CUdevice_attribute = _dr.CUdevice_attribute
CUcontext = _dr.CUcontext
CUstream = _dr.CUstream
CUmodule = _dr.CUmodule
CUfunction = _dr.CUfunction
CUdeviceptr = _dr.CUdeviceptr

# Public names that are not cuda-python API (the conformance test checks all the others).
EMULATOR_EXTRAS = ("image_entries", "kernel_extents", "host_library", "HOST_FLAGS", "HOST_DEFINE")
_OK = CUresult.CUDA_SUCCESS
# the driver's name of each runtime attribute the emulated device answers
_ATTRIBUTES = {
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: "ComputeCapabilityMajor",
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: "ComputeCapabilityMinor",
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: "MultiProcessorCount",
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_WARP_SIZE: "WarpSize",
    CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: "MaxThreadsPerBlock",
}
_WORD = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8}
HOST_FLAGS = ("-x", "c++", "-std=c++11", "-O1", "-Wall", "-Werror", "-shared", "-fPIC")
HOST_DEFINE = "-DTRT_KV_HOST_EMULATION"


def _to_curesult(err: object) -> CUresult:
    """The driver twin of a runtime ``cudaError_t`` (cudaErrorStreamCaptureImplicit ->
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)."""
    special = {"MemoryAllocation": "OUT_OF_MEMORY", "InvalidResourceHandle": "INVALID_HANDLE"}
    words = err.name.removeprefix("cudaError")
    words = special.get(words, re.sub(r"(?<!^)(?=[A-Z])", "_", words).upper())
    return CUresult.__members__.get(f"CUDA_ERROR_{words}", CUresult.CUDA_ERROR_UNKNOWN)


def _returns(n: int) -> Callable:
    def convert(code: object) -> CUresult:
        return code if isinstance(code, CUresult) else _to_curesult(code)

    return returning(n, _OK, convert)


# -- initialization, device, context ------------------------------------------------------------
_STATE = threading.local()
_INIT = {"done": False, "primary": 0}


def _require_init() -> None:
    if not _INIT["done"]:
        raise CudaCallFailed(CUresult.CUDA_ERROR_NOT_INITIALIZED, "cuInit was not called")


@_returns(0)
def cuInit(Flags: int) -> None:
    if int(Flags) != 0:  # cuInit: "Currently, the Flags parameter must be 0."
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_VALUE, "cuInit flags must be 0")
    if not _INIT["done"]:
        _INIT["done"], _INIT["primary"] = True, device().new_handle()


@_returns(1)
def cuDeviceGetCount() -> int:
    _require_init()
    return 1


@_returns(1)
def cuDeviceGet(ordinal: int) -> object:
    _require_init()
    if int(ordinal) != 0:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_DEVICE, f"device {ordinal}")
    return CUdevice(0)


@_returns(1)
def cuDeviceGetAttribute(attrib: object, dev: object) -> int:
    _require_init()
    if int(dev) != 0:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_DEVICE, f"device {int(dev)}")
    if attrib not in _ATTRIBUTES:
        raise EmulatorError(f"cuDeviceGetAttribute: {attrib!r} is not emulated")
    runtime_attr = getattr(_crt.cudaDeviceAttr, f"cudaDevAttr{_ATTRIBUTES[attrib]}")
    return _crt.device_attributes()[runtime_attr]


@_returns(1)
def cuDevicePrimaryCtxRetain(dev: object) -> object:
    _require_init()
    return CUcontext(_INIT["primary"])


@_returns(0)
def cuCtxSetCurrent(ctx: object) -> None:
    _require_init()
    if int(ctx) not in (0, _INIT["primary"]):
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_CONTEXT, f"context {int(ctx):#x}")
    _STATE.ctx = int(ctx)


def _current() -> int:
    _require_init()
    # The runtime API makes the primary context current on first use; every emulated thread
    # starts as if it had (cuCtxSetCurrent(0) unbinds it).
    return getattr(_STATE, "ctx", _INIT["primary"])


@_returns(1)
def cuCtxGetCurrent() -> object:
    return CUcontext(_current())


@_returns(1)
def cuCtxGetDevice() -> object:
    if _current() == 0:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_CONTEXT, "no current context")
    return CUdevice(0)


@_returns(0)
def cuCtxSynchronize() -> None:
    if _crt.cudaDeviceSynchronize()[0] != _crt.cudaError_t.cudaSuccess:
        raise CudaCallFailed(
            CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "synchronize in capture"
        )


@_returns(0)
def cuStreamSynchronize(hStream: object) -> None:
    device().synchronize(int(hStream), "cuStreamSynchronize")


@_returns(1)
def cuGetErrorString(error: CUresult) -> bytes:
    return CUresult(error).name.encode()  # NVIDIA's sentences live in libcuda; the name here


@_returns(1)
def cuGetErrorName(error: CUresult) -> bytes:
    return CUresult(error).name.encode()


# -- memory ----------------------------------------------------------------------------------------
@_returns(1)
def cuMemAlloc(bytesize: int) -> object:
    # cuMemAlloc: "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE."
    if int(bytesize) == 0:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 0 bytes")
    err, ptr = _crt.cudaMalloc(bytesize)
    if err != _crt.cudaError_t.cudaSuccess:
        raise CudaCallFailed(_to_curesult(err), "cuMemAlloc")
    return CUdeviceptr(ptr)


@_returns(0)
def cuMemFree(dptr: object) -> None:
    _crt.cudaFree(int(dptr))


def _memcpy(dst: object, src: object, count: int, kind: str, stream: object = 0) -> None:
    """A copy on ``stream`` (queued); the synchronous host copies (legacy stream, not ``DD``)
    return once done, as ``cudaMemcpy`` (see :mod:`.cuda_runtime`)."""
    work = device().copy_work(int(dst), int(src), int(count), kind)
    queued = device().submit(int(stream), work, f"cuMemcpy{kind}")
    if int(stream) == 0 and kind != "DD":
        device().queue.complete(queued, f"cuMemcpy{kind}")


@_returns(0)
def cuMemcpyHtoD(dstDevice: object, srcHost: object, ByteCount: int) -> None:
    _memcpy(dstDevice, srcHost, ByteCount, "HD")


@_returns(0)
def cuMemcpyDtoH(dstHost: object, srcDevice: object, ByteCount: int) -> None:
    _memcpy(dstHost, srcDevice, ByteCount, "DH")


@_returns(0)
def cuMemcpyDtoDAsync(
    dstDevice: object, srcDevice: object, ByteCount: int, hStream: object
) -> None:
    _memcpy(dstDevice, srcDevice, ByteCount, "DD", hStream)


# -- modules and launches ------------------------------------------------------------------------
_MODULES: dict[int, set[str]] = {}  # module handle -> entry names in its image
_FUNCTIONS: dict[int, str] = {}  # function handle -> entry name


def image_entries(image: bytes) -> set[str]:
    """Kernel entry names in an NVRTC image: PTX ``.entry`` lines, or cubin (ELF) symbols."""
    if image.startswith(b"\x7fELF"):
        symbol = rb"(?<=\x00)(" + kernels.PREFIX.encode() + rb"\w+)(?=\x00)"
        return {m.decode() for m in re.findall(symbol, image)}
    return {m.decode() for m in re.findall(rb"\.entry\s+(\w+)", image)}


@_returns(1)
def cuModuleLoadData(image: bytes) -> object:
    _require_init()
    entries = image_entries(bytes(image))
    if not entries:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_IMAGE, "no kernel entry in the image")
    lib = host_library()
    missing = sorted(e for e in entries if not hasattr(lib, _host_name(e)))
    if missing:
        raise EmulatorError(
            f"cuModuleLoadData: expected entries of {kernels.SOURCE_NAME}, got {missing}"
        )
    h = device().new_handle()
    _MODULES[h] = entries
    return CUmodule(h)


@_returns(1)
def cuModuleGetFunction(hmod: object, name: bytes) -> object:
    entries = _MODULES.get(int(hmod))
    if entries is None:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_HANDLE, f"module {int(hmod):#x}")
    text = name.decode() if isinstance(name, bytes) else str(name)
    if text not in entries:
        raise CudaCallFailed(CUresult.CUDA_ERROR_NOT_FOUND, f"no entry {text}")
    h = device().new_handle()
    _FUNCTIONS[h] = text
    return CUfunction(h)


@_returns(0)
def cuModuleUnload(hmod: object) -> None:
    if _MODULES.pop(int(hmod), None) is None:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_HANDLE, f"module {int(hmod):#x}")


@_returns(0)
def cuLaunchKernel(
    f: object,
    gridDimX: int,
    gridDimY: int,
    gridDimZ: int,
    blockDimX: int,
    blockDimY: int,
    blockDimZ: int,
    sharedMemBytes: int,
    hStream: object,
    kernelParams: object,
    extra: object,
) -> None:
    name = _FUNCTIONS.get(int(f))
    if name is None:
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_HANDLE, f"function {int(f):#x}")
    grid, block = (gridDimX, gridDimY, gridDimZ), (blockDimX, blockDimY, blockDimZ)
    # CUDA limits: at most 1024 threads per block (1024 x 1024 x 64), grid x < 2**31,
    # grid y and z <= 65535; every dimension >= 1.
    if (
        min(*grid, *block) < 1
        or block[0] * block[1] * block[2] > 1024
        or block[2] > 64
        or grid[0] >= 2**31
        or max(grid[1:]) > 65535
    ):
        raise CudaCallFailed(CUresult.CUDA_ERROR_INVALID_VALUE, f"grid {grid}, block {block}")
    values, types = kernelParams
    pointers = [int(v or 0) for v, t in zip(values, types) if t is ctypes.c_void_p]
    sizes = [int(v) for v, t in zip(values, types) if t is ctypes.c_int]
    extents = kernel_extents(name, sizes)
    if len(pointers) != len(extents):
        raise EmulatorError(f"{name}: expected {len(extents)} pointers, got {len(pointers)}")
    fn = getattr(host_library(), _host_name(name))
    mem = device().memory

    def check() -> list[int]:
        return [mem.host_address(p, n) for p, n in zip(pointers, extents)]

    def run() -> None:
        fn(*(ctypes.c_void_p(h) for h in check()), *(ctypes.c_int(s) for s in sizes))

    check()  # fail at the launch, not later
    device().submit(int(hStream), Checked(check, run), f"cuLaunchKernel({name})")


def kernel_extents(name: str, sizes: list[int]) -> list[int]:
    """Bytes each pointer argument of kernel ``name`` spans for int32 ``sizes``
    ``(B, N, S_max, H, S|T)`` (the contract in ``plugins/kv_cache_update.cu``)."""
    form, *tags = name.removeprefix(kernels.PREFIX + "_").split("_")
    b, n, s_max, h, s = sizes
    cache = b * n * s_max * h * _WORD[tags[0]]
    if form == "padded":
        return [cache, b * n * s * h * _WORD[tags[0]], b * _WORD[tags[1]]]
    return [cache, s * n * h * _WORD[tags[0]], b * _WORD[tags[1]], (b + 1) * _WORD[tags[2]]]


def _host_name(entry: str) -> str:
    return entry.replace(kernels.PREFIX, "trt_kv_host", 1)


def host_library() -> ctypes.CDLL:
    """``plugins/kv_cache_update.cu`` built for the host with ``-DTRT_KV_HOST_EMULATION`` (once
    per source text; cached in the temp directory).

    Raises:
        EmulatorError: no host C++ compiler, or the build failed.
    """
    return _build(kernels.source())


@functools.cache
def _build(text: str) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise EmulatorError("host kernel build: expected g++ or c++ on PATH, got neither")
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / "trt_kv_emulator" / f"kv_cache_update_{digest}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")  # other processes may build it too
        src = out.with_suffix(f".{os.getpid()}.cu")
        src.write_text(text)
        result = subprocess.run(
            [cxx, *HOST_FLAGS, HOST_DEFINE, str(src), "-o", str(tmp)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise EmulatorError(f"host kernel build: expected success, got {result.stderr}")
        tmp.replace(out)
    return ctypes.CDLL(str(out))
