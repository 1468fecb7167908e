"""A backend used from two threads at once (issue 37): ``run`` called directly from a second
thread while a step is in flight gave logits off by 6-9, with no error, and a ``close``
during a step freed what the step was using. Each is now refused with ConcurrentUseError,
as a second thread on a session is; the step in flight finishes as if alone.

A step is held in flight by the backend's own hooks, never by patching it: the ``embed``
function of the ALiBi embeddings network (tests/builder/test_decoder_embeddings.py), the
``forward`` of a reference backend."""

import threading

import numpy as np
import pytest

from tests.builder.test_decoder_embeddings import (
    BACKENDS,
    embed,
    engines,
    engines_if_gpu,
    make_backend,
)
from tests.support.tiny_models import TINY_GQA
from trt_kv.errors import ConcurrentUseError
from trt_kv.models.llama import random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session

__all__ = ["engines", "engines_if_gpu"]  # fixtures of test_decoder_embeddings, used here

NAMES = {
    "interpreter": "InterpreterBackend",
    "tensorrt": "TrtBackend",
    "polygraphy": "PolygraphyBackend",
}
PROMPTS = [[3, 14, 15], [5, 35]]


class Gate:
    """Holds the step that calls it, once armed, until the test releases it."""

    def __init__(self) -> None:
        self.armed = False
        self.entered, self.release = threading.Event(), threading.Event()

    def hold(self) -> None:
        if self.armed:
            self.entered.set()
            assert self.release.wait(30)


class InFlight:
    """``call()`` on a worker thread, held inside the backend's step by ``gate``."""

    def __init__(self, gate: Gate, call) -> None:
        self.gate, self.result, self.error = gate, None, None
        gate.armed = True
        self.thread = threading.Thread(target=self._run, args=(call,))

    def _run(self, call) -> None:
        try:
            self.result = call()
        except BaseException as err:  # re-raised by finish()
            self.error = err

    def __enter__(self) -> "InFlight":
        self.thread.start()
        if not self.gate.entered.wait(30):  # the worker is inside the step now, or failed
            self.__exit__()
            self.finish()
            raise AssertionError("the worker never reached the gate")
        return self

    def __exit__(self, *exc) -> None:
        self.gate.release.set()
        self.thread.join(30)

    def finish(self) -> object:
        if self.error is not None:
            raise self.error
        return self.result


def _gated(kind: str, engines_if_gpu):
    """A backend of the ALiBi embeddings network whose ``embed`` waits at ``gate``, and a
    function that plans a fresh prefill of PROMPTS (the embedder keeps one plan's result)."""
    gate = Gate()

    def gated_embed(ids: np.ndarray) -> np.ndarray:
        gate.hold()
        return embed(ids)

    backend = make_backend(kind, True, engines_if_gpu, embed=gated_embed)
    state = Session(backend).state
    return backend, lambda: state.plan([0, 1], PROMPTS, from_empty=True), gate


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_second_thread_running_a_step_of_a_busy_backend_is_refused(kind, engines_if_gpu):
    backend, plan, gate = _gated(kind, engines_if_gpu)
    name = NAMES[kind]
    try:
        solo = backend.run(plan())  # the step as it runs alone
        with InFlight(gate, lambda: backend.run(plan())) as worker:
            expected = (
                rf"^{name}.run: expected one thread at a time, got another thread in {name}.run$"
            )
            with pytest.raises(ConcurrentUseError, match=expected):
                backend.run(plan())
        np.testing.assert_array_equal(worker.finish(), solo)  # the step in flight, untouched
    finally:
        gate.release.set()
        getattr(backend, "close", lambda: None)()


@pytest.mark.parametrize("kind", BACKENDS[1:])  # those with a close(): the GPU ones
def test_closing_a_backend_during_a_step_of_another_thread_is_refused(kind, engines_if_gpu):
    backend, plan, gate = _gated(kind, engines_if_gpu)
    name = NAMES[kind]
    try:
        with InFlight(gate, lambda: backend.run(plan())) as worker:
            expected = (
                rf"^{name}.close: expected one thread at a time, got another thread in {name}.run$"
            )
            with pytest.raises(ConcurrentUseError, match=expected):
                backend.close()
            assert not backend.closed
        assert worker.finish().shape == (2, backend.vocab_size)  # the step ran to its end
    finally:
        gate.release.set()
        backend.close()


class _GatedReference(ReferenceBackend):
    """A reference backend whose model forward is held by a gate (its documented hook)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__(
            TINY_GQA, random_weights(TINY_GQA, seed=4, std=0.3), capacity=2, max_seq_len=12
        )
        self.gate = gate

    def forward(self, plan, caches):
        self.gate.hold()
        return super().forward(plan, caches)


def test_a_second_thread_running_a_step_of_a_busy_reference_backend_is_refused():
    gate = Gate()
    backend = _GatedReference(gate)
    plan = Session(backend).state.plan([0, 1], PROMPTS, from_empty=True)
    expected = (
        r"^_GatedReference.run: expected one thread at a time, "
        r"got another thread in _GatedReference.run$"
    )
    with (
        InFlight(gate, lambda: backend.run(plan)) as worker,
        pytest.raises(ConcurrentUseError, match=expected),
    ):
        backend.run(plan)
    worker.finish()
