"""Deferred stream work: what the emulated device has been given but has not run yet.

A real GPU runs stream work some time after the call that submits it returns; the host may
rely on a result only once CUDA guarantees completion. The emulator makes "some time" as late
as CUDA allows: :meth:`WorkQueue.submit` only queues; the work runs when a synchronizing call
needs it (``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaDeviceSynchronize``, a
synchronous ``cudaMemcpy``, ``cudaFree``, a second ``cudaStreamQuery``...) and no earlier.
So a host that reads an async download before synchronizing sees its old bytes, and an async
upload reads the host buffer as it is when the stream reaches the copy, as on a GPU.

Order (CUDA Programming Guide, "Streams" and "Default Stream"; every emulated stream is a
blocking stream, as ``cudaStreamCreate`` makes them):

- work on one stream runs in submission order;
- work on the legacy default stream (0) waits for all work submitted before it on every
  stream, and work submitted after it on any stream waits for it ("the legacy default stream
  ... is an implicit stream which synchronizes with all other blocking streams");
- ``cudaStreamWaitEvent(s, e)``: work submitted to ``s`` afterwards waits for ``e``'s record.

Completing one piece of work runs exactly the pending work it depends on (transitively), in
submission order, then it; everything else stays pending.

A piece of work that raises when it runs is dropped from the queue and its exception surfaces
from the synchronizing call that ran it, as :class:`StreamWorkError` naming the call that
submitted it (a real GPU reports such errors, e.g. ``cudaErrorIllegalAddress``, from a later
synchronizing call too).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from trt_kv.emulator.memory import EmulatorError

LEGACY_STREAM = 0


class StreamWorkError(EmulatorError):
    """Deferred stream work failed when a synchronizing call ran it (``__cause__``: why)."""


@dataclass(frozen=True)
class Checked:
    """Stream work with its pointer checks: done when it is submitted, again when it runs
    (``run`` repeats them), and again when a graph launch submits it as a captured node."""

    check: Callable[[], object]
    run: Callable[[], None]
    moves: tuple[str, int] | None = None  # a copy's direction ("HD"...) and bytes

    def __call__(self) -> None:
        self.run()


@dataclass(eq=False)
class Work:
    """One pending piece of stream work: ``what`` submitted it, ``run`` performs it."""

    seq: int
    stream: int
    what: str
    run: Callable[[], None]
    deps: tuple[Work, ...]
    done: bool = False
    polled: bool = False  # a query already answered cudaErrorNotReady for this work


@dataclass
class WorkQueue:
    """Pending work of every stream of one device, with its ordering dependencies."""

    pending: dict[int, Work] = field(default_factory=dict)  # seq -> work, in submission order
    _tails: dict[int, Work] = field(default_factory=dict)  # stream -> its last pending work
    _seq: itertools.count = field(default_factory=itertools.count)

    def submit(
        self, stream: int, run: Callable[[], None], what: str, after: Work | None = None
    ) -> Work:
        """Queue ``run`` on ``stream`` behind everything CUDA orders it after (and ``after``);
        nothing runs."""
        if stream == LEGACY_STREAM:  # each stream's last work (it waits for the earlier)
            self._tails = {k: w for k, w in self._tails.items() if not w.done}
            deps = list(self._tails.values())
        else:
            deps = [w for w in (self._live_tail(stream), self._live_tail(LEGACY_STREAM)) if w]
        if after is not None and not after.done:
            deps.append(after)
        work = Work(next(self._seq), stream, what, run, tuple(deps))
        self.pending[work.seq] = work
        self._tails[stream] = work
        return work

    def wait(self, stream: int, work: Work | None) -> None:
        """Work submitted to ``stream`` from now on waits for ``work`` (cudaStreamWaitEvent):
        a no-op queued on ``stream`` after ``work``."""
        if work is not None and not work.done:
            self.submit(stream, lambda: None, "cudaStreamWaitEvent", after=work)

    def tail(self, stream: int) -> Work | None:
        """The last pending work of ``stream`` (None when the stream has none)."""
        return self._live_tail(stream)

    def _live_tail(self, stream: int) -> Work | None:
        work = self._tails.get(stream)
        return work if work is not None and not work.done else None

    def complete(self, work: Work | None, site: str) -> None:
        """Run ``work`` and the pending work it depends on, in submission order.

        Raises:
            StreamWorkError: a piece of that work raised; it is dropped, the rest stays queued.
        """
        if work is None or work.done:
            return
        needed, todo = {}, [work]
        while todo:
            w = todo.pop()
            if not w.done and w.seq not in needed:
                needed[w.seq] = w
                todo.extend(w.deps)
        for seq in sorted(needed):
            self._run(needed[seq], site)

    def complete_all(self, site: str) -> None:
        """Run every pending piece of work (cudaDeviceSynchronize and calls that imply it)."""
        while self.pending:
            self._run(self.pending[min(self.pending)], site)

    def discard(self) -> None:
        """Drop every pending piece of work unrun (after a failure that may have released
        the host buffers it would write)."""
        for work in self.pending.values():
            work.done = True
        self.pending.clear()

    def poll(self, work: Work | None, site: str) -> bool:
        """Whether ``work`` is complete, for cudaStreamQuery / cudaEventQuery: pending work
        answers "not ready" once and completes on the next poll, so a polling loop ends."""
        if work is None or work.done:
            return True
        if not work.polled:
            work.polled = True
            return False
        self.complete(work, site)
        return True

    def poll_all(self, site: str) -> bool:
        """:meth:`poll` for all pending work at once (a query of the legacy stream)."""
        if all(w.polled for w in self.pending.values()):
            self.complete_all(site)
            return True
        for w in self.pending.values():
            w.polled = True
        return False

    def _run(self, work: Work, site: str) -> None:
        if work.done:  # already run by a synchronizing call inside other work
            return
        work.done = True
        del self.pending[work.seq]
        try:
            work.run()
        except Exception as err:
            raise StreamWorkError(
                f"{work.what} (stream {work.stream:#x}) failed when {site} ran it: {err}"
            ) from err
