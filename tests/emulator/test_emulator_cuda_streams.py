"""The emulated device defers stream work: it runs when CUDA guarantees completion (a
synchronizing call), never at submit. Each test would pass on a device that runs work at
submit only where it says so; expected bytes are written out."""

import ctypes
import mmap
import os

import numpy as np
import pytest

from tests.support.emulated_cuda import ok, rt
from trt_kv.emulator import EmulatorError, emulated_gpu

pytestmark = pytest.mark.usefixtures("gpu")


@pytest.fixture
def gpu():
    with emulated_gpu():
        yield


def kind(name):
    return getattr(rt().cudaMemcpyKind, f"cudaMemcpy{name}")


def upload(ptr, host, stream):
    ok(rt().cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, kind("HostToDevice"), stream))


def download(host, ptr, stream):
    ok(rt().cudaMemcpyAsync(host.ctypes.data, ptr, host.nbytes, kind("DeviceToHost"), stream))


def read(ptr, n):
    """The device bytes through a synchronous copy (which waits for all earlier work)."""
    host = np.zeros(n, np.uint8)
    ok(rt().cudaMemcpy(host.ctypes.data, ptr, n, kind("DeviceToHost")))
    return host.tolist()


def test_an_async_download_lands_at_the_synchronize_not_before():
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(4))
    ok(rt().cudaMemsetAsync(ptr, 7, 4, stream))
    host = np.array([1, 2, 3, 4], np.uint8)
    download(host, ptr, stream)
    assert host.tolist() == [1, 2, 3, 4]  # not synchronized: the old host bytes
    ok(rt().cudaStreamSynchronize(stream))
    assert host.tolist() == [7, 7, 7, 7]


def test_an_async_upload_reads_the_host_buffer_when_the_stream_reaches_it():
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(4))
    host = np.array([1, 2, 3, 4], np.uint8)
    upload(ptr, host, stream)
    host[:] = [9, 8, 7, 6]  # changed before the synchronize: the copy uploads this
    ok(rt().cudaStreamSynchronize(stream))
    assert read(ptr, 4) == [9, 8, 7, 6]


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux /proc/self/mem")
def test_a_host_buffer_released_before_the_synchronize_is_an_error_there():
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(4096))
    # A mapping of its own: closing it unmaps it. 16 MB, copied from its lowest page: a new
    # mapping made meanwhile lands at the top of the freed gap (top-down mmap), not there.
    host = mmap.mmap(-1, 16 << 20)
    view = ctypes.c_char.from_buffer(host)
    address = ctypes.addressof(view)
    del view
    ok(rt().cudaMemcpyAsync(ptr, address, 4096, kind("HostToDevice"), stream))
    host.close()  # released before the stream reached the copy
    with pytest.raises(EmulatorError, match=r"cudaMemcpyAsync .* released before"):
        rt().cudaStreamSynchronize(stream)


def test_pinned_memory_is_page_aligned_and_read_when_the_stream_reaches_it():
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(4))
    pinned = ok(rt().cudaHostAlloc(4, rt().cudaHostAllocDefault))
    assert pinned % 4096 == 0
    host = np.ctypeslib.as_array((ctypes.c_uint8 * 4).from_address(pinned))
    host[:] = [1, 2, 3, 4]
    ok(rt().cudaMemcpyAsync(ptr, pinned, 4, kind("HostToDevice"), stream))
    host[:] = [5, 6, 7, 8]  # a DMA from pinned memory reads it when the stream gets there
    ok(rt().cudaStreamSynchronize(stream))
    assert read(ptr, 4) == [5, 6, 7, 8]
    ok(rt().cudaFreeHost(pinned))


def test_pinned_memory_freed_before_its_copy_ran_is_an_error_at_the_synchronize():
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(4))
    pinned = ok(rt().cudaHostAlloc(4, rt().cudaHostAllocDefault))
    ok(rt().cudaMemcpyAsync(ptr, pinned, 4, kind("HostToDevice"), stream))
    ok(rt().cudaFreeHost(pinned))  # documented without synchronization: the copy is pending
    with pytest.raises(EmulatorError, match="released by cudaFreeHost"):
        rt().cudaStreamSynchronize(stream)


def test_cuda_free_host_of_anything_but_a_live_pinned_block_is_invalid_value():
    pinned = ok(rt().cudaHostAlloc(8, 0))
    ok(rt().cudaFreeHost(pinned))
    host = np.zeros(8, np.uint8)
    for ptr in (pinned, host.ctypes.data):
        assert rt().cudaFreeHost(ptr)[0] == rt().cudaError_t.cudaErrorInvalidValue
    assert rt().cudaHostAlloc(8, 1 << 7)[0] == rt().cudaError_t.cudaErrorInvalidValue


def test_counting_counts_the_callers_calls_and_bytes_and_can_leave_work_unrun():
    from trt_kv.emulator import counting

    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(4))
    host = np.array([1, 2, 3, 4], np.uint8)
    with counting() as outer:
        upload(ptr, host, stream)
        with counting(perform=False) as inner:
            upload(ptr, np.array([9, 9, 9, 9], np.uint8), stream)  # checked, counted, not run
            ok(rt().cudaStreamSynchronize(stream))
        assert read(ptr, 4) == [1, 2, 3, 4]
    assert dict(inner.calls) == {"cudaMemcpyAsync": 1, "cudaStreamSynchronize": 1}
    assert dict(outer.calls) == {"cudaMemcpyAsync": 2, "cudaStreamSynchronize": 1, "cudaMemcpy": 1}
    assert outer.bytes == {"HD": 8, "DH": 4} and inner.bytes == {"HD": 4}
    assert 0 < inner.emulator_seconds <= outer.emulator_seconds
    with counting(perform=False), pytest.raises(EmulatorError, match="outside every allocation"):
        upload(ptr + 4096, host, stream)  # checks still run at submission


def test_each_stream_runs_in_its_own_order_and_only_when_synchronized():
    a, b = ok(rt().cudaStreamCreate()), ok(rt().cudaStreamCreate())
    pa, pb = ok(rt().cudaMalloc(2)), ok(rt().cudaMalloc(2))
    ok(rt().cudaMemsetAsync(pa, 1, 2, a))
    ok(rt().cudaMemsetAsync(pb, 5, 2, b))
    ok(rt().cudaMemsetAsync(pa, 2, 1, a))  # after the first memset of a: [2, 1]
    ok(rt().cudaMemsetAsync(pb, 6, 1, b))
    host_a, host_b = np.zeros(2, np.uint8), np.zeros(2, np.uint8)
    download(host_a, pa, a)
    download(host_b, pb, b)
    ok(rt().cudaStreamSynchronize(a))
    assert host_a.tolist() == [2, 1]
    assert host_b.tolist() == [0, 0]  # stream b was not synchronized
    ok(rt().cudaStreamSynchronize(b))
    assert host_b.tolist() == [6, 5]


def test_legacy_stream_work_waits_for_every_stream_and_they_wait_for_it():
    a, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(3))
    ok(rt().cudaMemsetAsync(ptr, 1, 3, a))
    ok(rt().cudaMemset(ptr, 2, 2))  # legacy stream: after a's memset; returns before it runs
    ok(rt().cudaMemsetAsync(ptr, 3, 1, a))  # after the legacy memset
    host = np.zeros(3, np.uint8)
    download(host, ptr, a)
    assert host.tolist() == [0, 0, 0]
    ok(rt().cudaStreamSynchronize(a))  # runs the legacy memset a's later work waits for
    assert host.tolist() == [3, 2, 1]


def test_device_to_device_memcpy_returns_before_it_runs_host_copies_after():
    a, src, dst = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(2)), ok(rt().cudaMalloc(2))
    ok(rt().cudaMemsetAsync(src, 4, 2, a))
    ok(rt().cudaMemset(dst, 0, 2))
    ok(rt().cudaMemcpy(dst, src, 2, kind("DeviceToDevice")))  # "no host-side synchronization"
    host = np.array([9, 9], np.uint8)
    download(host, dst, a)
    assert host.tolist() == [9, 9]
    assert read(dst, 2) == [4, 4]  # a synchronous download waits for everything before it
    assert host.tolist() == [4, 4]  # ... the async download on stream a included


def test_event_query_answers_not_ready_then_completes_and_sync_stops_at_the_record():
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(1))
    event = ok(rt().cudaEventCreate())
    first, second = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    ok(rt().cudaMemsetAsync(ptr, 1, 1, stream))
    download(first, ptr, stream)
    ok(rt().cudaEventRecord(event, stream))
    ok(rt().cudaMemsetAsync(ptr, 2, 1, stream))
    download(second, ptr, stream)
    assert rt().cudaEventQuery(event)[0] == rt().cudaError_t.cudaErrorNotReady
    assert first.tolist() == [0]
    polls = 1
    while rt().cudaEventQuery(event)[0] == rt().cudaError_t.cudaErrorNotReady:
        polls += 1
    assert polls == 1  # the next query completed it
    assert (first.tolist(), second.tolist()) == ([1], [0])  # work after the record: pending
    ok(rt().cudaEventSynchronize(event))
    assert second.tolist() == [0]
    ok(rt().cudaStreamSynchronize(stream))
    assert second.tolist() == [2]


def test_stream_query_polling_ends_and_elapsed_time_waits_for_both_records():
    stream = ok(rt().cudaStreamCreate())
    start, end = ok(rt().cudaEventCreate()), ok(rt().cudaEventCreate())
    ok(rt().cudaEventRecord(start, stream))
    ok(rt().cudaEventRecord(end, stream))
    assert rt().cudaEventElapsedTime(start, end)[0] == rt().cudaError_t.cudaErrorNotReady
    answers = [rt().cudaStreamQuery(stream)[0] for _ in range(3)]
    e = rt().cudaError_t
    assert answers == [e.cudaErrorNotReady, e.cudaSuccess, e.cudaSuccess]
    assert ok(rt().cudaEventElapsedTime(start, end)) >= 0


def test_stream_wait_event_orders_work_across_streams():
    a, b = ok(rt().cudaStreamCreate()), ok(rt().cudaStreamCreate())
    ptr, event = ok(rt().cudaMalloc(1)), ok(rt().cudaEventCreate())
    ok(rt().cudaMemsetAsync(ptr, 3, 1, a))
    ok(rt().cudaEventRecord(event, a))
    ok(rt().cudaMemsetAsync(ptr, 4, 1, a))  # after the record: b does not wait for it
    ok(rt().cudaStreamWaitEvent(b, event, 0))
    host = np.zeros(1, np.uint8)
    download(host, ptr, b)
    ok(rt().cudaStreamSynchronize(b))  # runs a up to the record first
    assert host.tolist() == [3]
    ok(rt().cudaStreamWaitEvent(b, event, 0))  # already complete: nothing to wait for
    ok(rt().cudaStreamWaitEvent(a, ok(rt().cudaEventCreate()), 0))  # never recorded: no-op
    ok(rt().cudaStreamSynchronize(a))
    assert read(ptr, 1) == [4]


@pytest.mark.parametrize("finish", ["destroy", "free"])
def test_queued_work_completes_after_its_stream_is_destroyed_and_before_a_free(finish):
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(1))
    host = np.zeros(1, np.uint8)
    ok(rt().cudaMemsetAsync(ptr, 8, 1, stream))
    download(host, ptr, stream)
    if finish == "destroy":
        ok(rt().cudaStreamDestroy(stream))  # returns at once; the work still completes
        assert host.tolist() == [0]
        ok(rt().cudaDeviceSynchronize())
    else:
        ok(rt().cudaFree(ptr))  # synchronizes the device: the work ran on live memory first
    assert host.tolist() == [8]


def test_driver_work_waits_for_cu_stream_synchronize():
    from cuda.bindings import driver as dr

    assert dr.cuInit(0)[0] == dr.CUresult.CUDA_SUCCESS
    stream, src, dst = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(2)), ok(rt().cudaMalloc(2))
    ok(rt().cudaMemset(src, 6, 2))
    ok(rt().cudaMemset(dst, 0, 2))
    assert dr.cuMemcpyDtoDAsync(dst, src, 2, stream)[0] == dr.CUresult.CUDA_SUCCESS
    host = np.zeros(2, np.uint8)
    download(host, dst, stream)
    assert host.tolist() == [0, 0]
    assert dr.cuStreamSynchronize(stream)[0] == dr.CUresult.CUDA_SUCCESS
    assert host.tolist() == [6, 6]


def test_polygraphy_async_copies_land_at_stream_synchronize():
    from polygraphy import cuda

    stream = cuda.Stream()
    array = cuda.DeviceArray.raw((4,))
    source = np.array([1, 2, 3, 4], np.uint8)
    array.copy_from(source, stream)
    source[:] = [5, 6, 7, 8]  # before the synchronize: the copy reads these
    host = np.zeros(4, np.uint8)
    array.copy_to(host, stream)
    assert host.tolist() == [0, 0, 0, 0]
    stream.synchronize()
    assert host.tolist() == [5, 6, 7, 8]
    array.free()
    stream.free()


def doubling_context():
    """An execution context of an engine y = x + x, x float32 [B, 4], B in 1..2."""
    from trt_kv._trt import trt
    from trt_kv.builder import Profile, build_engine, create_network

    builder, network = create_network()
    x = network.add_input("x", trt.float32, (-1, 4))
    y = network.add_elementwise(x, x, trt.ElementWiseOperation.SUM).get_output(0)
    y.name = "y"
    network.mark_output(y)
    data = build_engine(builder, network, [Profile("p", {"x": ((1, 4), (2, 4), (2, 4))})]).data
    return trt.Runtime(trt.Logger()).deserialize_cuda_engine(data).create_execution_context()


def test_an_engine_enqueue_reads_its_input_when_the_stream_runs_it():
    ctx = doubling_context()
    stream, px, py = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(16)), ok(rt().cudaMalloc(16))
    host = np.array([[1, 2, 3, 4]], np.float32)
    upload(px, host, stream)
    assert ctx.set_input_shape("x", (1, 4))
    assert ctx.set_tensor_address("x", px) and ctx.set_tensor_address("y", py)
    assert tuple(ctx.get_tensor_shape("y")) == (1, 4)  # known from the input shapes
    assert ctx.execute_async_v3(stream)
    host[:] = [[10, 20, 30, 40]]  # before the synchronize: the upload, then y = x + x, see this
    out = np.full((1, 4), -1, np.float32)
    download(out, py, stream)
    assert out.tolist() == [[-1, -1, -1, -1]]
    ok(rt().cudaStreamSynchronize(stream))
    assert out.tolist() == [[20, 40, 60, 80]]


def test_a_graph_launch_checks_its_captured_enqueue_bindings_at_the_launch():
    ctx = doubling_context()
    stream, px, py = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(16)), ok(rt().cudaMalloc(16))
    assert ctx.set_input_shape("x", (1, 4))
    assert ctx.set_tensor_address("x", px) and ctx.set_tensor_address("y", py)
    assert ctx.execute_async_v3(stream)  # the warm-up enqueue capture needs
    mode = rt().cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    ok(rt().cudaStreamBeginCapture(stream, mode))
    assert ctx.execute_async_v3(stream)
    graph_exec = ok(rt().cudaGraphInstantiate(ok(rt().cudaStreamEndCapture(stream)), 0))
    ok(rt().cudaGraphLaunch(graph_exec, stream))
    ok(rt().cudaFree(py))  # synchronizes first: the launch above ran on live memory
    with pytest.raises(EmulatorError, match="use after free"):
        rt().cudaGraphLaunch(graph_exec, stream)


def test_a_runner_that_skips_its_synchronize_reads_logits_that_never_arrived(tmp_path):
    """A deliberately broken TrtBackend: it downloads the logits asynchronously and returns
    them without synchronizing the stream. On a GPU that is a race; here it always shows."""
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.engine.store import build_model_engine
    from trt_kv.models.llama import build_llama_network, random_weights
    from trt_kv.models.llama.network import LOGITS
    from trt_kv.runtime import Session
    from trt_kv.runtime.backend import last_token_logits, step_feed
    from trt_kv.runtime.gpu.trt_backend import TrtBackend
    from trt_kv.runtime.interpreter_backend import InterpreterBackend

    class SkipsTheSynchronize(TrtBackend):
        def run(self, plan):
            feed = step_feed(plan, self.roles, self.embed)
            self._bind(plan, feed)
            self.staging.upload(feed, self.stream)
            self._execute()
            self.landing = np.full(tuple(self.context.get_tensor_shape(LOGITS)), np.nan, np.float32)
            download(self.landing, self.logits.ptr, self.stream)  # no synchronize: the defect
            return last_token_logits(self.landing, plan)

    weights = random_weights(TINY_GQA, seed=3, std=0.3)
    shapes = {"max_seq_len": 16, "max_batch": 1, "max_step_tokens": 4}
    path = build_model_engine("nosync", TINY_GQA, weights, out_dir=tmp_path, **shapes).path
    broken = SkipsTheSynchronize(path)
    try:
        logits = Session(broken).prefill([[5, 17, 42]])
        assert np.isnan(logits).all()  # what the host read: the copy had not run
        ok(rt().cudaStreamSynchronize(broken.stream))
        net = build_llama_network(TINY_GQA, weights, **shapes)
        expected = Session(InterpreterBackend(net)).prefill([[5, 17, 42]])
        np.testing.assert_allclose(broken.landing, expected, rtol=1e-3, atol=1e-3)  # [B, V]
    finally:
        broken.close()


def test_a_2d_download_waits_for_earlier_stream_work_and_a_2d_device_copy_does_not():
    stream, ptr = ok(rt().cudaStreamCreate()), ok(rt().cudaMalloc(8))
    ok(rt().cudaMemset(ptr, 0, 8))
    ok(rt().cudaMemsetAsync(ptr, 5, 2, stream))
    host = np.zeros((2, 2), np.uint8)  # as cudaMemcpy: the legacy stream waits for stream
    ok(rt().cudaMemcpy2D(host.ctypes.data, 2, ptr, 4, 2, 2, kind("DeviceToHost")))
    assert host.tolist() == [[5, 5], [0, 0]]
    ok(rt().cudaMemcpy2D(ptr + 2, 4, ptr, 4, 2, 2, kind("DeviceToDevice")))
    late = np.zeros(8, np.uint8)
    download(late, ptr, stream)  # queued on stream after the (pending) legacy copy
    assert late.tolist() == [0] * 8  # "no host-side synchronization": nothing ran yet
    ok(rt().cudaStreamSynchronize(stream))
    assert late.tolist() == [5, 5, 5, 5, 0, 0, 0, 0]
