"""``trt-kv serve`` as a process: its ready line, SIGTERM (or a first Ctrl-C) draining (the
streams in flight end with a finish_reason, new requests are refused, exit 0 within
``--drain-timeout`` + 5 s), a second Ctrl-C ending it at once by SIGINT (130 in a shell)."""

import json
import signal
import time

import httpx
import pytest

from tests.support.servers import TINY_OPTIONS, serve_process

MODEL = "tiny"


def open_stream(client, url, max_tokens):
    """A streamed completion, its first event read; returns (response, line iterator)."""
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": max_tokens, "stream": True}
    response = client.send(
        client.build_request("POST", f"{url}/completions", json=body), stream=True
    )
    lines = response.iter_lines()
    assert next(lines).startswith("data: {")
    return response, lines


def finish_of(lines):
    """The finish_reason of a stream's last chunk; asserts ``[DONE]`` closes it."""
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    return json.loads(events[-2])["choices"][0]["finish_reason"]


def test_the_ready_line_names_the_model_backend_and_url(tiny_dir):
    with serve_process("--model", str(tiny_dir), *TINY_OPTIONS, "--api-key", "k1") as (child, url):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert httpx.get(url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
        assert httpx.get(f"{url}/models").status_code == 401  # --api-key reaches the app
        keyed = httpx.get(f"{url}/models", headers={"Authorization": "Bearer k1"})
        assert keyed.json()["data"][0]["id"] == MODEL
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_the_streams_in_flight_then_exits_0(tiny_dir, sig):
    drain = 2.0
    # S_max 8192: the long stream's 8000 tokens take far longer than the drain (~1-2 ms a
    # token on the tiny model), however fast the interpreter gets
    options = (*TINY_OPTIONS, "--max-seq-len", "8192", "--drain-timeout", str(drain))
    with (
        serve_process("--model", str(tiny_dir), *options) as (child, url),
        httpx.Client(timeout=60) as client,
    ):
        short, short_lines = open_stream(client, url, 40)  # ~0.1 s: finishes in the drain
        long, long_lines = open_stream(client, url, 8000)  # cancelled at the drain's end
        child.send_signal(sig)
        signalled = time.monotonic()
        time.sleep(0.3)
        with pytest.raises((httpx.ConnectError, httpx.RemoteProtocolError, AssertionError)):
            answer = httpx.post(f"{url}/completions", json={"model": MODEL, "prompt": "w5"})
            assert answer.status_code == 200  # refused (503) or not connected at all
        assert finish_of(short_lines) == "length"
        assert finish_of(long_lines) == "cancelled"
        code = child.wait(drain + 5 + 5)
        elapsed = time.monotonic() - signalled
        short.close()
        long.close()
        stderr = child.stderr.read()
    assert code == 0, stderr
    assert elapsed < drain + 5, elapsed
    assert "draining" in stderr and "Traceback" not in stderr


def test_a_second_ctrl_c_quits_at_once(tiny_dir):
    with (
        serve_process("--model", str(tiny_dir), *TINY_OPTIONS, "--drain-timeout", "30") as (
            child,
            url,
        ),
        httpx.Client(timeout=60) as client,
    ):
        response, _ = open_stream(client, url, 1000)  # keeps the drain waiting
        child.send_signal(signal.SIGINT)
        time.sleep(0.3)
        start = time.monotonic()
        child.send_signal(signal.SIGINT)
        code = child.wait(10)
        elapsed = time.monotonic() - start
        response.close()
        stderr = child.stderr.read()
    assert code == -signal.SIGINT, stderr  # a shell shows 130
    assert elapsed < 3, elapsed
    assert "trt-kv: interrupted" in stderr and "Traceback" not in stderr


def test_a_port_in_use_is_one_line_before_the_model_loads(tiny_dir):
    import socket

    from tests.support.cli_user import run_cli

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = run_cli("serve", "--model", str(tiny_dir), "--port", str(port), check=False)
    assert out.returncode == 2
    assert out.stderr == (
        f"trt-kv: error: --port: expected a port free on 127.0.0.1, got {port} "
        "(Address already in use)\n"
    )


def test_the_serve_options_default_as_documented():
    from trt_kv import build_defaults
    from trt_kv.cli.serve_engine import serve_arguments

    args = serve_arguments([])
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 8000, None)
    assert args.max_queue == build_defaults.MAX_QUEUE
    assert args.prefill_chunk == build_defaults.PREFILL_CHUNK
    assert args.drain_timeout == build_defaults.DRAIN_TIMEOUT_S == 30.0  # docs/serve.md says 30
    assert args.max_batch == build_defaults.MAX_BATCH and args.model == "default"


def test_an_idle_connection_outlives_the_clients_keepalive(tiny_dir):
    """A connection idle for 6 s still takes a request: the server keeps idle connections
    open longer than httpx's (so the openai client's) 5 s keepalive_expiry, so it never
    closes a pooled connection at the moment a client reuses it (uvicorn's default is 5 s)."""
    import socket

    def health(raw, reader):
        """One GET /health on the connection; its status line (b"" once the server closed)."""
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status = reader.readline()
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        reader.read(length)
        return status

    with serve_process("--model", str(tiny_dir), *TINY_OPTIONS) as (_, url):
        address = httpx.URL(url)
        with socket.create_connection((address.host, address.port), timeout=30) as raw:
            reader = raw.makefile("rb")
            assert health(raw, reader).startswith(b"HTTP/1.1 200")
            time.sleep(6.0)
            assert health(raw, reader).startswith(b"HTTP/1.1 200")
