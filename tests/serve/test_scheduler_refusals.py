"""Bad requests are refused by name before anything is queued: a bad field
(ArgumentError naming it), prompt + max_tokens past S_max (LimitError naming S_max), a full
queue (QueueFullError), a closed scheduler (ClosedError)."""

import re

import pytest

from tests.support.serve_sessions import SHAPES, host_session
from trt_kv.errors import ArgumentError, ClosedError, LimitError, QueueFullError
from trt_kv.serve.scheduler import SamplingParams, Scheduler

S_MAX, CAPACITY = SHAPES["max_seq_len"], SHAPES["max_batch"]


@pytest.fixture
def scheduler():
    return Scheduler(host_session("float32"), eos_ids=[2], max_queue=2)


BAD_FIELDS = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.0}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"n": 0}, "n"),
    ({"n": CAPACITY + 1}, "n"),
    ({"stop_token_ids": frozenset({64})}, "stop_token_ids"),
]


@pytest.mark.parametrize(("fields", "name"), BAD_FIELDS)
def test_a_bad_field_is_refused_by_name_and_nothing_is_queued(scheduler, fields, name):
    params = SamplingParams(**{"max_tokens": 4, **fields})
    with pytest.raises(ArgumentError, match=rf"^{name}: expected"):
        scheduler.submit([1, 2, 3], params)
    assert scheduler.stats().queue_length == 0 and not scheduler.has_work()


@pytest.mark.parametrize(
    ("prompt", "name"),
    [([], "prompt"), ([1, 64], "prompt"), ([1, -1], "prompt"), ([1.0], "prompt")],
)
def test_a_bad_prompt_is_refused(scheduler, prompt, name):
    with pytest.raises((ArgumentError, TypeError), match=rf"^{name}: expected"):
        scheduler.submit(prompt, SamplingParams(max_tokens=4))
    assert scheduler.stats().submitted == 0


def test_prompt_plus_max_tokens_past_s_max_names_the_limit(scheduler):
    prompt = [1] * 40
    scheduler.submit(prompt, SamplingParams(max_tokens=S_MAX - 40))  # exactly S_max: taken
    with pytest.raises(LimitError, match=re.escape(f"S_max = {S_MAX} tokens, got 40 + 9 = 49")):
        scheduler.submit(prompt, SamplingParams(max_tokens=S_MAX - 39))
    assert scheduler.stats().queue_length == 1


def test_a_full_queue_refuses_until_a_request_leaves_it(scheduler):
    for _ in range(2):
        scheduler.submit([1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(QueueFullError, match="max_queue = 2"):
        scheduler.submit([1, 2], SamplingParams(max_tokens=2))
    scheduler.step()  # the head takes a slot: one place in the queue
    scheduler.submit([1, 2], SamplingParams(max_tokens=2))
    assert scheduler.stats().queue_length == 2


def test_close_ends_every_request_and_refuses_new_ones(scheduler):
    running = scheduler.submit([1, 2, 3], SamplingParams(max_tokens=8, n=2))
    scheduler.step()
    waiting = scheduler.submit([4, 5], SamplingParams(max_tokens=8))
    scheduler.close("cancelled")
    for ticket in (running, waiting):
        assert ticket.done and set(ticket.finish_reasons.values()) == {"cancelled"}
    assert scheduler.stats().free == CAPACITY
    with pytest.raises(ClosedError, match="scheduler"):
        scheduler.submit([1], SamplingParams(max_tokens=1))
