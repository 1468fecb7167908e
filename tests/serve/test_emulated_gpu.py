"""``trt-kv serve --backend tensorrt|polygraphy --emulate-gpu``, as ``generate`` runs there:
the engine built (or reused) and run on the emulated GPU; greedy answers sent together equal
the interpreter's of the same network."""

import asyncio

import openai
import pytest

from tests.support.servers import app_server

MODEL = "tiny"
SIZES = ["--dtype", "float32", "--max-seq-len", "64", "--max-batch", "2", "--max-step-tokens", "8"]
PROMPTS = ["w5 w6 w7", "w8 w9 w10 w11 w12 w13 w14 w15 w16 w17"]  # the second: two chunks


def answers(options):
    with app_server(options) as (url, _):

        async def ask():
            async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as c:
                sent = [
                    c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
                    for p in PROMPTS
                ]
                return [a.choices[0].text for a in await asyncio.gather(*sent)]

        return asyncio.run(ask())


@pytest.fixture(scope="module")
def interpreter_answers(tiny_dir):
    return answers(["--model", str(tiny_dir), "--backend", "interpreter", *SIZES])


@pytest.mark.parametrize("backend", ["tensorrt", "polygraphy"])
def test_an_emulated_gpu_backend_serves_the_interpreters_answers(
    tiny_dir, tmp_path_factory, interpreter_answers, backend
):
    engines = tmp_path_factory.mktemp("engines")
    options = ["--model", str(tiny_dir), "--backend", backend, "--emulate-gpu", *SIZES]
    assert answers([*options, "--out", str(engines)]) == interpreter_answers
