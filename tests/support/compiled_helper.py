"""Whether a test needs the compiled helper (``trt_kv/interpreter/_native.c``): it fails where
``pip install`` should have built it and did not, and skips where it cannot be built; this
file holds no tests."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import pytest

from trt_kv.interpreter import half


def compiled_helper_expected() -> bool:
    """True where ``pip install`` builds the helper: a C compiler, an x86-64 Linux processor
    with AVX2, FMA and F16C (elsewhere the install skips it and the recipes run)."""
    if platform.machine() != "x86_64" or not (shutil.which("cc") or shutil.which("gcc")):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f" {flag}" in flags for flag in ("f16c", "avx2", "fma"))


def require_compiled_helper() -> None:
    """Fail where the compiled helper should have been built and was not (or did not load);
    skip where it cannot be (no C compiler, another processor). Returns where it loaded."""
    if half.COMPILED is not None:
        return
    if compiled_helper_expected():
        pytest.fail(
            "the compiled float16 helper was not built, or did not load (a build of "
            "another _native.c is passed over): pip install -e . rebuilds it"
        )
    pytest.skip(
        "no compiled float16 helper here (no C compiler, or not x86-64 with AVX2, FMA, F16C)"
    )
