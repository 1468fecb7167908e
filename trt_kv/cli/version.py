"""``trt-kv --version``: trt_kv, the TensorRT module it would use, and the CUDA status."""

from __future__ import annotations

import sys


def cuda_status() -> str:
    """Driver version and device count/name, or why no device is usable."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError as e:
        return f"cuda-python not importable ({e})"
    from trt_kv.runtime.gpu.cuda import cuda_version_text, gpu_unavailable_reason

    _, driver = rt.cudaDriverGetVersion()
    _, runtime = rt.cudaRuntimeGetVersion()
    head = f"runtime {cuda_version_text(runtime)}, " + (
        f"driver {cuda_version_text(driver)}" if driver else "no driver"
    )
    reason = gpu_unavailable_reason()
    if reason is not None:
        return f"{head}; no usable device: {reason}"
    from trt_kv.runtime.gpu.cuda import device_capability

    _, count = rt.cudaGetDeviceCount()
    (major, minor), name = device_capability()
    return f"{head}; {count} device(s), 0: {name}, compute capability {major}.{minor}"


def gpu_support() -> str:
    """Whether the installed TensorRT runs engines on device 0's compute capability (from
    :data:`trt_kv.gpu_targets.SUPPORT`), or why there is nothing to ask."""
    from trt_kv.errors import TrtKvError
    from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason, tensorrt_refusal

    if gpu_unavailable_reason() is not None:
        return "no GPU to run engines on"
    try:
        reason = tensorrt_refusal()
    except TrtKvError as e:
        return f"unknown ({e})"
    return "runs on this GPU (portable engines)" if reason is None else f"NO: {reason}"


def version_text() -> str:
    """Several lines: trt_kv, Python, TensorRT module and version, Polygraphy, CUDA."""
    import platform

    import trt_kv
    from trt_kv.errors import TrtKvError

    try:
        trt = f"{trt_kv.FEATURES.module} {trt_kv.FEATURES.version}"
        if trt_kv.FEATURES.is_rtx:
            trt += " (builds engines on the CPU; engines run on NVIDIA GPUs)"
    except TrtKvError as e:
        trt = f"none ({e})"
    try:
        import polygraphy

        poly = polygraphy.__version__
    except ImportError:
        poly = "not installed"
    return "\n".join(
        [
            f"trt_kv {trt_kv.__version__}",
            f"Python {platform.python_version()} ({sys.executable})",
            f"TensorRT: {trt}",
            f"Polygraphy: {poly}",
            f"CUDA: {cuda_status()}",
            f"GPU support: {gpu_support()}",
        ]
    )
