"""What several subcommands share: the model/engine options, the model engine (reused or
built), and plain-text tables. Nothing heavy is imported at module level."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trt_kv.jobs import BuiltFile

DTYPES = ("float16", "bfloat16", "float32")
# trt_kv.engine_file.ENGINES_DIR, without importing NumPy and TensorRT to print --help.
ENGINES_DIR = Path(__file__).resolve().parent.parent.parent / "engines"


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--model --dtype --max-seq-len --max-batch --max-step-tokens --out``."""
    p.add_argument(
        "--model",
        default="default",
        help="'default' (SmolLM2-135M-Instruct), a Hugging Face folder or a .gguf file",
    )
    p.add_argument("--dtype", default="float16", choices=DTYPES, help="weights and activations")
    p.add_argument("--max-seq-len", type=int, default=256, help="S_max of every cache")
    p.add_argument("--max-batch", type=int, default=8, help="most sequences per step")
    p.add_argument(
        "--max-step-tokens",
        type=int,
        default=None,
        help="longest prompt per step (None: min(64, max-seq-len))",
    )
    p.add_argument("--out", type=Path, default=ENGINES_DIR, help="engine folder")


def max_step_tokens(args: argparse.Namespace) -> int:
    """``--max-step-tokens``, defaulting to ``min(64, --max-seq-len)``."""
    if args.max_step_tokens is None:
        return min(64, args.max_seq_len)
    return args.max_step_tokens


def model_engine(
    args: argparse.Namespace, name: str, config: object, weights: object, batch: int
) -> BuiltFile:
    """The model engine for these arguments: reused from ``args.out`` when its sidecar was
    built for the same shapes, else (re)built."""
    from trt_kv.engine_file import load_engine_file
    from trt_kv.errors import EngineFileError
    from trt_kv.jobs import BuiltFile, build_llama_engine, model_engine_path

    want = {
        "max_seq_len": args.max_seq_len,
        "max_batch": max(batch, args.max_batch),
        "max_step_tokens": max_step_tokens(args),
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


def _caches(r: BuiltFile) -> str:
    """``"60 x [B, 3, 256, 64] float16"``: count, shape and dtype of the cache inputs."""
    kinds = sorted({(a.shape, a.dtype) for a in r.meta.aliases})
    shape = lambda s: "[" + ", ".join("B" if d == -1 else str(d) for d in s) + "]"  # noqa: E731
    return "; ".join(
        f"{sum((a.shape, a.dtype) == k for a in r.meta.aliases)} x {shape(k[0])} {k[1]}"
        for k in kinds
    )


def engine_table(rows: list[BuiltFile]) -> str:
    """One line per engine: file, bytes, caches, alias pairs, build seconds."""
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
    return table(head, body)


def table(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])
