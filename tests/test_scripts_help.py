"""Every script in ``scripts/`` answers ``--help`` (the benchmarks the suite does not run
otherwise included), and the GPU-only one refuses a machine without a GPU in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason

FOLDER = Path(__file__).resolve().parents[1] / "scripts"
SCRIPTS = sorted(FOLDER.glob("*.py"))


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )


def test_the_scripts_are_found() -> None:
    assert {"bench_llama_cpp.py", "bench_cuda_cache_ops.py"} <= {s.name for s in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_script_answers_help(script: Path) -> None:
    done = _run(script, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a CUDA GPU is usable here")
def test_cuda_benchmark_without_a_gpu_says_why_in_one_line() -> None:
    done = _run(FOLDER / "bench_cuda_cache_ops.py")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: bench_cuda_cache_ops.py: expected a CUDA GPU"
    )
    assert done.stdout == ""
