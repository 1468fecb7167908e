"""Random traffic: arrivals, lengths, n, sampling and cancellations drawn from a seed. Every
request is answered (each choice exactly one final event, never more tokens than asked) or
refused by name when the queue is full; nothing is lost, and every slot is free after."""

import numpy as np
import pytest

from tests.support.serve_sessions import host_session
from trt_kv.errors import QueueFullError
from trt_kv.serve.scheduler import SamplingParams, Scheduler


@pytest.mark.parametrize("seed", [0, 1])
def test_random_traffic_answers_or_refuses_every_request_and_frees_every_slot(seed):
    rng = np.random.default_rng(seed)
    scheduler = Scheduler(host_session("float16"), eos_ids=[2], max_queue=6, prefill_chunk=4)
    tickets, refused = [], 0
    for step in range(400):
        if step < 300 and rng.random() < 0.3:
            params = SamplingParams(
                max_tokens=int(rng.integers(1, 12)),
                temperature=float(rng.choice([0.0, 0.8])),
                seed=int(rng.integers(0, 100)),
                n=int(rng.choice([1, 1, 2])),
                top_logprobs=None if rng.random() < 0.5 else 2,
            )
            prompt = rng.integers(0, 64, size=int(rng.integers(1, 30))).tolist()
            try:
                tickets.append(scheduler.submit(prompt, params))
            except QueueFullError:
                refused += 1
        if tickets and rng.random() < 0.05:
            scheduler.cancel(tickets[int(rng.integers(len(tickets)))])
        scheduler.step()
    while scheduler.step():
        pass
    assert refused > 0 and len(tickets) > 50
    finals = 0
    for ticket in tickets:
        per_choice = {i: [] for i in range(ticket.n)}
        while not ticket.events.empty():
            event = ticket.events.get_nowait()
            per_choice[event.choice].append(event)
        for events in per_choice.values():
            assert [e.finish_reason is not None for e in events] == [False] * (len(events) - 1) + [
                True
            ]
            assert len([e for e in events if e.token_id is not None]) <= ticket.params.max_tokens
            finals += 1
    stats = scheduler.stats()
    assert sum(stats.finished.values()) == finals == sum(t.n for t in tickets)
    assert set(stats.finished) == {"stop", "length", "cancelled"}
    assert (stats.free, stats.running, stats.prefilling, stats.queue_length) == (4, 0, 0, 0)
    assert stats.submitted == len(tickets)
