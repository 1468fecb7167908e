"""Shared test set-up: GPU and nvcc tests skip with a clear reason where they cannot run."""

from __future__ import annotations

import shutil

import pytest
from real_model import hf_saved_folder, hf_smollm2, hf_tokenizer, smollm2, smollm2_gguf

from trt_kv.runtime.cuda import gpu_unavailable_reason

# Session fixtures of the real default model, shared by its test modules.
__all__ = ["hf_saved_folder", "hf_smollm2", "hf_tokenizer", "smollm2", "smollm2_gguf"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_reason = gpu_unavailable_reason()
    for item in items:
        if "gpu" in item.keywords and gpu_reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {gpu_reason}"))
        if "nvcc" in item.keywords and shutil.which("nvcc") is None:
            item.add_marker(pytest.mark.skip(reason="needs nvcc (CUDA toolkit) on PATH"))
