"""``trt-kv --version``: trt_kv, the TensorRT module it would use, and the CUDA status."""

from __future__ import annotations

import sys


def _cuda_version(v: int) -> str:
    """CUDA's integer version ``13040`` as ``"13.4"``."""
    return f"{v // 1000}.{v % 1000 // 10}"


def cuda_status() -> str:
    """Driver version and device count/name, or why no device is usable."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError as e:
        return f"cuda-python not importable ({e})"
    _, driver = rt.cudaDriverGetVersion()
    _, runtime = rt.cudaRuntimeGetVersion()
    head = f"runtime {_cuda_version(runtime)}, " + (
        f"driver {_cuda_version(driver)}" if driver else "no driver"
    )
    from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is not None:
        return f"{head}; no usable device: {reason}"
    _, count = rt.cudaGetDeviceCount()
    _, props = rt.cudaGetDeviceProperties(0)
    name = props.name.decode(errors="replace").rstrip("\0")
    return f"{head}; {count} device(s), 0: {name} (sm_{props.major}{props.minor})"


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
        ]
    )
