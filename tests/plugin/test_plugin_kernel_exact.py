"""The kernels write exactly what ``trt_kv.reference.kv_cache_update`` writes, bit for bit.

Two executors run the same cases through the same launch plans (``plan_launch``):
- ``host``: ``plugins/kv_cache_update.cu`` built by the host C++ compiler with
  ``-DTRT_KV_HOST_EMULATION`` (same element functions, a one-thread loop instead of the grid);
  runs on the CPU, so the index arithmetic, bounds skipping and packed-sequence search are
  checked in CI.
- ``gpu``: the real kernels, NVRTC-compiled and launched through cuda-python
  (``trt_kv.plugin.launch``); without a CUDA device, on the emulated GPU, whose driver loads
  the NVRTC image and runs the host build of the same source for each launch.
Last, on a GPU with a TensorRT that has both ``add_plugin_v3`` and IKVCacheUpdateLayer: an engine
with the plugin = an engine with the native layer = the reference.
"""

from __future__ import annotations

import ctypes
import shutil
import zlib

import numpy as np
import pytest

from trt_kv import dtypes
from trt_kv._trt import FEATURES, logger, trt
from trt_kv.builder import add_cache_input, add_kv_cache_update, create_network
from trt_kv.plugin import enable_aliased_io, kernels, launch
from trt_kv.plugin.kernels import PREFIX, plan_launch
from trt_kv.reference import kv_cache_update

CXX = shutil.which("g++") or shutil.which("c++")
CACHE_DTYPES = ("float32", "float16", "bfloat16")
INDEX_DTYPES = ("int32", "int64")
FORMS = [("padded", None)] + [("packed", li) for li in INDEX_DTYPES]
WORD = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def _args(cache, update, write_indices, update_lengths):
    lengths = None if update_lengths is None else dtypes.name_of(update_lengths.dtype)
    plan = plan_launch(
        cache.shape, update.shape, dtypes.name_of(cache.dtype), write_indices.dtype.name, lengths
    )
    arrays = [a for a in (update, write_indices, update_lengths) if a is not None]
    return plan, arrays


class HostExecutor:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def __call__(self, cache, update, write_indices, update_lengths=None):
        plan, arrays = _args(cache, update, write_indices, update_lengths)
        out = np.ascontiguousarray(cache).copy()
        fn = getattr(self.lib, plan.name.replace(PREFIX, "trt_kv_host"))
        pointers = [ctypes.c_void_p(a.ctypes.data) for a in (out, *arrays)]
        fn(*pointers, *(ctypes.c_int(s) for s in plan.sizes))
        return out


class GpuExecutor:
    def __init__(self) -> None:
        from cuda.bindings import driver

        self.driver = driver
        (device,) = launch.check(driver.cuDeviceGet(0), "cuDeviceGet")
        (ctx,) = launch.check(driver.cuDevicePrimaryCtxRetain(device), "primary context")
        launch.check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def _upload(self, a):
        (ptr,) = launch.check(self.driver.cuMemAlloc(max(a.nbytes, 1)), "cuMemAlloc")
        if a.nbytes:
            launch.check(self.driver.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
        return ptr

    def _run(self, cache, arrays, execute):
        """Upload cache and arrays, ``execute(device pointers)``, return the cache read back."""
        out = np.ascontiguousarray(cache).copy()
        buffers = [self._upload(np.ascontiguousarray(a)) for a in (out, *arrays)]
        try:
            execute([int(b) for b in buffers])
            launch.check(self.driver.cuCtxSynchronize(), "cuCtxSynchronize")
            launch.check(
                self.driver.cuMemcpyDtoH(out.ctypes.data, buffers[0], out.nbytes), "cuMemcpyDtoH"
            )
        finally:
            for b in buffers:
                self.driver.cuMemFree(b)
        return out

    def __call__(self, cache, update, write_indices, update_lengths=None):
        plan, arrays = _args(cache, update, write_indices, update_lengths)
        return self._run(cache, arrays, lambda pointers: launch.launch(plan, pointers, 0))

    def run_engine(self, data, cache, update, write_indices, update_lengths=None):
        """Run a :func:`build_update_engine` engine with cache and cache_out on one buffer."""
        engine = trt.Runtime(logger()).deserialize_cuda_engine(data)
        context = engine.create_execution_context()
        arrays = [a for a in (update, write_indices, update_lengths) if a is not None]

        def execute(pointers):
            for name, ptr in zip(("cache", *ENGINE_INPUTS), pointers):
                context.set_tensor_address(name, ptr)
            context.set_tensor_address("cache_out", pointers[0])
            assert context.execute_async_v3(0)

        return self._run(cache, arrays, execute)


@pytest.fixture(scope="module")
def host():
    if CXX is None:
        pytest.skip("no host C++ compiler (g++ or c++) on PATH")
    from trt_kv.emulator.cuda_driver import host_library  # the emulated driver runs it too

    return HostExecutor(host_library())


@pytest.fixture(scope="module")
def gpu():
    if launch.gpu_count() == 0:
        pytest.skip("no CUDA device (cuInit/cuDeviceGetCount through cuda-python found none)")
    if not kernels.nvrtc_available():
        pytest.skip("cuda-python cannot load libnvrtc (pip install nvidia-cuda-nvrtc)")
    return GpuExecutor()


@pytest.fixture(params=["host", pytest.param("gpu", marks=pytest.mark.gpu(tensorrt=False))])
def run(request):
    return request.getfixturevalue(request.param)


ENGINE_INPUTS = ("update", "write_indices", "update_lengths")


def build_update_engine(method, cache, update, write_indices, update_lengths=None):
    """Serialized engine: one cache update by ``method`` with static shapes from the arrays."""
    builder, network = create_network()
    b, n, s_max, h = cache.shape
    dtype = dtypes.name_of(cache.dtype)
    c = add_cache_input(
        network, "cache", num_heads=n, max_seq_len=s_max, head_dim=h, dtype=dtype, batch=b
    )
    arrays = (update, write_indices, update_lengths)
    t = {
        name: network.add_input(name, dtypes.to_trt(a.dtype), a.shape)
        for name, a in zip(ENGINE_INPUTS, arrays)
        if a is not None
    }
    add_kv_cache_update(
        network,
        c,
        t["update"],
        t["write_indices"],
        output_name="cache_out",
        update_lengths=t.get("update_lengths"),
        method=method,
    )
    config = builder.create_builder_config()
    enable_aliased_io(config)
    data = builder.build_serialized_network(network, config)
    assert data is not None, f"{method} engine failed to build (see the TensorRT log)"
    return bytes(data)


def random_bits(rng, shape, dtype):
    """Arbitrary bit patterns (NaN payloads, denormals, -0) viewed as ``dtype``."""
    word = WORD[dtype]
    bits = rng.integers(0, np.iinfo(word).max, size=shape, dtype=word, endpoint=True)
    return bits.view(dtypes.to_numpy(dtype))


def assert_bits_equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    word = np.uint32 if actual.dtype.itemsize == 4 else np.uint16
    np.testing.assert_array_equal(actual.view(word), expected.view(word))


def make_case(rng, dtype, index_dtype, lengths_dtype):
    """A batch of 3 sequences with different lengths (one empty) and in-bounds starts."""
    b, n, s_max, h = 3, 2, 9, 5
    cache = random_bits(rng, (b, n, s_max, h), dtype)
    counts = np.array([4, 0, 2]) if lengths_dtype else np.array([3, 3, 3])
    starts = np.array([rng.integers(0, s_max - c + 1) for c in counts], dtype=index_dtype)
    if lengths_dtype is None:
        return cache, random_bits(rng, (b, n, 3, h), dtype), starts, None
    lengths = np.concatenate([[0], np.cumsum(counts)]).astype(lengths_dtype)
    return cache, random_bits(rng, (int(lengths[-1]), n, h), dtype), starts, lengths


@pytest.mark.parametrize("dtype", CACHE_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize(("form", "lengths_dtype"), FORMS)
def test_update_matches_reference_bit_exact(run, dtype, index_dtype, form, lengths_dtype):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{index_dtype}{form}{lengths_dtype}".encode()))
    for _ in range(4):
        case = make_case(rng, dtype, index_dtype, lengths_dtype)
        assert_bits_equal(run(*case), kv_cache_update(*case))


def test_padded_write_past_s_max_is_skipped_and_negative_start_skips_the_sequence(run):
    cache = np.zeros((2, 1, 4, 2), np.float32)
    update = np.arange(1, 13, dtype=np.float32).reshape(2, 1, 3, 2)
    out = run(cache, update, np.array([2, -1], np.int32))
    expected = np.zeros_like(cache)
    expected[0, 0, 2:4] = [[1, 2], [3, 4]]  # s = 2 would land at 4 == S_max: skipped
    assert_bits_equal(out, expected)


def test_packed_write_past_s_max_is_skipped_and_negative_start_skips_the_sequence(run):
    cache = np.zeros((3, 1, 3, 1), np.float16)
    update = np.array([1, 2, 3, 4, 5, 6, 7], np.float16).reshape(7, 1, 1)
    lengths = np.array([0, 3, 5, 7], np.int64)  # sequences: tokens 0-2, 3-4, 5-6
    out = run(cache, update, np.array([1, 0, -1], np.int64), lengths)
    expected = np.zeros_like(cache)
    expected[0, 0, 1:3, 0] = [1, 2]  # token 2 would land at 3 == S_max: skipped
    expected[1, 0, 0:2, 0] = [4, 5]  # sequence 2 starts at -1: nothing written
    assert_bits_equal(out, expected)


def test_packed_tokens_past_the_last_length_are_not_written(run):
    cache = np.zeros((1, 1, 4, 1), np.float32)
    update = np.array([7, 8, 9], np.float32).reshape(3, 1, 1)
    out = run(cache, update, np.array([0], np.int32), np.array([0, 2], np.int32))
    assert out[0, 0, :, 0].tolist() == [7, 8, 0, 0]


def test_extreme_int64_indices_and_lengths_write_nothing(run):
    big = 2**62
    cache = np.zeros((2, 1, 4, 1), np.float32)
    padded = run(cache, np.ones((2, 1, 2, 1), np.float32), np.array([2**63 - 1, -(2**63)]))
    assert not padded.any()
    lengths = np.array([-big, 1, 2], np.int64)  # sequence 0 claims to start 2**62 tokens back
    packed = run(cache, np.ones((2, 1, 1), np.float32), np.array([big, 2**63 - 1]), lengths)
    assert not packed.any()


def test_only_the_written_window_changes(run):
    rng = np.random.default_rng(0)
    cache = random_bits(rng, (1, 2, 6, 3), "bfloat16")
    update = random_bits(rng, (1, 2, 2, 3), "bfloat16")
    out = run(cache, update, np.array([3], np.int64))
    changed = (out.view(np.uint16) != cache.view(np.uint16)).any(axis=(0, 1, 3))
    assert not changed[[0, 1, 2, 5]].any()
    assert_bits_equal(out[:, :, 3:5], update)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (FEATURES.python_plugins and FEATURES.kv_cache_update_layer),
    reason=f"needs TensorRT with add_plugin_v3 and IKVCacheUpdateLayer (>= 10.15); "
    f"{FEATURES.module} {FEATURES.version} has add_plugin_v3={FEATURES.python_plugins}, "
    f"layer={FEATURES.kv_cache_update_layer}",
)
@pytest.mark.parametrize("dtype", CACHE_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("form", ["padded", "packed"])
def test_plugin_engine_equals_native_layer_engine_equals_reference(gpu, dtype, index_dtype, form):
    rng = np.random.default_rng(7)
    case = make_case(rng, dtype, index_dtype, index_dtype if form == "packed" else None)
    expected = kv_cache_update(*case)
    for method in ("layer", "plugin"):
        assert_bits_equal(gpu.run_engine(build_update_engine(method, *case), *case), expected)


def _descs(*arrays):
    """``trt.PluginTensorDesc`` of each array, as TensorRT hands them to ``enqueue``."""
    out = []
    for a in arrays:
        d = trt.PluginTensorDesc()
        d.type, d.format, d.dims = (
            dtypes.to_trt(a.dtype),
            trt.TensorFormat.LINEAR,
            trt.Dims(a.shape),
        )
        out.append(d)
    return out


@pytest.mark.gpu(tensorrt=False)
@pytest.mark.parametrize(("form", "lengths_dtype"), FORMS)
def test_plugin_enqueue_in_place_matches_the_reference(gpu, form, lengths_dtype):
    """The plugin's ``enqueue`` as TensorRT calls it with aliased I/O: output 0 is input 0."""
    from trt_kv.plugin import KvCacheUpdatePlugin

    rng = np.random.default_rng(zlib.crc32(f"enqueue{form}{lengths_dtype}".encode()))
    case = make_case(rng, "float16", "int64", lengths_dtype)
    arrays = [a for a in case[1:] if a is not None]
    descs = _descs(case[0], *arrays)
    plugin = KvCacheUpdatePlugin(form)
    out = gpu._run(case[0], arrays, lambda p: plugin.enqueue(descs, descs[:1], p, [p[0]], 0, 0))
    assert_bits_equal(out, kv_cache_update(*case))


@pytest.mark.gpu(tensorrt=False)
def test_plugin_enqueue_copies_the_cache_when_output_is_another_buffer(gpu):
    """Without aliased I/O TensorRT gives output 0 its own buffer: ``enqueue`` copies the cache
    there first, then writes the update; the input cache keeps its bytes."""
    from trt_kv.plugin import KvCacheUpdatePlugin

    rng = np.random.default_rng(11)
    case = make_case(rng, "bfloat16", "int32", None)
    arrays = [a for a in case[1:] if a is not None]
    descs = _descs(case[0], *arrays)
    junk = random_bits(rng, case[0].shape, "bfloat16")
    result = {}

    def execute(pointers):
        out = gpu._upload(junk)
        try:
            KvCacheUpdatePlugin("padded").enqueue(descs, descs[:1], pointers, [int(out)], 0, 0)
            launch.check(gpu.driver.cuCtxSynchronize(), "cuCtxSynchronize")
            host = np.empty_like(junk)
            launch.check(gpu.driver.cuMemcpyDtoH(host.ctypes.data, out, host.nbytes), "DtoH")
            result["out"] = host
        finally:
            gpu.driver.cuMemFree(out)

    cache_after = gpu._run(case[0], arrays, execute)
    assert_bits_equal(result["out"], kv_cache_update(*case))
    assert_bits_equal(cache_after, case[0])
