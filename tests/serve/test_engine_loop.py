"""The worker thread between the scheduler and an asyncio server: events reach coroutines
as they come, a consumer that stops early (a client that disconnected) frees its slots at
the next step, a drain refuses new requests and ends what is left with a finish reason."""

import asyncio
import time

import pytest

from tests.support.serve_sessions import PROMPTS, host_session, solo
from trt_kv.errors import DrainingError
from trt_kv.serve.scheduler import EngineLoop, SamplingParams, Scheduler


@pytest.fixture
def loop():
    steps = []
    engine = EngineLoop(
        Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=4),
        on_step=lambda stats, seconds: steps.append((stats, seconds)),
    )
    engine.steps = steps
    engine.start()
    yield engine
    engine.stop()


async def collect(engine, ticket):
    return [e async for e in engine.events(ticket)]


def test_concurrent_streams_get_the_ids_of_each_request_alone(loop):
    async def main():
        tickets = [loop.submit(p, SamplingParams(max_tokens=8)) for p in PROMPTS[:4]]
        return await asyncio.gather(*(collect(loop, t) for t in tickets))

    results = asyncio.run(main())
    for prompt, events in zip(PROMPTS, results):
        assert [e.token_id for e in events] == solo(lambda: host_session("float16"), prompt, 8)[0]
        assert events[-1].finish_reason == "length"
    assert max(stats.occupancy for stats, _ in loop.steps) > 1
    assert all(seconds > 0 for _, seconds in loop.steps)


def test_a_consumer_that_stops_early_frees_its_slot_within_a_step(loop):
    async def main():
        ticket = loop.submit(PROMPTS[1], SamplingParams(max_tokens=40))
        stream = loop.events(ticket)
        first = await stream.__anext__()
        await stream.aclose()  # the client went away
        return ticket, first

    ticket, first = asyncio.run(main())
    assert first.token_id is not None
    deadline = time.monotonic() + 10
    while not ticket.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ticket.finish_reasons == {0: "cancelled"} and ticket.completion_tokens < 40
    assert loop.scheduler.stats().free == loop.scheduler.capacity


def test_an_idle_loop_sleeps_until_a_request_comes(loop):
    time.sleep(0.2)
    assert loop.scheduler.stats().steps == 0
    ticket = loop.submit(PROMPTS[0], SamplingParams(max_tokens=2))
    assert asyncio.run(collect(loop, ticket))[-1].finish_reason == "length"


def test_drain_lets_requests_in_flight_finish_and_refuses_new_ones(loop):
    tickets = [loop.submit(p, SamplingParams(max_tokens=6)) for p in PROMPTS[:3]]
    loop.drain(30)
    assert [t.finish_reasons for t in tickets] == [{0: "length"}] * 3
    with pytest.raises(DrainingError, match="draining"):
        loop.submit(PROMPTS[2], SamplingParams(max_tokens=2))


def test_drain_past_its_deadline_ends_the_rest_as_cancelled(loop):
    running = loop.submit(PROMPTS[0], SamplingParams(max_tokens=44))
    waiting = [loop.submit(PROMPTS[1], SamplingParams(max_tokens=20, n=4)) for _ in range(2)]
    loop.drain(0)
    assert running.finish_reasons == {0: "cancelled"}
    assert all(set(t.finish_reasons.values()) == {"cancelled"} for t in waiting)
    assert loop.scheduler.stats().free == loop.scheduler.capacity


def test_alive_while_the_worker_thread_runs():
    engine = EngineLoop(Scheduler(host_session("float16"), eos_ids=[]))
    assert not engine.alive  # not started
    engine.start()
    assert engine.alive
    engine.stop()
    assert not engine.alive
