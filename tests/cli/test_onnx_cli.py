"""``--model decoder.onnx`` (an exported tiny Llama, growing cache) wherever ``--model``
works: generate (interpreter, emulated TensorRT from an engine built by another process),
build (the rewritten graph next to the engine), inspect (what was rewritten), chat and bench;
the reference backend refuses it by name. Ids are onnxruntime's on the original graph."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.cli_user import run_cli, write_tiny_tokenizer
from tests.support.onnx_decoders import tiny_model
from tests.support.onnx_models import PROMPTS, export, ort_greedy

N = 12
SIZES = ("--max-seq-len", "64", "--max-batch", "3")
IDS = ";".join(",".join(map(str, p)) for p in PROMPTS)


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    """(the exported .onnx beside a word-level tokenizer, onnxruntime's greedy ids)."""
    folder = tmp_path_factory.mktemp("onnx_cli")
    path = export(tiny_model("llama"), folder / "tiny-llama.onnx")
    write_tiny_tokenizer(folder)
    return path, [ort_greedy(path, p, N) for p in PROMPTS]


def generated(out) -> list[list[int]]:
    """The ids lines ``[i] [a, b, ...]`` of ``generate --prompt-ids``."""
    return [json.loads(ids) for ids in re.findall(r"^\[\d+\] (\[[\d, ]*\])", out.stdout, re.M)]


def test_generate_on_the_interpreter_equals_onnxruntime(onnx_model):
    path, want = onnx_model
    argv = ("--backend", "interpreter", "--prompt-ids", IDS, "--max-new-tokens", N, "--ignore-eos")
    out = run_cli("generate", "--model", path, *SIZES, *argv)
    assert generated(out) == want


def test_built_engine_runs_on_the_emulated_gpu_in_another_process(onnx_model, tmp_path):
    path, want = onnx_model
    run_cli("build", "--model", path, *SIZES, "--out", tmp_path)
    engines = sorted(tmp_path.glob("tiny-llama-*.engine"))
    assert len(engines) == 1
    assert engines[0].with_name(engines[0].name + ".trt_kv.onnx").is_file()
    argv = ("--prompt-ids", IDS, "--max-new-tokens", N, "--ignore-eos", "--emulate-gpu")
    out = run_cli(
        "generate", "--model", path, *SIZES, "--out", tmp_path, "--backend", "tensorrt", *argv
    )
    assert "reused" in out.stderr
    assert generated(out) == want
    shown = run_cli("inspect", engines[0]).stdout
    line = next(ln for ln in shown.splitlines() if ln.startswith("onnx rewrite"))
    assert "4 caches (layers 0, 1) -> TensorScatter, S_max 64" in line
    assert "removed inputs ['attention_mask']" in line


def test_an_engine_runs_with_a_renamed_copy_of_its_file(onnx_model, tmp_path):
    """The model is the file's bytes (sha256), not its name or folder: an engine built from
    one file is taken with a renamed copy of it elsewhere, on the emulated GPU."""
    path, want = onnx_model
    run_cli("build", "--model", path, *SIZES, "--out", tmp_path / "engines")
    (engine,) = (tmp_path / "engines").glob("tiny-llama-*.engine")
    copy = tmp_path / "copy" / "renamed.onnx"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    argv = ("--prompt-ids", IDS, "--max-new-tokens", N, "--ignore-eos", "--emulate-gpu")
    out = run_cli("generate", "--model", copy, "--engine", engine, "--backend", "tensorrt", *argv)
    assert generated(out) == want


def test_text_in_and_out_with_the_tokenizer_beside_the_file(onnx_model):
    path, want = onnx_model
    words = " ".join(f"w{i}" for i in PROMPTS[0])
    argv = ("--backend", "interpreter", "--prompt", words, "--max-new-tokens", N, "--ignore-eos")
    out = run_cli("generate", "--model", path, *SIZES, *argv, "--no-chat", "-q")
    assert out.stdout.split() == [f"w{i}" for i in want[0]]


def test_chat_and_bench_take_an_onnx_model(onnx_model):
    path, _ = onnx_model
    chat = run_cli(
        "chat",
        "--model",
        path,
        *SIZES,
        "--backend",
        "interpreter",
        "--max-new-tokens",
        "3",
        "--ignore-eos",
        "-q",
        stdin="w5 w6\n",
    )
    assert len(chat.stdout.split()) == 3
    bench = run_cli(
        "bench",
        "--model",
        path,
        "--backend",
        "interpreter",
        "--batch",
        "1",
        "--context",
        "4",
        "--decode-steps",
        "2",
        "--repeats",
        "1",
        "--json",
    )
    assert json.loads(bench.stdout)["model"] == "tiny-llama"


def test_reference_backend_refuses_an_onnx_model(onnx_model, tmp_path):
    path, _ = onnx_model
    out = run_cli(
        "generate", "--model", path, "--backend", "reference", "--prompt-ids", "5", check=False
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "trt-kv: error: --backend reference: expected a model of trt_kv's own architectures "
        "(llama, gpt2), got an ONNX graph (use --backend interpreter, or a GPU backend)"
    )


def test_tokenizer_folder_without_tokenizer_json_is_refused(onnx_model, tmp_path):
    path, _ = onnx_model
    out = run_cli(
        "generate", "--model", path, "--tokenizer", tmp_path, "--prompt", "w5", check=False
    )
    assert out.returncode == 2
    assert f"--tokenizer: expected a folder with tokenizer.json, got {tmp_path}" in out.stderr
