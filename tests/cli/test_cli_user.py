"""``trt-kv`` driven as a user drives it: ``python -m trt_kv`` in a subprocess."""

import json
import re

import pytest

from tests.support.cli_user import run_cli, run_in_terminal, write_tiny_model
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason

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
    flat = " ".join(out.split())  # argparse wraps help text at the terminal's width
    assert "S_max of every cache (default: 512, or a GPT-2's n_positions when smaller)" in flat
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

    from tests.support.cli_user import user_env

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=user_env(), check=True
    )
    assert out.stdout.strip() == "[]"


def test_help_imports_no_subcommand_module_numpy_tensorrt_or_tqdm():
    # what `trt-kv --help` loads: trt_kv.cli only, no argparse (issue 15: --help <= 60 ms)
    code = (
        "import sys\nfrom trt_kv.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        "heavy = ('numpy', 'tensorrt', 'tensorrt_rtx', 'tqdm', 'polygraphy', 'cuda')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy "
        "or m.startswith(('trt_kv.cli.', 'trt_kv.runtime'))), file=sys.stderr)"
    )
    import subprocess
    import sys

    from tests.support.cli_user import user_env

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=user_env(), check=True
    )
    assert out.stdout.startswith("usage: trt-kv")
    assert out.stderr.strip() == "[]"


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
        # two prompts (3 + 5 ids) x 8 new tokens: the first of each from the prefill
        assert "interpreter: prefill 8 tokens, " in out
        assert "; decode 14 tokens in 7 steps, " in out


@pytest.fixture(scope="module")
def tiny_gguf(tiny):
    """The tiny checkpoint as llama.cpp writes it: ``(path, number of tensors)``."""
    import transformers
    from safetensors.numpy import load_file

    from tests.support.gguf_files import llama_gguf_tensors, llama_metadata, write_gguf

    config = transformers.LlamaConfig(**json.loads((tiny / "config.json").read_text()))
    tensors = llama_gguf_tensors(load_file(str(tiny / "model.safetensors")), config)
    path = write_gguf(tiny.parent / "tiny.gguf", "llama", llama_metadata(config), tensors)
    return path, len(tensors)


def test_a_terminal_shows_the_gguf_dequantize_progress(tiny_gguf):
    path, count = tiny_gguf
    argv = ("generate", "--model", path, "--backend", "interpreter", "--max-seq-len", "32")
    code, screen = run_in_terminal(*argv)
    assert code == 0, screen
    assert re.search(rf"dequantize tiny\.gguf: +\d+%\|.*\| \d+/{count} \[.*tensor/s\]", screen)
    code, quiet = run_in_terminal(*argv, "--quiet")
    assert code == 0, quiet
    piped = run_cli(*argv)
    for out in (quiet, piped.stdout + piped.stderr):
        assert "dequantize" not in out and "%|" not in out


def test_a_terminal_shows_the_tensorrt_build_phases(tiny, tmp_path):
    code, screen = run_in_terminal(
        "build", "--model", tiny, "--out", tmp_path, "--max-seq-len", "32"
    )
    assert code == 0, screen
    assert re.search(r"TensorRT build: +\d+%\|.*\| \d/\d phases \[.*, Building engine", screen)


def test_engines_of_other_shapes_never_overwrite_each_other(tiny, tmp_path):
    for s_max in ("32", "48"):
        run_cli("build", "--model", tiny, "--out", tmp_path, "--max-seq-len", s_max, "-q")
    names = sorted(re.sub("-[0-9a-f]{8}-", "-", p.name) for p in tmp_path.glob("tiny*.engine"))
    assert names == ["tiny-float16-s32-b8-t32-k1.engine", "tiny-float16-s48-b8-t48-k1.engine"]


def test_demo_reuses_an_engine_and_says_when_and_how_long_it_took_to_build(tiny, tmp_path):
    args = ("demo", "--model", tiny, "--out", tmp_path, "--max-seq-len", "32", "-q")
    first = run_cli(*args).stdout
    name = r"tiny-[0-9a-f]{8}-float16-s32-b8-t32-k1\.engine"
    assert re.search(rf"{name} .* built now", first), first
    built_s = re.search(rf"{name} .* (\d+\.\d\d) +built now", first)[1]
    second = run_cli(*args).stdout
    when = r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    pattern = rf"{name} .* reused \(built {when} in (\d+\.\d\d) s\)"
    reused = re.search(pattern, second)
    assert reused, second
    assert reused[1] == built_s  # the first build's time, not the lookup's


def test_demo_says_built_or_reused_reuses_the_doc_example_and_notes_on_stderr(tiny, tmp_path):
    args = ("demo", "--model", tiny, "--out", tmp_path, "--max-seq-len", "32", "-q")
    first = run_cli(*args)
    assert f"engines in {tmp_path} (" in first.stdout and "): 2 built now\n" in first.stdout
    doc = tmp_path / "kv_cache_doc_example.engine"
    stamp = doc.stat().st_mtime_ns
    second = run_cli(*args)
    assert "): 2 reused\n" in second.stdout
    assert re.search(r"kv_cache_doc_example\.engine .* reused \(built ", second.stdout)
    assert doc.stat().st_mtime_ns == stamp  # not written again
    for out in (first, second):
        notes = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
        assert len(notes) == 1 and "note: " not in out.stdout
        if gpu_unavailable_reason() is not None:
            assert notes[0].startswith("note: no GPU here (")
    (tmp_path / "kv_cache_doc_example.engine.json").write_text("{}")  # a broken sidecar
    assert "): 1 built now, 1 reused\n" in run_cli(*args).stdout


def test_generate_reports_prefill_and_decode_apart_in_text_and_json(tiny):
    args = (*generate_args(tiny), "--prompt-ids", "1,2,3;4,5", "--max-new-tokens", "5", "-q")
    out = run_cli(*args, "--ignore-eos")
    assert [line[:4] for line in out.stdout.splitlines()] == ["[0] ", "[1] "]  # the ids only
    line = out.stderr.splitlines()[-1]  # the speed line: stderr, stdout holds the ids only
    pattern = (
        r"interpreter: prefill 5 tokens, (\d+\.\d) ms; decode 8 tokens in 4 steps, "
        r"(\d+\.\d\d) ms/step, (\d+\.\d) tokens/s"
    )
    found = re.fullmatch(pattern, line)
    assert found, line
    ms_per_step, rate = float(found[2]), float(found[3])
    assert rate == pytest.approx(8 / (4 * ms_per_step / 1e3), rel=0.02)
    out = json.loads(run_cli(*args, "--ignore-eos", "--json").stdout)
    assert "tokens_per_s" not in out  # no figure mixing prefill with decode
    assert out["prefill"]["tokens"] == 5 and out["prefill"]["ms"] > 0
    decode = out["decode"]
    assert (decode["tokens"], decode["steps"]) == (8, 4)
    assert decode["tokens_per_s"] == pytest.approx(8e3 / (4 * decode["ms_per_step"]), rel=1e-3)


def test_one_new_token_is_a_prefill_without_decode_steps(tiny):
    args = (*generate_args(tiny), "--prompt-ids", "1,2,3", "--max-new-tokens", "1", "-q")
    out = json.loads(run_cli(*args, "--json").stdout)
    assert len(out["ids"][0]) == 1
    assert out["decode"] == {"tokens": 0, "steps": 0, "ms_per_step": None, "tokens_per_s": None}
    line = run_cli(*args).stderr.splitlines()[-1]
    assert line.endswith("; no decode step (every sequence stopped at its first token)"), line
