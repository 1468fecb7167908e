"""Sampling per request: a seeded sampled request gives the same ids whatever else runs
(and as ``generate`` with that seed alone), n choices each their own seed, OpenAI's
frequency/presence penalties by their definition, logprobs from the step's logits."""

import dataclasses

import numpy as np

from tests.support.serve_sessions import PROMPTS, drain_events, host_session
from trt_kv.runtime import Sampler, generate
from trt_kv.serve.scheduler import SamplingParams, Scheduler
from trt_kv.serve.scheduler.choice import choice_seed

SAMPLED = SamplingParams(max_tokens=10, temperature=0.9, top_k=20, top_p=0.95, seed=1234)


def run(scheduler):
    while scheduler.step():
        pass


def token_ids(events):
    return [e.token_id for e in events]


def test_a_seeded_sampled_request_gives_the_ids_of_generate_alone_whatever_else_runs():
    alone = generate(
        host_session("float16"),
        [PROMPTS[2]],
        10,
        Sampler(temperature=0.9, top_k=20, top_p=0.95, seed=1234),
    ).ids[0]
    for others in (0, 3):
        scheduler = Scheduler(host_session("float16"), eos_ids=[], prefill_chunk=4)
        crowd = [scheduler.submit(PROMPTS[k], SamplingParams(max_tokens=12)) for k in range(others)]
        ticket = scheduler.submit(PROMPTS[2], SAMPLED)
        run(scheduler)
        assert token_ids(drain_events(ticket)[0]) == alone, f"with {others} others"
        assert all(t.done for t in crowd)


def test_n_sampled_choices_each_take_their_own_seed():
    scheduler = Scheduler(host_session("float16"), eos_ids=[])
    ticket = scheduler.submit(PROMPTS[2], dataclasses.replace(SAMPLED, n=3))
    run(scheduler)
    events = drain_events(ticket)
    for i in range(3):
        sampler = Sampler(temperature=0.9, top_k=20, top_p=0.95, seed=choice_seed(1234, i))
        alone = generate(host_session("float16"), [PROMPTS[2]], 10, sampler).ids[0]
        assert token_ids(events[i]) == alone
    assert len({tuple(token_ids(e)) for e in events.values()}) == 3
    assert choice_seed(1234, 0) == 1234 and choice_seed(1234, 1) != choice_seed(1235, 1)


def test_frequency_and_presence_penalties_follow_openais_definition():
    """logits[t] -= frequency * count(t) + presence * (count(t) > 0) over generated ids;
    checked step by step against the logits of a session fed the same ids."""
    params = SamplingParams(max_tokens=10, frequency_penalty=1.5, presence_penalty=0.5)
    scheduler = Scheduler(host_session("float16"), eos_ids=[])
    ticket = scheduler.submit(PROMPTS[0], params)
    run(scheduler)
    got = token_ids(drain_events(ticket)[0])
    session = host_session("float16")
    logits, counts = session.prefill([PROMPTS[0]])[0], np.zeros(64)
    for t in got:
        penalized = logits - 1.5 * counts - 0.5 * (counts > 0)
        assert t == int(np.argmax(penalized.astype(np.float32)))
        counts[t] += 1
        logits = session.decode([t])[0]
    plain = generate(host_session("float16"), [PROMPTS[0]], 10).ids[0]
    assert got != plain  # this prompt's greedy answer repeats a token: the penalty shows


def test_logprobs_are_the_log_softmax_of_the_step_logits():
    scheduler = Scheduler(host_session("float16"), eos_ids=[])
    ticket = scheduler.submit(PROMPTS[1], SamplingParams(max_tokens=3, top_logprobs=2))
    plain = scheduler.submit(PROMPTS[1], SamplingParams(max_tokens=3))
    run(scheduler)
    events = drain_events(ticket)[0]
    session = host_session("float16")
    logits = session.prefill([PROMPTS[1]])[0].astype(np.float64)
    for e in events:
        expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert abs(e.logprob - expected[e.token_id]) < 1e-9
        best = np.argsort(-expected, kind="stable")[:2]
        assert e.top_logprobs == tuple((int(t), float(expected[t])) for t in best)
        assert e.top_logprobs[0][0] == e.token_id  # greedy: the best alternative
        logits = session.decode([e.token_id])[0].astype(np.float64)
    assert all(e.logprob is None and e.top_logprobs == () for e in drain_events(plain)[0])


def test_an_end_id_stops_a_choice_with_stop_and_a_stop_id_too():
    first = generate(host_session("float16"), [PROMPTS[3]], 4).ids[0]
    scheduler = Scheduler(host_session("float16"), eos_ids=[first[1]])
    by_eos = scheduler.submit(PROMPTS[3], SamplingParams(max_tokens=4))
    by_stop = scheduler.submit(
        PROMPTS[3], SamplingParams(max_tokens=4, stop_token_ids=frozenset({first[0]}))
    )
    run(scheduler)
    eos_events, stop_events = drain_events(by_eos)[0], drain_events(by_stop)[0]
    assert token_ids(eos_events) == first[:2] and eos_events[-1].finish_reason == "stop"
    assert token_ids(stop_events) == first[:1] and stop_events[-1].finish_reason == "stop"


def test_ignore_eos_runs_past_the_end_id_to_max_tokens_and_a_stop_id_still_ends():
    first = generate(host_session("float16"), [PROMPTS[3]], 4).ids[0]
    scheduler = Scheduler(host_session("float16"), eos_ids=[first[1]])
    past = scheduler.submit(PROMPTS[3], SamplingParams(max_tokens=4, ignore_eos=True))
    stopped = scheduler.submit(
        PROMPTS[3],
        SamplingParams(max_tokens=4, ignore_eos=True, stop_token_ids=frozenset({first[1]})),
    )
    run(scheduler)
    past_events, stopped_events = drain_events(past)[0], drain_events(stopped)[0]
    assert token_ids(past_events) == first and past_events[-1].finish_reason == "length"
    assert token_ids(stopped_events) == first[:2] and stopped_events[-1].finish_reason == "stop"
