"""``emulated_gpu()`` installs the stand-ins where trt_kv looks them up and restores
everything on exit: modules, Polygraphy's wrapper, and the cached GPU probe."""

import sys

import pytest

from trt_kv.emulator import emulated_gpu, is_active, provides
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason


def runtime_name():
    from cuda.bindings import runtime

    return runtime.__name__


def test_activation_swaps_and_restores_cuda_modules_and_the_gpu_probe():
    real_reason = gpu_unavailable_reason()
    real_runtime = sys.modules["cuda.bindings.runtime"]
    with emulated_gpu():
        assert is_active()
        assert runtime_name() == "trt_kv.emulator.cuda_runtime"
        assert gpu_unavailable_reason() is None  # the emulated device is usable
    assert not is_active()
    assert sys.modules["cuda.bindings.runtime"] is real_runtime
    assert gpu_unavailable_reason() == real_reason  # the probe's cache did not leak


def test_nested_blocks_restore_only_at_the_outermost_exit():
    with emulated_gpu():
        with emulated_gpu():
            assert runtime_name() == "trt_kv.emulator.cuda_runtime"
        assert is_active() and runtime_name() == "trt_kv.emulator.cuda_runtime"
    assert runtime_name() == "cuda.bindings.runtime"


def test_exit_restores_even_when_the_block_raises():
    with pytest.raises(KeyError), emulated_gpu():
        raise KeyError("boom")
    assert not is_active() and runtime_name() == "cuda.bindings.runtime"


def test_polygraphy_wrapper_is_swapped_and_restored():
    from polygraphy.cuda import cuda as pg_cuda

    saved = pg_cuda.G_CUDA
    with emulated_gpu():
        assert type(pg_cuda.wrapper()).__name__ == "EmulatedCuda"
    assert pg_cuda.G_CUDA is saved


def test_polygraphy_device_array_runs_on_the_emulated_device():
    import numpy as np
    from polygraphy.cuda import DeviceArray, DeviceView, Stream

    with emulated_gpu():
        stream = Stream()
        arr = DeviceArray((2, 3), np.float32)
        arr.copy_from(np.arange(6, dtype=np.float32).reshape(2, 3), stream=stream)
        stream.synchronize()
        assert arr.numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
        view = DeviceView(arr.ptr, (3,), np.float32)
        assert view.numpy().tolist() == [0, 1, 2]
        assert not hasattr(view, "view")  # Polygraphy's own class: only DeviceArray has view()
        arr.free()
        stream.free()


def test_cuda_and_polygraphy_are_always_provided():
    assert {"cuda", "polygraphy"} <= provides()


def queue_a_download(host):
    """A memset and an async download of it into ``host``, queued and not synchronized."""
    from cuda.bindings import runtime as rt

    _, stream = rt.cudaStreamCreate()
    _, ptr = rt.cudaMalloc(host.nbytes)
    rt.cudaMemsetAsync(ptr, 3, host.nbytes, stream)
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    rt.cudaMemcpyAsync(host.ctypes.data, ptr, host.nbytes, kind, stream)


def test_leaving_the_block_completes_queued_work_or_drops_it_after_a_failure():
    import numpy as np

    done, dropped = np.zeros(2, np.uint8), np.zeros(2, np.uint8)
    with emulated_gpu():
        queue_a_download(done)
        with emulated_gpu():
            pass  # an inner block's exit is not the device's
        assert done.tolist() == [0, 0]  # never synchronized: still queued
    assert done.tolist() == [3, 3]
    with pytest.raises(KeyError), emulated_gpu():
        queue_a_download(dropped)
        raise KeyError("the block failed")
    assert dropped.tolist() == [0, 0]
    with emulated_gpu():
        from cuda.bindings import runtime as rt

        assert rt.cudaDeviceSynchronize()[0] == rt.cudaError_t.cudaSuccess
    assert dropped.tolist() == [0, 0]  # dropped, not left for a later block
