"""The session state machine (``test_session_state_machine.py``) on the TensorRT backend:
an engine of the same float32 network (MAX_BATCH = 2) with CAPACITY = 3 slots, closed
part-way through; after ``close()`` every call must raise ClosedError and change nothing.

Marked ``gpu``: without a GPU it runs on the emulated device, on a real GPU unchanged.
"""

import pytest
from hypothesis import settings
from hypothesis.stateful import precondition, rule

import tests.runtime.test_session_state_machine as machine
from tests.support.tiny_models import TINY_GQA
from trt_kv.engine.store import build_model_engine

pytestmark = pytest.mark.gpu

_ENGINES = []


def _engine(tmp_path_factory):
    if not _ENGINES:
        out = tmp_path_factory.mktemp("engines")
        shapes = machine.NETWORK_SHAPES
        built = build_model_engine(
            "machine", TINY_GQA, machine.WEIGHTS, dtype="float32", out_dir=out, **shapes
        )
        _ENGINES.append(built.path)
    return _ENGINES[0]


@pytest.fixture(autouse=True)
def engine(tmp_path_factory):
    TensorRTMachine.engine = _engine(tmp_path_factory)


class TensorRTMachine(machine.InterpreterMachine):
    engine = None  # set by the fixture

    def make_backend(self):
        from trt_kv.runtime.gpu.trt_backend import TrtBackend

        return TrtBackend(self.engine, capacity=machine.CAPACITY)

    @precondition(lambda self: not self.closed and self.calls >= 8)
    @rule()
    def close(self):
        self.backend.close()
        self.closed = True


TensorRTMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, **machine.SETTINGS
)
test_session_state_machine_on_tensorrt = TensorRTMachine.TestCase
