"""One test per defect the emulated device found in the GPU backends (issue 10: 1, 2, 3, 6).

Marked ``gpu``: on a machine without a GPU they run on the emulated device, on a real GPU
unchanged. Each failed before its fix (noted per test).
"""

import gc
import json

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.engine.file import sidecar_path
from trt_kv.engine.store import build_model_engine
from trt_kv.errors import EngineRunError, ShapeError
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

pytestmark = pytest.mark.gpu

WEIGHTS = random_weights(TINY_GQA, seed=3, std=0.3)
SHAPES = {"max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}
PROMPTS = [[5, 17, 42, 8], [61, 3]]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    return {
        dtype: build_model_engine(
            f"defects-{dtype}", TINY_GQA, WEIGHTS, dtype=dtype, out_dir=out, **SHAPES
        ).path
        for dtype in ("float32", "bfloat16")
    }


def reference_ids(prompts, n):
    backend = ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=16)
    return generate(Session(backend), prompts, n).ids


def test_polygraphy_binds_aliased_cache_outputs(engines):
    # Defect 1: TrtRunner re-views the feed of an aliased output (obj.view()), which
    # polygraphy.cuda.DeviceView lacks: AttributeError on the first step, before the fix.
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend

    backend = PolygraphyBackend(engines["float32"])
    try:
        assert generate(Session(backend), PROMPTS, 4).ids == reference_ids(PROMPTS, 4)
    finally:
        backend.close()


def test_polygraphy_runs_bfloat16_caches(engines):
    # Defect 2: the ml_dtypes bfloat16 NumPy dtype is not a Polygraphy DataType, so
    # TrtRunner's input check refused the caches ("Received unexpected dtype"), before the fix.
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend

    net = build_llama_network(TINY_GQA, WEIGHTS, dtype="bfloat16", **SHAPES)
    expected = generate(Session(InterpreterBackend(net)), PROMPTS, 4)
    backend = PolygraphyBackend(engines["bfloat16"])
    try:
        assert generate(Session(backend), PROMPTS, 4).ids == expected.ids
    finally:
        backend.close()


def test_a_refused_binding_raises_instead_of_replaying_nothing(engines, tmp_path):
    # Defect 3: a sidecar that claims batches up to 3 for an engine built for 2 (edited, or
    # stale): trt_kv's own profile check passes, TensorRT's set_input_shape refuses B = 3.
    # Before the fix that result was ignored, and so were the failed warm-up and captured
    # enqueues; the step died later on an unrelated ValueError (a logits shape of -1), seen
    # on the emulated device. Now the refusal itself is the error.
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    path = tmp_path / "claims-3.engine"
    path.write_bytes(engines["float32"].read_bytes())
    side = json.loads(sidecar_path(engines["float32"]).read_text())
    for profile in side["profiles"]:
        for shapes in profile["shapes"].values():
            shapes[2][0] = 3  # max batch
    sidecar_path(path).write_text(json.dumps(side))
    backend = TrtBackend(path, capacity=3, cuda_graph="manual")
    with pytest.raises(EngineRunError, match="set_input_shape"):
        Session(backend).decode([1, 2, 3])
    backend.close()


def test_a_batch_no_profile_holds_is_refused_before_anything_runs(engines):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    backend = TrtBackend(engines["float32"], capacity=3)
    s = Session(backend)
    before = s.storage.read_slot("past_key.0", 2)
    with pytest.raises(ShapeError, match="a profile that holds them"):
        s.decode([1, 2, 3])
    assert s.storage.read_slot("past_key.0", 2).tobytes() == before.tobytes()
    backend.close()


def test_manual_graphs_after_steps_of_other_shapes_give_reference_ids(engines):
    # Defect 6a: graphs keyed by (lo, B) were replayed after a step of other shapes without
    # a fresh enqueue (the emulated TensorRT refuses that replay), before the fix.
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    backend = TrtBackend(engines["float32"], cuda_graph="manual")
    s = Session(backend)
    ref = Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=16))
    try:
        for session in (s, ref):
            session.prefill(PROMPTS)
            session.decode([7, 9])
            session.decode([11, 13])
            session.step([[2, 4, 6]])  # other shapes: B = 1, S = 3
            session.decode([7, 9])  # (lo, B) of a captured graph
        np.testing.assert_allclose(s.decode([1, 2]), ref.decode([1, 2]), rtol=1e-4, atol=1e-4)
    finally:
        backend.close()


def test_rtx_runtime_config_lives_as_long_as_its_context(engines):
    # Defect 6c: the IRuntimeConfig was a local of the constructor; nothing kept it alive
    # while its context lived (the emulated context holds it weakly and refuses the enqueue),
    # before the fix.
    from trt_kv._trt import FEATURES
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if not FEATURES.is_rtx:
        pytest.skip("IRuntimeConfig CUDA graphs are TensorRT-RTX only")
    backend = TrtBackend(engines["float32"], cuda_graph="runtime")
    gc.collect()
    try:
        assert backend.context.get_runtime_config() is not None
        assert generate(Session(backend), PROMPTS, 4).ids == reference_ids(PROMPTS, 4)
    finally:
        backend.close()
