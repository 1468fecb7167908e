"""The scheduler: continuous batching of requests over one Session's slots, in tokens
(never HTTP): :class:`Scheduler`, its requests' :class:`SamplingParams`, :class:`Ticket` and
:class:`TokenEvent` s, and :class:`EngineLoop`, the worker thread asyncio servers drive it by."""

from trt_kv.errors import DrainingError, LimitError, QueueFullError
from trt_kv.serve.scheduler.loop import EngineLoop
from trt_kv.serve.scheduler.params import SamplingParams, TokenEvent
from trt_kv.serve.scheduler.scheduler import Scheduler
from trt_kv.serve.scheduler.ticket import SchedulerStats, Ticket

__all__ = [
    "DrainingError",
    "EngineLoop",
    "LimitError",
    "QueueFullError",
    "SamplingParams",
    "Scheduler",
    "SchedulerStats",
    "Ticket",
    "TokenEvent",
]
