"""CUDA-level costs of a decode step's host side on a real GPU (no TensorRT needed).

    python scripts/bench_cuda_cache_ops.py

Step inputs (one pinned staging upload against one pageable copy per input), ``reorder``
(device-to-device slot moves against the host round trip trt_kv did before) on SmolLM2-135M's
60 caches, and clearing a prefill's slots (one memset per cache against one per cache per
slot); medians, microseconds. Also checks the reordered device caches against host caches,
byte for byte. Results of 2026-11-26 on an H200: docs/gpu-results.md. Without a usable CUDA
GPU it prints why in one line and exits 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
from cuda.bindings import runtime as rt

from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.errors import TrtKvError
from trt_kv.runtime.gpu.cuda import DeviceBuffer, create_stream, require_gpu, synchronize
from trt_kv.runtime.gpu.device import DeviceCaches
from trt_kv.runtime.gpu.staging import StepInputs
from trt_kv.runtime.storage import HostCaches

# SmolLM2-135M: 30 layers x K/V caches [capacity, 3, 512, 64] float16 (196,608 bytes a slot)
ALIASES = [
    CacheAlias(f"past_{kind}.{i}", f"present_{kind}.{i}", (-1, 3, 512, 64), "float16")
    for i in range(30)
    for kind in ("key", "value")
]
CAPACITY = 4


def median_us(fn: Callable[[], object], n: int = 300) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def step_inputs(stream: int, batch: int) -> None:
    feed = {
        "input_ids": np.ones((batch, 1), np.int32),
        "position_ids": np.ones((batch, 1), np.int64),
        "write_indices": np.ones(batch, np.int32),
        "key_value_lengths": np.ones(batch, np.int32),
        "last_token_rows": np.zeros(batch, np.int32),
    }
    staging = StepInputs(dict.fromkeys(feed, 8 * 8 * 64))
    staging.arrange(feed)
    buffers = {name: DeviceBuffer(4096) for name in feed}

    def staged() -> None:
        staging.upload(feed, stream)
        synchronize(stream)

    def pageable() -> None:  # the path before: one pageable upload per input
        held = {name: np.ascontiguousarray(host) for name, host in feed.items()}
        for name, host in held.items():
            buffers[name].upload(host, stream=stream)
        synchronize(stream)

    print(
        f"B={batch} step inputs: one pinned staging upload + sync {median_us(staged):.1f} us; "
        f"{len(feed)} pageable uploads + sync {median_us(pageable):.1f} us"
    )
    staging.free()


def old_reorder(caches: DeviceCaches, order: Sequence[int]) -> None:
    """The path before: every named slot to the host and back, one upload per head."""
    saved = {s: {a.input: caches.read_slot(a.input, s) for a in ALIASES} for s in set(order)}
    for k, s in enumerate(order):
        for name, rows in saved[s].items():
            caches.write_slot(name, k, rows)


def cache_ops() -> None:
    dev, host = DeviceCaches(ALIASES, CAPACITY), HostCaches(ALIASES, CAPACITY)
    rng = np.random.default_rng(0)
    for a in ALIASES:
        for slot in range(CAPACITY):
            rows = rng.standard_normal((3, 512, 64)).astype(np.float16)
            dev.write_slot(a.input, slot, rows)
            host.write_slot(a.input, slot, rows)
    for order in ([1, 0, 3, 2], [0, 0, 0, 0], [3, 2, 1, 0]):
        dev.reorder(order)
        host.reorder(order)
    same = all(
        dev.read_slot(a.input, s).tobytes() == host.read_slot(a.input, s).tobytes()
        for a in ALIASES
        for s in range(CAPACITY)
    )
    print(f"reorder, 3 orders x 60 caches x 4 slots: {'bit-identical' if same else 'DIFFERS'}")

    def new() -> None:
        dev.reorder([1, 0, 3, 2])
        rt.cudaDeviceSynchronize()

    old = median_us(lambda: old_reorder(dev, [1, 0, 3, 2]), 10)
    print(f"beam-4 reorder: device-to-device {median_us(new, 50):.0f} us; host trip {old:.0f} us")

    def zero_run() -> None:
        dev.zero(0, CAPACITY)
        rt.cudaDeviceSynchronize()

    def zero_each() -> None:
        for slot in range(CAPACITY):
            dev.zero(slot)
        rt.cudaDeviceSynchronize()

    print(
        f"clear 4 slots: one memset per cache {median_us(zero_run, 50):.0f} us; "
        f"one per cache per slot {median_us(zero_each, 50):.0f} us"
    )
    dev.free()


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    try:
        require_gpu("bench_cuda_cache_ops.py")
    except TrtKvError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = rt.cudaGetDeviceProperties(0)[1].name.split(b"\0")[0].decode()
    print(f"device: {name}")
    stream = create_stream()
    for batch in (1, 8):
        step_inputs(stream, batch)
    cache_ops()
    return 0


if __name__ == "__main__":
    sys.exit(main())
