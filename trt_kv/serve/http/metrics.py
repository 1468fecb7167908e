"""The server's Prometheus metrics (``GET /metrics``), each app with its own
``CollectorRegistry`` (so that several apps in one process, as tests make them, count apart).

Requests by endpoint and status, prompt (and cached) and generated tokens, time to first
token and between tokens (seconds, per choice), the queue and running slots (read from the
scheduler when scraped) and the batch occupancy (sequences in each decode step).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "trt_kv"
# seconds: a decode step of the default model is ~4 ms on a GPU, ~40 ms on the interpreter
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OCCUPANCY_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class ServerMetrics:
    """The metrics of one app; ``stats`` returns the scheduler's
    :class:`~trt_kv.serve.scheduler.SchedulerStats` when scraped."""

    def __init__(self, stats: Callable[[], object]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "requests answered, by endpoint and HTTP status",
            ["endpoint", "status"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "prompt tokens", registry=r)
        self.cached_tokens = Counter(
            f"{PREFIX}_cached_prompt_tokens", "prompt tokens a slot held already", registry=r
        )
        self.generated_tokens = Counter(
            f"{PREFIX}_generation_tokens", "tokens generated", registry=r
        )
        self.first_token = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "from the request to its first token",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.inter_token = Histogram(
            f"{PREFIX}_inter_token_seconds", "between a choice's tokens",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.occupancy = Histogram(
            f"{PREFIX}_batch_occupancy", "sequences in each decode step",
            buckets=OCCUPANCY_BUCKETS, registry=r,
        )  # fmt: skip
        queue = Gauge(f"{PREFIX}_queue_length", "requests waiting for a slot", registry=r)
        running = Gauge(f"{PREFIX}_running_slots", "slots held: prefilling or decoding", registry=r)
        free = Gauge(f"{PREFIX}_free_slots", "slots free", registry=r)
        queue.set_function(lambda: stats().queue_length)
        running.set_function(lambda: (lambda s: s.capacity - s.free)(stats()))
        free.set_function(lambda: stats().free)

    def on_step(self, stats: object, step_seconds: float) -> None:
        """The loop's step observer: a decode step's occupancy (steps of none skipped)."""
        if stats.occupancy:
            self.occupancy.observe(stats.occupancy)

    def text(self) -> bytes:
        """Everything, in Prometheus' text format."""
        return generate_latest(self.registry)
