"""Serving under load: ``trt-kv serve`` beside ``llama-server``, streaming clients on loopback.

    python scripts/bench_serve.py                      # both servers, the default model
    python scripts/bench_serve.py --servers trt-kv     # one of them
    python scripts/bench_serve.py --url trt-kv=http://127.0.0.1:8000   # a server already up

Each server is started here on a free loopback port with the same slots and context: ``trt-kv
serve --backend interpreter --max-batch 8`` (the default model, S_max 512) and ``llama-server
-m GGUF -np 8 -c 4096 --poll 0`` (8 x S_max; see LLAMA_FLAGS) on the default model's GGUF
(``LLAMA_SERVER`` names the binary, else ``../shared/llama.cpp/run llama-server``). Both use
every core; run it on a quiet machine (the first line prints the load average). Every request
is ``/v1/completions``, streaming, greedy, a 64-token prompt (each request its own, so no
prefix is reused) and 64 new tokens (``ignore_eos``). Rows: 1, 4, 8 and 16 clients sending at
once, then 8 such requests one at a time (``--sequential``). Columns per server: generated
tokens/s over the row's wall time, time to first token (TTFT) and inter-token latency (ITL)
p50/p99 in ms, each streamed chunk one token (both servers stream one token a chunk;
``usage`` counts the tokens).

Then one stream's longest inter-token gap while another request's 384-token prompt (three
128-token chunks) is prefilled, beside what continuous batching promises it: one chunk's time
(the slowest of the three, each measured alone) plus one decode step (ITL p50 of one stream
alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SLOTS = 8
S_MAX = 512
CHUNK = 128  # trt-kv's prefill chunk (MAX_STEP_TOKENS)
# llama-server's threads sleep instead of polling for work: one stream alone made 72 tokens/s
# so, 63 with the default polling (50), on the 2-core machine of docs/serve.md
LLAMA_FLAGS = ("--poll", "0")
TEXT = (
    "The history of the lighthouse begins with fires lit on hilltops to guide ships home. "
    "Later, towers of stone carried lamps of oil, and lenses made by Fresnel sent their "
    "light many miles out to sea. Keepers lived beside them with their families, trimming "
    "wicks, polishing glass and writing the weather in logbooks every night of the year. "
    "Today most lights run by themselves, watched from far away by people who rarely see "
    "the ocean, yet sailors still look for them when the night is dark and the sea is rough."
)


@dataclass
class Trace:
    """One streamed request: when it was sent, when each token chunk arrived (seconds)."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.arrivals[0] - self.sent

    @property
    def gaps(self) -> list[float]:
        return list(np.diff(self.arrivals))


@dataclass
class Row:
    """A load's figures: generated tokens/s, TTFT and ITL percentiles (ms)."""

    tokens_per_s: float
    ttft_ms: tuple[float, float]
    itl_ms: tuple[float, float]
    prompt_tokens: set[int]
    completion_tokens: set[int]


def prompts(tokenizer: object, count: int, length: int, first: int = 0) -> list[str]:
    """``count`` distinct texts of exactly ``length`` tokens each (request i opens with
    "Story i", i from ``first``): no request finds another's prompt in a server's cache."""
    out = []
    for i in range(first, first + count):
        ids = tokenizer.encode(f"Story {i + 1}. " + " ".join([TEXT] * 6), add_special_tokens=False)
        text = tokenizer.decode(ids[:length])
        got = len(tokenizer.encode(text, add_special_tokens=False))
        if got != length:
            raise SystemExit(f"prompt {i}: {got} tokens after a round trip, not {length}")
        out.append(text)
    return out


async def stream(
    client: httpx.AsyncClient, model: str, prompt: str, new_tokens: int, trace: Trace | None = None
) -> Trace:
    """One streaming ``/v1/completions`` request, its token chunks timed as they arrive (into
    ``trace`` when given, which the caller may watch)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": new_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    trace = trace or Trace(0.0)
    trace.sent = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"{response.status_code}: {(await response.aread()).decode()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("choices"):
                trace.arrivals.append(time.perf_counter())
            if chunk.get("usage"):
                trace.prompt_tokens = chunk["usage"]["prompt_tokens"]
                trace.completion_tokens = chunk["usage"]["completion_tokens"]
    return trace


async def load(url: str, model: str, texts: Sequence[str], new_tokens: int, at_once: bool) -> Row:
    """Send ``texts`` all at once (``at_once``) or one after another; the row's figures."""
    # a connection per request, as separate clients have (llama-server closes kept-alive
    # connections after a few requests, which a pooled client finds only when it reuses one)
    limits = httpx.Limits(max_connections=len(texts) + 1, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        if at_once:
            traces = await asyncio.gather(*(stream(client, model, t, new_tokens) for t in texts))
        else:
            traces = [await stream(client, model, t, new_tokens) for t in texts]
        wall = time.perf_counter() - start
    ttft = [t.ttft * 1e3 for t in traces]
    itl = [g * 1e3 for t in traces for g in t.gaps]
    return Row(
        sum(t.completion_tokens for t in traces) / wall,
        _p50_p99(ttft),
        _p50_p99(itl),
        {t.prompt_tokens for t in traces},
        {t.completion_tokens for t in traces},
    )


def _p50_p99(values: Sequence[float]) -> tuple[float, float]:
    """Median and 99th percentile (nan, nan for none: one token has no gap)."""
    if not values:
        return (float("nan"), float("nan"))
    return (float(np.percentile(values, 50)), float(np.percentile(values, 99)))


@dataclass
class Gap:
    """A running stream's longest gap while a long prompt was prefilled, and the bound."""

    longest_ms: float
    chunks_ms: list[float]  # each 128-token chunk of the long prompt, alone (TTFT differences)
    step_ms: float  # ITL p50 of one stream alone

    @property
    def bound_ms(self) -> float:
        """The slowest chunk plus one decode step."""
        return max(self.chunks_ms) + self.step_ms


async def prefill_gap(url: str, model: str, tokenizer: object) -> Gap:
    """Stream A runs (a 64-token prompt, 256 tokens); after its 16th token B sends a 384-token
    prompt: A's longest gap among those overlapping B's prefill (B's send to its first token).
    The bound's parts are measured alone: one stream's decode step, and each chunk of B's
    prompt as the TTFT of a prompt one chunk longer less that of the one before (a chunk
    deep in a prompt attends to more keys: it may take longer than the first)."""
    short, long, solo_text = (
        prompts(tokenizer, 1, n, i)[0] for i, n in ((1, 64), (2, 384), (3, 64))
    )
    solo = await load(url, model, [solo_text], 64, at_once=True)
    ttft = [0.0]
    for k in (1, 2, 3):  # a fresh prompt each: nothing cached
        alone = await load(url, model, prompts(tokenizer, 1, k * CHUNK, 10 + k), 1, at_once=True)
        ttft.append(alone.ttft_ms[0])
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        a = Trace(0.0)
        running = asyncio.create_task(stream(client, model, short, 256, a))
        while len(a.arrivals) < 16 and not running.done():
            await asyncio.sleep(0.005)
        b = await stream(client, model, long, 1)
        await running
    spans = zip(a.arrivals, a.arrivals[1:])
    overlapping = [end - begin for begin, end in spans if end >= b.sent and begin <= b.arrivals[0]]
    return Gap(max(overlapping) * 1e3, list(np.diff(ttft)), solo.itl_ms[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(argv: Sequence[str], port: int, log: Path) -> Iterator[str]:
    """Run ``argv`` (a server on ``port``) until the block ends; its base URL once
    ``/v1/models`` answers 200. SIGTERM at the end, SIGKILL 30 s later."""
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{argv[0]} exited {proc.returncode}: see {log}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{argv[0]} not up after 600 s: see {log}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def trtkv_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "trt_kv", "serve", "--backend", "interpreter",
            "--max-batch", str(SLOTS), "--port", str(port)]  # fmt: skip


def llama_argv(port: int, gguf: Path) -> list[str]:
    """``$LLAMA_SERVER``, else ``shared/llama.cpp/run llama-server`` beside the checkout (or
    beside the folder holding it, for a git worktree)."""
    binary = os.environ.get("LLAMA_SERVER")
    runs = [d / "shared" / "llama.cpp" / "run" for d in (ROOT.parent, ROOT.parent.parent)]
    run = next((r for r in runs if r.exists()), None)
    if not binary and run is None:
        raise SystemExit(f"no llama-server: set LLAMA_SERVER (looked for {runs[0]})")
    tool = [binary] if binary else [str(run), "llama-server"]
    return [*tool, "-m", str(gguf), "-np", str(SLOTS), "-c", str(SLOTS * S_MAX), *LLAMA_FLAGS,
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


async def measure(url: str, tokenizer: object, clients: Sequence[int], sequential: int) -> dict:
    """Every row and the prefill gap against the server at ``url``."""
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    await load(url, model, ["Warm up."], 4, at_once=True)
    rows, first = {}, 100
    for n in clients:
        texts = prompts(tokenizer, n, 64, first)
        rows[str(n)] = await load(url, model, texts, 64, at_once=True)
        print(f"  {n} clients: {rows[str(n)].tokens_per_s:.1f} tokens/s", file=sys.stderr)
        first += n
    texts = prompts(tokenizer, sequential, 64, first)
    rows["seq"] = await load(url, model, texts, 64, at_once=False)
    return {"rows": rows, "gap": await prefill_gap(url, model, tokenizer)}


def _pair(values: tuple[float, float]) -> str:
    return f"{values[0]:.0f} / {values[1]:.0f}"


def table(results: dict[str, dict]) -> str:
    """Side by side, a row per load: tokens/s, TTFT and ITL p50 / p99 for each server."""
    names = list(results)
    head = "| clients | " + " | ".join(
        f"{n} tok/s | {n} TTFT p50 / p99 ms | {n} ITL p50 / p99 ms" for n in names
    )
    lines = [head + " |", "|---" * (1 + 3 * len(names)) + "|"]
    for key in results[names[0]]["rows"]:
        cells = []
        for n in names:
            row = results[n]["rows"][key]
            cells += [f"{row.tokens_per_s:.1f}", _pair(row.ttft_ms), _pair(row.itl_ms)]
        label = "1 at a time" if key == "seq" else key
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for n in names:
        rows, gap = results[n]["rows"], results[n]["gap"]
        speedup = rows["8"].tokens_per_s / rows["seq"].tokens_per_s if "8" in rows else 0.0
        counts = sorted(c for r in rows.values() for c in r.completion_tokens)
        lines.append(
            f"- {n}: 8 clients at once / one at a time: {speedup:.2f}x tokens/s; a stream's "
            f"longest inter-token gap while a 384-token prompt prefills: {gap.longest_ms:.0f} ms "
            f"(its 128-token chunks alone: {' / '.join(f'{c:.0f}' for c in gap.chunks_ms)} ms; "
            f"the slowest + one decode step of {gap.step_ms:.0f} ms = {gap.bound_ms:.0f} ms); "
            f"tokens per request {counts[0]}..{counts[-1]}"
        )
    return "\n".join(lines)


def machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), "unknown CPU",
    )  # fmt: skip
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {model} (load average before: {load})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default="trt-kv,llama-server")
    p.add_argument("--clients", default="1,4,8,16")
    p.add_argument("--sequential", type=int, default=8, help="requests sent one at a time")
    p.add_argument("--url", action="append", default=[], help="NAME=URL of a running server")
    p.add_argument("--logs", type=Path, default=Path("/tmp"), help="servers' output here")
    args = p.parse_args()
    from trt_kv.checkpoints.default import default_gguf
    from trt_kv.checkpoints.gguf import read_gguf

    gguf = default_gguf()
    tokenizer = read_gguf(gguf).tokenizer()
    clients = [int(c) for c in args.clients.split(",")]
    given = dict(u.split("=", 1) for u in args.url)
    results = {}
    for name in args.servers.split(","):
        print(f"{name}:", file=sys.stderr)
        if name in given:
            results[name] = asyncio.run(measure(given[name], tokenizer, clients, args.sequential))
            continue
        port = free_port()
        argv = trtkv_argv(port) if name == "trt-kv" else llama_argv(port, gguf)
        with server(argv, port, args.logs / f"bench_serve-{name}.log") as url:
            results[name] = asyncio.run(measure(url, tokenizer, clients, args.sequential))
    print(f"{machine()}; 64-token prompts, 64 new tokens each, streaming, greedy")
    llama = f"-np {SLOTS} -c {SLOTS * S_MAX} {' '.join(LLAMA_FLAGS)}"
    print(f"trt-kv serve {' '.join(trtkv_argv(0)[4:-2])}; llama-server {llama}\n")
    print(table(results))


if __name__ == "__main__":
    main()
