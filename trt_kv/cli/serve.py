"""``trt-kv serve``: OpenAI's HTTP API (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``, ``/metrics``) over one engine, batching requests continuously
(:mod:`trt_kv.serve`). One line with the URL on stdout when ready. SIGTERM or Ctrl-C drains
(up to ``--drain-timeout`` seconds for the requests in flight, then exit 0); Ctrl-C again
quits at once (status 130)."""

from __future__ import annotations

import argparse
import sys

from trt_kv import build_defaults as defaults
from trt_kv.cli import common, options
from trt_kv.cli.checks import integer, real

EXAMPLE = "trt-kv serve --backend interpreter --port 8000 --max-batch 8"
HOST, PORT = "127.0.0.1", 8000


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p, {"max_batch": "slots: most sequences decoding at once"})
    options.add_device_arguments(p)
    options.add_backend_argument(p)
    p.add_argument("--host", default=HOST, help="address to listen on")
    p.add_argument("--port", type=integer(0, 65535), default=PORT, help="port (0: any free)")
    p.add_argument("--api-key", help="answer 401 unless requests carry Authorization: Bearer KEY")
    p.add_argument(
        "--max-queue",
        type=integer(1),
        default=defaults.MAX_QUEUE,
        help="requests that may wait for a slot; more get 429 with Retry-After",
    )
    p.add_argument(
        "--prefill-chunk",
        type=integer(1),
        default=defaults.PREFILL_CHUNK,
        help="prompt tokens prefilled per step between the running sequences' decode steps "
        "(at most --max-step-tokens)",
    )
    p.add_argument(
        "--drain-timeout",
        type=real(0.0),
        default=defaults.DRAIN_TIMEOUT_S,
        help="seconds the requests in flight get to finish after SIGTERM or Ctrl-C; then "
        "they end with finish_reason 'cancelled' and the server exits 0",
    )


def run(args: argparse.Namespace) -> int:
    from trt_kv.cli.serve_engine import served_engine
    from trt_kv.serve.http.app import create_app
    from trt_kv.serve.http.server import listening_socket, serve

    sock = listening_socket(args.host, args.port)  # a port in use is said before the model loads
    with sock, served_engine(args) as engine:
        app = create_app(
            engine.loop, engine.tokenizer, model_name=engine.model_name, api_key=args.api_key
        )

        def ready(url: str) -> None:
            print(
                f"trt-kv serve: {engine.model_name} on {engine.backend} at {url}/v1 "
                f"(Ctrl-C drains, twice quits)",
                flush=True,
            )

        serve(
            app, engine.loop, host=args.host, port=args.port,
            drain_timeout=args.drain_timeout, on_ready=ready, sock=sock,
        )  # fmt: skip
    print("trt-kv serve: drained", file=sys.stderr)
    return 0
