"""Session calls that were silent or a generic Python error (issue 30): a batch no profile
holds, a second thread, an immutable sampler, malformed token arrays and stop ids. Each is a
named error with the cache unchanged."""

import threading

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.errors import ArgumentError, ConcurrentUseError, ShapeError
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Sampler, Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

WEIGHTS = random_weights(TINY_GQA, seed=4, std=0.3)
S_MAX = 12
V = TINY_GQA.vocab_size


def refused(s, exc, match, call):
    """``call()`` raises ``exc`` matching ``match``; lengths and every cache byte unchanged."""
    lengths = s.state.lengths
    arrays = {k: v.copy() for k, v in s.storage.arrays.items()}
    with pytest.raises(exc, match=match):
        call()
    np.testing.assert_array_equal(s.state.lengths, lengths)
    for name, before in arrays.items():
        assert s.storage.arrays[name].tobytes() == before.tobytes(), name


@pytest.fixture(scope="module")
def net():
    return build_llama_network(TINY_GQA, WEIGHTS, max_seq_len=S_MAX, max_batch=2, max_step_tokens=4)


def test_a_batch_above_max_batch_is_refused_before_any_slot_is_reset(net):
    """capacity 4 > max_batch 2 is by design (steps run on windows of slots), but a step of
    3 sequences fits no profile: prefill reset slots 0 and 1 before the step said so."""
    s = Session(InterpreterBackend(net, capacity=4))
    s.prefill([[1, 2, 3], [4, 5]])
    three = [[1], [2], [3]]
    batch = r"step shapes: expected a profile that holds them, got .*input_ids in \[1, 1\]"
    refused(s, ShapeError, batch, lambda: s.prefill(three))
    refused(s, ShapeError, batch, lambda: generate(s, three, 2))
    refused(s, ShapeError, batch, lambda: s.step([[1, 2], [3], [4]]))
    assert s.state.lengths.tolist() == [3, 2, 0, 0]
    s.prefill([[7], [8]], lo=2)  # two at a time still run, in any window
    assert s.state.lengths.tolist() == [3, 2, 1, 1]


def test_a_chunked_prefill_checks_every_chunk_before_the_first_runs(net):
    s = Session(InterpreterBackend(net, capacity=4))
    s.prefill([[1, 2, 3], [4, 5]])
    # 6 tokens: chunks of 4 and 2, the first of slots 0 and 1, the second of 0, 1 and 2
    long = [[1] * 6, [2] * 6, [3] * 6]
    refused(s, ShapeError, "step shapes: expected a profile", lambda: s.prefill(long))


class _Gated:
    """A user's backend whose step waits until the test lets it go (a step in flight)."""

    name = "gated"

    def __init__(self) -> None:
        self.inner = ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=S_MAX)
        self.storage, self.vocab_size = self.inner.storage, self.inner.vocab_size
        self.max_step_tokens = self.inner.max_step_tokens
        self.entered, self.release = threading.Event(), threading.Event()

    def run(self, plan):
        self.entered.set()
        assert self.release.wait(30)
        return self.inner.run(plan)


@pytest.mark.parametrize(
    ("first", "second", "match"),
    [
        (
            "decode",
            "decode",
            "Session.decode: expected one thread at a time, got another thread in Session.decode",
        ),
        (
            "decode",
            "fork",
            "Session.fork: expected one thread at a time, got another thread in Session.decode",
        ),
        (
            "generate",
            "reset",
            "Session.reset: expected one thread at a time, got another thread in Session.generate",
        ),
    ],
)
def test_a_second_thread_on_a_busy_session_raises_and_changes_nothing(first, second, match):
    """2 threads x 25 decodes gave length 53 and an unwritten cache row: now the second
    call, made while the first is provably inside the backend's step, is refused."""
    backend = _Gated()
    s = Session(backend)
    backend.release.set()
    s.prefill([[1, 2], [3, 4]])
    backend.release.clear()
    backend.entered.clear()
    calls = {
        "decode": lambda: s.decode([5, 6]),
        "generate": lambda: generate(s, [[1, 2], [3]], 3),
        "fork": lambda: s.fork(0, 1),
        "reset": lambda: s.reset(0),
    }
    worker = threading.Thread(target=calls[first])
    worker.start()
    try:
        assert backend.entered.wait(30)  # the first call is inside run() now
        lengths = s.state.lengths
        with pytest.raises(ConcurrentUseError, match=match):
            calls[second]()
        np.testing.assert_array_equal(s.state.lengths, lengths)
    finally:
        backend.release.set()
        worker.join(30)
    s.decode([7, 8])  # free again once the first returned


def test_a_second_session_on_a_busy_backend_raises_and_changes_nothing():
    """Two sessions on one backend share its caches: a step of one while another thread is
    inside the other's step is refused, as on one session."""
    backend = _Gated()
    first, second = Session(backend), Session(backend)
    backend.release.set()
    first.prefill([[1, 2], [3, 4]])
    backend.release.clear()
    backend.entered.clear()
    worker = threading.Thread(target=lambda: first.decode([5, 6]))
    worker.start()
    try:
        assert backend.entered.wait(30)
        with pytest.raises(ConcurrentUseError, match=r"Session.fork: .* in Session.decode"):
            second.fork(0, 1)
        np.testing.assert_array_equal(second.state.lengths, [0] * second.capacity)
    finally:
        backend.release.set()
        worker.join(30)
    second.fork(0, 1)  # free again once the first returned (one thread may use both)


def test_the_sampler_is_immutable():
    """``s.temperature = -1.0`` after construction sampled the inverted distribution."""
    sampler = Sampler(1.0, top_k=3, seed=2)
    for field, value in {"temperature": -1.0, "top_k": 0, "seed": -1, "top_p": 2.0}.items():
        with pytest.raises(AttributeError):
            setattr(sampler, field, value)
    assert (sampler.temperature, sampler.top_k, sampler.seed) == (1.0, 3, 2)


def test_a_tiny_temperature_is_refused_before_the_prefill():
    s = Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=S_MAX))
    s.prefill([[1, 2, 3]])
    match = r"temperature: expected 0 \(greedy\) or a number in \[0.001, 1000\], got 1e-320"
    refused(s, ArgumentError, match, lambda: generate(s, [[1]], 2, Sampler(1e-320)))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda s: s.step(np.array(5)),
            ShapeError,
            r"tokens: expected an array \[B, S\], got "
            r"shape \(\)",
        ),
        (lambda s: s.step(np.ones((1, 1, 1), np.int64)), ShapeError, "shape \\(1, 1, 1\\)"),
        (
            lambda s: generate(s, [[1]], 2, eos_ids=[2**70]),
            ArgumentError,
            rf"eos_ids: expected token ids in \[0, {V}\), got {2**70}",
        ),
        (
            lambda s: generate(s, [[1]], 2, eos_ids=np.array([[1, 2]])),
            ArgumentError,
            r"eos_ids: expected token ids .*, got \[1, 2\]",
        ),
        (lambda s: generate(s, [[1]], 2, eos_ids=[[1]]), ArgumentError, r"got \[1\]"),
    ],
)
def test_malformed_arrays_and_stop_ids_are_named_errors(call, exc, match):
    """Each was a TypeError or OverflowError (from len() of a 0-d array, iterating it,
    or int64 conversion)."""
    s = Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=S_MAX))
    s.prefill([[1, 2, 3]])
    refused(s, exc, match, lambda: call(s))


def test_a_zero_dimensional_array_is_one_stop_id():
    s = Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=1, max_seq_len=S_MAX))
    free = generate(s, [[1, 2]], 6).ids[0]
    stop = free[2]
    assert generate(s, [[1, 2]], 6, eos_ids=np.array(stop)).ids[0] == free[: free.index(stop) + 1]
