"""The GPU backends over device caches, every dtype: windows ``lo > 0``, cache operations,
NaN outside the written window.

Expected values come from the same network run on the host by the interpreter
(``InterpreterBackend``, host caches): the GPU backends must give the same logits and leave
the same cache bytes. Marked ``gpu``: on the emulated device here, on a real GPU unchanged
(compared there within float tolerance, not bit for bit).
"""

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv import dtypes
from trt_kv.engine.store import build_model_engine
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.runtime import Session
from trt_kv.runtime.interpreter_backend import InterpreterBackend

pytestmark = pytest.mark.gpu

WEIGHTS = random_weights(TINY_GQA, seed=5, std=0.3)
SHAPES = {"max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}
CAPACITY = 4  # slots; steps bind windows of at most max_batch of them
DTYPES = ("float32", "float16", "bfloat16")
BACKENDS = ("tensorrt", "tensorrt-manual-graph", "tensorrt-graph", "polygraphy")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    return {
        d: build_model_engine(f"matrix-{d}", TINY_GQA, WEIGHTS, dtype=d, out_dir=out, **SHAPES).path
        for d in DTYPES
    }


def gpu_session(kind, path):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if kind == "polygraphy":
        return Session(PolygraphyBackend(path, capacity=CAPACITY))
    graph = {"tensorrt": False, "tensorrt-manual-graph": "manual", "tensorrt-graph": True}[kind]
    return Session(TrtBackend(path, capacity=CAPACITY, cuda_graph=graph))


def host_session(dtype):
    net = build_llama_network(TINY_GQA, WEIGHTS, dtype=dtype, **SHAPES)
    return Session(InterpreterBackend(net, capacity=CAPACITY))


def same(a, b):
    """Bit-identical on the emulated device (it runs the interpreter); close on a GPU."""
    from trt_kv.emulator import is_active

    if is_active():
        return np.asarray(a).tobytes() == np.asarray(b).tobytes()
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return np.allclose(a, b, rtol=2e-2, atol=2e-2, equal_nan=True)


def close(session):
    getattr(session.backend, "close", lambda: None)()


def script(s):
    """Windows at lo > 0, fork, reorder, snapshot/restore, crop; every step's logits."""
    out = [s.prefill([[5, 17, 42], [61, 3, 9, 2]], lo=2)]  # slots 2, 3
    out.append(s.decode([7, 8], lo=2))
    out.append(s.prefill([[11, 12]], lo=0))  # slot 0, batch 1
    s.fork(2, 1)  # slot 1 shares slot 2's prefix
    out.append(s.decode([30, 31], lo=1))  # window slots 1, 2
    snap = s.snapshot(3)
    out.append(s.decode([4], lo=3))
    s.restore(3, snap)  # undo that step
    out.append(s.decode([4], lo=3))  # same logits again
    s.reorder([3, 2, 1, 0])
    out.append(s.decode([1, 2], lo=0))
    s.crop(0, 3)
    out.append(s.step([[6, 6]], lo=0))
    caches = {
        a.input: [s.storage.read_slot(a.input, k) for k in range(4)] for a in s.storage.aliases
    }
    return out, caches


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_windows_and_cache_operations_match_the_host_run(engines, dtype, kind):
    from trt_kv._trt import FEATURES

    if kind == "tensorrt-graph" and not FEATURES.is_rtx:
        kind = "tensorrt-manual-graph"
    expected_logits, expected_caches = script(host_session(dtype))
    s = gpu_session(kind, engines[dtype])
    try:
        logits, caches = script(s)
    finally:
        close(s)
    assert same(logits[4], logits[5])  # restore undid the step
    for k, (got, want) in enumerate(zip(logits, expected_logits)):
        assert same(got, want), f"step {k}"
    for name in expected_caches:
        for slot in range(CAPACITY):
            assert same(caches[name][slot], expected_caches[name][slot]), (name, slot)


@pytest.mark.parametrize("kind", ["tensorrt", "polygraphy"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_outside_the_written_window_stays_bit_identical(engines, dtype, kind):
    s = gpu_session(kind, engines[dtype])
    np_dtype = dtypes.to_numpy(dtype)
    # a NaN with a payload, so any rewrite (even with another NaN) shows in the bytes
    bits = {"float32": 0x7FC0_1234, "float16": 0x7E12, "bfloat16": 0x7FC3}[dtype]
    uint = {4: np.uint32, 2: np.uint16}[np_dtype.itemsize]
    poison = np.full(s.storage.slot_shape, bits, uint).view(np_dtype)
    try:
        for a in s.storage.aliases:
            for slot in range(CAPACITY):
                s.storage.write_slot(a.input, slot, poison)
        logits = [s.step([[5, 17, 42], [61, 3]], lo=1), s.decode([7, 8], lo=1)]
        written = {1: 4, 2: 3}  # slot -> rows written (prompt + one decode token)
        for a in s.storage.aliases:
            for slot in range(CAPACITY):
                rows = s.storage.read_slot(a.input, slot)
                n = written.get(slot, 0)
                assert rows[:, n:].tobytes() == poison[:, n:].tobytes(), (a.input, slot)
                assert not np.isnan(rows[:, :n].astype(np.float32)).any(), (a.input, slot)
        assert all(np.isfinite(x).all() for x in logits)
    finally:
        close(s)
