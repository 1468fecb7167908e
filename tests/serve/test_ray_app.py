"""trt_kv.serve.ray_app on a local Ray instance: two replicas, each with its own engine of the
tiny model, behind Ray Serve's HTTP proxy, reached by the ``openai`` client. The application
is docs/serve.md's scale-out block, run with the tiny model's options.

Ray runs here as CI runs it: a local instance of this machine's CPUs (fractional ``num_cpus``
per replica), loopback only, no dashboard, no usage report. Every process it starts carries
a marker in its environment; after ``ray.shutdown()`` none is left."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path

import openai
import pytest
import ray
from ray import serve

from tests.support.cli_user import ROOT
from tests.support.servers import TINY_OPTIONS
from trt_kv.serve.ray_app import REPLICA_HEADER

MARKER = "TRT_KV_RAY_TEST"
DOC_OPTIONS = '["--backend", "interpreter", "--max-batch", "8"]'


def doc_recipe(tiny_dir: Path) -> object:
    """docs/serve.md's scale-out block run with the tiny model's options and a quarter of a
    CPU reserved a replica (Ray's books; the tiny model needs little): its ``app``."""
    text = (ROOT / "docs" / "serve.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "ray_app" in b]
    assert DOC_OPTIONS in code and "num_cpus=1)" in code, code
    tiny = json.dumps(["--model", str(tiny_dir), *TINY_OPTIONS])
    scope: dict = {}
    exec(code.replace(DOC_OPTIONS, tiny).replace("num_cpus=1)", "num_cpus=0.25)"), scope)
    return scope["app"]


def marked_processes(marker: str) -> list[int]:
    """Pids whose environment holds ``TRT_KV_RAY_TEST=marker`` (this process excluded)."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            pass
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_url(tiny_dir):
    """Base URL (``http://127.0.0.1:PORT/v1``) of two replicas of the tiny model's engine;
    Ray shut down after, and no process of it left."""
    marker = uuid.uuid4().hex
    saved = dict(os.environ)
    os.environ.update(
        {
            MARKER: marker,  # inherited by every process Ray starts
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), saved.get("PYTHONPATH")])),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    port = free_port()
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")  # fmt: skip
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(doc_recipe(tiny_dir), route_prefix="/")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        serve.shutdown()
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)
        deadline = time.monotonic() + 30
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marked_processes(marker) == [], "Ray left processes running"


def test_requests_through_the_proxy_reach_both_replicas_and_agree(ray_url):
    """Sent one after another, greedy requests reach both replicas (Ray's router picks one
    per request), and both answer alike: same engine, same text."""
    replicas, texts = set(), set()
    with openai.OpenAI(base_url=ray_url, api_key="unused", max_retries=0) as client:
        model = client.models.list().data[0].id
        for _ in range(40):
            raw = client.completions.with_raw_response.create(
                model=model, prompt="w1 w2 w3", max_tokens=6, temperature=0
            )
            replicas.add(raw.headers[REPLICA_HEADER])
            texts.add(raw.parse().choices[0].text)
            if len(replicas) == 2:
                break
    assert len(replicas) == 2, replicas
    assert len(texts) == 1, texts


async def _stream(client, model: str, i: int) -> tuple[str, str, int]:
    """One streamed chat request through the proxy: its replica, text and usage's count."""
    raw = await client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": f"w{i} w{i + 1}"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, tokens = "", 0
    async for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return raw.headers[REPLICA_HEADER], text, tokens


def test_concurrent_streams_through_the_proxy_each_end_with_usage(ray_url):
    """Eight chat streams at once (the async client): each streams to its end through the
    proxy with its usage, spread over both replicas; the same request alone gives the same
    text whichever replica answers."""

    async def run() -> list[tuple[str, str, int]]:
        async with openai.AsyncOpenAI(base_url=ray_url, api_key="unused", max_retries=0) as c:
            model = (await c.models.list()).data[0].id
            together = await asyncio.gather(*(_stream(c, model, i % 4) for i in range(8)))
            alone = [await _stream(c, model, i) for i in range(4)]
            return together, alone

    together, alone = asyncio.run(run())
    assert len({replica for replica, _, _ in together}) == 2
    assert all(tokens >= 1 for _, _, tokens in together)
    assert [text for _, text, _ in together] == [alone[i % 4][1] for i in range(8)]
