"""Shared test set-up: GPU and nvcc tests skip with a clear reason where they cannot run."""

from __future__ import annotations

import shutil

import pytest

from trt_kv.runtime.cuda import gpu_unavailable_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_reason = gpu_unavailable_reason()
    for item in items:
        if "gpu" in item.keywords and gpu_reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {gpu_reason}"))
        if "nvcc" in item.keywords and shutil.which("nvcc") is None:
            item.add_marker(pytest.mark.skip(reason="needs nvcc (CUDA toolkit) on PATH"))
