"""Step inputs through one pinned buffer and one upload (``StepInputs``): the bytes that land
on the device are the step's, at 256-byte aligned addresses that hold while the shapes do.
CUDA only: on a real GPU unchanged, else on the emulated device."""

import numpy as np
import pytest

from trt_kv.errors import ShapeError

pytestmark = pytest.mark.gpu(tensorrt=False)


def feed(b, s, seed):
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, 1000, (b, s)).astype(np.int32),
        "position_ids": rng.integers(0, 64, (b, s)).astype(np.int64),
        "write_indices": rng.integers(0, 64, (b,)).astype(np.int32),
    }


def test_each_step_lands_whole_at_the_arranged_addresses():
    from trt_kv.runtime.gpu.cuda import create_stream, synchronize
    from trt_kv.runtime.gpu.staging import StepInputs

    stream = create_stream()
    staging = StepInputs(dict.fromkeys(feed(1, 1, 0), 4 * 8 * 8))
    try:
        for b, s in ((4, 8), (2, 1), (2, 1), (1, 3)):
            step = feed(b, s, seed=b * 10 + s)
            addresses = staging.arrange(step)
            assert all(a % 256 == 0 for a in addresses.values())
            for k in range(3):  # new values each step, the same addresses
                step = feed(b, s, seed=100 * k + b)
                staging.upload(step, stream)
                synchronize(stream)
                for name, host in step.items():
                    got = staging.device.download(
                        np.empty_like(host), addresses[name] - staging.device.address()
                    )
                    np.testing.assert_array_equal(got, host)
    finally:
        staging.free()


def test_a_step_of_other_shapes_than_arranged_is_refused():
    from trt_kv.runtime.gpu.cuda import create_stream
    from trt_kv.runtime.gpu.staging import StepInputs

    staging = StepInputs(dict.fromkeys(feed(1, 1, 0), 4 * 8 * 8))
    try:
        staging.arrange(feed(2, 1, 0))
        with pytest.raises(ShapeError, match="input_ids: expected the arranged shape"):
            staging.upload(feed(2, 2, 0), create_stream())
    finally:
        staging.free()


def test_pinned_memory_that_cannot_be_had_is_a_device_memory_error():
    from trt_kv.errors import DeviceMemoryError
    from trt_kv.runtime.gpu.cuda import PinnedBuffer

    with pytest.raises(DeviceMemoryError, match=r"cudaHostAlloc of step inputs: expected host"):
        PinnedBuffer(1 << 62, "step inputs")


def test_a_captured_upload_and_download_replay_with_the_pinned_bytes_of_the_launch():
    """What a replayed decode step rests on: a graph holding the staging upload (pinned ->
    device) and a download into pinned memory reads and writes the pinned bytes when it is
    launched, not when it was captured."""
    from cuda.bindings import runtime as rt

    from trt_kv.runtime.gpu.cuda import PinnedBuffer, check, create_stream, synchronize
    from trt_kv.runtime.gpu.staging import StepInputs

    stream = create_stream()
    staging = StepInputs(dict.fromkeys(feed(1, 1, 0), 4 * 8 * 8))
    out = PinnedBuffer(4096, "outputs")
    graph = graph_exec = None
    try:
        staging.arrange(feed(2, 1, 0))
        staging.upload(feed(2, 1, 0), stream)  # an ordinary step first
        synchronize(stream)
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(rt.cudaStreamBeginCapture(stream, mode))
        staging.copy(stream)
        staging.device.download_to(out, staging.used, stream)  # device -> pinned, captured
        graph = check(rt.cudaStreamEndCapture(stream))
        graph_exec = check(rt.cudaGraphInstantiate(graph, 0))
        for seed in (1, 2, 3):
            step = feed(2, 1, seed)
            staging.write(step)  # host memory only
            check(rt.cudaGraphLaunch(graph_exec, stream))
            synchronize(stream)
            landed = out.view(0, np.uint8, (staging.used,)).copy()
            assert landed.tobytes() == staging.host.view(0, np.uint8, (staging.used,)).tobytes()
            ids = staging.views["input_ids"]
            np.testing.assert_array_equal(ids, step["input_ids"])
    finally:
        if graph_exec is not None:
            rt.cudaGraphExecDestroy(graph_exec)
        if graph is not None:
            rt.cudaGraphDestroy(graph)
        out.free()
        staging.free()
