"""Defects of the GPU code paths that issue 10 found by reading them against the APIs; each
test failed before its fix. The device ones run on the real GPU where there is one, else on
the emulated GPU (``@pytest.mark.gpu(tensorrt=False)``: CUDA only)."""

import os
import subprocess
import sys

import pytest

from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.errors import SlotError

# N=1, S_max=10, H=8, float16: one slot is 1 * 10 * 8 * 2 = 160 bytes, not a multiple of 256.
ODD = [CacheAlias("past_key_0", "present_key_0", (-1, 1, 10, 8), "float16")]


@pytest.mark.gpu(tensorrt=False)
def test_every_bound_cache_window_is_256_byte_aligned_or_refused():
    # TensorRT, IExecutionContext::setTensorAddress: "The pointer must have at least 256-byte
    # alignment." Slot lo of a 160-byte-slot cache starts at byte 160 * lo.
    from trt_kv.runtime.gpu.device import DeviceCaches

    caches = DeviceCaches(ODD, capacity=16)
    assert caches.address("past_key_0", 0) % 256 == 0
    assert caches.address("past_key_0", 8) % 256 == 0  # 8 * 160 = 1280 = 5 * 256
    with pytest.raises(SlotError, match="multiple of 8"):
        caches.address("past_key_0", 1)


@pytest.mark.gpu(tensorrt=False)
def test_check_window_refuses_a_misaligned_start_for_every_cache():
    from trt_kv.runtime.gpu.device import DeviceCaches

    caches = DeviceCaches(ODD, capacity=16)
    caches.check_window(0)
    caches.check_window(8)
    with pytest.raises(SlotError, match="past_key_0 window at slot 4"):
        caches.check_window(4)


@pytest.mark.gpu
def test_a_step_at_a_misaligned_window_is_refused_before_any_slot_changes(tmp_path):
    from tests.support.tiny_models import ONE_KV_HEAD
    from trt_kv.engine.store import build_model_engine
    from trt_kv.models.llama import random_weights
    from trt_kv.runtime import Session
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    # one KV head of 8 float16 values, S_max = 10: 160-byte slots, windows at 0, 8, 16...
    cfg = ONE_KV_HEAD
    path = build_model_engine(
        "odd-slots",
        cfg,
        random_weights(cfg, seed=0),
        dtype="float16",
        max_seq_len=10,
        max_batch=2,
        max_step_tokens=4,
        out_dir=tmp_path,
    ).path
    session = Session(TrtBackend(path, capacity=16))
    session.prefill([[1, 2, 3]], lo=8)
    session.fork(8, 1)  # a copy needs no alignment; binding slot 1 as a window does
    before = session.snapshot(1)
    with pytest.raises(SlotError, match="multiple of 8"):
        session.prefill([[4, 5]], lo=1)
    assert session.length(1) == 3
    for name, rows in session.snapshot(1).items():
        assert rows.tobytes() == before[name].tobytes()


@pytest.mark.gpu(tensorrt=False)
def test_a_failed_cuda_malloc_leaves_a_buffer_that_collects_cleanly():
    from trt_kv.errors import DeviceMemoryError
    from trt_kv.runtime.gpu.cuda import DeviceBuffer

    buf = DeviceBuffer.__new__(DeviceBuffer)
    match = "cudaMalloc of device buffer: expected a size that fits device memory, got 1,152,"
    with pytest.raises(DeviceMemoryError, match=match):
        buf.__init__(1 << 60)  # no device has an exabyte
    buf.__del__()  # what garbage collection does next; no AttributeError (no ptr yet)


def fake_full_tensorrt(tmp_path):
    """A ``tensorrt`` package that is TensorRT-RTX's Python module under the other name: how
    trt_kv behaves with full TensorRT installed, on a machine that has only RTX."""
    pkg = tmp_path / "tensorrt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from tensorrt_rtx import *\nfrom tensorrt_rtx import __version__\n"
    )
    return str(tmp_path)


def polygraphy_switch(pythonpath, env_value):
    code = (
        "import trt_kv._trt as t, polygraphy.config as c; "
        "print(t.FEATURES.module, c.USE_TENSORRT_RTX)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    env.pop("TRT_KV_TRT_MODULE", None)
    env["POLYGRAPHY_USE_TENSORRT_RTX"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_polygraphy_is_pointed_at_full_tensorrt_even_when_the_variable_says_rtx(tmp_path):
    path = [fake_full_tensorrt(tmp_path), *sys.path]
    assert polygraphy_switch(path, "1") == ["tensorrt", "False"]


def test_polygraphy_is_pointed_at_tensorrt_rtx_even_when_the_variable_says_full(tmp_path):
    from trt_kv._trt import FEATURES

    if not FEATURES.is_rtx:
        pytest.skip("needs tensorrt_rtx as the imported module")
    assert polygraphy_switch(sys.path, "0") == ["tensorrt_rtx", "True"]


@pytest.mark.gpu(tensorrt=False)
def test_a_slot_read_returns_the_bytes_written_before_it():
    # Found by the deferring emulator: DeviceBuffer.download on the legacy stream (what
    # DeviceCaches.read_slot, and so snapshot/reorder/fork reads, use) returned after
    # cudaMemcpyAsync without synchronizing: the host array could be read before the copy
    # landed (np.empty's bytes). write_slot uploaded asynchronously from a temporary it made
    # (the float16 conversion), which could be freed before the copy read it.
    import numpy as np

    from trt_kv.runtime.gpu.device import DeviceCaches

    caches = DeviceCaches(ODD, capacity=2)
    rows = np.arange(80, dtype=np.float32).reshape(1, 10, 8)  # converted to float16 inside
    caches.write_slot("past_key_0", 1, rows)
    got = caches.read_slot("past_key_0", 1)
    assert got.dtype == np.float16
    assert got[0, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert got[0, 9].tolist() == [72, 73, 74, 75, 76, 77, 78, 79]
    assert caches.read_slot("past_key_0", 0).tolist() == np.zeros((1, 10, 8)).tolist()
