"""Each sampling parameter reaches the sampler (an answer it must change, or one it must
equal), prefix reuse shows in ``usage.prompt_tokens_details.cached_tokens``, and a seeded
sampled answer does not depend on what else runs."""

import asyncio

import openai

MODEL = "tiny"
PROMPT = "w5 w6 w7"


EXTENSIONS = ("top_k", "repetition_penalty")  # not OpenAI's: the client sends them as extra_body


def text(client, **request):
    extra = {k: request.pop(k) for k in EXTENSIONS if k in request}
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, **request}
    return client.completions.create(**request, extra_body=extra).choices[0].text


def test_top_k_1_and_a_tiny_top_p_sample_the_greedy_answer(client):
    greedy = text(client, temperature=0)
    assert text(client, temperature=1.0, top_k=1, seed=3) == greedy
    assert text(client, temperature=1.0, top_p=1e-6, seed=3) == greedy
    assert text(client, temperature=1.0, seed=3) != greedy  # sampling does change it


def test_repetition_penalty_removes_repeats(client):
    words = text(client, temperature=0).split()
    assert len(set(words)) < len(words)  # the greedy answer repeats itself
    words = text(client, temperature=0, repetition_penalty=1e3).split()
    assert len(set(words)) == len(words)
    assert not set(words) & set(PROMPT.split())  # the prompt's ids count too


def test_openai_penalties_change_the_greedy_answer(client):
    greedy = text(client, temperature=0)
    assert text(client, temperature=0, presence_penalty=2.0) != greedy
    assert text(client, temperature=0, frequency_penalty=2.0) != greedy


def test_the_next_chat_turn_reuses_the_cached_prefix(client):
    first = [{"role": "user", "content": "w60 w61 w62 w63"}]
    answer = client.chat.completions.create(
        model=MODEL, messages=first, max_tokens=4, temperature=0
    )
    turn = [
        *first,
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "w64"},
    ]
    again = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=4, temperature=0)
    # the first turn's prompt (9 tokens) and answer were cached in the slot it freed
    assert again.usage.prompt_tokens_details.cached_tokens >= answer.usage.prompt_tokens


def test_a_seeded_sampled_answer_is_the_same_whatever_else_runs(server, client):
    url, _ = server
    seeded = {"temperature": 0.9, "seed": 11, "extra_body": {"top_k": 20}}
    alone = text(client, temperature=0.9, seed=11, top_k=20)

    async def crowded():
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as c:
            others = [
                c.completions.create(model=MODEL, prompt=p, max_tokens=30, temperature=1.0)
                for p in ("w1 w2", "w40", "w70 w71 w72 w73 w74 w75 w76 w77 w78 w79")
            ]
            mine = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, **seeded)
            return (await asyncio.gather(mine, *others))[0].choices[0].text

    assert asyncio.run(crowded()) == alone


def test_ignore_eos_runs_past_the_models_end_id_to_max_tokens(client, tiny_dir, tmp_path):
    """A model whose end id is the second word of a greedy answer stops there; with
    ``ignore_eos`` (vLLM's and llama-server's extension) it runs on to ``max_tokens``."""
    import json
    import shutil

    from tests.support.servers import TINY_OPTIONS, app_server

    words = text(client, prompt="w5 w6 w7", max_tokens=4, temperature=0).split()
    folder = shutil.copytree(tiny_dir, tmp_path / MODEL)
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = int(words[1].removeprefix("w"))
    (folder / "config.json").write_text(json.dumps(config))
    with (
        app_server(["--model", str(folder), *TINY_OPTIONS]) as (url, _),
        openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as ends,
    ):
        request = {"model": MODEL, "prompt": "w5 w6 w7", "max_tokens": 4, "temperature": 0}
        stopped = ends.completions.create(**request).choices[0]
        past = ends.completions.create(**request, extra_body={"ignore_eos": True}).choices[0]
    # the end id is the last token (shown: not a special token of this vocabulary)
    assert (stopped.finish_reason, stopped.text.split()) == ("stop", words[:2])
    assert (past.finish_reason, past.text.split()) == ("length", words)
