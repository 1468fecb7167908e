"""``trt-kv generate``: prompts in, generated ids (and text) out, on any backend."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_kv.cli import common
from trt_kv.errors import TrtKvError

HELP = "generate tokens for prompts on a chosen backend"
EXAMPLE = 'trt-kv generate --prompt-ids "1,2,3;4,5" --max-new-tokens 8 --backend interpreter'
BACKENDS = ("reference", "interpreter", "tensorrt", "polygraphy")
GPU_BACKENDS = ("tensorrt", "polygraphy")


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    """Prompt, sampling and output options (``generate`` and ``demo``)."""
    common.add_model_arguments(p)
    p.add_argument("--prompt-ids", default="1,2,3,4,5;6,7,8", help="token ids, ';' per prompt")
    p.add_argument("--prompt", help="text (needs tokenizer.json in --model)")
    p.add_argument("--max-new-tokens", type=int, default=8, help="tokens to generate per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--engine", type=Path, help="engine file for tensorrt/polygraphy")
    p.add_argument("--cuda-graph", action="store_true", help="replay decode as a CUDA graph")
    p.add_argument("--json", action="store_true", help="one JSON line: backend, ids, tokens/s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_generation_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default="reference", help="where to run")


def _parse_ids(text: str) -> list[list[int]]:
    try:
        return [[int(t) for t in seq.split(",") if t.strip()] for seq in text.split(";")]
    except ValueError as e:
        raise TrtKvError(f"--prompt-ids: expected '1,2,3;4,5', got {text!r}") from e


def _prompts(args: argparse.Namespace) -> tuple[list[list[int]], object | None]:
    if args.prompt is None:
        return _parse_ids(args.prompt_ids), None
    tok_path = Path(args.model) / "tokenizer.json"
    if not tok_path.is_file():
        raise TrtKvError(
            f"--prompt: expected {tok_path} (a model folder with tokenizer.json), "
            "got none; use --prompt-ids"
        )
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tok_path))
    return [tokenizer.encode(args.prompt).ids], tokenizer


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
        )
        return InterpreterBackend(net)
    require_gpu(f"--backend {args.backend}")
    path = args.engine or common.model_engine(args, name, config, weights, batch).path
    if args.backend == "polygraphy":
        from trt_kv.runtime.polygraphy_backend import PolygraphyBackend

        return PolygraphyBackend(path)
    from trt_kv.runtime.trt_backend import TrtBackend

    return TrtBackend(path, cuda_graph=args.cuda_graph)


def run(args: argparse.Namespace) -> int:
    import json

    from trt_kv.examples import load_model
    from trt_kv.runtime.cuda import require_gpu
    from trt_kv.runtime.generate import generate
    from trt_kv.runtime.sampling import Sampler
    from trt_kv.runtime.session import Session

    if args.backend in GPU_BACKENDS:
        require_gpu(f"--backend {args.backend}")  # fail before loading any weights
    prompts, tokenizer = _prompts(args)
    name, config, weights = load_model(args.model)
    backend = make_backend(args, name, config, weights, len(prompts))
    sampler = Sampler(args.temperature, args.top_k, args.seed)
    result = generate(Session(backend), prompts, args.max_new_tokens, sampler)
    if args.json:
        print(
            json.dumps(
                {
                    "backend": backend.name,
                    "ids": result.ids,
                    "tokens_per_s": round(result.tokens_per_s, 3),
                }
            )
        )
        return 0
    for k, ids in enumerate(result.ids):
        text = f"  {tokenizer.decode(ids)!r}" if tokenizer else ""
        print(f"[{k}] {ids}{text}")
    print(f"{backend.name}: {result.steps} steps, {result.tokens_per_s:.2f} tokens/s")
    return 0
