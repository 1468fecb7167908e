"""Every mistake a user can make on the ``trt-kv`` command line: one line
``trt-kv: error: ...`` on stderr, exit status 2, no traceback, nothing built."""

import subprocess
import sys

import pytest

from tests.support.cli_user import run_cli
from tests.support.cli_user import tiny_model as tiny_model  # the fixture
from trt_kv.cli import main
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason
from trt_kv.runtime.host_memory import available_host_bytes

TEMPERATURE = "argument --temperature: expected 0 (greedy) or a number in [0.001, 1000], got "
PENALTY = "argument --repetition-penalty: expected a finite number in [0.001, 1000.0], got "


def error_of(capsys, *argv):
    """Run ``trt-kv ARGV`` in this process; the one stderr line it must print (exit 2)."""
    try:
        code = main(list(map(str, argv)))
    except SystemExit as e:  # argparse's own refusals exit
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trt-kv: error: "), err
    return lines[0].removeprefix("trt-kv: error: ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--max-seq-len", "-3"],
            "argument --max-seq-len: expected an integer in [1, 2147483647], got -3",
        ),
        (
            ["--max-seq-len", "3000000000"],  # write indices are int32
            "argument --max-seq-len: expected an integer in [1, 2147483647], got 3000000000",
        ),
        (["--max-batch", "0"], "argument --max-batch: expected an integer >= 1, got 0"),
        (
            ["--max-step-tokens", "x"],
            "argument --max-step-tokens: expected an integer >= 1, got 'x'",
        ),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: expected an integer >= 1, got 0"),
        (
            ["--temperature", "nan"],
            TEMPERATURE + "nan",
        ),
        (
            ["--temperature", "-1"],
            TEMPERATURE + "-1",
        ),
        (["--temperature", "1e-320"], TEMPERATURE + "1e-320"),  # was a NaN traceback
        (["--top-k", "0"], "argument --top-k: expected an integer >= 1, got 0"),
        (["--top-p", "1.5"], "argument --top-p: expected a finite number in [0.0, 1.0], got 1.5"),
        (
            ["--top-k", "5"],
            "--top-k: expected --temperature > 0 (greedy decoding ignores it), got 0",
        ),
        (
            ["--top-p", "0.9"],
            "--top-p: expected --temperature > 0 (greedy decoding ignores it), got 0",
        ),
        (["--seed", "-1"], "argument --seed: expected an integer >= 0, got -1"),
        (["--repetition-penalty", "1e-300", "--temperature", "1"], PENALTY + "1e-300"),  # NaN
        (["--repetition-penalty", "1001"], PENALTY + "1001"),
        (["--backend", "cuda"], "argument --backend: invalid choice: 'cuda'"),
    ],
)
def test_out_of_range_options_are_refused_by_name(capsys, argv, message):
    assert error_of(capsys, "generate", *argv).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,,2", "--prompt-ids: expected '1,2,3;4,5' (no empty item at prompt 0), got '1,,2'"),
        ("1,2;", "--prompt-ids: expected '1,2,3;4,5' (a non-empty prompt at prompt 1), got '1,2;'"),
        ("", "--prompt-ids: expected '1,2,3;4,5' (a non-empty prompt at prompt 0), got ''"),
        ("1,x", "--prompt-ids: expected '1,2,3;4,5', got '1,x'"),
        ("1,2.5", "--prompt-ids: expected '1,2,3;4,5', got '1,2.5'"),
        ("3,-1", "--prompt-ids: expected token ids >= 0, got -1"),
    ],
)
def test_malformed_prompt_ids_are_refused_not_skipped(capsys, text, message):
    assert error_of(capsys, "generate", "--prompt-ids", text) == message


def test_out_of_vocabulary_ids_name_the_option_and_the_vocabulary(capsys, tiny_model):
    message = error_of(capsys, "generate", "--model", tiny_model, "--prompt-ids", "1,2;3,97")
    assert message == "--prompt-ids: expected token ids in [0, 97), got 97"


def test_a_missing_model_folder_is_refused(capsys, tmp_path):
    message = error_of(capsys, "generate", "--model", tmp_path / "nope")
    nope = tmp_path / "nope"
    assert message == (
        f"--model: expected 'default', a model folder, a .gguf or an .onnx file, got {nope} "
        "(no such folder or file)"
    )
    assert error_of(capsys, "build", "--model", tmp_path / "nope").startswith("--model: expected")


def test_out_under_a_file_is_refused_before_building(capsys, tmp_path):
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" / "engines"
    message = error_of(capsys, "build", "--no-model", "--out", out)
    assert message == f"--out: expected a folder, got {out} ({tmp_path / 'a_file'} is a file)"
    assert not out.exists()


@pytest.mark.skipif(available_host_bytes() is None, reason="no MemAvailable (not Linux)")
def test_cache_whose_rope_tables_exceed_host_memory_is_refused_before_building(
    capsys, tmp_path, tiny_model
):
    out = tmp_path / "engines"
    message = error_of(
        capsys, "build", "--model", tiny_model, "--max-seq-len", 2**31 - 1, "--out", out
    )
    assert message.startswith("--max-seq-len: expected an S_max whose RoPE tables fit host memory")
    assert message.endswith("got 2147483647 (tables [S_max, H] of 256.0 GiB)"), message
    assert not out.exists()


def test_runtime_cache_on_a_cpu_backend_is_refused(capsys, tmp_path):
    argv = ["--backend", "interpreter", "--runtime-cache", tmp_path / "k.rtxcache"]
    message = error_of(capsys, "generate", *argv)
    assert message == "--runtime-cache: expected --backend tensorrt, got interpreter"


def test_step_wider_than_the_cache_is_refused(capsys):
    message = error_of(capsys, "build", "--max-seq-len", "16", "--max-step-tokens", "32")
    assert message == "--max-step-tokens: expected <= --max-seq-len = 16, got 32"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--backend", "interpreter", "--cuda-graph"],
            "--cuda-graph: expected --backend tensorrt, got interpreter",
        ),
        (
            ["--backend", "reference", "--cuda-graph"],
            "--cuda-graph: expected --backend tensorrt, got reference",
        ),
        (
            ["--backend", "polygraphy", "--cuda-graph"],
            "--cuda-graph: expected --backend tensorrt, got polygraphy",
        ),
        (
            ["--backend", "interpreter", "--engine", "e.engine"],
            "--engine: expected --backend tensorrt or polygraphy, got interpreter",
        ),
        (
            ["--backend", "reference", "--engine", "e.engine"],
            "--engine: expected --backend tensorrt or polygraphy, got reference",
        ),
        (
            ["--backend", "reference", "--device-top-k", "2"],
            "--device-top-k: expected --backend interpreter or tensorrt or polygraphy, got "
            "reference",
        ),
        (
            ["--backend", "reference", "--weights", "int8"],
            "--weights: expected --backend interpreter or tensorrt or polygraphy, got reference",
        ),
        (
            ["--backend", "interpreter", "--compute-capability", "8.9"],
            "--compute-capability: expected --backend tensorrt or polygraphy, got interpreter",
        ),
        (
            ["--backend", "reference", "--compute-capability", "8.9"],
            "--compute-capability: expected --backend tensorrt or polygraphy, got reference",
        ),
        (
            ["--backend", "reference", "--dtype", "float16"],
            "--dtype: expected float32 or none with --backend reference (it computes in "
            "float32), got float16",
        ),
        (
            ["--backend", "reference", "--dtype", "bfloat16"],
            "--dtype: expected float32 or none with --backend reference (it computes in "
            "float32), got bfloat16",
        ),
    ],
)
def test_options_the_backend_would_ignore_are_refused(capsys, argv, message):
    assert error_of(capsys, "generate", *argv) == message


@pytest.mark.parametrize("backend", ["reference", "interpreter"])
def test_max_batch_is_the_capacity_on_cpu_backends_too(tiny_model, backend):
    from trt_kv.cli import backends, make_parser
    from trt_kv.models.loading import load_model

    args = make_parser().parse_args(
        ["generate", "--model", str(tiny_model), "--backend", backend, "--max-batch", "3"]
    )
    model = load_model(str(tiny_model))
    made = backends.make_backend(args, model.name, model.config, model.weights, 1)
    assert made.storage.capacity == 3


def test_bench_refuses_cuda_graph_on_a_cpu_backend_and_zero_sizes(capsys):
    assert error_of(capsys, "bench", "--backend", "interpreter", "--cuda-graph") == (
        "--cuda-graph: expected --backend tensorrt, got interpreter"
    )
    assert error_of(capsys, "bench", "--batch", "1", "0").startswith(
        "argument --batch: expected an integer >= 1, got 0"
    )


def test_prompt_and_prompt_ids_together_are_refused(capsys, tiny_model):
    message = error_of(
        capsys, "generate", "--model", tiny_model, "--prompt", "hi", "--prompt-ids", "1"
    )
    assert message == "--prompt: expected --prompt or --prompt-ids, got both"


def test_a_malformed_tokenizer_is_a_config_error_with_its_cause(capsys, tiny_model):
    (tiny_model / "tokenizer.json").write_text("{not json")
    try:
        message = error_of(capsys, "generate", "--model", tiny_model, "--prompt", "hi")
    finally:
        (tiny_model / "tokenizer.json").unlink()
    assert message.startswith(f"{tiny_model / 'tokenizer.json'}: expected a tokenizer.json, got ")


def test_a_user_sees_one_line_and_no_traceback(tmp_path):
    out = run_cli("generate", "--temperature", "nan", check=False)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == f"trt-kv: error: {TEMPERATURE}nan\n"
    out = run_cli("generate", "--model", tmp_path / "missing", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("trt-kv: error: --model: ")


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU")
def test_demo_without_a_gpu_refuses_gpu_only_options_before_building(capsys, tmp_path):
    message = error_of(capsys, "demo", "--cuda-graph", "--out", tmp_path)
    assert message == (
        "--cuda-graph: expected --backend tensorrt, got interpreter (auto's pick: no GPU)"
    )
    assert not any(tmp_path.iterdir())


def test_a_prompt_longer_than_the_cache_names_max_seq_len(capsys):
    """Not --max-step-tokens: its default is derived from --max-seq-len."""
    long = ",".join(["1"] * 10)
    message = error_of(capsys, "generate", "--prompt-ids", long, "--max-seq-len", "4")
    assert message == (
        "--prompt-ids: expected longest prompt + --max-new-tokens - 1 <= --max-seq-len = 4, got 10"
    )


def test_prompts_that_cannot_fit_are_refused_before_loading(capsys):
    message = error_of(
        capsys, "generate", "--prompt-ids", "1,2,3", "--max-seq-len", "8", "--max-new-tokens", "7"
    )
    assert message == (
        "--prompt-ids: expected longest prompt + --max-new-tokens - 1 <= --max-seq-len = 8, got 9"
    )


def test_bench_sizes_that_cannot_fit_are_refused_before_loading(capsys):
    message = error_of(capsys, "bench", "--context", "128", "--max-seq-len", "130")
    assert message == (
        "--max-seq-len: expected at least the largest --context + --decode-steps = 144, got 130"
    )
    message = error_of(capsys, "bench", "--context", "128", "256", "--max-step-tokens", "145")
    assert message == (
        "--max-step-tokens: expected <= the smallest --context + --decode-steps = 144, got 145"
    )


def test_a_build_tensorrt_refuses_names_its_error_and_keeps_stdout_clean(tiny_model, tmp_path):
    # B = 10**8 makes the prefill profile's tensors exceed TensorRT's volume limit (without
    # the device top-k, whose next_token TensorRT-RTX 1.7 refuses first at that size: "i32
    # vs. expected type:i64", another TensorRT error of the same path)
    argv = ("build", "--model", tiny_model, "--out", tmp_path, "--max-batch", 10**8)
    argv = (*argv, "--device-top-k", 0, "-q")
    out = run_cli(*argv, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "[TRT]" not in out.stdout  # TensorRT's log goes to stderr, beside our error line
    last = out.stderr.splitlines()[-1]
    assert last.startswith(
        "trt-kv: error: network: expected an engine from build_serialized_network, got None "
        "(IBuilder::buildSerializedNetwork: Error Code 4"
    )
    assert "[TRT] [E] IBuilder::buildSerializedNetwork: Error Code 4" in out.stderr


def test_build_with_a_bad_checkpoint_writes_nothing(capsys, tiny_model, tmp_path):
    """The model is read and its engine built before the doc example is written."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    out = tmp_path / "engines"
    message = error_of(capsys, "build", "--model", broken, "--out", out, "-q")
    assert message.startswith(f"{weights}: expected a safetensors file, got ")
    assert not out.exists()


@pytest.mark.parametrize("command", ["generate", "--help", "--version"])
def test_a_reader_that_left_the_pipe_gets_no_traceback(tiny_model, command):
    """``trt-kv generate --json | head -c 0`` (and the top-level ``--help``, printed from a
    stored text, and ``--version``, printed while the arguments are parsed): stdout's reader
    is gone before anything is written; Python's documented recipe applies (exit 1, stderr
    quiet)."""
    import os

    from tests.support.cli_user import user_env

    read, write = os.pipe()
    os.close(read)  # the reader left: every write to stdout fails with EPIPE
    try:
        argv = {
            "generate": ["generate", "--model", str(tiny_model), "--prompt-ids", "1,2", "--json"],
            "--help": ["--help"],
            "--version": ["--version"],
        }[command]
        out = subprocess.run(
            [sys.executable, "-m", "trt_kv", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=user_env(),
            check=False,
        )
    finally:
        os.close(write)
    assert (out.returncode, out.stderr) == (1, "")


def _program_in_child(
    blocked: str | None, argv: list[str], **env: str
) -> subprocess.CompletedProcess[str]:
    """``trt-kv ARGV`` in a child Python where the module ``blocked``, if any, does not import
    (``sys.modules[blocked] = None`` makes every import of it fail as a missing one does)."""
    from tests.support.cli_user import user_env

    block = f"sys.modules[{blocked!r}] = None; " if blocked else ""
    child = (
        f"import sys; {block}from trt_kv.cli import program; "
        f"sys.argv = ['trt-kv', *{argv!r}]; program()"
    )
    return subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        env=user_env(**env),
        check=False,
    )


def test_a_broken_install_raising_its_own_import_error_is_one_line(tiny_model, tmp_path):
    """A package whose own ``__init__`` raises ImportError (no module name on it, as NumPy's
    broken-install error): named from where it was raised; the first line of its message."""
    from tests.support.cli_user import ROOT

    fake = tmp_path / "site" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("broken install\\nsecond line")\n')
    argv = ["generate", "--model", str(tiny_model), "--prompt-ids", "1"]
    out = _program_in_child(None, argv, PYTHONPATH=f"{fake.parent}:{ROOT}")
    assert (out.returncode, out.stdout) == (1, ""), out.stderr
    assert out.stderr == (
        "trt-kv: error: the Python package 'numpy' did not import (broken install); "
        "reinstall trt_kv with its requirements (pip install -e . in a checkout)\n"
    )


def test_a_dependency_that_does_not_import_while_parsing_is_one_line():
    """``--version`` imports TensorRT as the arguments are parsed."""
    out = _program_in_child("numpy", ["--version"])
    assert (out.returncode, out.stdout) == (1, ""), out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("trt-kv: error: the Python package ")


def test_an_import_error_inside_trt_kv_keeps_its_traceback(tiny_model):
    """trt_kv's own modules failing to import is a bug to report, not an environment to fix:
    the ImportError propagates with its traceback."""
    argv = ["generate", "--model", str(tiny_model), "--prompt-ids", "1"]
    out = _program_in_child("trt_kv.runtime.session", argv)
    assert out.returncode == 1 and out.stdout == ""
    assert "Traceback" in out.stderr and "trt_kv.runtime.session" in out.stderr
    assert "did not import" not in out.stderr


def test_a_dependency_that_does_not_import_is_one_line_naming_it(tiny_model):
    """A broken environment (here NumPy blocked with ``sys.modules['numpy'] = None``, which
    makes every import of it fail as a missing module does): exit 1, one line naming the
    package, no traceback."""
    out = _program_in_child("numpy", ["generate", "--model", str(tiny_model), "--prompt-ids", "1"])
    assert (out.returncode, out.stdout) == (1, ""), out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("trt-kv: error: the Python package 'numpy' did not import (")


@pytest.mark.parametrize(
    ("command", "flags", "named"),
    [
        (
            "generate",
            ["--backend", "tensorrt", "--emulate-gpu", "--engine", "{tmp}/none.engine"],
            "--engine: ",
        ),
        (
            "chat",
            ["--backend", "tensorrt", "--emulate-gpu", "--engine", "{tmp}/none.engine"],
            "--engine: ",
        ),
        ("generate", ["--prompt-file", "{tmp}/none.txt"], "--prompt-file: "),
        ("chat", ["--top-k", "3"], "--top-k: "),
        ("generate", ["--repetition-penalty", "0"], "argument --repetition-penalty: "),
    ],
)
def test_arguments_judged_without_the_model_are_refused_before_it_loads(
    tmp_path, capsys, command, flags, named
):
    """The model folder's config.json is no JSON: loading it would fail with another error,
    so the option's own error proves it was judged first."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    argv = [command, "--model", broken, *(f.format(tmp=tmp_path) for f in flags)]
    assert error_of(capsys, *argv).startswith(named)
    assert "config.json" in error_of(capsys, command, "--model", broken)  # what loading says


def test_demo_takes_the_build_options_whatever_backend_runs(capsys):
    """demo builds the engine on every machine, so the build's options are read even where
    the interpreter then runs (no GPU here): the first refusal is the prompt's, after them."""
    argv = ["demo", "--compute-capability", "8.9", "--weights", "int8", "--device-top-k", "2"]
    argv += ["--prompt-ids", "1,2,3", "--max-seq-len", "4", "--max-new-tokens", "10"]
    assert error_of(capsys, *argv) == (
        "--prompt-ids: expected longest prompt + --max-new-tokens - 1 <= --max-seq-len = 4, got 12"
    )
