"""Serving an app with uvicorn, with trt_kv's own signal handling: SIGTERM or a first Ctrl-C
drains (the listening socket closes, new requests get 503, the requests in flight finish or,
after ``drain_timeout`` seconds, end with finish_reason ``"cancelled"``; then exit 0); a
second Ctrl-C ends the process at once by SIGINT (status 130 in a shell), as ``trt-kv``'s
other commands end on Ctrl-C. uvicorn's own handlers are not installed: after a graceful
shutdown they raise the signal again, so a SIGTERM would end the process with 143.

The bound: a drain ends within ``drain_timeout + DRAIN_MARGIN_S`` seconds of the signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator

import uvicorn
from fastapi import FastAPI

from trt_kv.build_defaults import DRAIN_TIMEOUT_S
from trt_kv.errors import ArgumentError, mismatch
from trt_kv.serve.scheduler import EngineLoop

DRAIN_MARGIN_S = 5.0  # after it, for the cancelled streams' last chunks to be sent
# Seconds an idle connection stays open: above httpx's (so the openai client's) 5 s
# keepalive_expiry, so a pooled connection is never closed by the server at the moment a client
# reuses it (uvicorn's own 5 s default races it: httpx.ReadError, seen once in five load tests)
KEEP_ALIVE_S = 15.0


class Server(uvicorn.Server):
    """uvicorn's server; its signals drain ``loop`` (see the module); ``on_ready(url)``
    once listening (the port bound, ``--port 0`` resolved)."""

    def __init__(
        self,
        config: uvicorn.Config,
        loop: EngineLoop,
        drain_timeout: float,
        on_ready: Callable[[str], None],
    ) -> None:
        super().__init__(config)
        self.loop, self.drain_timeout, self.on_ready = loop, drain_timeout, on_ready
        self.drainer: threading.Thread | None = None

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self.on_ready(f"http://{host}:{port}")

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # a server in a thread (tests): its owner stops it
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.signal(s, self.on_signal) for s in handled}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def on_signal(self, signum: int, frame: object) -> None:
        """First SIGINT/SIGTERM: drain; a second SIGINT: end now, by SIGINT."""
        if self.drainer is None:
            self.drain()
        elif signum == signal.SIGINT:
            print("trt-kv: interrupted", file=sys.stderr, flush=True)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    def drain(self) -> None:
        """Stop accepting and drain the loop (on a thread: it waits for the requests)."""
        print(
            f"trt-kv serve: draining: up to {self.drain_timeout:g} s for the requests in "
            "flight (Ctrl-C again quits now)",
            file=sys.stderr,
            flush=True,
        )
        self.drainer = threading.Thread(
            target=self.loop.drain, args=(self.drain_timeout,), name="trt-kv-drain", daemon=True
        )
        self.drainer.start()
        self.should_exit = True


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port) and listening, made before anything
    slow (the model) so that a port in use is said at once.

    Raises:
        ArgumentError: naming ``--port`` (or ``--host``): the address cannot be bound.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as e:
        raise ArgumentError(
            mismatch("--host", "an address of this machine", "", f"{host} ({e})")
        ) from None
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else type(e).__name__
        raise ArgumentError(
            mismatch("--port", f"a port free on {host}", "", f"{port} ({reason})")
        ) from None


def serve(
    app: FastAPI,
    loop: EngineLoop,
    *,
    host: str,
    port: int,
    drain_timeout: float = DRAIN_TIMEOUT_S,
    on_ready: Callable[[str], None] = lambda url: None,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``app`` on ``sock`` (:func:`listening_socket`), else on ``host:port``, until a
    signal drains it (see the module); returns once drained. ``loop`` is stopped on return."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=drain_timeout + DRAIN_MARGIN_S,
    )
    server = Server(config, loop, drain_timeout, on_ready)
    try:
        server.run(sockets=None if sock is None else [sock])
    finally:
        if server.drainer is not None:
            server.drainer.join(DRAIN_MARGIN_S)
        loop.stop()
