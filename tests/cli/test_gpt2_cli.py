"""``trt-kv build|generate|bench --model GPT2_FOLDER`` as a user runs them, and
``trt-kv generate --engine FILE --prompt-ids ...`` with no ``--model`` (the sidecar's roles)."""

import json

import pytest

from tests.support.cli_user import run_cli
from tests.support.gpt2_models import PROMPTS, SIZES_ONLY, hf_greedy, save_gpt2, save_tokenizer

SIZES = ("--max-seq-len", "32", "--max-step-tokens", "8", "--dtype", "float32")
IDS = ";".join(",".join(map(str, p)) for p in PROMPTS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    return folder, save_gpt2(folder)


def on_interpreter(model: object, *argv: str, check: bool = True) -> object:
    """``trt-kv generate --model MODEL --backend interpreter ARGV...``."""
    return run_cli("generate", "--model", model, "--backend", "interpreter", *argv, check=check)


def test_generate_on_the_interpreter_gives_transformers_ids(folder):
    path, hf_model = folder
    out = on_interpreter(
        path,
        "--prompt-ids",
        IDS,
        "--max-new-tokens",
        "6",
        "--ignore-eos",
        "--json",
        *SIZES,
    )
    assert json.loads(out.stdout)["ids"] == [hf_greedy(hf_model, p, 6) for p in PROMPTS]


def test_max_seq_len_past_n_positions_is_one_error_line_naming_it(folder):
    out = on_interpreter(
        folder[0],
        "--max-seq-len",
        "64",
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "trt-kv: error: --max-seq-len: expected <= n_positions = 40 (GPT-2's position table),"
        " got 64"
    )


def test_build_then_generate_from_the_engine_alone_and_bench(folder, tmp_path):
    path, hf_model = folder
    out = run_cli("build", "--model", path, "--out", tmp_path, "--max-batch", "2", *SIZES)
    engine = next(tmp_path.glob(f"{path.name}-*.engine"))
    assert engine.name in out.stdout
    out = run_cli(
        "generate",
        "--engine",
        engine,
        "--backend",
        "tensorrt",
        "--emulate-gpu",
        "--prompt-ids",
        IDS,
        "--max-new-tokens",
        "6",
        "--json",
        TRT_KV_EMULATED_MODELS=str(path),  # the sidecar names no path: the emulator is told
    )
    assert json.loads(out.stdout)["ids"] == [hf_greedy(hf_model, p, 6) for p in PROMPTS]
    text = run_cli(
        "generate", "--engine", engine, "--backend", "tensorrt", "--emulate-gpu", "--prompt",
        "hi", check=False,
    )  # fmt: skip
    assert text.returncode == 2 and text.stderr.strip() == (
        "trt-kv: error: --prompt: expected --prompt-ids (text needs --model's tokenizer), got text"
    )
    inspect = run_cli("inspect", engine).stdout
    assert "roles        token_ids: input_ids, positions: position_ids" in inspect
    assert "decoder      vocab 101, S_max 32, B <= 2, S <= 8 per step" in inspect
    bench = run_cli(
        "bench",
        "--model",
        path,
        "--backend",
        "interpreter",
        "--context",
        "4",
        "--decode-steps",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--json",
        *SIZES,
    )
    assert json.loads(bench.stdout)["model"] == path.name


def test_text_prompts_where_the_folder_has_a_tokenizer(tmp_path):
    vocab = save_tokenizer(tmp_path)
    save_gpt2(tmp_path, vocab_size=vocab)
    out = on_interpreter(
        tmp_path,
        "--prompt",
        "the fox",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
        "--json",
        *SIZES,
    )
    result = json.loads(out.stdout)
    assert len(result["ids"][0]) == 4 and isinstance(result["text"][0], str)


def test_text_prompts_without_a_tokenizer_are_refused(folder):
    out = on_interpreter(
        folder[0],
        "--prompt",
        "hi",
        *SIZES,
        check=False,
    )
    assert out.returncode == 2 and "pass token ids (--prompt-ids)" in out.stderr


@pytest.fixture(scope="module")
def as_saved(tmp_path_factory):
    """A GPT-2 of sizes only, as ``save_pretrained`` writes it: n_positions 48 (below the
    default S_max 512), eos_token_id 50256 (GPT2Config's default, past the vocabulary 211)."""
    folder = tmp_path_factory.mktemp("gpt2_as_saved")
    return folder, save_gpt2(folder, base=SIZES_ONLY, initializer_range=0.3)


EOS_NOTE = (
    "trt_kv: note: {folder}: eos_token_id 50256 outside the vocabulary [0, 211): the model "
    "can never generate it, so it is not an end id here"
)


def test_a_folder_as_save_pretrained_writes_it_generates_with_one_line_about_its_eos(as_saved):
    """Was refused twice: S_max 512 past n_positions 48, then eos_ids 50256 past V = 211."""
    path, hf_model = as_saved
    out = on_interpreter(path, "--prompt-ids", IDS, "--max-new-tokens", "6", "--json")
    assert json.loads(out.stdout)["ids"] == [hf_greedy(hf_model, p, 6) for p in PROMPTS]
    notes = [line for line in out.stderr.splitlines() if "eos_token_id" in line]
    assert notes == [EOS_NOTE.format(folder=path)]


def test_a_folder_as_saved_builds_an_engine_of_s_max_n_positions(as_saved, tmp_path):
    path, _ = as_saved
    run_cli("build", "--model", path, "--out", tmp_path, "--max-batch", "1", "--dtype", "float32")
    assert [p.name.split("-")[-5:] for p in tmp_path.glob(f"{path.name}-*.engine")] == [
        ["float32", "s48", "b1", "t48", "k1.engine"]
    ]


def test_an_s_max_given_past_n_positions_stays_refused_by_name(as_saved):
    out = on_interpreter(as_saved[0], "--max-seq-len", "512", check=False)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "trt-kv: error: --max-seq-len: expected <= n_positions = 48 (GPT-2's position table),"
        " got 512"
    )
