"""Shared test set-up.

Tests marked ``gpu`` run on the real GPU when one is usable, unchanged. Without one (CI, every
machine here) they run on the emulated GPU: setup, call and teardown of each such test happen
inside ``trt_kv.emulator.emulated_gpu()``, so module fixtures (engines, device buffers) made
for one gpu test stay usable by the next. ``@pytest.mark.gpu(tensorrt=False)`` marks a test
that needs CUDA only (it runs emulated even without a TensorRT runtime stand-in). On a real
GPU whose compute capability the installed TensorRT does not run (TensorRT-RTX 1.7 on an
H100/H200: every engine refused), the gpu tests that run engines skip, naming why
(``trt_kv.runtime.gpu.cuda.tensorrt_refusal``); the CUDA-only ones run. nvcc tests skip with
a clear reason without nvcc.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import nullcontext

import pytest

from tests.support.real_model import (
    hf_saved_folder,
    hf_smollm2,
    hf_tokenizer,
    smollm2,
    smollm2_gguf,
)
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason, tensorrt_refusal

REAL_GPU_REASON = gpu_unavailable_reason()  # None: a real GPU is usable
# None: the installed TensorRT runs engines on that real GPU (TensorRT-RTX 1.7 on an H200: no)
REAL_TRT_REASON = tensorrt_refusal() if REAL_GPU_REASON is None else None


def emulated(item: pytest.Item) -> bool:
    """Whether ``item`` runs on the emulated GPU (a gpu test on a machine without one)."""
    return item.get_closest_marker("gpu") is not None and REAL_GPU_REASON is not None


def pytest_report_header(config: pytest.Config) -> str:
    if REAL_GPU_REASON is None and REAL_TRT_REASON is not None:
        return f"gpu tests: on the real GPU, those that run engines skipped ({REAL_TRT_REASON})"
    if REAL_GPU_REASON is None:
        return "gpu tests: on the real GPU"
    return f"gpu tests: on the EMULATED GPU (no real one: {REAL_GPU_REASON})"


# Session fixtures of the real default model, shared by its test modules.
__all__ = ["hf_saved_folder", "hf_smollm2", "hf_tokenizer", "smollm2", "smollm2_gguf"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker and marker.kwargs.get("tensorrt", True) and REAL_TRT_REASON is not None:
            # a real GPU whose compute capability the installed TensorRT does not run: every
            # engine would be refused at deserialization (TensorRT-RTX 1.7.1 on an H200)
            item.add_marker(pytest.mark.skip(reason=f"runs a TensorRT engine: {REAL_TRT_REASON}"))
        if emulated(item):
            # @pytest.mark.gpu(tensorrt=False): the test needs CUDA only, not TensorRT's runtime
            needs = (
                "tensorrt"
                if item.get_closest_marker("gpu").kwargs.get("tensorrt", True)
                else "cuda"
            )
            from trt_kv.emulator import provides

            if needs not in provides():
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"GPU test on the emulated GPU: no {needs} stand-in registered "
                        f"(trt_kv.emulator.register_installer(..., provides={needs!r}))"
                    )
                )
        if item.get_closest_marker("nvcc") is not None and shutil.which("nvcc") is None:
            item.add_marker(pytest.mark.skip(reason="needs nvcc (CUDA toolkit) on PATH"))


def _device(item: pytest.Item) -> object:
    if not emulated(item):
        return nullcontext()
    from trt_kv.emulator import emulated_gpu

    return emulated_gpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _device(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _device(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _device(item):
        yield
