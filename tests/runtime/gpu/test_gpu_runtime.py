"""On a GPU: engines against the reference, fast path, Polygraphy path, CUDA graphs.

Every test here is marked ``gpu`` and skips with the reason where no CUDA device is usable.
"""

import numpy as np
import pytest

from tests.support.tiny_models import WIDE_GQA
from trt_kv.engine.store import build_doc_example, build_model_engine
from trt_kv.models.llama import random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.reference import kv_cache_update
from trt_kv.runtime import Session, generate

pytestmark = pytest.mark.gpu

CFG = WIDE_GQA
WEIGHTS = random_weights(CFG, seed=1, std=0.3)
PROMPTS = [[5, 17, 42, 8], [61, 3]]


@pytest.fixture(scope="module")
def engine_path(tmp_path_factory):
    return build_model_engine(
        "gpu-tiny",
        CFG,
        WEIGHTS,
        dtype="float32",
        max_seq_len=32,
        max_batch=2,
        max_step_tokens=8,
        out_dir=tmp_path_factory.mktemp("engines"),
    ).path


def reference_ids(n=8):
    return generate(
        Session(ReferenceBackend(CFG, WEIGHTS, capacity=2, max_seq_len=32)), PROMPTS, n
    ).ids


def test_doc_example_engine_matches_reference_and_writes_in_place(tmp_path):
    from trt_kv.runtime.gpu.cuda import DeviceBuffer, create_stream, synchronize
    from trt_kv.runtime.gpu.engine_loader import load_cuda_engine

    built = build_doc_example(tmp_path)
    engine, _, _ = load_cuda_engine(built.path)
    ctx = engine.create_execution_context()
    cache = np.full((4, 2, 8, 1), np.nan, np.float32)
    update = np.arange(1, 33, dtype=np.float32).reshape(4, 2, 4, 1)
    idx = np.array([2, 1, 1, 3], np.int32)
    bufs = {
        name: DeviceBuffer(a.nbytes)
        for name, a in (("cache", cache), ("update", update), ("write_indices", idx))
    }
    stream = create_stream()
    for name, a in (("cache", cache), ("update", update), ("write_indices", idx)):
        bufs[name].upload(a, stream=stream)
        ctx.set_tensor_address(name, bufs[name].ptr)
    ctx.set_tensor_address("cache_out", bufs["cache"].ptr)  # the alias: same address
    assert ctx.execute_async_v3(stream)
    synchronize(stream)
    out = bufs["cache"].download(np.empty_like(cache))
    expected = kv_cache_update(cache, update, idx)
    assert out.tobytes() == expected.tobytes()  # NaN rows outside the window bit-identical


def test_fast_path_gives_reference_ids(engine_path):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    assert generate(Session(TrtBackend(engine_path)), PROMPTS, 8).ids == reference_ids()


def test_polygraphy_path_gives_reference_ids(engine_path):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend

    assert generate(Session(PolygraphyBackend(engine_path)), PROMPTS, 8).ids == reference_ids()


def test_cuda_graph_path_gives_the_same_ids(engine_path):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    assert (
        generate(Session(TrtBackend(engine_path, cuda_graph=True)), PROMPTS, 8).ids
        == reference_ids()
    )


def test_nan_outside_the_written_window_stays_untouched(engine_path):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    s = Session(TrtBackend(engine_path))
    n, s_max, h = s.storage.slot_shape
    for a in s.storage.aliases:
        for slot in range(s.capacity):
            s.storage.write_slot(a.input, slot, np.full((n, s_max, h), np.nan, np.float32))
    s.step(PROMPTS)
    s.decode([1, 2])
    for a in s.storage.aliases:
        rows = s.storage.read_slot(a.input, 0)
        assert np.isnan(rows[:, len(PROMPTS[0]) + 1 :]).all()
        assert not np.isnan(rows[:, : len(PROMPTS[0]) + 1]).any()


def test_memory_report_counts_every_cache(engine_path):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    mem = Session(TrtBackend(engine_path)).memory()
    assert mem["total"] == 2 * CFG.num_hidden_layers * 2 * 2 * 32 * 16 * 4
