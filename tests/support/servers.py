"""A real ``trt-kv serve`` app on a free loopback port, in this process (a thread runs
uvicorn) or as a child process (``python -m trt_kv serve``), over a tiny Llama checkpoint
with a word-level tokenizer and a chat template (``w0`` .. ``w96``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.cli_user import user_env, write_tiny_model, write_tiny_tokenizer

# the tiny model on the interpreter, float32: S_max 1024 (a token takes ~5 ms: 1000 of them
# keep a request running for seconds), 4 slots, steps of 8 tokens; what generate takes too
TINY_MODEL_OPTIONS = (
    "--backend", "interpreter", "--dtype", "float32", "--max-seq-len", "1024",
    "--max-batch", "4", "--max-step-tokens", "8",
)  # fmt: skip
TINY_OPTIONS = (*TINY_MODEL_OPTIONS, "--prefill-chunk", "8")  # serve's
TINY_S_MAX = 1024


def write_tiny_served_model(folder: Path) -> Path:
    """The tiny checkpoint folder with its tokenizer and chat template."""
    write_tiny_model(folder)
    return write_tiny_tokenizer(folder)


@contextmanager
def app_server(options: list[str], api_key: str | None = None) -> Iterator[tuple[str, object]]:
    """``trt-kv serve OPTIONS``' app served on ``127.0.0.1:<free port>`` by a thread of this
    process; yields the base URL (``http://127.0.0.1:PORT/v1``) and the app; stops the
    server and the engine after."""
    from trt_kv.cli.serve_engine import served_engine
    from trt_kv.serve.http.app import create_app

    with served_engine(options) as engine:
        app = create_app(
            engine.loop, engine.tokenizer, model_name=engine.model_name, api_key=api_key
        )
        with thread_server(app, engine.loop) as url:
            yield url, app


@contextmanager
def thread_server(app: object, loop: object) -> Iterator[str]:
    """``app`` served by uvicorn on a thread, on a free loopback port; yields its base URL."""
    import uvicorn

    from trt_kv.serve.http.server import Server

    bound: list[str] = []
    ready = threading.Event()
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = Server(config, loop, 5.0, lambda url: (bound.append(url), ready.set()))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert ready.wait(60), "the server did not start"
    try:
        yield f"{bound[0]}/v1"
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def serve_process(*argv: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """``python -m trt_kv serve ARGV... --port 0`` as a child process; yields it and its base
    URL once it printed its ready line; kills it after if it still runs."""
    child = subprocess.Popen(
        [sys.executable, "-m", "trt_kv", "serve", *argv, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=user_env(),
    )
    try:
        line = child.stdout.readline()
        assert " at http://" in line, (
            line,
            child.poll(),
            child.stderr.read() if child.poll() is not None else "",
        )
        url = line.split(" at ", 1)[1].split()[0]
        yield child, url
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(30)
