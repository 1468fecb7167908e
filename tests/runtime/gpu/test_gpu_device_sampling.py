"""Sampling on the device on the GPU backends: engines built with ``device_top_k`` give
``generate`` the host-sampling path's ids (greedy and seeded top-k) on the TensorRT backend
(with and without trt_kv's CUDA graph) and Polygraphy, and a greedy decode step downloads
``[B]`` int32 only. Marked ``gpu``: without one they run on the emulated device (the counts
exist only there; results "emulated")."""

import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.cli import main
from trt_kv.engine.store import build_model_engine
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.runtime import Session, generate
from trt_kv.runtime.generate import device_sampling
from trt_kv.runtime.interpreter_backend import InterpreterBackend
from trt_kv.runtime.sampling import Sampler

pytestmark = pytest.mark.gpu

SHAPES = {"max_seq_len": 24, "max_batch": 2, "max_step_tokens": 4, "dtype": "float32"}
WEIGHTS = random_weights(TINY_GQA, seed=5, std=0.3)
PROMPTS = [[3, 4, 5], [9, 1]]
SAMPLERS = {
    1: lambda: Sampler(),
    4: lambda: Sampler(temperature=0.8, top_k=3, seed=3),  # k > top_k: ties settle
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    return {
        k: build_model_engine(
            "sampling", TINY_GQA, WEIGHTS, out_dir=out, **SHAPES, device_top_k=k
        ).path
        for k in SAMPLERS
    }


def gpu_backend(kind, path):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if kind == "polygraphy":
        return PolygraphyBackend(path)
    return TrtBackend(path, cuda_graph="manual" if kind == "cuda_graph" else False)


def test_engine_names_and_inspect_say_k(engines, capsys):
    assert "-k1" in engines[1].name and "-k4" in engines[4].name
    assert main(["inspect", str(engines[4])]) == 0
    assert "sampling     on the device: the 4 best next ids (top_ids, top_logits [B, 4])" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("kind", ["tensorrt", "cuda_graph", "polygraphy"])
@pytest.mark.parametrize("k", list(SAMPLERS))
def test_device_sampling_gives_the_host_paths_ids(engines, kind, k):
    host = InterpreterBackend(build_llama_network(TINY_GQA, WEIGHTS, **SHAPES))  # logits only
    want = generate(Session(host), PROMPTS, 10, SAMPLERS[k]())
    backend = gpu_backend(kind, engines[k])
    try:
        session = Session(backend)
        assert backend.device_top_k == k and device_sampling(session, SAMPLERS[k](), 1.0)
        assert generate(session, PROMPTS, 10, SAMPLERS[k]()).ids == want.ids
        # a sampler these candidates cannot serve takes the logits path
        assert not device_sampling(session, Sampler(temperature=0.8, top_k=4, seed=3), 1.0)
    finally:
        backend.close()


@pytest.mark.parametrize("cuda_graph", [False, "manual"])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_greedy_decode_step_downloads_the_next_ids_only(engines, cuda_graph, batch):
    from trt_kv.emulator import counting, is_active
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if not is_active():
        pytest.skip("call counts exist on the emulated device only")
    backend = TrtBackend(engines[1], capacity=2, cuda_graph=cuda_graph)
    try:
        session = Session(backend)
        session.prefill([[3, 4, 5]] * batch)
        session.decode_top_k([6] * batch)  # binds the decode state (and captures)
        session.decode_top_k([7] * batch)
        with counting() as counts:
            ids, logits = session.decode_top_k([8] * batch)
        assert ids.shape == (batch, 1) and logits is None
        assert counts.bytes["DH"] == 4 * batch <= 8 * batch  # next_token [B] int32
        assert counts.bytes["HD"] == backend.staging.used  # the step inputs, one upload
        # with trt_kv's capture the copies are in the graph: one launch, one synchronize
        copies = {"cudaGraphLaunch": 1} if cuda_graph else {"cudaMemcpyAsync": 2}
        assert dict(counts.calls) == {"cudaStreamSynchronize": 1, **copies}
        assert dict(counts.trt) == ({} if cuda_graph else {"execute_async_v3": 1})
    finally:
        backend.close()
