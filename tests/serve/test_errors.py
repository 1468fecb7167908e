"""Refusals in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400
naming the field (never FastAPI's 422), 400 naming S_max before queuing, 401 without the
API key, 404 for another model, 429 with ``Retry-After`` when the queue is full."""

import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import TINY_OPTIONS, TINY_S_MAX, app_server

MODEL = "tiny"


def post(url, path, body, **headers):
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)


def error_of(answer, status):
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "w5", "temperature": "hot"}, "temperature"),
        ({"prompt": "w5", "temperature": 3.0}, "temperature"),
        ({"prompt": "w5", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "w5", "max_tokens": 2.5}, "max_tokens"),
        ({"prompt": "w5", "top_p": 1.5}, "top_p"),
        ({"prompt": "w5", "n": 0}, "n"),
        ({"prompt": "w5", "stream": "yes"}, "stream"),
        ({"prompt": "w5", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "w5", "logprobs": 9}, "logprobs"),
        ({"prompt": "w5", "frequency_penalty": 2.5}, "frequency_penalty"),
        ({"prompt": "w5", "ignore_eos": "yes"}, "ignore_eos"),
        ({"prompt": [5, "w6"]}, "prompt"),
        ({"prompt": "w5", "n": 5}, "n"),  # more choices than the 4 slots: the scheduler's check
        ({}, "prompt"),
    ],
)
def test_a_wrong_type_or_range_is_400_naming_the_field(server, body, param):
    url, _ = server
    error = error_of(post(url, "/completions", {"model": MODEL, **body}), 400)
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert param in error["message"]


def test_a_chat_field_deep_in_the_body_is_named_by_its_path(server):
    url, _ = server
    body = {"model": MODEL, "messages": [{"role": "robot", "content": "w5"}]}
    assert error_of(post(url, "/chat/completions", body), 400)["param"] == "messages.0.role"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "top_logprobs": 21}
    assert error_of(post(url, "/chat/completions", body), 400)["param"] == "top_logprobs"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completions", {"prompt": "w5"}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "w5", "name_x": 1}]}),
    ],
)
def test_unknown_fields_are_ignored(server, path, body):
    url, _ = server
    unknown = {"user": "me", "suffix_x": 3, "store": True, "metadata": {"a": "b"}}
    assert post(url, path, {"model": MODEL, **body, "max_tokens": 1, **unknown}).status_code == 200


def test_a_body_that_is_not_json_is_400(server):
    url, _ = server
    answer = httpx.post(f"{url}/completions", content=b"{not json", timeout=60)
    assert error_of(answer, 400)["type"] == "invalid_request_error"


def test_another_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="w5", max_tokens=1)
    assert e.value.response.json()["error"]["param"] == "model"


def test_prompt_and_max_tokens_past_s_max_is_400_naming_it_before_queuing(client, server):
    _, app = server
    submitted = app.state.loop.scheduler.stats().submitted
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=TINY_S_MAX)
    error = e.value.response.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", "context_length_exceeded")
    assert f"S_max = {TINY_S_MAX}" in error["message"]
    assert app.state.loop.scheduler.stats().submitted == submitted  # never queued


def test_a_prompt_filling_s_max_leaves_no_default_room(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=" ".join(["w9"] * TINY_S_MAX))
    assert f"S_max = {TINY_S_MAX}" in e.value.response.json()["error"]["message"]


def test_the_api_key_is_needed_when_set(tiny_dir):
    with app_server(["--model", str(tiny_dir), *TINY_OPTIONS], api_key="sekrit") as (url, _):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            answer = httpx.get(f"{url}/models", headers=headers)
            assert error_of(answer, 401)["code"] == "invalid_api_key"
        with (
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0) as c,
            pytest.raises(openai.AuthenticationError),
        ):
            c.completions.create(model=MODEL, prompt="w5", max_tokens=1)
        with openai.OpenAI(base_url=url, api_key="sekrit", max_retries=0) as c:
            assert c.completions.create(model=MODEL, prompt="w5", max_tokens=1).choices
        assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200


def gauges(url):
    """``/metrics``' unlabelled samples by name."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_full_queue_is_429_with_retry_after(tiny_dir):
    options = [*TINY_OPTIONS, "--max-batch", "1", "--max-queue", "1", "--prefill-chunk", "4"]
    with app_server(["--model", str(tiny_dir), *options]) as (url, app):
        scheduler = app.state.loop.scheduler
        assert (scheduler.capacity, scheduler.max_queue, scheduler.prefill_chunk) == (1, 1, 4)
        long = {"model": MODEL, "prompt": "w5", "max_tokens": 1000, "stream": True}
        with (
            httpx.Client(timeout=60) as a,
            httpx.Client(timeout=60) as b,
            a.stream("POST", f"{url}/completions", json=long) as running,
        ):
            lines = running.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)  # its first token: it holds the one slot
            short = {"model": MODEL, "prompt": "w5", "max_tokens": 1}
            waiting = threading.Thread(target=post, args=(url, "/completions", short))
            waiting.start()
            deadline = time.monotonic() + 30
            while scheduler.stats().queue_length < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            seen = gauges(url)  # /metrics as the queue fills
            assert (seen["trt_kv_queue_length"], seen["trt_kv_running_slots"]) == (1, 1)
            assert seen["trt_kv_free_slots"] == 0
            answer = b.post(f"{url}/completions", json=long)
            error = error_of(answer, 429)
            assert answer.headers["retry-after"] == "1"
            assert error["code"] == "queue_full"
            with (
                openai.OpenAI(base_url=url, api_key="x", max_retries=0) as c,
                pytest.raises(openai.RateLimitError),
            ):
                c.completions.create(model=MODEL, prompt="w5", max_tokens=1)
        waiting.join(60)  # taken once the stream closed (its ticket cancelled)


def test_no_such_route_or_method_has_the_same_body(server):
    url, _ = server
    assert error_of(httpx.get(f"{url}/embeddings"), 404)["code"] == "not_found"
    error_of(httpx.get(f"{url}/completions"), 405)


def test_a_draining_server_answers_503_to_health_and_to_new_requests(tiny_dir):
    with app_server(["--model", str(tiny_dir), *TINY_OPTIONS]) as (url, app):
        loop, health = app.state.loop, url.removesuffix("/v1") + "/health"
        assert httpx.get(health).json() == {"status": "ok"}
        body = {"model": MODEL, "prompt": "w5", "max_tokens": 400, "stream": True}
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)  # its first token: in flight
            drain = threading.Thread(target=loop.drain, args=(60,))
            drain.start()
            time.sleep(0.05)
            answer = httpx.get(health)
            assert (answer.status_code, answer.json()) == (503, {"status": "draining"})
            short = {"model": MODEL, "prompt": "w5", "max_tokens": 1}
            assert error_of(post(url, "/completions", short), 503)["code"] == "shutting_down"
            assert loop.scheduler.stats().running == 1  # all while the stream ran on
            assert '"finish_reason":"length"' in [x for x in lines if x.strip()][-2]
        drain.join(60)
        assert httpx.get(health).status_code == 503


def test_health_is_503_once_the_engine_loop_stopped(tiny_dir):
    with app_server(["--model", str(tiny_dir), *TINY_OPTIONS]) as (url, app):
        health = url.removesuffix("/v1") + "/health"
        assert httpx.get(health).status_code == 200
        app.state.loop.stop()
        answer = httpx.get(health)
        assert (answer.status_code, answer.json()) == (503, {"status": "stopped"})
