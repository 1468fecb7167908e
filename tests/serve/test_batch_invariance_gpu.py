"""The scheduler's oracle on emulated TensorRT (the fast path and Polygraphy): greedy ids
under concurrency equal ``generate`` of each request alone on the same engine, as in
test_batch_invariance.py (same prompts, same escape hatch: the emulated device runs the
network on the interpreter, whose float32 products may round differently by batch shape).
Marked ``gpu``: on a real GPU TensorRT picks its own kernels per shape and no such promise
holds (docs/serve.md)."""

import pytest

from tests.serve.test_batch_invariance import EPS, MAX_TOKENS, check_against_solo
from tests.support.serve_sessions import CONFIG, PROMPTS, SHAPES, WEIGHTS, run_to_end, solo
from trt_kv.engine.store import build_model_engine
from trt_kv.runtime import Session
from trt_kv.serve.scheduler import SamplingParams, Scheduler

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    return {
        d: build_model_engine(f"serve-{d}", CONFIG, WEIGHTS, dtype=d, out_dir=out, **SHAPES).path
        for d in EPS
        if d != "reference"
    }


def gpu_session(kind, path):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    return Session(PolygraphyBackend(path) if kind == "polygraphy" else TrtBackend(path))


@pytest.mark.parametrize("backend", ["tensorrt", "polygraphy"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_greedy_ids_on_emulated_tensorrt_equal_the_request_run_alone(engines, dtype, backend):
    from trt_kv.emulator import is_active

    if not is_active():
        pytest.skip("a real GPU: TensorRT picks its own kernels per shape, no such promise")
    sessions = []

    def make():
        sessions.append(gpu_session(backend, engines[dtype]))
        return sessions[-1]

    try:
        oracles = [solo(make, p, MAX_TOKENS) for p in PROMPTS]
        scheduler = Scheduler(make(), eos_ids=[], prefill_chunk=4)
        params = SamplingParams(max_tokens=MAX_TOKENS)
        arrivals = {2 * i: [lambda k=4 - i: scheduler.submit(PROMPTS[k], params)] for i in range(5)}
        tickets, steps = run_to_end(scheduler, arrivals)
        for ticket, k in zip(tickets, [4, 3, 2, 1, 0]):
            got = []
            while not ticket.events.empty():
                got.append(ticket.events.get_nowait().token_id)
            check_against_solo(dtype, got, oracles[k])
        assert max(o for o, _ in steps) >= 3
    finally:
        for s in sessions:
            s.backend.close()
