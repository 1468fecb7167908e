"""The emulated TensorRT runtime: the rules it enforces, engine matching, profiles, capture.

These run inside ``emulated_gpu()`` explicitly (they test the emulator itself); every engine is
built by the real TensorRT-RTX builder.
"""

import numpy as np
import pytest

from tests.support.trt_log import Log
from trt_kv._trt import FEATURES, trt
from trt_kv.builder import Profile, build_engine, create_network
from trt_kv.builder.doc_example import doc_example_network
from trt_kv.emulator import emulated_gpu
from trt_kv.emulator.device import device
from trt_kv.engine.recipes import recipe_rebuilder
from trt_kv.engine.store import build_doc_example
from trt_kv.errors import EngineFileError

DOC_CACHE = np.arange(64, dtype=np.float32).reshape(4, 2, 8, 1)
DOC_UPDATE = -np.arange(1, 33, dtype=np.float32).reshape(4, 2, 4, 1)
DOC_INDICES = np.array([2, 1, 1, 3], np.int32)


@pytest.fixture
def gpu():
    with emulated_gpu():
        yield device()


def doc_engine(log):
    builder, network, profiles = doc_example_network()
    data = build_engine(builder, network, profiles).data
    return trt.Runtime(log).deserialize_cuda_engine(data)


def upload(gpu, array):
    ptr = gpu.memory.malloc(array.nbytes)
    gpu.memory.view(ptr, array.shape, array.dtype)[...] = array
    return ptr


def synced_view(gpu, ptr, shape, dtype):
    """Device bytes as the host may see them: after the device is synchronized (an enqueue
    runs when a synchronizing call needs it, not when it is made)."""
    from cuda.bindings import runtime as rt

    assert rt.cudaDeviceSynchronize()[0] == rt.cudaError_t.cudaSuccess
    return gpu.memory.view(ptr, shape, dtype)


def bound_doc_context(gpu, log):
    ctx = doc_engine(log).create_execution_context()
    ptrs = {n: upload(gpu, a) for n, a in (("cache", DOC_CACHE), ("update", DOC_UPDATE))}
    ptrs["write_indices"] = upload(gpu, DOC_INDICES)
    for name, ptr in ptrs.items():
        assert ctx.set_tensor_address(name, ptr)
    assert ctx.set_tensor_address("cache_out", ptrs["cache"])
    return ctx, ptrs


def test_doc_example_updates_the_bound_cache_in_place(gpu):
    ctx, ptrs = bound_doc_context(gpu, Log())
    assert ctx.execute_async_v3(0)
    out = synced_view(gpu, ptrs["cache"], DOC_CACHE.shape, np.float32)
    assert out[0, 0, :, 0].tolist() == [0, 1, -1, -2, -3, -4, 6, 7]  # rows 2..5 of slot 0
    assert out[3, 1, :, 0].tolist() == [56, 57, 58, -29, -30, -31, -32, 63]  # rows 3..6


def test_unknown_engine_bytes_are_refused_with_the_reason():
    builder, network = create_network()  # a whole engine built outside the emulator
    x = network.add_input("never_seen_x", trt.float32, (3, 5))
    network.mark_output(network.add_identity(x).get_output(0))
    data = build_engine(builder, network, []).data
    log = Log()
    with emulated_gpu():
        assert trt.Runtime(log).deserialize_cuda_engine(b"not an engine") is None
        assert "malformed engine: expected an engine starting b'vtrt'" in log.errors[-1]
        assert trt.Runtime(log).deserialize_cuda_engine(data[:-1]) is None  # truncated
        assert f"expected {len(data)} bytes (the engine's header), got" in log.errors[-1]
        assert trt.Runtime(log).deserialize_cuda_engine(data) is None
        assert "never seen" in log.errors[-1]


@pytest.mark.parametrize(
    ("break_it", "reason"),
    [
        (lambda ctx, p: ctx.set_tensor_address("cache_out", p["update"]), "aliased output"),
        (lambda ctx, p: ctx.set_tensor_address("update", 0), "update has no address"),
        (lambda ctx, p: ctx.set_tensor_address("update", p["update"] + 256), "outside every"),
        (lambda ctx, p: device().memory.free(p["update"]), "use after free"),
    ],
    ids=["alias-elsewhere", "no-address", "past-the-end", "freed"],
)
def test_execute_refuses_a_bad_binding(gpu, break_it, reason):
    log = Log()
    ctx, ptrs = bound_doc_context(gpu, log)
    before = gpu.memory.view(ptrs["cache"], DOC_CACHE.shape, np.float32).copy()
    break_it(ctx, ptrs)
    assert ctx.execute_async_v3(0) is False
    assert reason in log.errors[-1]
    assert gpu.memory.view(ptrs["cache"], DOC_CACHE.shape, np.float32).tobytes() == (
        before.tobytes()
    )


def test_unaligned_and_unknown_addresses_are_refused_when_set(gpu):
    log = Log()
    ctx, ptrs = bound_doc_context(gpu, log)
    assert ctx.set_tensor_address("update", ptrs["update"] + 4) is False
    assert "256-byte" in log.errors[-1]
    assert ctx.set_tensor_address("nope", ptrs["update"]) is False


def two_profile_engine(log):
    """x [-1, 4] float32 -> y = x + x, profiles B in 1..2 and 3..8."""
    builder, network = create_network()
    x = network.add_input("x", trt.float32, (-1, 4))
    y = network.add_elementwise(x, x, trt.ElementWiseOperation.SUM).get_output(0)
    y.name = "y"
    network.mark_output(y)
    profiles = [
        Profile("small", {"x": ((1, 4), (2, 4), (2, 4))}),
        Profile("large", {"x": ((3, 4), (5, 4), (8, 4))}),
    ]
    data = build_engine(builder, network, profiles).data
    return trt.Runtime(log).deserialize_cuda_engine(data)


def test_profiles_are_selected_and_enforced(gpu):
    log = Log()
    engine = two_profile_engine(log)
    assert engine.num_optimization_profiles == 2
    assert [tuple(d) for d in engine.get_tensor_profile_shape("x", 1)] == [(3, 4), (5, 4), (8, 4)]
    ctx = engine.create_execution_context()
    assert ctx.active_optimization_profile == 0
    assert ctx.set_input_shape("x", (5, 4)) is False  # outside profile 0
    assert "outside optimization profile 0" in log.errors[-1]
    assert ctx.set_input_shape("x", (2, 4))
    assert ctx.set_optimization_profile_async(1, 0)
    assert ctx.active_optimization_profile == 1
    assert tuple(ctx.get_tensor_shape("x")) == (-1, 4)  # shapes must be set again
    assert ctx.set_optimization_profile_async(2, 0) is False
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    px, py = upload(gpu, x), gpu.memory.malloc(x.nbytes)
    assert ctx.set_tensor_address("x", px) and ctx.set_tensor_address("y", py)
    assert ctx.execute_async_v3(0) is False  # no shape set under profile 1
    assert ctx.set_input_shape("x", (5, 4))
    assert ctx.execute_async_v3(0)
    assert synced_view(gpu, py, (5, 4), np.float32).tolist() == (2 * x).tolist()


@pytest.mark.skipif(not FEATURES.dimension_names, reason="TensorRT without dimension names")
def test_inputs_with_the_same_dimension_name_must_be_bound_equal(gpu):
    """x [-1, 4] and z [-1, 2] name axis 0 "B" (as every Llama input does): TensorRT requires
    named-alike dimensions to be equal at run time, and the emulator refuses otherwise."""
    log = Log()
    builder, network = create_network()
    x = network.add_input("x", trt.float32, (-1, 4))
    z = network.add_input("z", trt.float32, (-1, 2))
    for t in (x, z):
        t.set_dimension_name(0, "B")
    for name, t in (("y", x), ("w", z)):
        out = network.add_elementwise(t, t, trt.ElementWiseOperation.SUM).get_output(0)
        out.name = name
        network.mark_output(out)
    shapes = {"x": ((1, 4), (2, 4), (4, 4)), "z": ((1, 2), (2, 2), (4, 2))}
    data = build_engine(builder, network, [Profile("p", shapes)]).data
    ctx = trt.Runtime(log).deserialize_cuda_engine(data).create_execution_context()
    x3, z2 = np.ones((3, 4), np.float32), np.ones((2, 2), np.float32)
    for name, array in (("x", x3), ("z", z2), ("y", x3), ("w", z2)):
        assert ctx.set_tensor_address(name, upload(gpu, array))
    assert ctx.set_input_shape("x", (3, 4)) and ctx.set_input_shape("z", (2, 2))
    assert ctx.execute_async_v3(0) is False
    assert "input dimensions named 'B' differ: {'x[0]': 3, 'z[0]': 2}" in log.errors[-1]
    assert ctx.set_input_shape("x", (2, 4))
    assert ctx.execute_async_v3(0)


def test_capture_needs_a_prior_enqueue_and_replays_only_at_its_shapes(gpu):
    from cuda.bindings import runtime as rt

    log = Log()
    ctx = two_profile_engine(log).create_execution_context()
    x = np.ones((2, 4), np.float32)
    px, py = upload(gpu, x), gpu.memory.malloc(x.nbytes)
    ctx.set_tensor_address("x", px)
    ctx.set_tensor_address("y", py)
    ctx.set_input_shape("x", (2, 4))
    _, stream = rt.cudaStreamCreate()
    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    rt.cudaStreamBeginCapture(stream, mode)
    assert ctx.execute_async_v3(stream) is False  # no warm-up enqueue of these shapes
    rt.cudaStreamEndCapture(stream)
    assert ctx.execute_async_v3(stream)
    rt.cudaStreamBeginCapture(stream, mode)
    assert ctx.execute_async_v3(stream)
    _, graph = rt.cudaStreamEndCapture(stream)
    _, graph_exec = rt.cudaGraphInstantiate(graph, 0)
    assert rt.cudaGraphLaunch(graph_exec, stream)[0] == rt.cudaError_t.cudaSuccess
    ctx.set_input_shape("x", (1, 4))
    assert ctx.execute_async_v3(stream)  # other shapes ran since the capture
    assert rt.cudaGraphLaunch(graph_exec, stream)[0] == rt.cudaError_t.cudaSuccess  # queued
    with pytest.raises(Exception, match=r"cudaGraphLaunch .* ran it: .*without a fresh enqueue"):
        rt.cudaStreamSynchronize(stream)


def test_a_sidecar_recipe_rebuilds_an_engine_built_elsewhere(tmp_path):
    from trt_kv.runtime.gpu.engine_loader import load_cuda_engine

    built = build_doc_example(tmp_path)  # outside the emulator: no build hook saw it
    with emulated_gpu(engines=[built.path], rebuild=recipe_rebuilder()):
        engine, _, _ = load_cuda_engine(built.path)
        assert engine.get_aliased_input_tensor("cache_out") == "cache"


def test_a_sidecar_without_a_recipe_is_refused(tmp_path):
    from trt_kv.engine.store import build_to_file
    from trt_kv.runtime.gpu.engine_loader import load_cuda_engine

    builder, network, profiles = doc_example_network("float16")  # built outside the emulator
    built = build_to_file(builder, network, profiles, tmp_path / "f16.engine", {"model": "x"})
    log = Log()
    with emulated_gpu(engines=[tmp_path]), pytest.raises(EngineFileError, match="None"):
        load_cuda_engine(built.path)
    with emulated_gpu(engines=[tmp_path]):
        assert trt.Runtime(log).deserialize_cuda_engine(built.path.read_bytes()) is None
    assert "no recipe" in log.errors[-1] or "'recipe'" in log.errors[-1]


def test_close_destroys_graphs_executables_and_the_stream(tmp_path):
    # Defect 6b: captured graphs, their executables and the stream were never destroyed.
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.engine.store import build_model_engine
    from trt_kv.models.llama import random_weights
    from trt_kv.runtime import Session
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    weights = random_weights(TINY_GQA, seed=1, std=0.3)
    with emulated_gpu():
        path = build_model_engine(
            "t", TINY_GQA, weights, out_dir=tmp_path, max_seq_len=8, max_batch=1, max_step_tokens=2
        ).path
        gpu = device()
        before = (set(gpu.graphs), set(gpu.execs), set(gpu.streams))
        backend = TrtBackend(path, cuda_graph="manual")
        s = Session(backend)
        s.prefill([[1, 2]])
        s.decode([3])
        s.decode([4])
        assert len(gpu.graphs) == len(before[0]) + 1
        backend.close()
        assert (set(gpu.graphs), set(gpu.execs), set(gpu.streams)) == before


def _widen_batch(side, to):
    """The sidecar edited to batch ``to``: every profile's max B, and the roles' max_batch."""
    for profile in side["profiles"]:
        for shapes in profile["shapes"].values():
            shapes[2][0] = to
    side["roles"]["max_batch"] = side["metadata"]["max_batch"] = to


def test_a_sidecar_whose_profiles_differ_from_the_recipe_build_is_refused(tmp_path):
    """The emulated engine took its profiles from the sidecar: one edited to batch 4 ran a
    batch-3 step on an engine built for B <= 2, where a real one refuses set_input_shape."""
    import json

    from tests.support.cli_user import write_tiny_model
    from trt_kv.engine.file import sidecar_path
    from trt_kv.engine.store import build_model_engine
    from trt_kv.models.loading import load_model

    folder = write_tiny_model(tmp_path / "tiny")
    model = load_model(folder, progress=False)
    built = build_model_engine(
        "tiny",
        model.config,
        model.weights,
        out_dir=tmp_path,
        dtype="float32",
        max_seq_len=16,
        max_batch=2,
        max_step_tokens=4,
    )  # fmt: skip  (outside the emulator: rebuilt from its recipe)
    side = json.loads(sidecar_path(built.path).read_text())
    _widen_batch(side, 4)
    sidecar_path(built.path).write_text(json.dumps(side))
    log = Log()
    with emulated_gpu(engines=[built.path], rebuild=recipe_rebuilder([folder])):
        assert trt.Runtime(log).deserialize_cuda_engine(built.path.read_bytes()) is None
    assert log.errors[-1].endswith(
        ": sidecar profile decode input input_ids: expected [min, opt, max] as built "
        "[[1, 1], [2, 1], [2, 1]], got [[1, 1], [2, 1], [4, 1]]"
    ), log.errors
