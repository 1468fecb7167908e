"""Device queries of the emulated CUDA runtime (re-exported by :mod:`.cuda_runtime`): one
device, named :data:`DEVICE_NAME`, of the compute capability the active ``emulated_gpu()``
block gave it (:attr:`trt_kv.emulator.device.Device.compute_capability`)."""

from __future__ import annotations

from cuda.bindings import runtime as _rt

from trt_kv.emulator.device import CudaCallFailed, returning
from trt_kv.emulator.device import device as _state
from trt_kv.emulator.memory import EmulatorError

cudaError_t = _rt.cudaError_t
cudaDeviceProp = _rt.cudaDeviceProp
cudaDeviceAttr = _rt.cudaDeviceAttr
DEVICE_NAME = b"trt_kv emulated GPU (CPU)"


def _returns(n: int) -> object:
    return returning(n, cudaError_t.cudaSuccess, lambda code: code)


def check_device(index: int) -> None:
    if int(index) != 0:
        raise CudaCallFailed(cudaError_t.cudaErrorInvalidDevice, f"device {index}: only 0")


@_returns(1)
def cudaGetDeviceCount() -> int:
    return 1


@_returns(1)
def cudaGetDevice() -> int:
    return 0


@_returns(0)
def cudaSetDevice(device: int) -> None:
    check_device(device)


@_returns(1)
def cudaGetDeviceProperties(device: int) -> object:
    check_device(device)
    prop = cudaDeviceProp()
    prop.name = DEVICE_NAME.ljust(256, b"\0")
    prop.major, prop.minor = _state().compute_capability
    prop.totalGlobalMem = _state().memory.capacity
    prop.multiProcessorCount = 1
    prop.warpSize = 32
    prop.maxThreadsPerBlock = 1024
    prop.maxThreadsDim = [1024, 1024, 64]
    prop.maxGridSize = [2**31 - 1, 65535, 65535]
    prop.unifiedAddressing = 1
    prop.textureAlignment = 512
    return prop


def device_attributes() -> dict[object, int]:
    """``cudaDeviceAttr`` -> value, for the attributes the emulated device answers."""
    major, minor = _state().compute_capability
    return {
        cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor: major,
        cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor: minor,
        cudaDeviceAttr.cudaDevAttrMultiProcessorCount: 1,
        cudaDeviceAttr.cudaDevAttrWarpSize: 32,
        cudaDeviceAttr.cudaDevAttrMaxThreadsPerBlock: 1024,
    }


def cudaRuntimeGetVersion() -> tuple:
    return _rt.cudaRuntimeGetVersion()  # the installed runtime library's: needs no GPU


@_returns(1)
def cudaDriverGetVersion() -> int:
    """The emulated driver: as new as the installed CUDA runtime (a driver older than the
    runtime would fail every call on a real machine)."""
    return int(_rt.cudaRuntimeGetVersion()[1])


@_returns(1)
def cudaDeviceGetAttribute(attr: object, device: int) -> int:
    check_device(device)
    values = device_attributes()
    if attr not in values:
        raise EmulatorError(f"cudaDeviceGetAttribute: {attr!r} is not emulated")
    return values[attr]


@_returns(2)
def cudaMemGetInfo() -> tuple[int, int]:
    mem = _state().memory
    return mem.capacity - mem.used, mem.capacity
