"""Scale-out on Ray Serve: replicas that each hold one engine (a started
:class:`~trt_kv.serve.scheduler.EngineLoop` over one ``Session``) and serve
:func:`~trt_kv.serve.http.app.create_app`'s OpenAI routes behind Ray's HTTP proxy.

    from functools import partial
    from ray import serve
    from trt_kv.cli.serve_engine import served_engine
    from trt_kv.serve.ray_app import deployment

    engine = partial(served_engine, ["--backend", "interpreter", "--max-batch", "8"])
    serve.run(deployment(engine, replicas=2, num_cpus=1), route_prefix="/")

``factory`` is a picklable callable that returns a context manager yielding the engine (what
``trt-kv serve`` builds from its options: :func:`trt_kv.cli.serve_engine.served_engine`, which
this module, below the CLI, does not import). Each replica calls it once, in its own process,
and closes it when Ray stops the replica. Ray's proxy routes each request to one replica;
continuous batching happens inside it, over its own slots. Every response carries
``x-trt-kv-replica``, the replica that answered (its Ray replica id).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Protocol

from fastapi import FastAPI
from ray import serve

from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.serve.http.app import create_app
from trt_kv.serve.scheduler import EngineLoop

REPLICA_HEADER = "x-trt-kv-replica"
# requests Ray's proxy sends one replica at once before it queues them in the proxy: the
# engine's own queue (build_defaults.MAX_QUEUE, 64) and slots (8) decide, so above both
MAX_ONGOING_REQUESTS = 128


class Engine(Protocol):
    """What a replica serves: a started loop, its tokenizer (None: token ids only), the
    model's name (requests' ``model``)."""

    loop: EngineLoop
    tokenizer: TextTokenizer | None
    model_name: str


EngineFactory = Callable[[], AbstractContextManager[Engine]]


class ReplicaHeader:
    """ASGI middleware: every HTTP response gets ``x-trt-kv-replica: <name>`` (streams
    too: it adds the header to the response's start and passes the body through)."""

    def __init__(self, app: Callable, name: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), name.encode())

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)


@serve.ingress()  # the app is built in the replica, over its engine (__serve_build_asgi_app__)
class EngineReplica:
    """One Ray Serve replica: the engine ``factory()`` yields, served by ``create_app``
    (with ``api_key``: 401 without it). The engine is closed when Ray stops the replica."""

    def __init__(self, factory: EngineFactory, api_key: str | None = None) -> None:
        self._stack = ExitStack()
        self.engine = self._stack.enter_context(factory())
        self.api_key = api_key

    def __serve_build_asgi_app__(self) -> FastAPI:
        engine = self.engine
        app = create_app(
            engine.loop, engine.tokenizer, model_name=engine.model_name, api_key=self.api_key
        )
        app.add_middleware(ReplicaHeader, name=serve.get_replica_context().replica_id.unique_id)
        return app

    def check_health(self) -> None:
        """Ray's periodic health check: raises once the engine's loop no longer steps, so Ray
        replaces this replica instead of routing requests to it."""
        if not self.engine.loop.alive:
            raise RuntimeError("trt_kv: the replica's engine loop has stopped")

    def __del__(self) -> None:
        self._stack.close()


def deployment(
    factory: EngineFactory,
    *,
    replicas: int = 1,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    api_key: str | None = None,
    max_ongoing_requests: int = MAX_ONGOING_REQUESTS,
) -> serve.Application:
    """The Ray Serve application: ``replicas`` replicas of :class:`EngineReplica`, each
    reserving ``num_cpus`` of the cluster's CPUs and ``num_gpus`` of its GPUs (fractions
    allowed; a GPU engine: ``num_gpus=1``, a replica per GPU), each building its own engine
    from ``factory``. Serve it with ``serve.run(app, route_prefix="/")`` or ``serve run``."""
    return serve.deployment(
        EngineReplica,
        name="trt_kv",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
        max_ongoing_requests=max_ongoing_requests,
    ).bind(factory, api_key)
