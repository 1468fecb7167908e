"""The emulated driver: the NVRTC image of ``plugins/kv_cache_update.cu`` loads, and each launch
runs the host build of the same source on device memory, checked before it runs."""

import ctypes

import numpy as np
import pytest

from trt_kv.emulator import EmulatorError, emulated_gpu
from trt_kv.plugin import kernels, launch
from trt_kv.plugin.kernels import plan_launch
from trt_kv.reference import kv_cache_update

pytestmark = pytest.mark.skipif(
    not kernels.nvrtc_available(), reason="needs libnvrtc (pip install nvidia-cuda-nvrtc)"
)


@pytest.fixture
def driver():
    with emulated_gpu():
        from cuda.bindings import driver

        launch.check(driver.cuInit(0), "cuInit")
        yield driver


def upload(driver, a):
    (ptr,) = launch.check(driver.cuMemAlloc(a.nbytes), "cuMemAlloc")
    launch.check(driver.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
    return int(ptr)


def download(driver, ptr, like):
    out = np.empty_like(like)
    launch.check(driver.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes), "cuMemcpyDtoH")
    return out


def padded_case():
    cache = np.zeros((2, 1, 4, 2), np.float32)
    update = np.arange(1, 9, dtype=np.float32).reshape(2, 1, 2, 2)
    idx = np.array([1, 2], np.int32)
    return cache, update, idx


def test_a_launch_runs_the_host_build_on_device_memory(driver):
    cache, update, idx = padded_case()
    plan = plan_launch(cache.shape, update.shape, "float32", "int32")
    ptrs = [upload(driver, a) for a in (cache, update, idx)]
    launch.launch(plan, ptrs, 0)
    expected = kv_cache_update(cache, update, idx)
    assert download(driver, ptrs[0], cache).tolist() == expected.tolist()


def test_a_launch_whose_update_buffer_is_too_small_is_refused(driver):
    cache, update, idx = padded_case()
    plan = plan_launch(cache.shape, update.shape, "float32", "int32")
    short = upload(driver, update[:1].copy())  # half the bytes the kernel reads
    ptrs = [upload(driver, cache), short, upload(driver, idx)]
    with pytest.raises(EmulatorError, match="inside one live allocation"):
        launch.launch(plan, ptrs, 0)


def test_a_launch_on_a_capturing_stream_replays_with_the_graph(driver):
    from cuda.bindings import runtime as rt

    cache, update, idx = padded_case()
    plan = plan_launch(cache.shape, update.shape, "float32", "int32")
    ptrs = [upload(driver, a) for a in (cache, update, idx)]
    (stream,) = [int(v) for v in rt.cudaStreamCreate()[1:]]
    rt.cudaStreamBeginCapture(stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal)
    launch.launch(plan, ptrs, stream)
    err, graph = rt.cudaStreamEndCapture(stream)
    assert err == rt.cudaError_t.cudaSuccess
    assert not download(driver, ptrs[0], cache).any()  # captured, not run
    exe = rt.cudaGraphInstantiate(graph, 0)[1]
    rt.cudaGraphLaunch(exe, stream)
    assert download(driver, ptrs[0], cache).tolist() == kv_cache_update(*padded_case()).tolist()


def test_an_unknown_entry_is_not_found(driver):
    (module,) = launch.check(driver.cuModuleLoadData(kernels.nvrtc_compile("sm_89")), "load")
    err, _ = driver.cuModuleGetFunction(module, b"no_such_kernel")
    assert err == driver.CUresult.CUDA_ERROR_NOT_FOUND


def test_an_image_without_kernels_is_invalid(driver):
    err, _ = driver.cuModuleLoadData(b"\x7fELF" + bytes(64))
    assert err == driver.CUresult.CUDA_ERROR_INVALID_IMAGE


def test_too_many_threads_per_block_is_invalid(driver):
    (module,) = launch.check(driver.cuModuleLoadData(kernels.nvrtc_compile("sm_89")), "load")
    name = kernels.kernel_name("padded", "float32", "int32")
    (fn,) = launch.check(driver.cuModuleGetFunction(module, name.encode()), "function")
    params = ((0, 0, 0, 1, 1, 1, 1, 1), (ctypes.c_void_p,) * 3 + (ctypes.c_int,) * 5)
    err = driver.cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, driver.CUstream(0), params, 0)[0]
    assert err == driver.CUresult.CUDA_ERROR_INVALID_VALUE


def test_the_device_reports_compute_capability_8_9(driver):
    (dev,) = launch.check(driver.cuDeviceGet(0), "cuDeviceGet")
    attr = driver.CUdevice_attribute
    major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    assert (major[1], minor[1]) == (8, 9)


def test_allocating_zero_bytes_is_invalid(driver):
    assert driver.cuMemAlloc(0)[0] == driver.CUresult.CUDA_ERROR_INVALID_VALUE
