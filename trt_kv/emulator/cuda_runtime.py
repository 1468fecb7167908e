"""Stand-in for ``cuda.bindings.runtime`` on the emulated device.

Same names, call signatures and ``(cudaError_t, *values)`` returns as cuda-python, for the
calls trt_kv, its tests and Polygraphy make; the enums and handle types ARE cuda-python's.
Misuse that CUDA reports with an error code returns that code; memory-safety violations that
CUDA leaves undefined or reports late (a copy leaving its allocation, a freed or foreign
pointer, a double free) raise :class:`~trt_kv.emulator.memory.EmulatorError` at once.

Stream work is deferred (:mod:`.streams`): async copies, memsets, engine enqueues, graph
launches and event records run when a synchronizing call needs them, and no earlier.
Synchronizing: ``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaDeviceSynchronize``,
``cudaFree`` (it synchronizes the device), a second ``cudaStreamQuery``/``cudaEventQuery`` of
pending work (the first answers ``cudaErrorNotReady``), and ``cudaMemcpy``/``cudaMemcpy2D`` to
or from host memory (legacy stream: it waits for all work before it and returns once done).
``cudaMemset`` and device-to-device ``cudaMemcpy``/``cudaMemcpy2D`` return before they run
("no host-side synchronization is performed"; API synchronization behavior). Deferred work
that fails raises :class:`~trt_kv.emulator.streams.StreamWorkError` from the synchronizing call
that ran it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cuda.bindings import runtime as _rt

from trt_kv.emulator.cuda_device_info import (  # noqa: F401 (re-exported API)
    DEVICE_NAME,
    cudaDeviceGetAttribute,
    cudaDriverGetVersion,
    cudaGetDevice,
    cudaGetDeviceCount,
    cudaGetDeviceProperties,
    cudaMemGetInfo,
    cudaRuntimeGetVersion,
    cudaSetDevice,
    device_attributes,
)
from trt_kv.emulator.cuda_events import (  # noqa: F401 (re-exported API)
    cudaEventCreate,
    cudaEventDestroy,
    cudaEventElapsedTime,
    cudaEventQuery,
    cudaEventRecord,
    cudaEventSynchronize,
    cudaStreamWaitEvent,
)
from trt_kv.emulator.device import Capture, CudaCallFailed, Stream, count_moves, returning
from trt_kv.emulator.device import device as _state
from trt_kv.emulator.memory import EmulatorError, is_device_pointer
from trt_kv.emulator.streams import Checked

# cuda-python's own types: values made here are indistinguishable from real ones.
cudaError_t = _rt.cudaError_t
cudaMemcpyKind = _rt.cudaMemcpyKind
cudaStreamCaptureMode = _rt.cudaStreamCaptureMode
cudaStreamCaptureStatus = _rt.cudaStreamCaptureStatus
cudaStream_t = _rt.cudaStream_t
cudaGraph_t = _rt.cudaGraph_t
cudaGraphExec_t = _rt.cudaGraphExec_t
cudaEvent_t = _rt.cudaEvent_t
cudaDeviceProp = _rt.cudaDeviceProp
cudaDeviceAttr = _rt.cudaDeviceAttr

# Public names that are not cuda-python API (the conformance test checks all the others).
EMULATOR_EXTRAS = ("submit", "DEVICE_NAME", "EMULATOR_PARTS", "device_attributes")
# modules whose API this one re-exports
EMULATOR_PARTS = ("trt_kv.emulator.cuda_events", "trt_kv.emulator.cuda_device_info")
_KINDS = {
    cudaMemcpyKind.cudaMemcpyHostToHost: "HH",
    cudaMemcpyKind.cudaMemcpyHostToDevice: "HD",
    cudaMemcpyKind.cudaMemcpyDeviceToHost: "DH",
    cudaMemcpyKind.cudaMemcpyDeviceToDevice: "DD",
}
_OK = cudaError_t.cudaSuccess


def submit(stream: object, work: Callable[[], None], what: str) -> None:
    """Queue ``work`` on ``stream`` (it runs when a synchronizing call needs it), or record it
    into the stream's capture (replayed by ``cudaGraphLaunch``). The emulated TensorRT's
    ``execute_async_v3`` enqueues through this.

    Raises:
        CudaCallFailed: ``.code`` is the cudaError_t CUDA returns (unknown stream, legacy stream
            during a capture, invalidated capture).
    """
    _state().submit(stream, work, what)


def _returns(n: int) -> Callable:
    return returning(n, _OK, lambda code: code)


# -- device ------------------------------------------------------------------------------------
@_returns(0)
def cudaDeviceSynchronize() -> None:
    _synchronize_device("cudaDeviceSynchronize")


def _synchronize_device(what: str) -> None:
    # "It is also invalid to query the execution status of or synchronize a broader handle
    # which encompasses an active stream capture, such as a device or context handle"
    active = _state().captures()
    if active:
        _state().invalidate(active, what)
        raise CudaCallFailed(
            cudaError_t.cudaErrorStreamCaptureUnsupported, f"{what}: device synchronize in capture"
        )
    _state().queue.complete_all(what)


def cudaGetErrorString(error: cudaError_t) -> tuple:
    return _rt.cudaGetErrorString(error)  # a static table in cuda-python: needs no GPU


def cudaGetErrorName(error: cudaError_t) -> tuple:
    return _rt.cudaGetErrorName(error)


# -- memory ------------------------------------------------------------------------------------
@_returns(1)
def cudaMalloc(size: int) -> int:
    dev = _state()
    dev.check_unsafe_call("cudaMalloc")
    if int(size) == 0:
        return 0
    try:
        return dev.memory.malloc(size)
    except EmulatorError as e:  # cudaMalloc "returns cudaErrorMemoryAllocation in case of failure"
        raise CudaCallFailed(cudaError_t.cudaErrorMemoryAllocation, str(e)) from e


@_returns(0)
def cudaFree(devPtr: int) -> None:
    # "If devPtr is 0, no operation is performed." Otherwise devPtr "must have been returned by
    # a previous call to cudaMalloc() ... Otherwise, or if cudaFree(devPtr) has already been
    # called before, an error is returned." The emulator raises (EmulatorError): a double free
    # is never silent, even where the caller ignores the return code.
    if int(devPtr) == 0:
        return
    _state().check_unsafe_call("cudaFree")
    # cudaFree synchronizes the device (CUDA Programming Guide, "Implicit Synchronization";
    # cudaFreeAsync exists to avoid it): queued work that uses the memory runs first.
    _synchronize_device("cudaFree")
    _state().memory.free(devPtr)


# The flags cudaHostAlloc takes (cuda-python's own values).
cudaHostAllocDefault = _rt.cudaHostAllocDefault
cudaHostAllocPortable = _rt.cudaHostAllocPortable
cudaHostAllocMapped = _rt.cudaHostAllocMapped
cudaHostAllocWriteCombined = _rt.cudaHostAllocWriteCombined
_HOST_ALLOC_FLAGS = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined


@_returns(1)
def cudaHostAlloc(size: int, flags: int) -> int:
    # "Allocates size bytes of host memory that is page-locked and accessible to the device."
    if int(flags) & ~_HOST_ALLOC_FLAGS:
        raise CudaCallFailed(cudaError_t.cudaErrorInvalidValue, f"cudaHostAlloc flags {flags}")
    try:
        return _state().host_alloc(max(int(size), 1))
    except (MemoryError, OverflowError) as e:  # no host memory to give: CUDA's answer
        raise CudaCallFailed(cudaError_t.cudaErrorMemoryAllocation, str(e)) from e


@_returns(0)
def cudaFreeHost(ptr: int) -> None:
    # "Frees the memory space pointed to by hostPtr, which must have been returned by a
    # previous call to cudaMallocHost() or cudaHostAlloc()." No synchronization is documented.
    _state().host_free(int(ptr))


def _sides(dst: int, src: int, kind: object) -> str:
    """The copy's direction as two letters, source then destination (``"HD"``...).

    Raises:
        CudaCallFailed: cudaErrorInvalidMemcpyDirection for a value no cudaMemcpyKind has.
    """
    try:
        kind = cudaMemcpyKind(kind)
    except ValueError as e:
        raise CudaCallFailed(cudaError_t.cudaErrorInvalidMemcpyDirection, str(e)) from e
    if kind == cudaMemcpyKind.cudaMemcpyDefault:
        # "Passing cudaMemcpyDefault is recommended, in which case the type of transfer is
        # inferred from the pointer values." (unified virtual addressing)
        return "".join("D" if is_device_pointer(p) else "H" for p in (src, dst))
    return _KINDS[kind]


def _copy(dst: int, src: int, count: int, kind: object) -> tuple[Callable[[], None], str]:
    sides = _sides(dst, src, kind)
    return _state().copy_work(dst, src, count, sides), sides


def _legacy_copy(work: Callable[[], None], sides: str, what: str) -> None:
    """Queue a synchronous copy on the legacy stream; wait for it unless device to device."""
    queued = _state().submit(0, work, what)
    # API synchronization behavior: a copy from or to host memory returns once done (from
    # pageable memory: once staged, which reads the host buffer); "For transfers from device
    # memory to device memory, no host-side synchronization is performed."
    if sides != "DD":
        _state().queue.complete(queued, what)


@_returns(0)
def cudaMemcpy(dst: int, src: int, count: int, kind: object) -> None:
    if int(count) == 0:
        return
    _legacy_copy(*_copy(dst, src, count, kind), "cudaMemcpy")


@_returns(0)
def cudaMemcpy2D(
    dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: object
) -> None:
    # cudaMemcpy2D: "`width` must not exceed either `dpitch` or `spitch`"; its documented
    # returns include cudaErrorInvalidPitchValue, which "indicates that one or more of the
    # pitch-related parameters passed to the API call is not within the acceptable range for
    # pitch" (cudaError_t). Synchronizing as cudaMemcpy for the same kind.
    if int(width) > min(int(dpitch), int(spitch)):
        raise CudaCallFailed(
            cudaError_t.cudaErrorInvalidPitchValue,
            f"cudaMemcpy2D width {width} > dpitch {dpitch} or spitch {spitch}",
        )
    if int(width) == 0 or int(height) == 0:
        return
    sides = _sides(dst, src, kind)
    work = _state().copy_work_2d(dst, dpitch, src, spitch, width, height, sides)
    _legacy_copy(work, sides, "cudaMemcpy2D")


@_returns(0)
def cudaMemcpyAsync(dst: int, src: int, count: int, kind: object, stream: object) -> None:
    # Deferred whatever the memory: "For transfers between device memory and pageable host
    # memory, the function might be synchronous with respect to host." Might: the host may
    # rely on nothing before the stream is synchronized.
    if int(count) == 0:
        return
    work, _ = _copy(dst, src, count, kind)
    _state().submit(stream, work, "cudaMemcpyAsync")


def _memset(devPtr: int, value: int, count: int) -> Checked:
    mem, ptr, count = _state().memory, int(devPtr), int(count)
    mem.find(ptr, count)

    def work() -> None:
        alloc, offset = mem.find(ptr, count)
        alloc.data[offset : offset + count] = int(value) & 0xFF

    return Checked(lambda: mem.find(ptr, count), work)


@_returns(0)
def cudaMemset(devPtr: int, value: int, count: int) -> None:
    # "The cudaMemset functions are asynchronous with respect to the host except when the
    # target memory is pinned host memory." (API synchronization behavior): queued.
    _state().submit(0, _memset(devPtr, value, count), "cudaMemset")


@_returns(0)
def cudaMemsetAsync(devPtr: int, value: int, count: int, stream: object) -> None:
    _state().submit(stream, _memset(devPtr, value, count), "cudaMemsetAsync")


# -- streams and capture ---------------------------------------------------------------------------
@_returns(1)
def cudaStreamCreate() -> object:
    dev = _state()
    h = dev.new_handle()
    dev.streams[h] = Stream(h)
    return cudaStream_t(h)


@_returns(0)
def cudaStreamDestroy(stream: object) -> None:
    dev = _state()
    s = dev.stream(stream)
    if s is None:
        raise CudaCallFailed(cudaError_t.cudaErrorInvalidResourceHandle, "the legacy stream")
    if s.capture is not None:
        raise CudaCallFailed(cudaError_t.cudaErrorStreamCaptureUnsupported, "stream capturing")
    # "In case the device is still doing work in the stream stream when cudaStreamDestroy() is
    # called, the function will return immediately and the resources associated with stream
    # will be released automatically once the device has completed all work in stream."
    # The queued work stays queued (a device synchronize or later legacy work runs it).
    del dev.streams[s.handle]


@_returns(0)
def cudaStreamSynchronize(stream: object) -> None:
    _state().synchronize(stream, "cudaStreamSynchronize")


@_returns(0)
def cudaStreamQuery(stream: object) -> None:
    # "Returns cudaSuccess if all operations in stream have completed, or cudaErrorNotReady
    # if not." Pending work answers NotReady once, then completes on the next query.
    if not _state().query(stream, "cudaStreamQuery"):
        raise CudaCallFailed(cudaError_t.cudaErrorNotReady, "work pending on the stream")


@_returns(1)
def cudaStreamIsCapturing(stream: object) -> object:
    s = _state().stream(stream)
    status = cudaStreamCaptureStatus
    if s is None or s.capture is None:
        return status.cudaStreamCaptureStatusNone
    if s.capture.invalid:
        return status.cudaStreamCaptureStatusInvalidated
    return status.cudaStreamCaptureStatusActive


@_returns(0)
def cudaStreamBeginCapture(stream: object, mode: object) -> None:
    s = _state().stream(stream)
    if s is None:
        # "Stream capture can be used on any CUDA stream except cudaStreamLegacy"
        raise CudaCallFailed(
            cudaError_t.cudaErrorStreamCaptureUnsupported, "capture of the legacy stream"
        )
    if s.capture is not None:
        raise CudaCallFailed(cudaError_t.cudaErrorIllegalState, "stream already capturing")
    s.capture = Capture(cudaStreamCaptureMode(mode), threading.get_ident())


@_returns(1)
def cudaStreamEndCapture(stream: object) -> object:
    dev = _state()
    s = dev.stream(stream)
    if s is None or s.capture is None:
        raise CudaCallFailed(cudaError_t.cudaErrorIllegalState, "stream is not capturing")
    capture = s.capture
    # "If the mode argument to cudaStreamBeginCapture was not cudaStreamCaptureModeRelaxed,
    # this call must be from the same thread as cudaStreamBeginCapture."
    if (
        capture.mode != cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
        and capture.thread != threading.get_ident()
    ):
        raise CudaCallFailed(cudaError_t.cudaErrorStreamCaptureWrongThread, "other thread")
    s.capture = None
    # "This call will take the associated streams out of capture mode, but will also return an
    # error value and a NULL graph." (an invalidated capture)
    if capture.invalid:
        raise CudaCallFailed(cudaError_t.cudaErrorStreamCaptureInvalidated, capture.invalid)
    h = dev.new_handle()
    dev.graphs[h] = list(capture.nodes)
    return cudaGraph_t(h)


# -- graphs ------------------------------------------------------------------------------------
def _graph_handle(table: dict, handle: object, what: str) -> int:
    h = int(handle) if handle is not None else 0
    if h not in table:
        raise CudaCallFailed(cudaError_t.cudaErrorInvalidValue, f"{what} {h:#x} is not live")
    return h


@_returns(1)
def cudaGraphInstantiate(graph: object, flags: int) -> object:
    dev = _state()
    nodes = dev.graphs[_graph_handle(dev.graphs, graph, "graph")]
    h = dev.new_handle()
    dev.execs[h] = tuple(nodes)
    return cudaGraphExec_t(h)


@_returns(0)
def cudaGraphLaunch(graphExec: object, stream: object) -> None:
    dev = _state()
    nodes = dev.execs[_graph_handle(dev.execs, graphExec, "graph exec")]
    for node in nodes:  # pointer checks at the launch too (a freed buffer: EmulatorError here)
        if isinstance(node.work, Checked):
            node.work.check()
        count_moves(node.work)  # the copies a replay makes

    def replay() -> None:
        for node in nodes:
            node.work()

    dev.submit(stream, replay, "cudaGraphLaunch")


@_returns(0)
def cudaGraphDestroy(graph: object) -> None:
    dev = _state()
    del dev.graphs[_graph_handle(dev.graphs, graph, "graph")]


@_returns(0)
def cudaGraphExecDestroy(graphExec: object) -> None:
    dev = _state()
    del dev.execs[_graph_handle(dev.execs, graphExec, "graph exec")]
