"""OpenAI's API as the official ``openai`` client sees it, sync and async, streamed and not,
on a real server over a loopback socket (the tiny model: its word-level tokenizer makes
every token one word, ``w0`` .. ``w96``, so texts and counts can be written down)."""

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

MODEL = "tiny"  # the served name: the checkpoint folder's
PROMPT = "w5 w6 w7"  # three tokens, no BOS
CHAT = [{"role": "user", "content": "w5 w6"}]  # 7 tokens in the tiny template (w1 w3 ... w1 w1 w4)


def greedy(client, prompt=PROMPT, max_tokens=8, **extra):
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **extra
    )


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_health(server):
    url, _ = server
    answer = httpx.get(url.removesuffix("/v1") + "/health")
    assert (answer.status_code, answer.json()) == (200, {"status": "ok"})


def test_a_completion_has_exact_usage_and_its_tokens_as_words(client):
    out = greedy(client, max_tokens=6)
    (choice,) = out.choices
    words = choice.text.split()
    assert len(words) == 6 and all(w.startswith("w") for w in words), choice.text
    assert choice.finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        3,
        6,
        9,
    )
    assert out.usage.prompt_tokens_details.cached_tokens >= 0


def test_token_ids_as_the_prompt_give_the_text_prompts_answer(client):
    assert greedy(client, prompt=[5, 6, 7]).choices[0].text == greedy(client).choices[0].text


def test_a_stream_is_the_whole_answer_in_pieces_then_usage(client):
    whole = greedy(client, max_tokens=6).choices[0].text
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    *pieces, last = chunks
    assert "".join(c.choices[0].text for c in pieces) == whole
    assert [c.choices[0].finish_reason for c in pieces][-1] == "length"
    assert all(c.usage is None for c in pieces)
    assert last.choices == [] and last.usage.completion_tokens == 6
    assert last.usage.prompt_tokens == 3


def test_a_stream_without_include_usage_has_no_usage_chunk(client):
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, stream=True
        )
    )
    assert all(c.choices and c.usage is None for c in chunks)


def test_chat_streamed_and_whole_agree(client):
    whole = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=5, temperature=0
    )
    assert whole.usage.prompt_tokens == 7 and whole.usage.completion_tokens == 5
    message = whole.choices[0].message
    assert message.role == "assistant" and len(message.content.split()) == 5
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=5, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_text_before_it_and_is_not_echoed(client, stream):
    words = greedy(client, max_tokens=8).choices[0].text.split()
    stop = words[3]  # the fourth word: the text is the three before it
    expected = " ".join(words[: words.index(stop)]) + " "
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    if stream:
        chunks = list(client.completions.create(**request, stop=[stop, "never"], stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(**request, stop=stop)
        text, reason = out.choices[0].text, out.choices[0].finish_reason
    assert (text, reason) == (expected, "stop")
    assert stop not in text


def test_a_stop_string_across_two_tokens(client):
    words = greedy(client, max_tokens=8).choices[0].text.split()
    stop = f"{words[2]} {words[3][:2]}"  # the end of one token and the start of the next
    out = greedy(client, max_tokens=8, stop=stop)
    first = " ".join(words[:2]) + " "
    assert (out.choices[0].text, out.choices[0].finish_reason) == (first, "stop")
    assert out.usage.completion_tokens == 4  # generated up to the token completing the stop


def test_n_choices_each_seeded_with_exact_usage(client):
    request = {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 5, "temperature": 1.0, "seed": 7, "n": 3,
    }  # fmt: skip
    out = client.completions.create(**request)
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.text for c in out.choices]
    assert len(set(texts)) > 1, texts  # each choice its own seed
    assert out.usage.completion_tokens == 15 and out.usage.prompt_tokens == 3
    assert [c.text for c in client.completions.create(**request).choices] == texts  # seeded


def test_chat_logprobs_give_each_token_and_its_alternatives(client):
    out = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert [t.token for t in content] == out.choices[0].message.content.split()
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token  # greedy: the best alternative is chosen
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert t.bytes == list(t.token.encode())
        assert [a.logprob for a in t.top_logprobs] == sorted(
            (a.logprob for a in t.top_logprobs), reverse=True
        )


def test_chat_without_logprobs_has_none(client):
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, temperature=0)
    assert out.choices[0].logprobs is None


def test_completion_logprobs_in_the_older_shape(client):
    out = greedy(client, max_tokens=4, logprobs=2)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text.replace(" ", "")
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(len(top) == 2 and max(top.values()) <= 0 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_default_max_tokens_fill_the_context(client, server):
    _, app = server
    s_max = app.state.loop.scheduler.max_seq_len
    prompt = " ".join(["w9"] * (s_max - 2))
    out = client.completions.create(model=MODEL, prompt=prompt, temperature=0)
    assert out.usage.completion_tokens == 2 and out.choices[0].finish_reason == "length"


async def _async_answers(url, prompts, stream):
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as c:

        async def one(prompt):
            request = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0}
            if not stream:
                return (await c.completions.create(**request)).choices[0].text
            pieces = [
                ch.choices[0].text
                async for ch in await c.completions.create(**request, stream=True)
            ]
            return "".join(pieces)

        return await asyncio.gather(*(one(p) for p in prompts))


@pytest.mark.parametrize("stream", [False, True])
def test_the_async_client_streamed_and_not(server, client, stream):
    url, _ = server
    prompts = ["w5 w6 w7", "w8 w9", "w10 w11 w12 w13"]
    alone = [greedy(client, prompt=p, max_tokens=6).choices[0].text for p in prompts]
    assert asyncio.run(_async_answers(url, prompts, stream)) == alone


def _metrics(server):
    url, _ = server
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    return {
        s.name: s for f in text_string_to_metric_families(text) for s in f.samples if not s.labels
    }, text


def _sample(text, name, **labels):
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_metrics_count_requests_tokens_and_statuses(server, client):
    _, before = _metrics(server)
    greedy(client, max_tokens=5)
    with pytest.raises(openai.BadRequestError):
        greedy(client, max_tokens=-1)
    flat, after = _metrics(server)
    delta = lambda name, **labels: _sample(after, name, **labels) - _sample(before, name, **labels)  # noqa: E731
    assert delta("trt_kv_requests_total", endpoint="/v1/completions", status="200") == 1
    assert delta("trt_kv_requests_total", endpoint="/v1/completions", status="400") == 1
    assert delta("trt_kv_generation_tokens_total") == 5
    assert delta("trt_kv_prompt_tokens_total") == 3
    assert delta("trt_kv_time_to_first_token_seconds_count") == 1
    assert delta("trt_kv_inter_token_seconds_count") == 4
    assert delta("trt_kv_batch_occupancy_count") >= 4  # a decode step per token after the first
    assert flat["trt_kv_queue_length"].value == 0 and flat["trt_kv_running_slots"].value == 0
    assert flat["trt_kv_free_slots"].value == 4


def test_each_app_counts_in_its_own_registry(server, client):
    from trt_kv.serve.http.app import create_app

    _, app = server
    greedy(client, max_tokens=1)
    other = create_app(app.state.loop, None, model_name="other")  # a second app, one process
    counted = lambda a: _sample(a.state.metrics.text().decode(), "trt_kv_requests_total")  # noqa: E731
    assert counted(app) >= 1 and counted(other) == 0
