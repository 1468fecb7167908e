"""``trt-kv serve --model decoder.onnx`` (an exported tiny Llama, growing cache): greedy
``/v1/completions`` answers, sent together so that they share decode steps, equal
``trt-kv generate`` of the same prompts and onnxruntime's ids on the original graph: text
through ``--tokenizer DIR`` on the interpreter, token-id prompts (the file has no tokenizer)
on the emulated TensorRT backend."""

import asyncio
import json
import re

import openai
import pytest

from tests.support.cli_user import run_cli, write_tiny_tokenizer
from tests.support.onnx_decoders import tiny_model
from tests.support.onnx_models import PROMPTS, export, ort_greedy
from tests.support.servers import app_server

MODEL = "tiny-llama"
NEW = 10
SIZES = ["--max-seq-len", "64", "--max-batch", "3", "--prefill-chunk", "4"]  # PROMPTS[0]: 2 chunks


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    """(the exported .onnx, alone in its folder; a tokenizer folder elsewhere; onnxruntime's
    greedy ids of :data:`PROMPTS`)."""
    path = export(tiny_model("llama"), tmp_path_factory.mktemp("onnx") / f"{MODEL}.onnx")
    tokenizer = write_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    return path, tokenizer, [ort_greedy(path, p, NEW) for p in PROMPTS]


def served(options: list[str], prompts: list) -> list[str]:
    """The texts of greedy completions of ``prompts``, sent together to ``trt-kv serve
    OPTIONS``."""
    with app_server(options) as (url, _):

        async def ask() -> list[str]:
            async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as c:
                sent = [
                    c.completions.create(model=MODEL, prompt=p, max_tokens=NEW, temperature=0)
                    for p in prompts
                ]
                return [a.choices[0].text for a in await asyncio.gather(*sent)]

        return asyncio.run(ask())


def test_text_completions_equal_generate_with_the_tokenizer_folder(onnx_model):
    path, tokenizer, want = onnx_model
    texts = [" ".join(f"w{i}" for i in p) for p in PROMPTS]
    options = ["--model", str(path), "--tokenizer", str(tokenizer), "--backend", "interpreter"]
    answers = served([*options, *SIZES], texts)
    generated = run_cli(
        "generate", *options, *SIZES[:4], "--prompt", texts[0], "--no-chat",
        "--max-new-tokens", NEW, "--json",
    )  # fmt: skip
    assert answers[0] == json.loads(generated.stdout)["text"][0]
    assert [a.split() for a in answers] == [[f"w{i}" for i in ids] for ids in want]


def test_token_id_prompts_on_the_emulated_gpu_equal_generate(onnx_model, tmp_path):
    """No tokenizer beside the file: prompts are token-id lists (OpenAI allows them), and
    each answer's ids come back as ``<|id:N|>``."""
    path, _, want = onnx_model
    options = ["--model", str(path), "--backend", "tensorrt", "--emulate-gpu", *SIZES[:4]]
    answers = served([*options, "--out", str(tmp_path), "--prefill-chunk", "4"], PROMPTS)
    ids = ";".join(",".join(map(str, p)) for p in PROMPTS)
    generated = run_cli(
        "generate", *options, "--out", tmp_path, "--prompt-ids", ids, "--max-new-tokens", NEW,
        "--json",
    )  # fmt: skip
    got = [[int(i) for i in re.findall(r"<\|id:(\d+)\|>", a)] for a in answers]
    assert got == json.loads(generated.stdout)["ids"] == want


def test_a_text_prompt_without_a_tokenizer_is_refused_by_name(onnx_model):
    path, _, _ = onnx_model
    options = ["--model", str(path), "--backend", "interpreter", *SIZES]
    with (
        app_server(options) as (url, _),
        openai.OpenAI(base_url=url, api_key="x", max_retries=0) as c,
        pytest.raises(openai.BadRequestError, match="this model has no tokenizer"),
    ):
        c.completions.create(model=MODEL, prompt="w5 w6", max_tokens=2)
