"""The emulated device's state: memory, streams, stream capture, graphs and events.

One :class:`Device` per process (:func:`device`), shared by the emulated runtime and driver
APIs, the way a real GPU outlives any one ``with emulated_gpu():`` block. Work submitted to a
stream is deferred (:mod:`.streams`): it runs when a synchronizing call needs it, as late as
CUDA allows; when the stream is being captured, :meth:`Device.submit` records it into the
capture's graph instead and ``cudaGraphLaunch`` replays it (as deferred work too).

The capture rules cite the CUDA Programming Guide, "Prohibited and Unhandled Operations" and
"Invalidation" (stream capture), and the ``cudaStreamBeginCapture`` reference.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cuda.bindings import runtime as _rt

from trt_kv.emulator.counting import emulated_call, performing, record_copy
from trt_kv.emulator.host_memory import transfer
from trt_kv.emulator.memory import DeviceMemory, EmulatorError, is_device_pointer
from trt_kv.emulator.streams import LEGACY_STREAM, Checked, Work, WorkQueue

Err = _rt.cudaError_t
PAGE = 4096  # cudaHostAlloc's blocks start on a page
DEFAULT_COMPUTE_CAPABILITY = (8, 9)  # an Ada GPU: TensorRT-RTX's portable engines run on it
Mode = _rt.cudaStreamCaptureMode


class CudaCallFailed(EmulatorError):
    """A CUDA call returned ``code`` (a ``cudaError_t`` or driver ``CUresult``) instead of
    success."""

    def __init__(self, code: Err, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


def returning(n: int, success: object, convert: Callable[[object], object]) -> Callable:
    """Decorator for an API body returning ``n`` values: cuda-python's ``(success, *values)``,
    or ``(convert(code), None * n)`` when the body raises :class:`CudaCallFailed`."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def api(*args: object) -> tuple:
            with emulated_call(fn.__name__, "cuda"):
                try:
                    values = fn(*args)
                except CudaCallFailed as e:
                    return (convert(e.code), *([None] * n))
            return (success, *(values if n > 1 else (values,) if n == 1 else ()))

        return api

    return wrap


@dataclass
class Node:
    """One recorded piece of stream work (a copy, a memset, a kernel, an engine enqueue)."""

    what: str
    work: Callable[[], None]


@dataclass
class Capture:
    """An active stream capture: its mode, thread and recorded nodes."""

    mode: Mode
    thread: int
    nodes: list[Node] = field(default_factory=list)
    invalid: str | None = None  # why the capture was invalidated


@dataclass
class Stream:
    handle: int
    capture: Capture | None = None


@dataclass
class Event:
    time: float | None = None  # perf_counter seconds of the last completed record
    captured: bool = False  # last recorded into a capturing stream
    record: Work | None = None  # the last record, while it is pending


class Device:
    """Memory, streams, graphs and events of the one emulated GPU."""

    def __init__(self, capacity: int = 16 << 30) -> None:
        self.memory = DeviceMemory(capacity)
        # (major, minor): set by each outermost emulated_gpu() block (default 8.9)
        self.compute_capability: tuple[int, int] = DEFAULT_COMPUTE_CAPABILITY
        self.streams: dict[int, Stream] = {}
        self.graphs: dict[int, list[Node]] = {}
        self.execs: dict[int, tuple[Node, ...]] = {}
        self.events: dict[int, Event] = {}
        self.queue = WorkQueue()
        self.pinned: dict[int, tuple[int, ctypes.Array]] = {}  # cudaHostAlloc: ptr -> block
        self.freed_pinned: dict[int, tuple[int, ctypes.Array]] = {}  # kept mapped (see free)
        self._handles = itertools.count(0x5EED_0001)

    def new_handle(self) -> int:
        """A fresh handle, never reused and never equal to another object's handle."""
        return next(self._handles)

    # -- streams and capture ---------------------------------------------------------------
    def stream(self, handle: object) -> Stream | None:
        """The stream for ``handle``; None for the legacy default stream (0).

        Raises:
            CudaCallFailed: cudaErrorInvalidResourceHandle for an unknown or destroyed stream.
        """
        h = int(handle) if handle is not None else LEGACY_STREAM
        if h == LEGACY_STREAM:
            return None
        if h not in self.streams:
            raise CudaCallFailed(
                Err.cudaErrorInvalidResourceHandle, f"stream {h:#x} is not a live stream"
            )
        return self.streams[h]

    def captures(self) -> list[Capture]:
        return [s.capture for s in self.streams.values() if s.capture is not None]

    def invalidate(self, captures: list[Capture], reason: str) -> None:
        # "When an invalid operation is attempted during stream capture, any associated
        # capture graphs are invalidated."
        for c in captures:
            c.invalid = c.invalid or reason

    def check_legacy_stream(self, what: str) -> None:
        """Refuse use of the legacy stream while a (blocking) stream is capturing.

        "When any stream in the same context is being captured, and it was not created with
        cudaStreamNonBlocking, any attempted use of the legacy stream is invalid." and "It is
        therefore also invalid to call synchronous APIs in this case. Synchronous APIs, such as
        cudaMemcpy(), enqueue work to the legacy stream and synchronize it before returning."
        (every emulated stream is blocking: cudaStreamCreate makes blocking streams).
        """
        active = self.captures()
        if active:
            self.invalidate(active, f"{what} used the legacy stream")
            raise CudaCallFailed(
                Err.cudaErrorStreamCaptureImplicit,
                f"{what}: the legacy stream is unusable while a stream is capturing",
            )

    def check_unsafe_call(self, what: str) -> None:
        """Refuse a potentially unsafe call (cudaMalloc, cudaFree...) under capture.

        cudaStreamBeginCapture, cudaStreamCaptureModeGlobal: "if the local thread has an ongoing
        capture sequence that was not initiated with cudaStreamCaptureModeRelaxed at
        cuStreamBeginCapture, or if any other thread has a concurrent capture sequence initiated
        with cudaStreamCaptureModeGlobal, this thread is prohibited from potentially unsafe API
        calls."
        """
        me = threading.get_ident()
        bad = [
            c
            for c in self.captures()
            if (c.thread == me and c.mode != Mode.cudaStreamCaptureModeRelaxed)
            or (c.thread != me and c.mode == Mode.cudaStreamCaptureModeGlobal)
        ]
        if bad:
            self.invalidate(bad, f"{what} during capture")
            raise CudaCallFailed(
                Err.cudaErrorStreamCaptureUnsupported, f"{what} is not permitted during capture"
            )

    def submit(self, stream: object, work: Callable[[], None], what: str) -> Work | None:
        """Queue ``work`` on ``stream`` (it runs when a synchronizing call needs it; see
        :mod:`.streams`), or record it when the stream is being captured (then None).

        Raises:
            CudaCallFailed: unknown stream (cudaErrorInvalidResourceHandle); the legacy stream
                during a capture (cudaErrorStreamCaptureImplicit); a capture already invalidated
                (cudaErrorStreamCaptureInvalidated).
        """
        s = self.stream(stream)
        if s is None:
            self.check_legacy_stream(what)
        elif s.capture is not None:
            # "When a capture graph is invalidated, further use of any streams which are being
            # captured ... is invalid and will return an error"
            if s.capture.invalid:
                raise CudaCallFailed(
                    Err.cudaErrorStreamCaptureInvalidated,
                    f"{what}: capture invalidated earlier ({s.capture.invalid})",
                )
            s.capture.nodes.append(Node(what, work))
            return None  # a captured copy's bytes are counted when a launch replays it
        count_moves(work)
        if not performing():  # counting(perform=False): checked now, never run
            work = Checked(work.check, _skip) if isinstance(work, Checked) else _skip
        return self.queue.submit(LEGACY_STREAM if s is None else s.handle, work, what)

    def synchronize(self, stream: object, what: str) -> None:
        """Complete the work queued on ``stream`` (and what it waits for), after
        :meth:`check_sync`; the legacy stream waits for every blocking stream.

        Raises:
            CudaCallFailed: as :meth:`check_sync`.
            StreamWorkError: queued work failed when it ran (see :mod:`.streams`).
        """
        self.check_sync(stream, what)
        s = self.stream(stream)
        if s is None:  # as a legacy-stream operation would: after all work submitted so far
            self.queue.complete_all(what)
        else:
            self.queue.complete(self.queue.tail(s.handle), what)

    def query(self, stream: object, what: str) -> bool:
        """Whether ``stream`` has no pending work: pending work answers False once and
        completes on the next query (:meth:`.streams.WorkQueue.poll`), so polling ends.

        Raises:
            CudaCallFailed: as :meth:`check_sync`.
            StreamWorkError: queued work failed when it ran.
        """
        self.check_sync(stream, what)
        s = self.stream(stream)
        if s is None:  # the legacy stream waits for every blocking stream
            return self.queue.poll_all(what)
        return self.queue.poll(self.queue.tail(s.handle), what)

    def check_sync(self, stream: object, what: str) -> None:
        """Refuse to synchronize or query a capturing stream.

        "It is invalid to synchronize or query the execution status of a stream which is being
        captured or a captured event, because they do not represent items scheduled for
        execution."
        """
        s = self.stream(stream)
        if s is None:
            self.check_legacy_stream(what)
        elif s.capture is not None:
            self.invalidate([s.capture], f"{what} of the capturing stream")
            raise CudaCallFailed(
                Err.cudaErrorStreamCaptureUnsupported,
                f"{what}: the stream is being captured",
            )

    # -- copies ----------------------------------------------------------------------------
    def copy_work(self, dst: int, src: int, count: int, kind: str) -> Checked:
        """Check a copy of ``count`` bytes now; return the work that performs it.

        ``kind``: two letters, source and destination, ``H`` host or ``D`` device (``"HD"``
        is host to device). Checked again when the work runs (deferred work, or a graph replay,
        may run after a free); the host side is read or written when the work runs.

        Raises:
            EmulatorError: as :meth:`copy_work_2d`.
        """
        return self.copy_work_2d(dst, count, src, count, count, 1, kind)

    def copy_work_2d(
        self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: str
    ) -> Checked:
        """As :meth:`copy_work` for ``height`` rows of ``width`` bytes, row ``r`` from
        ``src + r * spitch`` to ``dst + r * dpitch`` (callers check ``width <= pitch``).
        Each side's span, first row start to last row end, must lie in one live allocation
        (device) or be host memory: every row is then inside it. Counted as one copy of
        ``width * height`` bytes.

        Raises:
            EmulatorError: a device span outside one live allocation, a host side that is a
                device pointer or null, or a device source row overlapping a destination row.
        """
        dst, src, width, height = int(dst), int(src), int(width), int(height)
        dpitch, spitch = int(dpitch), int(spitch)
        src_side, dst_side = kind
        s_span, d_span = (p * (height - 1) + width for p in (spitch, dpitch))

        def addresses() -> tuple[int, int]:
            s = self._side(src, s_span, src_side, "source")
            d = self._side(dst, d_span, dst_side, "destination")
            # cudaMemcpy, cudaMemcpy2D: "The memory areas may not overlap."
            if kind == "DD" and _rows_overlap((src, spitch), (dst, dpitch), width, height):
                raise EmulatorError(
                    f"device copy [{src:#x}, +{s_span}) -> [{dst:#x}, +{d_span}): "
                    "expected non-overlapping ranges, got an overlap"
                )
            return d, s

        addresses()

        def work() -> None:
            d, s = addresses()
            for row in range(height):  # a released host buffer: EmulatorError, not a crash
                transfer(d + row * dpitch, s + row * spitch, width, kind)

        return Checked(addresses, work, (kind, width * height))

    def host_alloc(self, size: int) -> int:
        """Page-locked host memory (``cudaHostAlloc``): a page-aligned block, kept mapped
        after :meth:`host_free` so that stream work reaching it late is reported."""
        block = ctypes.create_string_buffer(size + PAGE)
        ptr = -ctypes.addressof(block) % PAGE + ctypes.addressof(block)
        self.pinned[ptr] = (size, block)
        return ptr

    def host_free(self, ptr: int) -> None:
        """Release a :meth:`host_alloc` block.

        Raises:
            CudaCallFailed: ``ptr`` is not a live pinned block (cudaErrorInvalidValue).
        """
        if ptr not in self.pinned:
            raise CudaCallFailed(
                Err.cudaErrorInvalidValue, f"cudaFreeHost({ptr:#x}): not a live pinned block"
            )
        self.freed_pinned[ptr] = self.pinned.pop(ptr)

    def _check_pinned_live(self, ptr: int, count: int, role: str) -> None:
        # cudaFreeHost documents no synchronization: work queued before it that reads or
        # writes the block may reach it after the free (on a GPU, memory no longer pinned).
        for start, (size, _) in self.freed_pinned.items():
            if start <= ptr < start + size:
                raise EmulatorError(
                    f"copy {role} [{ptr:#x}, +{count}): expected live host memory, got pinned "
                    "memory released by cudaFreeHost before the stream work reached it"
                )

    def _side(self, ptr: int, count: int, side: str, role: str) -> int:
        if side == "D":
            return self.memory.host_address(ptr, count)
        self._check_pinned_live(ptr, count, role)
        # cudaMemcpy: "Calling cudaMemcpy() with dst and src pointers that do not match the
        # direction of the copy results in an undefined behavior." The emulator refuses.
        if ptr == 0 or is_device_pointer(ptr):
            raise EmulatorError(
                f"copy {role} {ptr:#x}: expected a host pointer (the copy kind says host), "
                f"got {'null' if ptr == 0 else 'a device pointer'}"
            )
        return ptr


def count_moves(work: object) -> None:
    """Count the bytes ``work`` moves (a copy: :attr:`Checked.moves`) as submitted now."""
    if isinstance(work, Checked) and work.moves is not None:
        record_copy(*work.moves)


def _rows_overlap(a: tuple[int, int], b: tuple[int, int], width: int, height: int) -> bool:
    """Whether a row of ``a`` and a row of ``b`` (``(start, pitch)``, ``height`` rows of
    ``width`` bytes each) share a byte: rows sorted by start, each compared with the furthest
    end of the other side's rows before it."""
    rows = sorted(
        (p + r * pitch, side) for side, (p, pitch) in enumerate((a, b)) for r in range(height)
    )
    furthest = [-1, -1]  # per side: the furthest row end so far
    for start, side in rows:
        if furthest[1 - side] > start:
            return True
        furthest[side] = max(furthest[side], start + width)
    return False


def _skip() -> None:
    """Stream work stubbed out by ``counting(perform=False)``."""


_DEVICE: Device | None = None


def device() -> Device:
    """The process's emulated GPU (created on first use)."""
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = Device()
    return _DEVICE
