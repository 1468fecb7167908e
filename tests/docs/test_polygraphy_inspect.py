"""docs/cli.md's Polygraphy ``inspect model`` commands, run as written on this CPU machine.

What holds here (Polygraphy 0.53.6, TensorRT-RTX only, no GPU), and docs/cli.md says so:
without ``POLYGRAPHY_USE_TENSORRT_RTX=1`` Polygraphy looks for ``tensorrt`` and stops; with
it, Polygraphy loads the engine through TensorRT-RTX and stops at deserialization, which
needs a GPU. ``trt-kv inspect`` is the CPU way to see an engine.
"""

import importlib.util
import os
import shutil
import subprocess

import pytest

import trt_kv
from tests.support.cli_user import run_cli, user_env
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason

POLYGRAPHY = shutil.which("polygraphy")
pytestmark = [
    pytest.mark.skipif(POLYGRAPHY is None, reason="the polygraphy command is not installed"),
    pytest.mark.skipif(not trt_kv.FEATURES.is_rtx, reason="engines built by TensorRT-RTX"),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    run_cli("build", "--no-model", "--out", out, "-q")
    return out / "kv_cache_doc_example.engine"


def polygraphy(engine, switch):
    env = {k: v for k, v in user_env().items() if k != "POLYGRAPHY_USE_TENSORRT_RTX"}
    if switch is not None:
        env["POLYGRAPHY_USE_TENSORRT_RTX"] = switch
    out = subprocess.run(
        [POLYGRAPHY, "inspect", "model", str(engine)],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(engine),
        check=False,
    )
    return out.stdout + out.stderr


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt here")
def test_without_the_switch_polygraphy_looks_for_tensorrt(engine):
    out = polygraphy(engine, switch=None)
    assert "Module: 'tensorrt' is required but could not be imported" in out


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU")
def test_with_the_switch_polygraphy_loads_the_engine_with_tensorrt_rtx_then_needs_a_gpu(engine):
    out = polygraphy(engine, switch="1")
    assert f"Loading bytes from {engine}" in out
    assert "IRuntime::deserializeCudaEngine" in out  # TensorRT-RTX's runtime, reached
    assert "Could not deserialize engine" in out
    assert "'tensorrt' is required" not in out
