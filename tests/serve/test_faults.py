"""Faults stay with their request: a client gone mid-stream frees its slot (its ticket
cancelled), a request whose step raises gets an error (500 with OpenAI's body, or an error
event in its stream) while the others answer as they would alone."""

import threading
import time

import httpx
import openai
import pytest

from tests.support.servers import thread_server

MODEL = "tiny"
POISON = 13  # a prefill holding this id raises in the backend below


def wait_until(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_client_gone_mid_stream_frees_its_slot(server):
    url, app = server
    scheduler = app.state.loop.scheduler
    before = scheduler.stats()
    body = {"model": MODEL, "prompt": "w40 w41", "max_tokens": 1000, "stream": True}
    with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        wait_until(lambda: scheduler.stats().running == 1)
    # the response closed: the connection with it
    wait_until(lambda: scheduler.stats().free == scheduler.capacity)
    after = scheduler.stats()
    assert after.finished.get("cancelled", 0) == before.finished.get("cancelled", 0) + 1
    assert after.generated_tokens - before.generated_tokens < 1000  # it never ran to its end


class PoisonedBackend:
    """A user's backend (the interpreter's, delegated to) whose prefill steps raise for a
    prompt holding :data:`POISON`: the failure of one request's step."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, plan):
        rows = [ids[:n] for ids, n in zip(plan.input_ids, plan.counts)]
        if any(n > 1 and POISON in ids for ids, n in zip(rows, plan.counts)):
            raise RuntimeError("poisoned prompt")
        return self.inner.run(plan)


@pytest.fixture(scope="module")
def poisoned(tiny_dir):
    from trt_kv.checkpoints.tokenizer import TextTokenizer
    from trt_kv.models.architectures import architecture_of
    from trt_kv.models.loading import load_model
    from trt_kv.runtime.interpreter_backend import InterpreterBackend
    from trt_kv.runtime.session import Session
    from trt_kv.serve.http.app import create_app
    from trt_kv.serve.scheduler import EngineLoop, Scheduler

    model = load_model(str(tiny_dir))
    net = architecture_of(model.config).build_network(
        model.config, model.weights, max_seq_len=64, max_batch=4, max_step_tokens=8,
        dtype="float32",
    )  # fmt: skip
    backend = PoisonedBackend(InterpreterBackend(net))
    loop = EngineLoop(Scheduler(Session(backend), eos_ids=(), prefill_chunk=8))
    loop.start()
    app = create_app(loop, TextTokenizer.from_folder(tiny_dir), model_name=MODEL)
    try:
        with (
            thread_server(app, loop) as url,
            openai.OpenAI(base_url=url, api_key="x", max_retries=0) as client,
        ):
            yield client
    finally:
        loop.stop()


def test_a_failed_request_is_500_and_the_others_answer_as_alone(poisoned):
    request = {"model": MODEL, "prompt": "w20 w21 w22", "max_tokens": 30, "temperature": 0}
    alone = poisoned.completions.create(**request).choices[0].text
    answers = []
    other = threading.Thread(
        target=lambda: answers.append(poisoned.completions.create(**request).choices[0].text)
    )
    other.start()
    with pytest.raises(openai.InternalServerError) as e:
        poisoned.completions.create(model=MODEL, prompt=f"w5 w{POISON} w6", max_tokens=4)
    error = e.value.response.json()["error"]
    assert error["type"] == "server_error" and "poisoned prompt" in error["message"]
    other.join(60)
    assert answers == [alone]
    assert poisoned.completions.create(**request).choices[0].text == alone  # still serving


def test_a_failed_stream_ends_with_an_error_event(poisoned):
    stream = poisoned.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"w5 w{POISON}"}], max_tokens=4,
        stream=True,
    )  # fmt: skip
    with pytest.raises(openai.APIError, match="poisoned prompt"):
        list(stream)
