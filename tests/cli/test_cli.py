"""The ``trt-kv`` command: build, generate on each CPU backend, a clear no-GPU error."""

import json
import re

import pytest

from tests.support.cli_user import run_json
from tests.support.cli_user import tiny_model as tiny_model  # the fixture
from trt_kv.cli import main
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason


def test_build_prints_a_summary_table(tmp_path, capsys):
    assert main(["build", "--no-model", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "engine" in out and "alias pairs" in out and "kv_cache_doc_example.engine" in out
    assert (tmp_path / "kv_cache_doc_example.engine.json").is_file()


def test_build_a_checkpoint_folder(tiny_model, tmp_path, capsys):
    assert (
        main(
            [
                "build",
                "--model",
                str(tiny_model),
                "--out",
                str(tmp_path),
                "--max-seq-len",
                "32",
                "--max-batch",
                "2",
                "--max-step-tokens",
                "8",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert re.search(rf"{tiny_model.name}-[0-9a-f]{{8}}-float16-s32-b2-t8-k1\.engine", out), out


def test_generate_json_lists_generated_ids_per_prompt(tiny_model, capsys):
    out = run_json(
        capsys,
        "--model",
        str(tiny_model),
        "--prompt-ids",
        "1,2,3;4,5",
        "--max-new-tokens",
        "5",
        "--backend",
        "reference",
    )
    assert out["backend"] == "reference"
    assert [len(ids) for ids in out["ids"]] == [5, 5]
    assert out["prefill"] == {"tokens": 5, "ms": out["prefill"]["ms"]}
    assert (out["decode"]["tokens"], out["decode"]["steps"]) == (8, 4)


def test_top_p_zero_samples_the_greedy_ids(tiny_model, capsys):
    """top_p 0 keeps only the most likely token (Hugging Face's rule), whatever the seed."""
    args = ["--model", str(tiny_model), "--prompt-ids", "1,2,3;4,5", "--max-new-tokens", "6"]
    args += ["--backend", "reference"]
    greedy = run_json(capsys, *args)["ids"]
    sampled = run_json(capsys, *args, "--temperature", "1.3", "--top-p", "0", "--seed", "9")
    free = run_json(capsys, *args, "--temperature", "1.3", "--seed", "9")
    assert sampled["ids"] == greedy != free["ids"]


def test_interpreter_and_reference_generate_the_same_ids(tiny_model, capsys):
    args = [
        "--model",
        str(tiny_model),
        "--prompt-ids",
        "1,2,3;4,5",
        "--max-new-tokens",
        "6",
        "--dtype",
        "float32",
        "--max-seq-len",
        "32",
    ]
    ref = run_json(capsys, *args, "--backend", "reference")
    got = run_json(capsys, *args, "--backend", "interpreter")
    assert got["backend"] == "interpreter" and got["ids"] == ref["ids"]


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU")
@pytest.mark.parametrize("backend", ["tensorrt", "polygraphy"])
def test_gpu_backend_without_gpu_says_so_and_names_cpu_backends(backend, capsys):
    assert main(["generate", "--backend", backend]) == 2
    err = capsys.readouterr().err
    assert f"--backend {backend}: expected a CUDA GPU" in err
    assert "reference, interpreter" in err


def test_bad_prompt_ids_are_a_clear_error(capsys):
    assert main(["generate", "--prompt-ids", "1,x"]) == 2
    assert "--prompt-ids: expected '1,2,3;4,5', got '1,x'" in capsys.readouterr().err


def test_text_prompt_needs_a_tokenizer(tiny_model, capsys):
    assert main(["generate", "--model", str(tiny_model), "--prompt", "hello"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err


def test_text_prompt_is_tokenized_and_the_output_decoded(tiny_model, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(97)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tiny_model / "tokenizer.json"))
    args = ["--model", str(tiny_model), "--prompt", "w5 w17 w42", "--max-new-tokens", "4"]
    try:
        out = run_json(capsys, *args, "--backend", "reference")
        assert main(["generate", *args, "--backend", "reference"]) == 0
        streamed = capsys.readouterr().out
    finally:
        (tiny_model / "tokenizer.json").unlink()
    [ids] = out["ids"]
    assert len(ids) == 4
    assert out["text"] == [" ".join(f"w{i}" for i in ids)]
    assert streamed == out["text"][0] + "\n"  # streamed piece by piece: "w5", " w17", ...


def test_generation_stops_at_the_folders_eos_unless_ignore_eos(tiny_model, capsys):
    args = ["--model", str(tiny_model), "--prompt-ids", "1,2,3", "--max-new-tokens", "6"]
    free = run_json(capsys, *args, "--backend", "reference")["ids"][0]
    stop = free[2] if free[2] not in free[:2] else free[0]
    (tiny_model / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop]}))
    try:
        stopped = run_json(capsys, *args, "--backend", "reference")["ids"][0]
        ignored = run_json(capsys, *args, "--backend", "reference", "--ignore-eos")["ids"][0]
    finally:
        (tiny_model / "generation_config.json").unlink()
    assert stopped == free[: free.index(stop) + 1]
    assert ignored == free


def test_chat_without_a_prompt_is_a_one_line_error(capsys):
    assert main(["generate", "--chat"]) == 2
    assert (
        capsys.readouterr().err
        == "trt-kv: error: --chat: expected --prompt TEXT as well, got none\n"
    )


def test_demo_json_keeps_stdout_to_the_json_lines(tiny_model, tmp_path, capsys):
    """The table and the notes go to stderr with --json, so ``| jq`` reads stdout whole."""
    argv = ["demo", "--model", str(tiny_model), "--out", str(tmp_path), "--json", "-q"]
    argv += ["--max-seq-len", "32", "--prompt-ids", "1,2;3", "--max-new-tokens", "2"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    (line,) = captured.out.splitlines()
    assert len(json.loads(line)["ids"]) == 2
    assert "kv_cache_doc_example.engine" in captured.err
