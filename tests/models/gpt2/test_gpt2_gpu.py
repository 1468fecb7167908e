"""GPT-2 engines on the GPU backends (fast path, CUDA graphs, Polygraphy) against the
interpreter of the same network: batch 1 and 2, windows at lo > 0. Marked ``gpu``: on a
machine without one they run on the emulated GPU (results "emulated")."""

import numpy as np
import pytest

from tests.support.gpt2_models import PROMPTS, save_gpt2
from trt_kv.engine.store import build_model_engine
from trt_kv.models.gpt2 import build_gpt2_network
from trt_kv.models.loading import load_model
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

pytestmark = pytest.mark.gpu

OPTIONS = dict(dtype="float32", max_seq_len=32, max_batch=3, max_step_tokens=8)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    save_gpt2(folder)
    return load_model(folder, progress=False)


@pytest.fixture(scope="module")
def engine_path(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    return build_model_engine("gpt2", model.config, model.weights, out_dir=out, **OPTIONS).path


def interpreter(model):
    return InterpreterBackend(build_gpt2_network(model.config, model.weights, **OPTIONS))


def gpu_backend(kind, path):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if kind == "polygraphy":
        return PolygraphyBackend(path)
    return TrtBackend(path, cuda_graph=kind == "cuda_graph")


KINDS = ["tensorrt", "cuda_graph", "polygraphy"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lo, prompts", [(0, PROMPTS[:1]), (0, PROMPTS), (1, PROMPTS)])
def test_gpu_backend_steps_match_the_interpreter(model, engine_path, kind, lo, prompts):
    backend = gpu_backend(kind, engine_path)
    try:
        got, want = Session(backend), Session(interpreter(model))
        np.testing.assert_allclose(got.prefill(prompts, lo), want.prefill(prompts, lo), atol=1e-4)
        for step in range(4):
            tokens = [(7 * step + k) % 101 for k in range(len(prompts))]
            np.testing.assert_allclose(got.decode(tokens, lo), want.decode(tokens, lo), atol=1e-4)
    finally:
        backend.close()


@pytest.mark.parametrize("kind", KINDS)
def test_gpu_backend_generates_the_interpreter_ids(model, engine_path, kind):
    backend = gpu_backend(kind, engine_path)
    try:
        got = generate(Session(backend), PROMPTS, 12).ids
    finally:
        backend.close()
    assert got == generate(Session(interpreter(model)), PROMPTS, 12).ids


def test_the_sidecar_holds_the_roles_a_session_needs(engine_path):
    from trt_kv.engine.file import load_engine_file

    roles = load_engine_file(engine_path)[1].roles
    assert (roles.vocab_size, roles.max_seq_len, roles.max_batch) == (101, 32, 3)
    assert roles.inputs["token_ids"] == "input_ids" and len(roles.caches) == 4
