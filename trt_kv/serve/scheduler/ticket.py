"""A request as its caller holds it (:class:`Ticket`: its events, thread-safe) and the
scheduler's counters (:class:`SchedulerStats`)."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trt_kv.serve.scheduler.params import SamplingParams, TokenEvent


class Ticket:
    """One submitted request: ``events`` receives its :class:`TokenEvent` s (every choice's
    tokens, then one final event per choice), written by the scheduler's thread, read by any.
    ``cached_tokens`` is set when the request takes its slot (prompt tokens found cached
    there: prefix reuse). ``done`` once every choice has had its final event."""

    def __init__(self, prompt: list[int], params: SamplingParams) -> None:
        self.request_id = f"req-{uuid.uuid4().hex}"
        self.prompt, self.params = prompt, params
        self.prompt_tokens = len(prompt)
        self.n = params.n
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.finish_reasons: dict[int, str] = {}
        self.events: queue.Queue[TokenEvent] = queue.Queue()
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return len(self.finish_reasons) == self.n

    def put(self, event: TokenEvent) -> None:
        """Deliver ``event`` (the scheduler's thread), then wake every listener."""
        if event.token_id is not None:
            self.completion_tokens += 1
        if event.finish_reason is not None:
            self.finish_reasons[event.choice] = event.finish_reason
        self.events.put(event)
        with self._lock:
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` (from the scheduler's thread) after each event; returns the
        function that stops it."""
        with self._lock:
            self._listeners.append(wake)

        def stop() -> None:
            with self._lock:
                if wake in self._listeners:
                    self._listeners.remove(wake)

        return stop


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler after a step: requests waiting (``queue_length``), sequences decoding
    (``running``), requests prefilling, free slots out of ``capacity``; ``steps`` taken;
    ``occupancy``: sequences in the last decode step (its batch); totals of requests
    submitted, choices ended per finish reason, prompt tokens (``cached_tokens`` of them
    found cached) and generated tokens."""

    queue_length: int
    running: int
    prefilling: int
    free: int
    capacity: int
    steps: int
    occupancy: int
    submitted: int
    finished: Mapping[str, int]
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
