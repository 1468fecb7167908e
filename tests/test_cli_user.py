"""``trt-kv`` driven as a user drives it: ``python -m trt_kv`` in a subprocess."""

import re

import pytest
from cli_user import run_cli

SUBCOMMANDS = ("build", "generate", "demo")


def test_help_lists_every_subcommand_with_a_one_line_help():
    out = run_cli("--help").stdout
    assert out.startswith("usage: trt-kv")
    assert "build the doc example and the model engine" in out
    assert "generate tokens for prompts on a chosen backend" in out
    assert "build, then generate on the GPU" in out


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_help_shows_defaults_and_an_example(command):
    out = run_cli(command, "--help").stdout
    assert "S_max of every cache (default: 256)" in out
    assert "--quiet" in out
    example = out.split("example:\n", 1)[1].strip()
    assert example.startswith(f"trt-kv {command}")


def test_help_does_not_import_tensorrt_or_numpy():
    code = (
        "import sys; from trt_kv.cli import make_parser; make_parser(); "
        "print(sorted(m for m in ('numpy', 'tensorrt', 'tensorrt_rtx', 'trt_kv.runtime') "
        "if m in sys.modules))"
    )
    import subprocess
    import sys

    from cli_user import user_env

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=user_env(), check=True
    )
    assert out.stdout.strip() == "[]"


def test_version_names_trt_kv_tensorrt_and_cuda_status():
    import trt_kv

    lines = run_cli("--version").stdout.splitlines()
    assert lines[0] == f"trt_kv {trt_kv.__version__}"
    assert lines[2].startswith(f"TensorRT: {trt_kv.FEATURES.module} {trt_kv.FEATURES.version}")
    assert re.fullmatch(r"CUDA: runtime \d+\.\d+, (driver \d+\.\d+|no driver); .+", lines[4])
