"""The emulated CUDA runtime, called the way cuda-python is called: ``(err, value)`` tuples,
copies checked against their allocations, stream capture into graphs that replay."""

import numpy as np
import pytest

from tests.support.emulated_cuda import ok, rt
from trt_kv.emulator import EmulatorError, emulated_gpu, is_active

pytestmark = pytest.mark.usefixtures("gpu")


@pytest.fixture
def gpu():
    with emulated_gpu():
        yield


def h2d(ptr, host, stream=None):
    kind = rt().cudaMemcpyKind.cudaMemcpyHostToDevice
    if stream is None:
        return rt().cudaMemcpy(ptr, host.ctypes.data, host.nbytes, kind)
    return rt().cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, kind, stream)


def d2h(host, ptr):
    kind = rt().cudaMemcpyKind.cudaMemcpyDeviceToHost
    ok(rt().cudaMemcpy(host.ctypes.data, ptr, host.nbytes, kind))
    return host


def test_the_stand_in_is_what_cuda_bindings_runtime_imports():
    assert is_active()
    assert rt().__name__ == "trt_kv.emulator.cuda_runtime"
    assert ok(rt().cudaGetDeviceCount()) == 1


def test_upload_download_round_trip():
    ptr = ok(rt().cudaMalloc(64))
    ok(h2d(ptr, np.arange(16, dtype=np.float32)))
    assert d2h(np.empty(16, np.float32), ptr).tolist() == list(range(16))
    ok(rt().cudaFree(ptr))


def test_copy_past_the_end_of_an_allocation_is_an_error():
    ptr = ok(rt().cudaMalloc(60))
    with pytest.raises(EmulatorError, match="inside one live allocation"):
        h2d(ptr, np.zeros(16, np.float32))  # 64 bytes into 60


def test_copy_kind_must_match_the_pointers():
    ptr = ok(rt().cudaMalloc(64))
    other = ok(rt().cudaMalloc(64))
    kind = rt().cudaMemcpyKind.cudaMemcpyHostToDevice
    with pytest.raises(EmulatorError, match="expected a host pointer"):
        rt().cudaMemcpy(ptr, other, 64, kind)  # the source is device memory


def test_default_kind_infers_the_direction_from_the_pointers():
    ptr = ok(rt().cudaMalloc(8))
    kind = rt().cudaMemcpyKind.cudaMemcpyDefault
    src = np.array([7, 9], np.int32)
    ok(rt().cudaMemcpy(ptr, src.ctypes.data, 8, kind))
    out = np.zeros(2, np.int32)
    ok(rt().cudaMemcpy(out.ctypes.data, ptr, 8, kind))
    assert out.tolist() == [7, 9]


def test_overlapping_device_copy_is_an_error():
    ptr = ok(rt().cudaMalloc(64))
    with pytest.raises(EmulatorError, match="non-overlapping"):
        rt().cudaMemcpy(ptr + 8, ptr, 32, rt().cudaMemcpyKind.cudaMemcpyDeviceToDevice)


def test_double_free_is_an_error_not_a_return_code():
    ptr = ok(rt().cudaMalloc(16))
    ok(rt().cudaFree(ptr))
    with pytest.raises(EmulatorError, match="use after free"):
        rt().cudaFree(ptr)


def test_free_of_null_is_a_no_op():
    ok(rt().cudaFree(0))


def test_memset_writes_bytes():
    ptr = ok(rt().cudaMalloc(8))
    ok(rt().cudaMemset(ptr, 0, 8))
    ok(rt().cudaMemset(ptr + 4, 0x3F, 2))
    assert d2h(np.empty(8, np.uint8), ptr).tolist() == [0, 0, 0, 0, 0x3F, 0x3F, 0, 0]


def test_captured_work_runs_only_when_the_graph_is_launched():
    stream = ok(rt().cudaStreamCreate())
    ptr = ok(rt().cudaMalloc(4))
    ok(rt().cudaMemset(ptr, 0, 4))
    mode = rt().cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    ok(rt().cudaStreamBeginCapture(stream, mode))
    ok(rt().cudaMemsetAsync(ptr, 1, 4, stream))
    graph = ok(rt().cudaStreamEndCapture(stream))
    assert d2h(np.empty(4, np.uint8), ptr).tolist() == [0, 0, 0, 0]  # recorded, not run
    exe = ok(rt().cudaGraphInstantiate(graph, 0))
    ok(rt().cudaGraphLaunch(exe, stream))
    ok(rt().cudaStreamSynchronize(stream))
    assert d2h(np.empty(4, np.uint8), ptr).tolist() == [1, 1, 1, 1]
    ok(rt().cudaGraphExecDestroy(exe))
    ok(rt().cudaGraphDestroy(graph))
    assert rt().cudaGraphLaunch(exe, stream)[0] == rt().cudaError_t.cudaErrorInvalidValue


def test_synchronizing_a_capturing_stream_invalidates_the_capture():
    err = rt().cudaError_t
    stream = ok(rt().cudaStreamCreate())
    ok(rt().cudaStreamBeginCapture(stream, rt().cudaStreamCaptureMode.cudaStreamCaptureModeGlobal))
    assert rt().cudaStreamSynchronize(stream)[0] == err.cudaErrorStreamCaptureUnsupported
    status = ok(rt().cudaStreamIsCapturing(stream))
    assert status == rt().cudaStreamCaptureStatus.cudaStreamCaptureStatusInvalidated
    assert rt().cudaStreamEndCapture(stream) == (err.cudaErrorStreamCaptureInvalidated, None)
    ok(rt().cudaStreamSynchronize(stream))  # out of capture mode again


def test_synchronous_copy_during_a_capture_is_refused():
    err = rt().cudaError_t
    stream = ok(rt().cudaStreamCreate())
    ptr = ok(rt().cudaMalloc(16))
    ok(rt().cudaStreamBeginCapture(stream, rt().cudaStreamCaptureMode.cudaStreamCaptureModeGlobal))
    assert h2d(ptr, np.zeros(4, np.float32))[0] == err.cudaErrorStreamCaptureImplicit
    assert rt().cudaMalloc(16)[0] == err.cudaErrorStreamCaptureUnsupported
    assert rt().cudaStreamEndCapture(stream)[0] == err.cudaErrorStreamCaptureInvalidated


def test_replaying_a_graph_over_freed_memory_is_an_error():
    stream = ok(rt().cudaStreamCreate())
    ptr = ok(rt().cudaMalloc(16))
    ok(rt().cudaStreamBeginCapture(stream, rt().cudaStreamCaptureMode.cudaStreamCaptureModeGlobal))
    ok(rt().cudaMemsetAsync(ptr, 0, 16, stream))
    exe = ok(rt().cudaGraphInstantiate(ok(rt().cudaStreamEndCapture(stream)), 0))
    ok(rt().cudaFree(ptr))
    with pytest.raises(EmulatorError, match="use after free"):
        rt().cudaGraphLaunch(exe, stream)  # checked at the launch, before anything is queued


def test_unknown_stream_is_an_invalid_handle():
    err = rt().cudaStreamSynchronize(12345)[0]
    assert err == rt().cudaError_t.cudaErrorInvalidResourceHandle


def test_events_time_recorded_work():
    start, end = ok(rt().cudaEventCreate()), ok(rt().cudaEventCreate())
    stream = ok(rt().cudaStreamCreate())
    assert (
        rt().cudaEventElapsedTime(start, end)[0] == rt().cudaError_t.cudaErrorInvalidResourceHandle
    )
    ok(rt().cudaEventRecord(start, stream))
    ok(rt().cudaEventRecord(end, stream))
    ok(rt().cudaEventSynchronize(end))
    assert ok(rt().cudaEventElapsedTime(start, end)) >= 0.0


def test_device_properties_name_the_emulated_device():
    prop = ok(rt().cudaGetDeviceProperties(0))
    assert b"emulated" in prop.name and (prop.major, prop.minor) == (8, 9)
    assert rt().cudaGetDeviceProperties(1)[0] == rt().cudaError_t.cudaErrorInvalidDevice


def h2d_2d(ptr, dpitch, host, width=None, spitch=None):
    """cudaMemcpy2D of the rows of ``host [R, W]`` to ``ptr``, row r at ``ptr + r * dpitch``."""
    width = host.shape[1] * host.itemsize if width is None else width
    spitch = host.shape[1] * host.itemsize if spitch is None else spitch
    kind = rt().cudaMemcpyKind.cudaMemcpyHostToDevice
    return rt().cudaMemcpy2D(ptr, dpitch, host.ctypes.data, spitch, width, host.shape[0], kind)


def test_2d_copy_lands_each_row_at_its_pitch_and_leaves_the_gaps():
    ptr = ok(rt().cudaMalloc(24))
    ok(rt().cudaMemset(ptr, 0xEE, 24))
    rows = np.arange(12, dtype=np.uint8).reshape(3, 4)
    ok(h2d_2d(ptr, 8, rows))
    rows[:] = 99  # synchronous: the rows were read before the call returned
    got = d2h(np.empty((3, 8), np.uint8), ptr)
    assert got[:, :4].tolist() == np.arange(12).reshape(3, 4).tolist()
    assert (got[:, 4:] == 0xEE).all()
    back = np.zeros((3, 4), np.uint8)  # and back: device rows at pitch 8 to dense host rows
    kind = rt().cudaMemcpyKind.cudaMemcpyDeviceToHost
    ok(rt().cudaMemcpy2D(back.ctypes.data, 4, ptr, 8, 4, 3, kind))
    assert back.tolist() == got[:, :4].tolist()


def test_2d_copy_is_counted_as_one_call_of_all_its_bytes():
    from trt_kv.emulator import counting

    ptr = ok(rt().cudaMalloc(64))
    with counting() as counts:
        ok(h2d_2d(ptr, 16, np.zeros((4, 3), np.float32)))
    assert counts.calls == {"cudaMemcpy2D": 1}
    assert counts.bytes == {"HD": 48}


@pytest.mark.parametrize(("dpitch", "spitch"), [(8, 16), (16, 8)])
def test_2d_copy_wider_than_a_pitch_is_an_invalid_pitch_and_writes_nothing(dpitch, spitch):
    ptr = ok(rt().cudaMalloc(64))
    ok(rt().cudaMemset(ptr, 0, 64))
    err, *_ = h2d_2d(ptr, dpitch, np.ones((2, 16), np.uint8), width=12, spitch=spitch)
    assert err == rt().cudaError_t.cudaErrorInvalidPitchValue
    assert not d2h(np.empty(64, np.uint8), ptr).any()


def test_2d_copy_whose_last_row_leaves_the_allocation_is_an_error():
    ptr = ok(rt().cudaMalloc(30))  # rows at 0, 8, 16, 24: the last ends at 32
    ok(rt().cudaMemset(ptr, 0, 30))
    with pytest.raises(EmulatorError, match="inside one live allocation"):
        h2d_2d(ptr, 8, np.ones((4, 8), np.uint8))
    assert not d2h(np.empty(30, np.uint8), ptr).any()  # refused before any row was written


def test_2d_copy_host_side_must_not_be_a_device_pointer():
    ptr = ok(rt().cudaMalloc(64))
    other = ok(rt().cudaMalloc(64))
    kind = rt().cudaMemcpyKind.cudaMemcpyHostToDevice
    with pytest.raises(EmulatorError, match="expected a host pointer"):
        rt().cudaMemcpy2D(ptr, 16, other, 8, 8, 2, kind)


def test_2d_copy_between_overlapping_device_spans_is_an_error():
    ptr = ok(rt().cudaMalloc(64))
    kind = rt().cudaMemcpyKind.cudaMemcpyDeviceToDevice
    with pytest.raises(EmulatorError, match="non-overlapping"):
        rt().cudaMemcpy2D(ptr + 4, 16, ptr, 16, 8, 3, kind)
