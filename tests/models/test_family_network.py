"""Every decoder family in every route: the built network, run on the interpreter, equals the
NumPy reference (itself checked against Hugging Face in ``test_family_oracle``).

Each family's network is also compiled by the real TensorRT-RTX builder (float16, the best
routes), so TensorRT accepts every switch. Windowed families (window 3-5) see a 7-token
prompt, so keys leave the window in prefill and in decode.
"""

import numpy as np
import pytest

from tests.builder.test_routes import COMBINATIONS, _route_id
from tests.support.family_cases import CASES, PROMPTS, saved_family
from trt_kv.builder import build_engine
from trt_kv.models.llama import build_llama_network
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

S_MAX, MAX_STEP, NEW_TOKENS = 24, 8, 6


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def family(request, tmp_path_factory):
    """``(config, weights, reference prefill logits [2, V], reference ids)`` of a family."""
    _, config, weights = saved_family(request.param, tmp_path_factory.mktemp(request.param))
    reference = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    logits = reference.prefill(PROMPTS)
    fresh = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    return config, weights, logits, generate(fresh, PROMPTS, NEW_TOKENS).ids


# every route combination TensorRT-RTX builds (the list test_routes builds engines of)
@pytest.mark.parametrize("routes", COMBINATIONS, ids=[_route_id(r) for r in COMBINATIONS])
def test_every_route_on_the_interpreter_equals_the_reference(family, routes):
    config, weights, ref_logits, ref_ids = family
    net = build_llama_network(
        config,
        weights,
        max_seq_len=S_MAX,
        max_batch=2,
        max_step_tokens=MAX_STEP,
        dtype="float32",
        routes=routes,
    )
    logits = Session(InterpreterBackend(net)).prefill(PROMPTS)
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-4 * np.abs(ref_logits).max())
    assert generate(Session(InterpreterBackend(net)), PROMPTS, NEW_TOKENS).ids == ref_ids


def test_tensorrt_builds_the_family_network(family):
    config, weights, _, _ = family
    net = build_llama_network(
        config, weights, max_seq_len=S_MAX, max_batch=2, max_step_tokens=MAX_STEP
    )
    assert len(build_engine(net.builder, net.network, net.profiles).data) > 0


def test_chunked_prefill_across_the_window_equals_the_reference(family):
    """Steps of 3 tokens (the 7-token prompt runs as 3 + 3 + 1): a chunk's queries reach
    keys of earlier chunks, inside the window and out of it, through the linear cache."""
    config, weights, ref_logits, ref_ids = family
    net = build_llama_network(
        config, weights, max_seq_len=S_MAX, max_batch=2, max_step_tokens=3, dtype="float32"
    )
    logits = Session(InterpreterBackend(net)).prefill(PROMPTS)
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-4 * np.abs(ref_logits).max())
    assert generate(Session(InterpreterBackend(net)), PROMPTS, NEW_TOKENS).ids == ref_ids
