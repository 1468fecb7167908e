"""Events of the emulated CUDA runtime (re-exported by :mod:`.cuda_runtime`).

An event's record is stream work like any other (:mod:`.streams`): it completes when a
synchronizing call runs it. ``cudaEventSynchronize`` runs the recording stream up to the
record; ``cudaEventQuery`` of a pending record answers ``cudaErrorNotReady`` once and completes
it on the next query; ``cudaStreamWaitEvent`` orders later work of a stream after the record.
"""

from __future__ import annotations

import time

from cuda.bindings import runtime as _rt

from trt_kv.emulator.device import CudaCallFailed, Event, returning
from trt_kv.emulator.device import device as _state
from trt_kv.emulator.memory import EmulatorError

cudaError_t = _rt.cudaError_t
cudaEvent_t = _rt.cudaEvent_t


def _returns(n: int) -> object:
    return returning(n, cudaError_t.cudaSuccess, lambda code: code)


def _event(handle: object) -> Event:
    h = int(handle) if handle is not None else 0
    if h not in _state().events:
        raise CudaCallFailed(cudaError_t.cudaErrorInvalidResourceHandle, f"event {h:#x}")
    return _state().events[h]


@_returns(1)
def cudaEventCreate() -> object:
    h = _state().new_handle()
    _state().events[h] = Event()
    return cudaEvent_t(h)


@_returns(0)
def cudaEventDestroy(event: object) -> None:
    _event(event)
    del _state().events[int(event)]


@_returns(0)
def cudaEventRecord(event: object, stream: object) -> None:
    ev, s = _event(event), _state().stream(stream)
    ev.captured = s is not None and s.capture is not None

    def record() -> None:
        ev.time = time.perf_counter()
        if ev.record is queued:
            ev.record = None

    queued = _state().submit(stream, record, "cudaEventRecord")
    ev.record = queued  # None when captured


@_returns(0)
def cudaEventSynchronize(event: object) -> None:
    ev = _event(event)
    _check_event_usable(ev)
    _state().queue.complete(ev.record, "cudaEventSynchronize")


@_returns(0)
def cudaEventQuery(event: object) -> None:
    # "Returns cudaSuccess if all captured work has been completed, or cudaErrorNotReady if any
    # captured work is incomplete." Pending: NotReady once, complete on the next query.
    ev = _event(event)
    _check_event_usable(ev)
    if not _state().queue.poll(ev.record, "cudaEventQuery"):
        raise CudaCallFailed(cudaError_t.cudaErrorNotReady, "event record pending")


@_returns(0)
def cudaStreamWaitEvent(stream: object, event: object, flags: int) -> None:
    # "Makes all future work submitted to stream wait for all work captured in event."
    dev, ev = _state(), _event(event)
    s = dev.stream(stream)
    if s is not None and s.capture is not None:
        raise EmulatorError("cudaStreamWaitEvent on a capturing stream is not emulated")
    dev.queue.wait(0 if s is None else s.handle, ev.record)


def _check_event_usable(ev: Event) -> None:
    # cudaErrorCapturedEvent: "The operation is not permitted on an event which was last
    # recorded in a capturing stream."
    if ev.captured:
        raise CudaCallFailed(cudaError_t.cudaErrorCapturedEvent, "event recorded in a capture")


@_returns(1)
def cudaEventElapsedTime(start: object, end: object) -> float:
    a, b = _event(start), _event(end)
    for ev in (a, b):
        _check_event_usable(ev)
    # cudaEventElapsedTime: "If cudaEventRecord() has not been called on either event, then
    # cudaErrorInvalidResourceHandle is returned."
    # "If ... one or both of them has not yet been completed ..., cudaErrorNotReady is
    # returned."
    if a.record is not None or b.record is not None:
        raise CudaCallFailed(cudaError_t.cudaErrorNotReady, "event record pending")
    if a.time is None or b.time is None:
        raise CudaCallFailed(cudaError_t.cudaErrorInvalidResourceHandle, "event not recorded")
    return (b.time - a.time) * 1e3
