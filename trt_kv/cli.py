"""``trt-kv``: build engines, generate tokens, run the demo.

trt-kv build                       # doc example + default model engines into engines/
trt-kv generate --prompt-ids "1,2,3;4,5" --max-new-tokens 8 --backend interpreter --json
trt-kv demo                        # build, then generate on the best backend here
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from trt_kv._trt import FEATURES
from trt_kv.engine_file import ENGINES_DIR, load_engine_file
from trt_kv.errors import EngineFileError, TrtKvError
from trt_kv.examples import load_model
from trt_kv.jobs import BuiltFile, build_doc_example, build_llama_engine, model_engine_path
from trt_kv.runtime.cuda import gpu_unavailable_reason, require_gpu
from trt_kv.runtime.generate import generate
from trt_kv.runtime.sampling import Sampler
from trt_kv.runtime.session import Session

BACKENDS = ("reference", "interpreter", "tensorrt", "polygraphy")


def _caches(r: BuiltFile) -> str:
    """``"60 x [B, 3, 256, 64] float16"``: count, shape and dtype of the cache inputs."""
    kinds = sorted({(a.shape, a.dtype) for a in r.meta.aliases})
    shape = lambda s: "[" + ", ".join("B" if d == -1 else str(d) for d in s) + "]"  # noqa: E731
    return "; ".join(
        f"{sum((a.shape, a.dtype) == k for a in r.meta.aliases)} x {shape(k[0])} {k[1]}"
        for k in kinds
    )


def _table(rows: list[BuiltFile]) -> str:
    head = ("engine", "bytes", "caches", "alias pairs", "build s")
    body = [
        (
            r.path.name,
            f"{r.meta.nbytes:,}",
            _caches(r),
            str(len(r.meta.aliases)),
            f"{r.meta.build_seconds:.2f}",
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="'default' or a Hugging Face folder")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--max-seq-len", type=int, default=256, help="S_max of every cache")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument(
        "--max-step-tokens",
        type=int,
        default=None,
        help="longest prompt per step (default min(64, max-seq-len))",
    )
    p.add_argument("--out", type=Path, default=ENGINES_DIR)


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    if args.max_step_tokens is None:
        args.max_step_tokens = min(64, args.max_seq_len)
    return args


def _model_engine(
    args: argparse.Namespace, name: str, config: object, weights: object, batch: int
) -> BuiltFile:
    """The model engine for these arguments: reused from ``args.out`` when its sidecar was
    built for the same shapes, else (re)built."""
    want = {
        "max_seq_len": args.max_seq_len,
        "max_batch": max(batch, args.max_batch),
        "max_step_tokens": args.max_step_tokens,
        "dtype": args.dtype,
    }
    path = model_engine_path(name, args.dtype, args.out)
    if path.is_file() and args.command != "build":
        try:
            _, meta = load_engine_file(path)
            if all(meta.metadata.get(k) == v for k, v in want.items()):
                return BuiltFile(path, meta)
        except EngineFileError:
            pass  # stale or tampered: rebuild
    return build_llama_engine(name, config, weights, out_dir=args.out, **want)


def cmd_build(args: argparse.Namespace) -> int:
    rows = [build_doc_example(args.out)]
    if not args.no_model:
        name, config, weights = load_model(args.model)
        rows.append(_model_engine(args, name, config, weights, args.max_batch))
    print(f"built with {FEATURES.module} {FEATURES.version} into {args.out}")
    print(_table(rows))
    return 0


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
    if args.backend == "reference":
        from trt_kv.runtime.reference_backend import ReferenceBackend

        return ReferenceBackend(
            config,
            weights,
            capacity=batch,
            max_seq_len=args.max_seq_len,
            max_step_tokens=args.max_step_tokens,
        )
    if args.backend == "interpreter":
        from trt_kv.models.llama import build_llama_network
        from trt_kv.runtime.interpreter_backend import InterpreterBackend

        net = build_llama_network(
            config,
            weights,
            max_seq_len=args.max_seq_len,
            max_batch=batch,
            max_step_tokens=args.max_step_tokens,
            dtype=args.dtype,
        )
        return InterpreterBackend(net)
    require_gpu(f"--backend {args.backend}")
    path = args.engine or _model_engine(args, name, config, weights, batch).path
    if args.backend == "polygraphy":
        from trt_kv.runtime.polygraphy_backend import PolygraphyBackend

        return PolygraphyBackend(path)
    from trt_kv.runtime.trt_backend import TrtBackend

    return TrtBackend(path, cuda_graph=args.cuda_graph)


def cmd_generate(args: argparse.Namespace) -> int:
    if args.backend in ("tensorrt", "polygraphy"):
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


def cmd_demo(args: argparse.Namespace) -> int:
    args.no_model = False
    cmd_build(args)
    reason = gpu_unavailable_reason()
    args.backend = "tensorrt" if reason is None else "interpreter"
    if reason is not None:
        print(
            f"\nno GPU here ({reason}): the engine above cannot run on this machine; "
            "running the same network's decode loop on the CPU interpreter instead"
        )
    print(
        f"\ngenerate: backend={args.backend} prompts={args.prompt_ids} "
        f"max_new_tokens={args.max_new_tokens}"
    )
    return cmd_generate(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trt-kv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build the doc example and model engines")
    _model_args(p)
    p.add_argument("--no-model", action="store_true", help="only the doc example")
    p.set_defaults(func=cmd_build)
    for command, func in (("generate", cmd_generate), ("demo", cmd_demo)):
        p = sub.add_parser(command)
        _model_args(p)
        p.add_argument("--prompt-ids", default="1,2,3,4,5;6,7,8")
        p.add_argument("--prompt", help="text (needs tokenizer.json in --model)")
        p.add_argument("--max-new-tokens", type=int, default=8)
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--top-k", type=int)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--engine", type=Path, help="engine file for tensorrt/polygraphy")
        p.add_argument("--cuda-graph", action="store_true")
        p.add_argument("--json", action="store_true")
        if command == "generate":
            p.add_argument("--backend", choices=BACKENDS, default="reference")
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    try:
        return args.func(_resolve(args))
    except TrtKvError as e:
        print(f"trt-kv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
