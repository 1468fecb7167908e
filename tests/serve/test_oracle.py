"""The correctness oracle end to end: greedy answers, sent together so that they share
decode steps, equal ``trt-kv generate`` run alone on each prompt: ``/v1/completions`` as
``generate --no-chat`` (the raw text), ``/v1/chat/completions`` as ``generate`` with the
chat template (the default model's answer in a shared batch: test_docs_serve.py)."""

import asyncio
import json

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli_user import run_cli
from tests.support.servers import TINY_MODEL_OPTIONS

MODEL = "tiny"
NEW = 12
TEXTS = ["w5 w6 w7", "w30", "w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18"]  # the last: 2 chunks


def generated_alone(tiny_dir, text, chat):
    """``trt-kv generate``'s text for one prompt, alone in its run."""
    template = [] if chat else ["--no-chat"]
    out = run_cli(
        "generate", "--model", tiny_dir, *TINY_MODEL_OPTIONS, "--prompt", text, *template,
        "--max-new-tokens", NEW, "--json",
    )  # fmt: skip
    return json.loads(out.stdout)["text"][0]


def occupancy(url):
    """(decode steps of one sequence, decode steps) so far, from ``/metrics``."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    samples = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    return samples["trt_kv_batch_occupancy_bucket", "1.0"], samples[
        "trt_kv_batch_occupancy_count", None
    ]


async def together(url):
    """Every prompt as a completion and as a chat, all sent at once, greedy."""
    async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as c:
        completions = [
            c.completions.create(model=MODEL, prompt=t, max_tokens=NEW, temperature=0)
            for t in TEXTS
        ]
        chats = [
            c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": t}], max_tokens=NEW,
                temperature=0,
            )
            for t in TEXTS
        ]  # fmt: skip
        answers = await asyncio.gather(*completions, *chats)
    texts = [a.choices[0].text for a in answers[: len(TEXTS)]]
    return texts, [a.choices[0].message.content for a in answers[len(TEXTS) :]]


def test_greedy_answers_sent_together_equal_generate_alone(tiny_dir, server):
    url, _ = server
    single_before, steps_before = occupancy(url)
    completions, chats = asyncio.run(together(url))
    single, steps = occupancy(url)
    assert steps - steps_before > single - single_before  # some decode steps were shared
    assert completions == [generated_alone(tiny_dir, t, chat=False) for t in TEXTS]
    assert chats == [generated_alone(tiny_dir, t, chat=True) for t in TEXTS]
