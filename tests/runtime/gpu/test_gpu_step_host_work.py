"""What a decode step asks of TensorRT and CUDA once its binding state is set: counted on the
emulated device (``trt_kv.emulator.counting``; emulated figures, not GPU timings).

A step in an unchanged binding state (window, batch, step width) makes no TensorRT set-call:
the inputs go up in one copy from pinned memory, the engine runs (``execute_async_v3``, or
one graph launch with trt_kv's own capture), the logits come down in one synchronized copy.
"""

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.engine.store import build_model_engine
from trt_kv.models.llama import random_weights
from trt_kv.runtime import Session

pytestmark = pytest.mark.gpu

SHAPES = {"max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    weights = random_weights(TINY_GQA, seed=11, std=0.3)
    out = tmp_path_factory.mktemp("engines")
    return build_model_engine("host-work", TINY_GQA, weights, out_dir=out, **SHAPES).path


def decode_counts(engine, cuda_graph, batch):
    """Counts of the third decode step at an unchanged binding state."""
    from trt_kv.emulator import counting, is_active
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if not is_active():
        pytest.skip("call counts exist on the emulated device only")
    backend = TrtBackend(engine, capacity=2, cuda_graph=cuda_graph)
    try:
        session = Session(backend)
        session.prefill([[3, 4, 5]] * batch)
        session.decode([6] * batch)  # binds the decode state (and captures, with a graph)
        session.decode([7] * batch)
        with counting() as counts:
            logits = session.decode([8] * batch)
        assert logits.shape == (batch, TINY_GQA.vocab_size) and np.isfinite(logits).all()
        return counts, backend.staging.used
    finally:
        backend.close()


@pytest.mark.parametrize("batch", [1, 2])
def test_an_unchanged_decode_step_makes_no_set_call(engine, batch):
    counts, staged = decode_counts(engine, False, batch)
    assert dict(counts.trt) == {"execute_async_v3": 1}
    assert dict(counts.calls) == {"cudaMemcpyAsync": 2, "cudaStreamSynchronize": 1}
    assert counts.bytes["HD"] == staged  # every step input in one upload
    assert counts.bytes["DH"] == batch * TINY_GQA.vocab_size * 4  # the logits [B, V] float32


@pytest.mark.parametrize("batch", [1, 2])
def test_a_replayed_decode_step_makes_no_tensorrt_call_and_two_cuda_calls(engine, batch):
    """The graph holds the inputs' upload from pinned memory, the enqueue and the logits'
    download into pinned memory: one launch and one synchronize (issue 33: <= 3)."""
    counts, staged = decode_counts(engine, "manual", batch)
    assert dict(counts.trt) == {}
    assert dict(counts.calls) == {"cudaGraphLaunch": 1, "cudaStreamSynchronize": 1}
    assert counts.bytes["HD"] == staged  # the replayed upload
    assert counts.bytes["DH"] == batch * TINY_GQA.vocab_size * 4  # the replayed download


def test_a_change_of_window_binds_again_and_gives_the_same_logits(engine):
    from trt_kv.emulator import counting, is_active
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if not is_active():
        pytest.skip("call counts exist on the emulated device only")
    backend = TrtBackend(engine, capacity=2)
    try:
        session = Session(backend)
        session.prefill([[3, 4, 5], [3, 4, 5]])
        first = session.decode([6], lo=0)
        with counting() as counts:
            second = session.decode([6], lo=1)  # the same tokens at another window
        assert counts.trt["set_tensor_address"] > 0 and counts.trt["set_input_shape"] > 0
        np.testing.assert_array_equal(first, second)
    finally:
        backend.close()


def test_polygraphy_keeps_its_cache_views_across_steps(engine):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend

    backend = PolygraphyBackend(engine, capacity=2)
    try:
        session = Session(backend)
        session.prefill([[3, 4, 5], [3, 4, 5]])
        views = backend.cache_views(0, 2)
        for token in (6, 7, 8):
            session.decode([token, token])
        assert backend.cache_views(0, 2) is views
        assert list(backend._views) == [(0, 2)]  # one window used: one set of views
        session.decode([9], lo=1)
        assert list(backend._views) == [(0, 2), (1, 1)]
    finally:
        backend.close()


def test_a_failed_step_is_never_followed_by_a_replay(engine):
    """A replay is only right after a step of the same state that ran: a step that failed
    in between (here binding a batch no profile holds) left the previous key in place, and
    the next decode, rebound, replayed the graph with no ordinary enqueue first (review)."""
    from trt_kv.emulator import counting, is_active
    from trt_kv.errors import ShapeError
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if not is_active():
        pytest.skip("call counts exist on the emulated device only")
    backend = TrtBackend(engine, capacity=3, cuda_graph="manual")  # engine: max_batch 2
    try:
        session = Session(backend)
        session.prefill([[3, 4, 5]] * 2)
        for token in (6, 7):  # capture, then a replay
            session.decode([token] * 2)
        with pytest.raises(ShapeError):
            backend.run(session.state.plan(range(3), [[1], [2], [3]]))  # B = 3: no profile
        with counting() as counts:
            session.decode([8] * 2)
        assert counts.trt["execute_async_v3"] == 1 and "cudaGraphLaunch" not in counts.calls
    finally:
        backend.close()


@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_decode_steps_of_the_default_engine_download_4_bytes_a_sequence(engine, batch):
    """The engine is built with every option but its shapes left at the default: issue 37
    made that device_top_k 1, so each greedy decode step of generate downloads next_token
    [B] int32, not the logits [B, V] float32 (196,608 bytes a sequence for SmolLM2); the
    prefill still takes the logits (generate's design)."""
    from trt_kv.emulator import counting, is_active
    from trt_kv.runtime import generate
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if not is_active():
        pytest.skip("call counts exist on the emulated device only")
    backend = TrtBackend(engine, capacity=2)
    try:
        with counting() as counts:
            generate(Session(backend), [[3, 4, 5]] * batch, 3)
        prefill, decode = batch * TINY_GQA.vocab_size * 4, batch * 4
        assert counts.bytes["DH"] == prefill + 2 * decode  # 3 new tokens: 2 decode steps'
    finally:
        backend.close()
