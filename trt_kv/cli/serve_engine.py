"""The engine a server runs, from ``trt-kv serve``'s options: model, tokenizer, backend,
``Session``, :class:`~trt_kv.serve.scheduler.Scheduler` and a started
:class:`~trt_kv.serve.scheduler.EngineLoop`, built as ``generate`` builds its backend (the
same options, checks, engine reuse and ``--emulate-gpu``). :func:`served_engine` takes the
options as a command line, so that another front end (a Ray Serve replica) builds the same
engine without running the CLI:

    with served_engine(["--backend", "interpreter", "--max-batch", "8"]) as engine:
        app = create_app(engine.loop, engine.tokenizer, model_name=engine.model_name)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trt_kv.cli import backends, common
from trt_kv.cli.checks import check_model
from trt_kv.errors import ArgumentError, ConfigError, mismatch

if TYPE_CHECKING:
    from trt_kv.checkpoints.tokenizer import TextTokenizer
    from trt_kv.serve.scheduler import EngineLoop


@dataclass(frozen=True)
class ServedEngine:
    """What a server needs: the started ``loop``, the ``tokenizer`` (None: the model has
    none), the ``model_name`` it answers to, and the backend's name."""

    loop: EngineLoop
    tokenizer: TextTokenizer | None
    model_name: str
    backend: str


def serve_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """``trt-kv serve``'s options parsed from ``argv`` (every default as the CLI has it).
    Raises SystemExit(2) with one line on stderr for a usage mistake, as the CLI does."""
    from trt_kv.cli import make_parser

    return make_parser("serve").parse_args(["serve", *argv])


@contextmanager
def served_engine(options: Sequence[str] | argparse.Namespace) -> Iterator[ServedEngine]:
    """The engine of ``options`` (a command line of ``trt-kv serve``'s options, or its
    parsed arguments), its loop started; on exit the loop is stopped (requests still in
    it end "cancelled") and the backend closed. With ``--emulate-gpu``, the block runs on the
    emulated GPU.

    Raises:
        ArgumentError: as ``trt-kv generate`` refuses its model and backend options;
            ``--engine`` without ``--model`` (a server needs the model's tokenizer and end
            ids). As :func:`trt_kv.models.loading.load_model` and the engine build.
    """
    from trt_kv.runtime.session import Session
    from trt_kv.serve.scheduler import EngineLoop, Scheduler

    args = options if isinstance(options, argparse.Namespace) else serve_arguments(options)
    with ExitStack() as stack:
        stack.enter_context(common.on_device(args))
        check_serve_options(args)
        model = common.load_cli_model(args)
        try:
            tokenizer = model.checkpoint.tokenizer()
        except ConfigError:
            tokenizer = None  # token ids in and out
        backend = stack.enter_context(
            backends.opened_backend(args, model.name, model.config, model.weights, args.max_batch)
        )
        scheduler = Scheduler(
            Session(backend),
            eos_ids=model.checkpoint.eos_token_ids,
            max_queue=args.max_queue,
            prefill_chunk=args.prefill_chunk,
        )
        loop = EngineLoop(scheduler)
        loop.start()
        stack.callback(scheduler.close)
        stack.callback(loop.stop)
        yield ServedEngine(loop, tokenizer, model.name, backend.name)


def check_serve_options(args: argparse.Namespace) -> None:
    """Every check that needs no model: the backend and the options it ignores, a GPU for
    a GPU backend, ``--model``/``--out``/sizes, ``--engine``'s files (its sizes taken).
    Raises ArgumentError (or the error of the check that failed)."""
    backends.choose_backend(args)
    if args.model is None:
        raise ArgumentError(
            mismatch("--model", "the model of --engine (its tokenizer and end ids)", "", "none")
        )
    check_model(args)
    if args.engine is not None:
        backends.take_engine_sizes(args, backends.engine_sidecar(args.engine))
