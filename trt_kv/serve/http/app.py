"""The FastAPI app: OpenAI's routes over one :class:`~trt_kv.serve.scheduler.EngineLoop`.

``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed as server-sent events,
``data: [DONE]`` last, or whole), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus text). With ``api_key``, the ``/v1`` routes answer 401 without
``Authorization: Bearer <api_key>``. The handlers only translate
(:mod:`~trt_kv.serve.http.translate`, :mod:`~trt_kv.serve.http.responses`); the loop
schedules and runs. Several apps may share a process (each its own metrics registry).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.serve.http.errors import ApiError, install_error_handlers, server_error
from trt_kv.serve.http.generation import Generation
from trt_kv.serve.http.metrics import ServerMetrics
from trt_kv.serve.http.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from trt_kv.serve.http.protocol import Request as GenerationRequest
from trt_kv.serve.http.responses import ChatFormat, CompletionFormat, Format
from trt_kv.serve.http.translate import (
    chat_prompt,
    completion_prompt,
    sampling_params,
    submit,
)
from trt_kv.serve.scheduler import EngineLoop


def create_app(
    loop: EngineLoop,
    tokenizer: TextTokenizer | None,
    *,
    model_name: str,
    api_key: str | None = None,
) -> FastAPI:
    """The app serving ``loop`` (started by the caller) as ``model_name``; ``tokenizer``
    None serves token ids only (``/v1/completions`` with an id prompt, text shown as
    ``<|id:N|>``). The app neither starts nor stops the loop."""
    app = FastAPI(title="trt_kv", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics(loop.scheduler.stats)
    observe(loop, metrics.on_step)
    app.state.loop, app.state.metrics, app.state.model_name = loop, metrics, model_name
    install_error_handlers(app)
    app.add_middleware(CountRequests, metrics=metrics)
    authorized = [Depends(bearer(api_key))] if api_key else []

    def served(request: GenerationRequest) -> None:
        if request.model != model_name:
            raise ApiError(
                404, f"model: expected {model_name!r} (this server's one model), got "
                f"{request.model!r}", param="model", code="model_not_found",
            )  # fmt: skip

    async def run(
        request: Request,
        body: GenerationRequest,
        prompt: list[int],
        fmt: type[Format],
        kind: str,
    ) -> Response:
        started = time.monotonic()
        params = sampling_params(body, len(prompt), loop.scheduler.max_seq_len)
        ticket = submit(loop, prompt, params)
        generation = Generation(loop, ticket, tokenizer, body.stop, metrics, started)
        rendered = fmt(
            f"{kind}-{ticket.request_id}", model_name, tokenizer, body.top_count() is not None
        )
        if body.stream:
            events = sse(generation, rendered, body.include_usage())
            return ClosingStreamingResponse(events, media_type="text/event-stream")
        if await whole_or_gone(generation, request):
            return Response(status_code=CLIENT_GONE)  # nobody reads it; /metrics counts it
        failed = generation.error()
        if failed is not None:
            raise server_error(f"generation failed: {failed}")
        return JSONResponse(rendered.whole(generation).model_dump())

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        served(body)
        prompt = chat_prompt(body, tokenizer)
        return await run(request, body, prompt, ChatFormat, "chatcmpl")

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(request: Request, body: CompletionRequest) -> Response:
        served(body)
        prompt = completion_prompt(body, tokenizer)
        return await run(request, body, prompt, CompletionFormat, "cmpl")

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> JSONResponse:
        return JSONResponse(ModelList(data=[ModelCard(id=model_name)]).model_dump())

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 ``{"status": "ok"}``; 503 ``{"status": "draining"}`` once a drain began, and
        ``{"status": "stopped"}`` when the engine's loop no longer runs (as llama-server
        answers 503 while not ready: a balancer sends no more requests)."""
        if loop.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not loop.alive:
            return JSONResponse({"status": "stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return app


def observe(loop: EngineLoop, on_step: Callable[[object, float], None]) -> None:
    """Add ``on_step`` to the loop's step observer (kept: another app may watch it too)."""
    previous = loop.on_step

    def both(stats: object, seconds: float) -> None:
        if previous is not None:
            previous(stats, seconds)
        on_step(stats, seconds)

    loop.on_step = both


def bearer(api_key: str) -> Callable[[Request], None]:
    """A dependency answering 401 unless ``Authorization: Bearer <api_key>``."""

    def check(request: Request) -> None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip(), api_key):
            raise ApiError(
                401, "a valid API key is needed: Authorization: Bearer <key>",
                code="invalid_api_key",
            )  # fmt: skip

    return check


CLIENT_GONE = 499  # nginx's "client closed request": a whole answer's client left first
DISCONNECT_POLL_S = 0.02  # how often a whole answer's wait looks for its client gone


async def whole_or_gone(generation: Generation, request: Request) -> bool:
    """Read ``generation`` to its end, unless the client disconnects first: then its
    ticket is cancelled (the generation closed) and its slots free at the next step.
    Returns whether the client is gone."""

    async def read() -> None:
        async for _ in generation.pieces():
            pass

    reading = asyncio.ensure_future(read())
    try:
        while not reading.done():
            if await request.is_disconnected():
                return True
            await asyncio.wait({reading}, timeout=DISCONNECT_POLL_S)
        reading.result()  # (what it raised)
        return False
    finally:
        if not reading.done():
            reading.cancel()  # closes the pieces and the loop's events: the ticket cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await reading


def frame(data: str) -> str:
    """One server-sent event."""
    return f"data: {data}\n\n"


async def sse(generation: Generation, fmt: Format, include_usage: bool) -> AsyncIterator[str]:
    """A stream's events: chat's role chunks, a chunk per piece with text, a token or an
    end; a failed choice as an error event (OpenAI's error body; the ``openai`` client
    raises it); the usage chunk when asked for; ``[DONE]``."""
    for chunk in fmt.opening(len(generation.choices)):
        yield frame(chunk.model_dump_json())
    async for piece in generation.pieces():
        if piece.error is not None or piece.finish_reason == "error":
            error = server_error(f"generation failed: {piece.error or 'error'}")
            yield frame(json.dumps(error.body()))
            break
        yield frame(fmt.chunk(piece).model_dump_json())
    if include_usage:
        yield frame(fmt.usage_chunk(generation.usage()).model_dump_json())
    yield frame("[DONE]")


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its body iterator however the response ends: a
    client gone mid-stream closes the generation, whose ticket is then cancelled and its
    slot freed at the next step."""

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models")  # counted by name


class CountRequests:
    """ASGI middleware counting each ``/v1`` answer by endpoint (another path: ``other``)
    and status."""

    def __init__(self, app: Callable, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                endpoint = path if path in ROUTES else "other"
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
