"""Load: 200 requests against ``trt-kv serve`` (a child process, the tiny model, 4 slots, a
queue of 8) with seeded random arrivals, prompt lengths, token counts, streaming or not,
clients that disconnect mid-stream, prompts too long and bad parameters.

Every request is answered (200, ended with ``stop`` or ``length``), refused with a named
status (400 naming the field or the limit, 429 queue full) or dropped by its own client; the
server's ``/metrics`` counts the same statuses (nothing lost), every slot is free afterwards,
and the server's resident memory (``VmRSS``) from the 50th answer to the 200th stays within
5%. Not timed: the machine's speed changes how many requests find the queue full, never what
each must get."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import TINY_OPTIONS, TINY_S_MAX, serve_process

REQUESTS = 200
SLOTS, QUEUE = 4, 8  # TINY_OPTIONS' --max-batch, and --max-queue here
MODEL = "tiny"
RSS_FROM = 50  # the answer after which memory must hold still
RSS_TOLERANCE = 0.05


@dataclass(frozen=True)
class Planned:
    """One request of the plan: when it is sent (seconds after the first), what it asks,
    and the statuses it may get."""

    at: float
    words: int  # prompt "w1 .. wN": N tokens
    max_tokens: int
    stream: bool
    temperature: float = 0.0
    disconnect_after: int | None = None  # chunks read before the client goes away
    refused_by: str | None = None  # the field a 400 must name; None: 200 or 429


def plan(seed: int = 39) -> list[Planned]:
    """Exponential gaps (mean 40 ms), and every 40th request opens a burst of 16 sent at
    once (more than slots + queue: some must get 429). Of the requests: 8% ask more than
    S_max, 5% a negative temperature, 17% stream and disconnect after 1-4 chunks."""
    rng = random.Random(seed)
    out, at, burst = [], 0.0, 0
    for i in range(REQUESTS):
        burst = 16 if i % 40 == 0 else max(burst - 1, 0)
        at += 0.0 if burst else rng.expovariate(1 / 0.04)
        words, kind = rng.randint(1, 60), rng.random()
        if kind < 0.08:
            out.append(Planned(at, words, TINY_S_MAX, rng.random() < 0.5, refused_by="max_tokens"))
        elif kind < 0.13:
            out.append(Planned(at, words, 8, False, temperature=-0.5, refused_by="temperature"))
        elif kind < 0.30:
            out.append(Planned(at, words, 400, True, disconnect_after=rng.randint(1, 4)))
        else:
            out.append(Planned(at, words, rng.randint(1, 48), rng.random() < 0.5))
    return out


@dataclass
class Outcome:
    status: int
    finish_reason: str | None = None
    completion_tokens: int | None = None
    param: str | None = None  # the field a 400 named
    disconnected: bool = False


async def send(client: openai.AsyncOpenAI, p: Planned) -> Outcome:
    """``p`` as a ``/v1/completions`` request; what came back."""
    prompt = " ".join(f"w{1 + k % 96}" for k in range(p.words))
    args = {"model": MODEL, "prompt": prompt, "max_tokens": p.max_tokens}
    try:
        if not p.stream:
            done = await client.completions.create(**args, temperature=p.temperature)
            return Outcome(200, done.choices[0].finish_reason, done.usage.completion_tokens)
        stream = await client.completions.create(
            **args, temperature=p.temperature, stream=True, stream_options={"include_usage": True}
        )
        outcome, chunks = Outcome(200), 0
        async for chunk in stream:
            chunks += 1
            if p.disconnect_after is not None and chunks == p.disconnect_after:
                await stream.close()
                outcome.disconnected = True
                break
            if chunk.choices and chunk.choices[0].finish_reason:
                outcome.finish_reason = chunk.choices[0].finish_reason
            if chunk.usage:
                outcome.completion_tokens = chunk.usage.completion_tokens
        return outcome
    except openai.APIStatusError as e:
        error = e.body if isinstance(e.body, dict) else {}
        return Outcome(e.status_code, param=error.get("param"))


def rss_kib(pid: int) -> int:
    """The process's resident set (``VmRSS``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def run(url: str, pid: int, planned: list[Planned]) -> tuple[list[Outcome], list[int]]:
    """Send every planned request at its time; the outcomes (in plan order) and the server's
    RSS after each answer from the ``RSS_FROM``-th on."""
    rss: list[int] = []
    answered = 0
    # an idle connection expires here before uvicorn's keep-alive (5 s) closes it: at the
    # same 5 s (httpx's default) a request can go out on a socket the server is closing
    limits = httpx.Limits(max_connections=REQUESTS, keepalive_expiry=2.0)
    async with openai.AsyncOpenAI(
        base_url=url, api_key="unused", max_retries=0, timeout=120,
        http_client=httpx.AsyncClient(limits=limits, timeout=120),
    ) as client:  # fmt: skip
        start = time.monotonic()

        async def one(p: Planned) -> Outcome:
            nonlocal answered
            await asyncio.sleep(max(0.0, start + p.at - time.monotonic()))
            outcome = await send(client, p)
            answered += 1
            if answered >= RSS_FROM:
                rss.append(rss_kib(pid))
            return outcome

        outcomes = await asyncio.gather(*(one(p) for p in planned))
    return list(outcomes), rss


def metrics(url: str) -> list:
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_200_random_requests_are_each_answered_or_refused_and_leave_every_slot_free(tiny_dir):
    planned = plan()
    argv = ("--model", str(tiny_dir), *TINY_OPTIONS, "--max-queue", str(QUEUE))
    with serve_process(*argv) as (child, url):
        outcomes, rss = asyncio.run(run(url, child.pid, planned))
        deadline = time.monotonic() + 10
        while True:  # a disconnect frees its slot at the next step boundary
            gauges = {s.name: s.value for s in metrics(url) if not s.labels}
            if gauges["trt_kv_free_slots"] == SLOTS or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        counted = Counter(
            {s.labels["status"]: s.value for s in metrics(url)
             if s.name == "trt_kv_requests_total" and s.labels["endpoint"] == "/v1/completions"}
        )  # fmt: skip
        assert child.poll() is None, "the server died under load"

    assert len(outcomes) == REQUESTS
    for i, (p, o) in enumerate(zip(planned, outcomes)):
        if p.refused_by:
            assert (o.status, o.param) == (400, p.refused_by), (i, p, o)
        elif o.status == 200 and not o.disconnected:
            assert o.finish_reason in ("stop", "length"), (i, p, o)
            assert o.completion_tokens == p.max_tokens or o.finish_reason == "stop", (i, p, o)
        else:
            assert o.status == 429 or (o.status == 200 and p.disconnect_after), (i, p, o)
    statuses = Counter(str(o.status) for o in outcomes)
    assert set(statuses) == {"200", "400", "429"}, statuses
    assert sum(o.disconnected for o in outcomes) > 10
    assert counted == statuses, (counted, statuses)  # the server saw each request, once
    assert gauges["trt_kv_free_slots"] == SLOTS
    assert gauges["trt_kv_running_slots"] == 0 and gauges["trt_kv_queue_length"] == 0
    assert len(rss) == REQUESTS - RSS_FROM + 1
    assert max(rss) <= rss[0] * (1 + RSS_TOLERANCE), rss
    assert min(rss) >= rss[0] * (1 - RSS_TOLERANCE), rss
