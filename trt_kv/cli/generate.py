"""``trt-kv generate``: prompts in, generated ids (and text) out, on any backend."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trt_kv.cli import common
from trt_kv.cli.checks import (
    check_backend_options,
    check_model,
    check_prompt_lengths,
    check_vocabulary,
    integer,
    prompt_ids,
    real,
)
from trt_kv.errors import ArgumentError, ConfigError, mismatch

HELP = "generate tokens for prompts on a chosen backend"
EXAMPLE = 'trt-kv generate --prompt-ids "1,2,3;4,5" --max-new-tokens 8 --backend interpreter'
BACKENDS = ("reference", "interpreter", "tensorrt", "polygraphy")
GPU_BACKENDS = ("tensorrt", "polygraphy")
DEFAULT_PROMPT_IDS = "1,2,3,4,5;6,7,8"


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    """Prompt, sampling and output options (``generate`` and ``demo``)."""
    common.add_model_arguments(p)
    p.add_argument(
        "--prompt-ids", help=f"token ids, ';' per prompt (default: {DEFAULT_PROMPT_IDS})"
    )
    p.add_argument("--prompt", help="text (needs tokenizer.json in --model)")
    p.add_argument(
        "--max-new-tokens", type=integer(1), default=8, help="tokens to generate per prompt"
    )
    p.add_argument("--temperature", type=real(0.0), default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=integer(1), help="sample from the k most likely tokens")
    p.add_argument("--seed", type=integer(0), default=0, help="sampling seed")
    p.add_argument("--engine", type=Path, help="engine file for tensorrt/polygraphy")
    p.add_argument("--cuda-graph", action="store_true", help="replay decode as a CUDA graph")
    p.add_argument(
        "--emulate-gpu",
        action="store_true",
        help="run tensorrt/polygraphy on trt_kv's emulated GPU, on the CPU (a test of the "
        "decode loop; results are emulated, not measured on a GPU)",
    )
    p.add_argument("--json", action="store_true", help="one JSON line: backend, ids, tokens/s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_generation_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default="reference", help="where to run")


def read_prompts(args: argparse.Namespace) -> tuple[list[list[int]], object | None]:
    """``(prompts, tokenizer)`` from ``--prompt-ids`` or ``--prompt`` (then the model's
    tokenizer). Raises ArgumentError or ConfigError."""
    if args.prompt is None:
        ids = DEFAULT_PROMPT_IDS if args.prompt_ids is None else args.prompt_ids
        return prompt_ids(ids), None
    if args.prompt_ids is not None:
        raise ArgumentError("--prompt: expected --prompt or --prompt-ids, got both")
    tok_path = Path(args.model) / "tokenizer.json"
    if not tok_path.is_file():
        raise ConfigError(
            f"--prompt: expected {tok_path} (a model folder with tokenizer.json), "
            "got none; use --prompt-ids"
        )
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(tok_path))
    except Exception as err:  # tokenizers raises plain Exception for a malformed file
        raise ConfigError(mismatch(str(tok_path), "a tokenizer.json", "", err)) from err
    ids = tokenizer.encode(args.prompt).ids
    if not ids:
        raise ArgumentError(
            mismatch("--prompt", "text with at least one token", "", repr(args.prompt))
        )
    return [ids], tokenizer


def make_backend(
    args: argparse.Namespace, name: str, config: object, weights: object, batch: int
) -> object:
    """The backend ``args.backend`` for this model (building what it needs)."""
    from trt_kv.runtime.cuda import require_gpu

    step_tokens = common.max_step_tokens(args)
    if args.backend == "reference":
        from trt_kv.runtime.reference_backend import ReferenceBackend

        return ReferenceBackend(
            config,
            weights,
            capacity=batch,
            max_seq_len=args.max_seq_len,
            max_step_tokens=step_tokens,
        )
    if args.backend == "interpreter":
        from trt_kv.models.llama import build_llama_network
        from trt_kv.runtime.interpreter_backend import InterpreterBackend

        net = build_llama_network(
            config,
            weights,
            max_seq_len=args.max_seq_len,
            max_batch=batch,
            max_step_tokens=step_tokens,
            dtype=args.dtype,
            routes=args.routes,
        )
        return InterpreterBackend(net)
    require_gpu(f"--backend {args.backend}")
    path = args.engine
    if path is None:
        built = common.model_engine(args, name, config, weights, batch)
        print(f"engine {built.path}: {common.engine_status(built)}", file=sys.stderr)
        path = built.path
    if args.backend == "polygraphy":
        from trt_kv.runtime.polygraphy_backend import PolygraphyBackend

        return PolygraphyBackend(path)
    from trt_kv.runtime.trt_backend import TrtBackend

    return TrtBackend(path, cuda_graph=args.cuda_graph)


def run(args: argparse.Namespace) -> int:
    if args.emulate_gpu:
        from trt_kv.emulator import emulated_gpu

        with emulated_gpu():
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    import json

    from trt_kv.examples import load_model
    from trt_kv.runtime.cuda import require_gpu
    from trt_kv.runtime.generate import generate
    from trt_kv.runtime.sampling import Sampler
    from trt_kv.runtime.session import Session

    check_backend_options(args, args.backend)
    if args.backend in GPU_BACKENDS:
        require_gpu(f"--backend {args.backend}")  # fail before loading any weights
    check_model(args)
    prompts, tokenizer = read_prompts(args)
    option = "--prompt" if tokenizer else "--prompt-ids"
    step_tokens = common.max_step_tokens(args)
    check_prompt_lengths(prompts, step_tokens, args.max_seq_len, args.max_new_tokens, option)
    sampler = Sampler(args.temperature, args.top_k, args.seed)
    name, config, weights = load_model(args.model)
    check_vocabulary(prompts, config.vocab_size, option)
    backend = make_backend(args, name, config, weights, len(prompts))
    try:
        result = generate(Session(backend), prompts, args.max_new_tokens, sampler)
    finally:
        getattr(backend, "close", lambda: None)()  # GPU backends: runner, graphs, stream
    if args.json:
        print(
            json.dumps(
                {
                    "backend": backend.name,
                    "emulated_gpu": args.emulate_gpu,
                    "ids": result.ids,
                    "tokens_per_s": round(result.tokens_per_s, 3),
                }
            )
        )
        return 0
    for k, ids in enumerate(result.ids):
        text = f"  {tokenizer.decode(ids)!r}" if tokenizer else ""
        print(f"[{k}] {ids}{text}")
    where = " (emulated GPU)" if args.emulate_gpu else ""
    print(f"{backend.name}{where}: {result.steps} steps, {result.tokens_per_s:.2f} tokens/s")
    return 0
