"""A GPU backend's ``close()`` gives its device memory back, and nothing runs after it.

Marked ``gpu``: on a machine without a GPU they run on the emulated device (where every
allocation is counted, so all of it must come back), on a real GPU unchanged (where at least
the caches and step buffers trt_kv allocated must come back: TensorRT may keep pools of its
own).
"""

import gc

import pytest
from tiny_models import TINY_GQA

from trt_kv import emulator
from trt_kv.errors import ClosedError
from trt_kv.jobs import build_model_engine
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
        session.step([[7], [9]])  # the next decode step of both sequences
    with pytest.raises(ClosedError, match=r"device buffer: expected allocated memory, got freed"):
        generate(session, PROMPTS, 1)  # starts by clearing the caches
