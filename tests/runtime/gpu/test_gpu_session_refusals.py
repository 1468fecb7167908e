"""A GPU backend's session refuses what no profile holds, and memory it cannot have, by name
and with the cache unchanged (issue 30).

Marked ``gpu``: on a machine without a GPU they run on the emulated device, on a real GPU
unchanged.
"""

import gc

import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv import emulator
from trt_kv.engine.store import build_model_engine
from trt_kv.errors import DeviceMemoryError, ShapeError
from trt_kv.models.llama import random_weights
from trt_kv.runtime import Session, generate

pytestmark = pytest.mark.gpu

WEIGHTS = random_weights(TINY_GQA, seed=4, std=0.3)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    shapes = {"max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}
    return build_model_engine("refusals", TINY_GQA, WEIGHTS, out_dir=out, **shapes).path


def _free_bytes() -> int:
    from cuda.bindings import runtime as rt

    err, free, _ = rt.cudaMemGetInfo()
    assert err == rt.cudaError_t.cudaSuccess
    return free


def test_a_batch_above_max_batch_is_refused_before_any_slot_is_reset(engine):
    """capacity 4 on an engine of max_batch 2: a prefill of 3 raised ShapeError after it had
    reset slots 0 and 1 (lengths [3, 2, 0, 0] -> [0, 0, 0, 0])."""
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    backend = TrtBackend(engine, capacity=4)
    try:
        s = Session(backend)
        s.prefill([[1, 2, 3], [4, 5]])
        rows = {name: backend.storage.read_slot(name, 0) for name in backend.storage.buffers}
        for call in (lambda: s.prefill([[1], [2], [3]]), lambda: generate(s, [[1]] * 3, 2)):
            with pytest.raises(ShapeError, match="step shapes: expected a profile that holds"):
                call()
            assert s.state.lengths.tolist() == [3, 2, 0, 0]
        for name, before in rows.items():
            assert backend.storage.read_slot(name, 0).tobytes() == before.tobytes(), name
    finally:
        backend.close()


def test_a_capacity_beyond_device_memory_names_the_allocation_and_what_fits(engine):
    """capacity=10**12 was a bare ``RuntimeError: CUDA error: out of memory``."""
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    gc.collect()
    before = _free_bytes()
    with pytest.raises(DeviceMemoryError) as err:
        TrtBackend(engine, capacity=10**12)
    message = str(err.value)
    assert message.startswith("cudaMalloc of cache past_key.0: expected a size that fits")
    cfg = TINY_GQA  # float16 caches [capacity, N, S_max = 16, H], a K and a V per layer
    per_cache = cfg.num_key_value_heads * 16 * cfg.head_dim * 2
    per_slot = 2 * cfg.num_hidden_layers * per_cache
    asked = 10**12 * per_cache
    assert f"got {asked:,} bytes asked, " in message
    fits = before // per_slot
    assert f"the caches take {per_slot:,} bytes per slot: expected capacity <= " in message
    said = int(message.split("capacity <= ")[1].split(" ")[0].replace(",", ""))
    assert fits // 2 < said <= fits  # what was free when the caches were asked for
    assert message.endswith("on this device, got 1,000,000,000,000")
    gc.collect()
    if emulator.is_active():  # every allocation is counted (TensorRT may keep pools on a GPU)
        assert _free_bytes() == before  # nothing left allocated


def test_fork_of_a_slot_onto_itself_changes_nothing(engine):
    """Found by the state machine on the emulated device: fork(0, 0) was a cudaMemcpy of a
    range onto itself (overlapping ranges: undefined behaviour in CUDA)."""
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    backend = TrtBackend(engine)
    try:
        s = Session(backend)
        s.prefill([[1, 2, 3], [4, 5]])
        rows = {name: backend.storage.read_slot(name, 0) for name in backend.storage.buffers}
        s.fork(0, 0)
        assert s.state.lengths.tolist() == [3, 2]
        for name, before in rows.items():
            assert backend.storage.read_slot(name, 0).tobytes() == before.tobytes(), name
    finally:
        backend.close()


def test_a_reorder_whose_scratch_slot_cannot_be_had_changes_nothing(engine):
    """A swap needs the scratch slot; with no device memory left its allocation fails, and
    the lengths had already been swapped while the caches had not."""
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    backend = TrtBackend(engine, capacity=2)
    session = Session(backend)
    session.prefill([[1, 2, 3], [4, 5]])
    rows = [session.snapshot(0), session.snapshot(1)]
    release = _fill_device_memory()
    try:
        with pytest.raises(DeviceMemoryError, match="scratch"):
            session.reorder([1, 0])
        assert session.state.lengths.tolist() == [3, 2]
        for slot, before in enumerate(rows):
            after = session.snapshot(slot)
            assert all((after[k] == before[k]).all() for k in before)
    finally:
        release()
        backend.close()


def _fill_device_memory() -> object:
    """Leave 64 bytes of device memory free; returns what gives it back. The emulated card's
    memory is host memory, so there its capacity is lowered instead of allocated away."""
    from trt_kv.runtime.gpu.cuda import DeviceBuffer, free_device_bytes

    if not emulator.is_active():
        return DeviceBuffer(free_device_bytes() - 64, "filler").free
    memory = emulator.device().memory
    capacity, memory.capacity = memory.capacity, memory.used + 64
    return lambda: setattr(memory, "capacity", capacity)
