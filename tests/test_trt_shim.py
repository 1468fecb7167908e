"""The one TensorRT import: module choice, features, Polygraphy pointed at the same module."""

import importlib.util
import os
import signal
import subprocess
import sys

import pytest

from trt_kv import FEATURES


def run_python(code, unset=(), **env):
    full = {k: v for k, v in {**os.environ, **env}.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, check=False
    )


def test_features_describe_the_installed_module():
    import importlib

    mod = importlib.import_module(FEATURES.module)
    assert FEATURES.version == mod.__version__
    assert FEATURES.kv_cache_update_layer == hasattr(mod.INetworkDefinition, "add_kv_cache_update")
    assert FEATURES.attention_v2 and FEATURES.rotary_embedding
    assert FEATURES.aliased_tensor_query


def test_environment_variable_forces_the_module():
    out = run_python(
        "from trt_kv import FEATURES; print(FEATURES.module)", TRT_KV_TRT_MODULE=FEATURES.module
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == FEATURES.module


def test_unknown_forced_module_is_a_clear_error_on_first_use():
    out = run_python("import trt_kv; trt_kv.FEATURES", TRT_KV_TRT_MODULE="tensorflow")
    assert out.returncode != 0
    assert (
        "TRT_KV_TRT_MODULE: expected one of ('tensorrt', 'tensorrt_rtx'), got 'tensorflow'"
        in out.stderr
    )


MISSING = [m for m in ("tensorrt", "tensorrt_rtx") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(not MISSING, reason="both tensorrt and tensorrt_rtx are installed")
def test_a_forced_module_that_is_not_installed_is_one_error_line():
    """It was a ModuleNotFoundError traceback from ``trt-kv``."""
    out = run_python(
        "from trt_kv.cli import main; raise SystemExit(main(['build', '--no-model', '-q']))",
        TRT_KV_TRT_MODULE=MISSING[0],
    )
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"trt-kv: error: TRT_KV_TRT_MODULE: expected an installed module, got {MISSING[0]!r} "
        f"(No module named {MISSING[0]!r})\n"
    )


def test_an_installed_module_that_does_not_load_is_named_with_its_error(tmp_path):
    """A broken install (a missing CUDA library, memory running out while mapping one) was
    reported as 'no TensorRT module found'. Both candidates here are packages that fail to
    load, first on the path."""
    for name in ("tensorrt", "tensorrt_rtx"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('lib{name}.so.1: cannot open shared object file')\n"
        )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = run_python(
        "from trt_kv.cli import main; raise SystemExit(main(['build', '--no-model', '-q']))",
        unset=("TRT_KV_TRT_MODULE",),
        PYTHONPATH=os.pathsep.join([str(tmp_path), root]),
    )
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr == (
        "trt-kv: error: TensorRT: expected a module that loads, got 'tensorrt' is installed but "
        "did not load (libtensorrt.so.1: cannot open shared object file); 'tensorrt_rtx' is "
        "installed but did not load (libtensorrt_rtx.so.1: cannot open shared object file)\n"
    )


@pytest.mark.skipif(not FEATURES.is_rtx, reason="TensorRT-RTX only: Polygraphy's RTX switch")
def test_polygraphy_uses_tensorrt_rtx_after_trt_kv_import():
    code = "import trt_kv, polygraphy.config as c; print(c.USE_TENSORRT_RTX)"
    out = run_python(code, unset=("POLYGRAPHY_USE_TENSORRT_RTX",))
    assert out.stdout.strip() == "True", out.stderr


def test_import_trt_kv_does_not_import_tensorrt():
    code = "import sys, trt_kv; print(sorted(m for m in sys.modules if m.startswith('tensorrt')))"
    out = run_python(code)
    assert out.stdout.strip() == "[]", out.stderr


def test_ctrl_c_while_tensorrt_initializes_is_an_interrupt_not_a_broken_install(tmp_path):
    """pybind11 reports a KeyboardInterrupt raised in a module's init as ``ImportError:
    initialization failed`` raised from it (a Ctrl-C that lands while TensorRT loads): the
    command is interrupted, not told its install is broken."""
    fake = tmp_path / "tensorrt"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise ImportError('initialization failed') from KeyboardInterrupt()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    env.pop("TRT_KV_TRT_MODULE", None)
    out = subprocess.run(
        [sys.executable, "-m", "trt_kv", "--version"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.returncode == -signal.SIGINT, out.stderr
    assert out.stderr == "trt-kv: interrupted\n"
