"""A GPU backend's ``close()`` gives its device memory back, and nothing runs after it.

Marked ``gpu``: on a machine without a GPU they run on the emulated device (where every
allocation is counted, so all of it must come back), on a real GPU unchanged (where at least
the caches and step buffers trt_kv allocated must come back: TensorRT may keep pools of its
own).
"""

import gc

import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv import emulator
from trt_kv.engine.store import build_model_engine
from trt_kv.errors import ClosedError
from trt_kv.models.llama import random_weights
from trt_kv.runtime import Session, generate

pytestmark = pytest.mark.gpu

WEIGHTS = random_weights(TINY_GQA, seed=4, std=0.3)
PROMPTS = [[5, 17, 42, 8], [61, 3]]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    shapes = {"max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}
    return build_model_engine("close", TINY_GQA, WEIGHTS, out_dir=out, **shapes).path


def _tensorrt(engine):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    return TrtBackend(engine, cuda_graph=True)


def _polygraphy(engine):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend

    return PolygraphyBackend(engine)


def _free_bytes() -> int:
    from cuda.bindings import runtime as rt

    err, free, _ = rt.cudaMemGetInfo()
    assert err == rt.cudaError_t.cudaSuccess
    return free


@pytest.mark.parametrize("make", [_tensorrt, _polygraphy], ids=["tensorrt", "polygraphy"])
def test_close_frees_the_device_memory_and_later_use_raises(engine, make):
    gc.collect()  # an earlier test's backend left to its finalizer frees its memory now
    before = _free_bytes()
    backend = make(engine)
    session = Session(backend)
    first = generate(session, PROMPTS, 3).ids
    assert len(first) == 2
    cache_bytes = sum(backend.storage.nbytes().values())
    open_free = _free_bytes()
    assert before - open_free >= cache_bytes

    backend.close()
    if emulator.is_active():  # every allocation is counted: all of it is back
        assert _free_bytes() == before
    else:
        assert _free_bytes() - open_free >= cache_bytes
    backend.close()  # idempotent

    name = type(backend).__name__
    with pytest.raises(ClosedError, match=rf"{name}: expected an open backend, got closed"):
        backend.run(session.state.plan(range(2), [[7], [9]]))
    lengths = session.state.lengths
    with pytest.raises(ClosedError, match=rf"Session.step: expected an open backend \({name}\)"):
        session.step([[7], [9]])  # the next decode step of both sequences
    with pytest.raises(ClosedError, match=r"Session.generate: expected an open backend"):
        generate(session, PROMPTS, 1)
    assert session.state.lengths.tolist() == lengths.tolist()


@pytest.mark.parametrize("make", [_tensorrt, _polygraphy], ids=["tensorrt", "polygraphy"])
def test_no_session_operation_changes_anything_after_close(engine, make):
    backend = make(engine)
    session = Session(backend)
    session.prefill([[1, 2, 3], [4, 5]])
    backend.close()
    operations = {
        "fork": lambda: session.fork(0, 1),
        "reset": lambda: session.reset(0),
        "reorder": lambda: session.reorder([1, 1]),
        "crop": lambda: session.crop(0, 1),
        "prefill": lambda: session.prefill([[1]]),
        "decode": lambda: session.decode([1, 2]),
        "snapshot": lambda: session.snapshot(0),
        "restore": lambda: session.restore(0, {}),
        "freeze": session.freeze,
        "export_legacy": lambda: session.export_legacy([0]),
        "import_legacy": lambda: session.import_legacy([], [0]),
    }
    for operation, call in operations.items():
        with pytest.raises(ClosedError, match=rf"Session.{operation}: expected an open backend"):
            call()
        assert session.state.lengths.tolist() == [3, 2], operation
    assert not session.state.frozen
