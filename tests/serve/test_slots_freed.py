"""A slot frees as soon as nobody will read what it generates: a choice of ``n`` that met a
stop string ends there (the other choices go on), and a client of a whole (not streamed)
answer that disconnects cancels its request (a streamed one: test_faults.py)."""

import json
import socket
import time

import httpx

MODEL = "tiny"
PROMPT = "w5 w6 w7"


def wait_until(condition, seconds):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_choice_ending_at_a_stop_string_frees_its_slot_while_the_others_run(server, client):
    _, app = server
    scheduler = app.state.loop.scheduler
    request = {"model": MODEL, "prompt": PROMPT, "temperature": 1.0, "seed": 1, "n": 2}
    first, other = (c.text for c in client.completions.create(**request, max_tokens=200).choices)
    words = first.split()
    # two words early in choice 0's text that choice 1's never holds
    stop = next(s for k in range(1, 9) if (s := f"{words[k]} {words[k + 1]}") not in other)
    before = scheduler.stats()
    out = client.completions.create(**request, max_tokens=200, stop=stop)
    after = scheduler.stats()
    assert [(c.text, c.finish_reason) for c in out.choices] == [
        (first[: first.index(stop)], "stop"),
        (other, "length"),
    ]
    shown = out.usage.completion_tokens  # choice 0's tokens up to the stop, and 200
    assert shown < 200 + 12
    generated = after.generated_tokens - before.generated_tokens
    # a stopped choice left generating until the other ended would add ~190 unread tokens;
    # cancelled, it adds the few steps the server took to read the stop
    assert generated - shown <= 40, (generated, shown)
    assert after.finished.get("stop", 0) == before.finished.get("stop", 0) + 1


def test_a_client_gone_before_its_whole_answer_frees_its_slot(server):
    url, app = server
    scheduler = app.state.loop.scheduler
    before = scheduler.stats()
    host, port = httpx.URL(url).host, httpx.URL(url).port
    body = json.dumps({"model": MODEL, "prompt": "w40 w41", "max_tokens": 1000}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=30) as raw:
        raw.sendall(head + body)
        wait_until(lambda: scheduler.stats().running == 1, 30)
    # the socket closed before any answer: ~1000 tokens (~5 s) of work nobody would read
    gone = time.monotonic()
    wait_until(lambda: scheduler.stats().free == scheduler.capacity, 30)
    freed = time.monotonic() - gone
    after = scheduler.stats()
    assert after.finished.get("cancelled", 0) == before.finished.get("cancelled", 0) + 1
    assert after.generated_tokens - before.generated_tokens < 1000
    assert freed < 2.0, freed  # the disconnect is seen within 20 ms, the slot freed a step after
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert 'trt_kv_requests_total{endpoint="/v1/completions",status="499"} 1.0' in metrics
