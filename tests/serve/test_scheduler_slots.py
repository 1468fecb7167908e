"""Slots under the scheduler: lowest free first, a cancelled request's slots free at the
next step boundary, prefix reuse (a free slot's cached tokens spare their prefill), n
choices from one prefill, one request's failure isolated from the others."""

import pytest

from tests.support.serve_sessions import (
    CONFIG,
    PROMPTS,
    WEIGHTS,
    drain_events,
    host_session,
    solo,
)
from trt_kv.errors import ArgumentError
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session
from trt_kv.serve.scheduler import SamplingParams, Scheduler

GREEDY = SamplingParams(max_tokens=6)


def run(scheduler):
    while scheduler.step():
        pass


def ids(ticket, choice=0):
    return [e.token_id for e in drain_events(ticket)[choice]]


def test_requests_take_the_lowest_free_slots_and_free_them_when_done():
    scheduler = Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=8)
    a = scheduler.submit(PROMPTS[0], GREEDY)
    scheduler.step()  # a prefilled in slot 0
    b = scheduler.submit(PROMPTS[1], SamplingParams(max_tokens=1))
    c = scheduler.submit(PROMPTS[2], GREEDY)
    scheduler.step()  # b in slot 1, done after its prefill: slot 1 free again
    scheduler.step()  # c takes slot 1
    assert b.done and scheduler.stats().free == 2
    run(scheduler)
    assert a.done and c.done and scheduler.stats().free == 4


def test_a_cancelled_request_ends_with_its_reason_and_frees_its_slot_within_one_step():
    scheduler = Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=8)
    keep = scheduler.submit(PROMPTS[0], SamplingParams(max_tokens=10))
    gone = scheduler.submit(PROMPTS[1], SamplingParams(max_tokens=10, n=2))
    for _ in range(4):
        scheduler.step()
    assert scheduler.stats().free == 1
    scheduler.cancel(gone, reason="stop")  # as the HTTP layer does at a stop string
    scheduler.step()
    assert scheduler.stats().free == 3
    events = drain_events(gone)
    assert [e[-1].finish_reason for e in events.values()] == ["stop", "stop"]
    assert all(e[-1].token_id is None for e in events.values())
    run(scheduler)
    assert ids(keep) == solo(lambda: host_session("float16"), PROMPTS[0], 10)[0]


def test_one_choice_cancelled_frees_its_slot_at_the_next_step_and_the_others_go_on():
    scheduler = Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=8)
    three = scheduler.submit(PROMPTS[1], SamplingParams(max_tokens=10, n=3))
    scheduler.step()  # its 8 tokens prefilled: each choice has its first token
    assert scheduler.stats().running == 3
    later = scheduler.submit(PROMPTS[2], SamplingParams(max_tokens=10))
    scheduler.cancel(three, reason="stop", choice=1)  # a stop string met by choice 1
    scheduler.cancel(later, reason="stop", choice=0)  # asked while it waits: kept till it runs
    with pytest.raises(ArgumentError, match=r"^choice: expected an integer in \[0, 2\]"):
        scheduler.cancel(three, choice=3)
    scheduler.step()  # choice 1 ended at this boundary; later prefills its first chunk
    assert scheduler.stats().running == 2
    run(scheduler)
    events = drain_events(three)
    assert [(e.token_id is None, e.finish_reason) for e in events[1]] == [
        (False, None),
        (True, "stop"),
    ]
    expected = solo(lambda: host_session("float16"), PROMPTS[1], 10)[0]
    assert [e.token_id for e in events[0]] == [e.token_id for e in events[2]] == expected
    assert [e.finish_reason for e in drain_events(later)[0]] == [None, "stop"]  # one token, then
    assert scheduler.stats().finished == {"stop": 2, "length": 2}
    assert scheduler.stats().free == scheduler.capacity


def test_a_waiting_request_cancelled_never_runs():
    scheduler = Scheduler(host_session("float16"), eos_ids=[])
    ticket = scheduler.submit(PROMPTS[0], GREEDY)
    scheduler.cancel(ticket)
    run(scheduler)
    assert ids(ticket) == [None] and ticket.finish_reasons == {0: "cancelled"}
    assert scheduler.stats().finished == {"cancelled": 1}


def test_the_next_turn_reuses_the_cached_prefix_and_prefills_only_the_rest():
    scheduler = Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=4)
    first = scheduler.submit(PROMPTS[2], GREEDY)
    run(scheduler)
    answer = ids(first)
    turn = [*PROMPTS[2], *answer, 7, 9]
    second = scheduler.submit(turn, GREEDY)
    run(scheduler)
    # the slot holds the prompt and every answer token but the last (never fed)
    assert second.cached_tokens == len(PROMPTS[2]) + len(answer) - 1
    assert scheduler.stats().cached_tokens == second.cached_tokens
    assert ids(second) == solo(lambda: host_session("float16"), turn, 6)[0]


def test_a_prompt_that_is_all_cached_still_feeds_its_last_token():
    scheduler = Scheduler(host_session("float16"), eos_ids=[])
    run_once = [scheduler.submit(PROMPTS[1], GREEDY) for _ in range(2)]
    run(scheduler)
    assert [t.cached_tokens for t in run_once] == [0, 0]  # both ran at once: nothing cached
    again = scheduler.submit(PROMPTS[1], GREEDY)
    run(scheduler)
    assert again.cached_tokens == len(PROMPTS[1]) - 1
    assert ids(again) == ids(run_once[0])


def test_n_choices_share_one_prefill_and_greedy_choices_agree():
    scheduler = Scheduler(host_session("float16"), eos_ids=[])
    ticket = scheduler.submit(PROMPTS[3], SamplingParams(max_tokens=6, n=3))
    for _ in range(3):  # 18 tokens in chunks of max_step_tokens = 8
        scheduler.step()
    assert scheduler.stats().running == 3 and scheduler.stats().prefilling == 0
    run(scheduler)
    expected = solo(lambda: host_session("float16"), PROMPTS[3], 6)[0]
    events = drain_events(ticket)
    assert [[e.token_id for e in events[i]] for i in range(3)] == [expected] * 3
    assert scheduler.stats().prompt_tokens == len(PROMPTS[3])


def test_n_choices_wait_for_n_free_slots():
    scheduler = Scheduler(host_session("float16"), eos_ids=[])
    busy = scheduler.submit(PROMPTS[0], SamplingParams(max_tokens=3, n=2))
    scheduler.step()
    wide = scheduler.submit(PROMPTS[1], SamplingParams(max_tokens=3, n=3))
    scheduler.step()
    assert scheduler.stats().queue_length == 1  # 2 slots free, 3 needed
    run(scheduler)
    assert busy.done and wide.done


class FailingBackend(ReferenceBackend):
    """A user's backend that raises in any step feeding token 63, or taking a sequence past
    30 cached tokens (device faults)."""

    def run(self, plan):
        if (plan.input_ids == 63).any() or plan.kv_lengths.max() > 30:
            raise RuntimeError("the device fell over")
        return super().run(plan)


def failing_scheduler():
    backend = FailingBackend(CONFIG, WEIGHTS, capacity=4, max_seq_len=48, max_step_tokens=8)
    return Scheduler(Session(backend), eos_ids=[], prefill_chunk=4)


def test_a_failing_prefill_ends_its_request_with_an_error_and_the_others_go_on():
    scheduler = failing_scheduler()
    good = scheduler.submit(PROMPTS[0], SamplingParams(max_tokens=10))
    for _ in range(3):
        scheduler.step()
    bad = scheduler.submit([5, 6, 7, 8, 9, 63], GREEDY)  # fails in its second chunk
    run(scheduler)
    (last,) = drain_events(bad)[0]
    assert (last.finish_reason, last.error) == ("error", "RuntimeError: the device fell over")
    assert ids(good) == solo(lambda: host_session("reference"), PROMPTS[0], 10)[0]
    assert scheduler.stats().free == 4


def test_a_failing_decode_step_ends_the_requests_in_it_and_the_scheduler_goes_on():
    scheduler = failing_scheduler()
    long = scheduler.submit(PROMPTS[4], SamplingParams(max_tokens=20))  # past 30 at token 9
    short = scheduler.submit(PROMPTS[0], SamplingParams(max_tokens=20))  # shares that step
    run(scheduler)
    for ticket in (long, short):
        events = drain_events(ticket)[0]
        assert events[-1].finish_reason == "error" and events[-1].token_id is None
        assert len(events) < 20
    later = scheduler.submit(PROMPTS[1], GREEDY)
    run(scheduler)
    assert ids(later) == solo(lambda: host_session("reference"), PROMPTS[1], 6)[0]
    assert scheduler.stats().free == 4 and scheduler.stats().finished["error"] == 2


@pytest.mark.parametrize("kind", ["reference", "float16"])
def test_every_slot_is_free_after_a_mixed_run(kind):
    scheduler = Scheduler(host_session(kind), eos_ids=[], prefill_chunk=4)
    tickets = [
        scheduler.submit(p, SamplingParams(max_tokens=5, n=1 + k % 2))
        for k, p in enumerate(PROMPTS)
    ]
    scheduler.step()
    scheduler.cancel(tickets[2])
    run(scheduler)
    assert all(t.done for t in tickets)
    assert scheduler.stats().free == scheduler.capacity


def test_more_slots_than_the_engine_batch_decode_in_windows_of_its_batch():
    from tests.support.serve_sessions import SHAPES
    from trt_kv.models.llama import build_llama_network
    from trt_kv.runtime.interpreter_backend import InterpreterBackend

    net = build_llama_network(CONFIG, WEIGHTS, dtype="float16", **{**SHAPES, "max_batch": 2})
    scheduler = Scheduler(Session(InterpreterBackend(net, capacity=4)), eos_ids=[])
    assert (scheduler.capacity, scheduler.max_window) == (4, 2)
    tickets = [scheduler.submit(p, SamplingParams(max_tokens=12)) for p in PROMPTS[:4]]
    occupancy = []
    while scheduler.step():
        occupancy.append(scheduler.stats().occupancy)
    assert max(occupancy) == 4
    for ticket, prompt in zip(tickets, PROMPTS):
        assert ids(ticket) == solo(lambda: host_session("float16"), prompt, 12)[0]


def test_a_long_prompt_prefills_one_chunk_per_step_while_running_streams_go_on():
    scheduler = Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=4)
    running = scheduler.submit(PROMPTS[0], SamplingParams(max_tokens=20))
    scheduler.step()
    long = scheduler.submit(PROMPTS[4], GREEDY)  # 23 tokens: 6 chunks of 4
    chunks = 0
    while not long.completion_tokens:
        before = running.completion_tokens
        scheduler.step()
        chunks += 1
        assert running.completion_tokens == before + 1  # one token every step boundary
    assert chunks == 6 and long.cached_tokens == 0
    run(scheduler)
    assert ids(long) == solo(lambda: host_session("float16"), PROMPTS[4], 6)[0]


def test_abort_ends_the_requests_holding_slots_with_an_error_and_the_queue_goes_on():
    """What the engine loop does when a step raises past its own handlers
    (``Scheduler.abort``): every request holding slots ends with "error" and the error's
    message, its slots reset and free; a request still queued then runs as it would alone."""
    scheduler = Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=8)
    running = [scheduler.submit(p, SamplingParams(max_tokens=10, n=2)) for p in PROMPTS[:2]]
    queued = scheduler.submit(PROMPTS[2], GREEDY)
    for _ in range(3):
        scheduler.step()
    stats = scheduler.stats()
    assert (stats.free, stats.queue_length) == (0, 1)
    scheduler.abort(RuntimeError("a step failed"))
    stats = scheduler.stats()
    # finished counts choices: two requests of two
    assert (stats.free, stats.queue_length, stats.finished.get("error")) == (4, 1, 4)
    for ticket in running:
        assert ticket.done
        for events in drain_events(ticket).values():
            end = events[-1]
            assert (end.token_id, end.finish_reason) == (None, "error")
            assert end.error == "RuntimeError: a step failed"
    run(scheduler)
    assert ids(queued) == solo(lambda: host_session("float16"), PROMPTS[2], 6)[0]
    assert scheduler.stats().free == 4
