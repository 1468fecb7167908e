"""The bridge between a scheduler and an asyncio server: one worker thread steps the
scheduler while it has work and sleeps on a condition otherwise; requests' events reach
coroutines through :meth:`EngineLoop.events`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence

from trt_kv.errors import DrainingError, mismatch
from trt_kv.serve.scheduler.params import SamplingParams, TokenEvent
from trt_kv.serve.scheduler.scheduler import Scheduler
from trt_kv.serve.scheduler.ticket import SchedulerStats, Ticket


class EngineLoop:
    """Steps ``scheduler`` on a worker thread (:meth:`start`). ``on_step(stats, seconds)``
    runs on that thread after each step (metrics). The only thread that steps the
    scheduler's session: callers submit, cancel and read events."""

    def __init__(
        self,
        scheduler: Scheduler,
        on_step: Callable[[SchedulerStats, float], None] | None = None,
    ) -> None:
        self.scheduler, self.on_step = scheduler, on_step
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = self._draining = False

    def start(self) -> None:
        """Start the worker thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trt-kv-engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.scheduler.has_work():
                    self._wake.wait()
                if self._stopping:
                    return
            start = time.perf_counter()
            try:
                self.scheduler.step()
            except Exception as err:  # a fault outside any one request: theirs, not the loop's
                self.scheduler.abort(err)
            if self.on_step is not None:
                self.on_step(self.scheduler.stats(), time.perf_counter() - start)

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Ticket:
        """:meth:`Scheduler.submit`, then wake the worker.

        Raises:
            DrainingError: once :meth:`drain` began. As :meth:`Scheduler.submit` otherwise.
        """
        if self._draining:
            raise DrainingError(mismatch("server", "one accepting requests", "", "draining"))
        ticket = self.scheduler.submit(prompt_ids, params)
        self._notify()
        return ticket

    def cancel(self, ticket: Ticket, reason: str = "cancelled", choice: int | None = None) -> None:
        """:meth:`Scheduler.cancel` (the request, or its choice ``choice``), then wake the
        worker (it frees the slots)."""
        self.scheduler.cancel(ticket, reason, choice)
        self._notify()

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` began (new requests are refused; ``/health`` says so)."""
        return self._draining

    async def events(self, ticket: Ticket) -> AsyncIterator[TokenEvent]:
        """``ticket``'s events as they come, until the final event of every choice. A
        consumer that stops early (``aclose``, a cancelled task: a client that
        disconnected) cancels the ticket, so its slots free at the next step."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        stop_listening = ticket.listen(lambda: loop.call_soon_threadsafe(ready.set))
        ended: set[int] = set()
        try:
            while len(ended) < ticket.n:
                while ticket.events.empty():
                    await ready.wait()
                    ready.clear()
                event = ticket.events.get_nowait()
                if event.finish_reason is not None:
                    ended.add(event.choice)
                yield event
        finally:
            stop_listening()
            if len(ended) < ticket.n:
                self.cancel(ticket)

    @property
    def alive(self) -> bool:
        """Whether the worker thread runs (started, not stopped): what a health check asks,
        so that a balancer or Ray restarts a replica whose engine no longer steps."""
        return self._thread is not None and self._thread.is_alive()

    def drain(self, timeout: float) -> None:
        """Stop accepting (:meth:`submit` raises DrainingError), let the requests in flight
        finish for up to ``timeout`` seconds, then end the rest ("cancelled") and stop."""
        self._draining = True
        deadline = time.monotonic() + timeout
        while self.scheduler.has_work() and time.monotonic() < deadline:
            if self._thread is None or not self._thread.is_alive():
                break
            time.sleep(0.01)
        self.stop()
        self.scheduler.close("cancelled")

    def stop(self) -> None:
        """Stop the worker thread after its current step (requests stay as they are)."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
