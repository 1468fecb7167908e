"""docs/serve.md's examples run as written against a server of the default model (served
once here, on a free port: the port and nothing else of the text is replaced), and the
default model's answer in a batch it shares."""

import asyncio
import contextlib
import io
import json
import re
import shlex
import subprocess

import openai
import pytest

from tests.support.cli_user import ROOT
from tests.support.real_model import CHAT_ANSWER, CHAT_QUESTION
from tests.support.servers import TINY_OPTIONS, app_server

DOC = (ROOT / "docs" / "serve.md").read_text()
DOC_URL = "http://127.0.0.1:8000/v1"


def blocks(kind):
    return re.findall(rf"```{kind}\n(.*?)```", DOC, re.S)


@pytest.fixture(scope="module")
def default_server():
    options = ["--backend", "interpreter", "--max-batch", "2", "--max-seq-len", "256"]
    with app_server(["--model", "default", *options]) as served:
        yield served


def test_the_docs_name_the_default_models_served_name(default_server):
    _, app = default_server
    assert f'"model": "{app.state.model_name}"' in DOC


def test_the_curl_commands_answer(default_server):
    url, _ = default_server
    text = blocks("bash")[1].replace("\\\n", " ").replace(DOC_URL, url)
    chat, stream = [shlex.split(line) for line in text.splitlines() if line.startswith("curl")]
    answer = json.loads(subprocess.run(chat, capture_output=True, text=True, check=True).stdout)
    assert answer["choices"][0]["message"]["content"] == CHAT_ANSWER
    events = subprocess.run(stream, capture_output=True, text=True, check=True).stdout.split("\n\n")
    assert events[0].startswith("data: {") and events[-2] == "data: [DONE]"


def test_the_openai_block_answers_as_its_comment_says(default_server):
    url, _ = default_server
    (code,) = [b for b in blocks("python") if "OpenAI(base_url" in b]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.replace(DOC_URL, url), {})
    first, *rest = out.getvalue().splitlines()
    assert first == CHAT_ANSWER
    assert "completion_tokens=16" in rest[-1]


def test_the_served_engine_block_builds_the_app(tiny_dir):
    (code,) = [b for b in blocks("python") if "served_engine(" in b]
    tiny = json.dumps(["--model", str(tiny_dir), *TINY_OPTIONS])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.replace('["--backend", "interpreter", "--max-batch", "8"]', tiny), {})
    assert out.getvalue() == "tiny ['/v1/chat/completions', '/v1/completions', '/v1/models']\n"


def test_the_default_model_answers_in_a_shared_batch(default_server):
    """Its answer ends at its end id, the 8th token (tests/support/real_model.py)."""
    url, app = default_server

    async def ask():
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as c:
            question = c.chat.completions.create(
                model=app.state.model_name, temperature=0, max_tokens=8,
                messages=[{"role": "user", "content": CHAT_QUESTION}],
            )  # fmt: skip
            other = c.completions.create(
                model=app.state.model_name, prompt="Once upon a time", max_tokens=8,
                temperature=0,
            )  # fmt: skip
            return await asyncio.gather(question, other)

    answer, _ = asyncio.run(ask())
    assert answer.choices[0].message.content == CHAT_ANSWER
    assert answer.choices[0].finish_reason == "stop"
