"""Launch the KV-cache update kernels through cuda-python's driver API.

One module per CUDA context, compiled by NVRTC for that context's GPU on first use
(:func:`trt_kv.plugin.kernels.arch_for`) and loaded with ``cuModuleLoadData``. Every call is
asynchronous on the given stream; pointers are device addresses as ints.
"""

from __future__ import annotations

import ctypes

from trt_kv.errors import GpuUnavailableError, TrtKvError, mismatch
from trt_kv.plugin.kernels import KernelLaunch, arch_for, nvrtc_compile


def _driver() -> object:
    try:
        from cuda.bindings import driver
    except ImportError as e:  # pragma: no cover - cuda-python is a dependency
        raise GpuUnavailableError(mismatch("cuda-python", "importable", "", repr(e))) from e
    return driver


class CudaCallError(TrtKvError, RuntimeError):
    """A CUDA driver call failed on a usable GPU (bad launch, bad pointer, out of memory...)."""


def check(result: tuple, call: str, error: type[Exception] = CudaCallError) -> tuple:
    """Unwrap a cuda-python ``(CUresult, *values)``; raise ``error`` naming ``call`` on failure."""
    driver = _driver()
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorString(result[0])
        raise error(mismatch(call, "CUDA_SUCCESS", "", text.decode() if text else result[0]))
    return result[1:]


def _init() -> object:
    """cuInit(0); the driver module. Raises GpuUnavailableError without libcuda or a GPU."""
    driver = _driver()
    try:
        result = driver.cuInit(0)
    except Exception as e:  # no libcuda: cuda.pathfinder raises DynamicLibNotFoundError
        raise GpuUnavailableError(
            mismatch("cuInit", "the NVIDIA driver", "libcuda", repr(e))
        ) from e
    check(result, "cuInit", GpuUnavailableError)
    return driver


def gpu_count() -> int:
    """Number of CUDA devices; 0 when the driver is missing or finds none."""
    try:
        driver = _init()
        (count,) = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    except (GpuUnavailableError, CudaCallError):
        return 0
    return count


class KernelModule:
    """The compiled kernels loaded into the current CUDA context."""

    def __init__(self) -> None:
        driver = _driver()
        (device,) = check(driver.cuCtxGetDevice(), "cuCtxGetDevice")
        attr = driver.CUdevice_attribute
        (major,) = check(
            driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            "cuDeviceGetAttribute(major)",
        )
        (minor,) = check(
            driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
            "cuDeviceGetAttribute(minor)",
        )
        self.arch = arch_for(major, minor)
        (self.module,) = check(
            driver.cuModuleLoadData(nvrtc_compile(self.arch)), "cuModuleLoadData"
        )
        self._functions: dict[str, object] = {}

    def function(self, name: str) -> object:
        """The ``CUfunction`` for entry point ``name``."""
        if name not in self._functions:
            (self._functions[name],) = check(
                _driver().cuModuleGetFunction(self.module, name.encode()),
                f"cuModuleGetFunction({name})",
            )
        return self._functions[name]


_MODULES: dict[tuple[str, int], KernelModule] = {}  # (driver module name, context) -> kernels


def current_module() -> KernelModule:
    """The :class:`KernelModule` of the calling thread's current context (loaded once).

    Raises:
        GpuUnavailableError: no current CUDA context.
    """
    driver = _init()
    (ctx,) = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    key = (driver.__name__, int(ctx))  # an emulated context never shadows a real one
    if key[1] == 0:
        raise GpuUnavailableError(mismatch("CUDA context", "a current context", "", "none"))
    if key not in _MODULES:
        _MODULES[key] = KernelModule()
    return _MODULES[key]


def copy_cache(dst: int, src: int, nbytes: int, stream: int) -> None:
    """``dst <- src`` on ``stream`` unless they are the same buffer (the aliased, in-place case)."""
    if dst != src and nbytes > 0:
        driver = _driver()
        check(
            driver.cuMemcpyDtoDAsync(dst, src, nbytes, driver.CUstream(stream)), "cuMemcpyDtoDAsync"
        )


def launch(plan: KernelLaunch, pointers: list[int], stream: int) -> None:
    """Launch ``plan`` on ``stream`` with device ``pointers`` (cache, update, write_indices
    [, update_lengths]) followed by the plan's int32 sizes."""
    if plan.num_elements == 0:
        return
    driver = _driver()
    values = (*pointers, *plan.sizes)
    types = (ctypes.c_void_p,) * len(pointers) + (ctypes.c_int,) * len(plan.sizes)
    check(
        driver.cuLaunchKernel(
            current_module().function(plan.name),
            *plan.grid,
            *plan.block,
            0,
            driver.CUstream(stream),
            (values, types),
            0,
        ),
        f"cuLaunchKernel({plan.name})",
    )
