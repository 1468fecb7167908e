"""The decode loop's stop tokens (one id or several, each sequence stops on its own, the stop
token kept) and its streaming callback (every token, in order, as it is chosen)."""

import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.errors import ArgumentError
from trt_kv.models.llama import random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6]]
WEIGHTS = random_weights(TINY_GQA, seed=0, std=0.3)


def _session():
    return Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=32))


@pytest.fixture(scope="module")
def free_run():
    """The ids without any stop token (10 each)."""
    ids = generate(_session(), PROMPTS, 10).ids
    assert ids[0][3] not in ids[0][:3]  # the stop chosen below appears first at step 3
    return ids


def test_a_sequence_stops_after_its_eos_and_keeps_it(free_run):
    stop = free_run[0][3]
    got = generate(_session(), PROMPTS, 10, eos_ids=stop).ids
    assert got[0] == free_run[0][:4]
    cut = free_run[1].index(stop) + 1 if stop in free_run[1] else 10
    assert got[1] == free_run[1][:cut]


def test_several_eos_ids_stop_at_the_first_met(free_run):
    stops = [free_run[0][3], free_run[1][1]]
    got = generate(_session(), PROMPTS, 10, eos_ids=stops).ids
    for k in range(2):
        first = min(i for i, t in enumerate(free_run[k]) if t in stops)
        assert got[k] == free_run[k][: first + 1]


def test_no_eos_runs_max_new_tokens(free_run):
    assert generate(_session(), PROMPTS, 10, eos_ids=()).ids == free_run


def test_on_token_sees_every_token_in_order(free_run):
    seen = []
    got = generate(_session(), PROMPTS, 10, on_token=lambda k, t: seen.append((k, t))).ids
    assert [t for k, t in seen if k == 0] == got[0] == free_run[0]
    assert [t for k, t in seen if k == 1] == got[1]
    steps = [seen[i : i + 2] for i in range(0, len(seen), 2)]
    assert all([k for k, _ in pair] == [0, 1] for pair in steps)  # one token each per step


@pytest.mark.parametrize("eos", [-1, TINY_GQA.vocab_size, [2, TINY_GQA.vocab_size + 5], 1.0, True])
def test_eos_ids_outside_the_vocabulary_are_refused_before_anything_runs(eos):
    session = _session()
    with pytest.raises(ArgumentError, match=r"eos_ids: expected token ids in \[0, "):
        generate(session, PROMPTS, 10, eos_ids=eos)
    assert session.state.lengths.tolist() == [0, 0]
