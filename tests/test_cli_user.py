"""``trt-kv`` driven as a user drives it: ``python -m trt_kv`` in a subprocess."""

import re

import pytest
from cli_user import run_cli, run_in_terminal, write_tiny_model

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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def generate_args(tiny):
    """Two prompts x 8 new tokens (the defaults): 16 tokens in all."""
    return ("generate", "--model", tiny, "--backend", "interpreter", "--max-seq-len", "32")


def test_a_terminal_shows_progress_bars_with_live_tokens_per_second(tiny):
    code, screen = run_in_terminal(*generate_args(tiny))
    assert code == 0, screen
    assert "load model.safetensors:" in screen
    # tqdm draws at start, then at most every 0.1 s: a tiny model shows the first frames
    assert re.search(r"network: +\d+%\|.*\| \d/2 \[.*layer/s\]", screen), screen
    assert re.search(r"generate: +\d+%\|.*\| \d+/16 \[.*tok/s\]", screen), screen
    assert "interpreter: " in screen  # the result line still follows


def test_quiet_or_not_a_terminal_shows_no_progress_bar(tiny):
    code, screen = run_in_terminal(*generate_args(tiny), "--quiet")
    assert code == 0, screen
    piped = run_cli(*generate_args(tiny))
    for out in (screen, piped.stdout + piped.stderr):
        assert "%|" not in out and "tok/s" not in out and "network:" not in out
        assert "interpreter: 8 steps" in out  # two prompts, 8 new tokens each


def test_a_terminal_shows_the_tensorrt_build_phases(tiny, tmp_path):
    code, screen = run_in_terminal(
        "build", "--model", tiny, "--out", tmp_path, "--max-seq-len", "32"
    )
    assert code == 0, screen
    assert re.search(r"TensorRT build: +\d+%\|.*\| \d/\d phases \[.*, Building engine", screen)


def test_engines_of_other_shapes_never_overwrite_each_other(tiny, tmp_path):
    for s_max in ("32", "48"):
        run_cli("build", "--model", tiny, "--out", tmp_path, "--max-seq-len", s_max, "-q")
    names = sorted(p.name for p in tmp_path.glob("tiny*.engine"))
    assert names == ["tiny-float16-s32-b8-t32.engine", "tiny-float16-s48-b8-t48.engine"]


def test_demo_reuses_an_engine_and_says_when_and_how_long_it_took_to_build(tiny, tmp_path):
    args = ("demo", "--model", tiny, "--out", tmp_path, "--max-seq-len", "32", "-q")
    first = run_cli(*args).stdout
    assert re.search(r"tiny-float16-s32-b8-t32\.engine .* built now", first), first
    built_s = re.search(r"tiny-float16-s32-b8-t32\.engine .* (\d+\.\d\d) +built now", first)[1]
    second = run_cli(*args).stdout
    pattern = r"reused \(built 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ in (\d+\.\d\d) s\)"
    reused = re.search(pattern, second)
    assert reused, second
    assert reused[1] == built_s  # the first build's time, not the lookup's
