"""``trt-kv bench``: prefill and decode timed apart, per batch size and context length, on
any backend: median and spread over repeats, tokens/s, cache memory; a table or JSON."""

from __future__ import annotations

import argparse

from trt_kv.cli import backends, common, generate, options
from trt_kv.cli.checks import check_model, integer
from trt_kv.errors import ArgumentError, mismatch

EXAMPLE = "trt-kv bench --backend interpreter --batch 1 8 --context 128 2048 --repeats 5"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(
        p,
        {
            "max_seq_len": "S_max (None: context + decode steps)",
            "max_batch": "engine profile's batch bound (at least the largest --batch)",
        },
    )
    p.set_defaults(max_seq_len=None, max_batch=1, runtime_cache=None)  # bench: no cache file
    p.add_argument(
        "--backend",
        choices=("auto", *generate.BACKENDS),
        default="auto",
        help="backend to time (auto: tensorrt where a GPU is usable, else interpreter)",
    )
    options.add_threads_argument(p)
    p.add_argument("--batch", type=integer(1), nargs="+", default=[1], help="batch sizes")
    p.add_argument("--context", type=integer(1), nargs="+", default=[128], help="prompt lengths")
    p.add_argument(
        "--decode-steps", type=integer(1), default=16, help="decode steps timed per repeat"
    )
    p.add_argument("--repeats", type=integer(1), default=5, help="timed repeats (median, min, max)")
    p.add_argument("--warmup", type=integer(0), default=1, help="untimed repeats first")
    p.add_argument("--cuda-graph", action="store_true", help="tensorrt: decode as a CUDA graph")
    p.add_argument("--json", action="store_true", help="one JSON object with every sample")


def _stats(samples: list[float]) -> dict:
    """Median, min, max and all samples (milliseconds)."""
    import statistics

    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def measure(session: object, batch: int, context: int, args: argparse.Namespace) -> dict:
    """Prefill ms and decode ms/step for ``batch`` prompts of ``context`` tokens, over
    ``args.warmup`` + ``args.repeats`` runs (the warm-up ones dropped)."""
    import time

    vocab = session.backend.vocab_size
    prompts = [[(7 * b + 3 * t) % (vocab - 1) + 1 for t in range(context)] for b in range(batch)]
    prefill_ms, decode_ms = [], []
    for r in range(args.warmup + args.repeats):
        start = time.perf_counter()
        logits = session.prefill(prompts)  # in steps of max_step_tokens
        prefilled = time.perf_counter()
        for _ in range(args.decode_steps):
            logits = session.decode(logits.argmax(axis=-1))
        done = time.perf_counter()
        if r >= args.warmup:
            prefill_ms.append((prefilled - start) * 1e3)
            decode_ms.append((done - prefilled) * 1e3 / args.decode_steps)
    prefill, decode = _stats(prefill_ms), _stats(decode_ms)
    per_slot = session.memory()["total"] // session.capacity
    return {
        "batch": batch,
        "context": context,
        "max_seq_len": session.state.max_seq_len,
        "max_step_tokens": session.backend.max_step_tokens,
        "prefill_ms": prefill,
        "prefill_tokens_per_s": batch * context / prefill["median"] * 1e3,
        "decode_ms_per_step": decode,
        "decode_tokens_per_s": batch / decode["median"] * 1e3,
        "cache_bytes": per_slot * batch,
    }


def _spread(s: dict) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def format_rows(backend: str, model: str, dtype: str, rows: list[dict]) -> str:
    """The measurements as a table: one line per (context, batch), each naming the model,
    the dtype and the backend."""
    head = (
        "model",
        "dtype",
        "backend",
        "batch",
        "context",
        "S_max",
        "prefill ms (min-max)",
        "prefill tok/s",
        "decode ms/step (min-max)",
        "decode tok/s",
        "cache MiB",
    )
    body = [
        (
            model,
            dtype,
            backend,
            str(r["batch"]),
            str(r["context"]),
            str(r["max_seq_len"]),
            _spread(r["prefill_ms"]),
            f"{r['prefill_tokens_per_s']:.1f}",
            _spread(r["decode_ms_per_step"]),
            f"{r['decode_tokens_per_s']:.1f}",
            f"{r['cache_bytes'] / 2**20:.2f}",
        )
        for r in rows
    ]
    return common.table(head, body)


def check_sizes(args: argparse.Namespace) -> None:
    """Refuse, before any model is loaded, a ``--max-seq-len`` without room for the largest
    ``--context`` plus ``--decode-steps``, and a ``--max-step-tokens`` wider than the
    smallest S_max it is built with (ArgumentError naming the option)."""
    need = max(args.context) + args.decode_steps
    if args.max_seq_len is not None and need > args.max_seq_len:
        raise ArgumentError(
            mismatch(
                "--max-seq-len",
                "at least the largest --context + --decode-steps =",
                need,
                args.max_seq_len,
            )
        )
    s_max = args.max_seq_len or min(args.context) + args.decode_steps
    if args.max_step_tokens is not None and args.max_step_tokens > s_max:
        bound = "--max-seq-len" if args.max_seq_len else "the smallest --context + --decode-steps"
        raise ArgumentError(
            mismatch("--max-step-tokens", f"<= {bound} =", s_max, args.max_step_tokens)
        )


def run(args: argparse.Namespace) -> int:
    import json

    from trt_kv.runtime.session import Session

    backends.choose_backend(args)  # before loading any weights
    check_model(args)
    check_sizes(args)
    model = common.load_cli_model(args)
    name, config, weights = model.name, model.config, model.weights
    reference = args.backend == "reference"  # float32 only
    dtype = "float32" if reference else args.dtype or common.DEFAULT_DTYPE
    capacity = max(args.batch)
    rows = []
    for context in args.context:
        shape = {
            "max_seq_len": args.max_seq_len or context + args.decode_steps,
            "max_step_tokens": args.max_step_tokens,  # None: default_step_tokens(S_max)
            "max_batch": capacity,
            "engine": None,
        }
        backend_args = argparse.Namespace(**{**vars(args), **shape})
        with backends.opened_backend(backend_args, name, config, weights, capacity) as backend:
            session = Session(backend)
            for b in args.batch:
                try:
                    rows.append(measure(session, b, context, args))
                except MemoryError as err:  # a prefill step's activations, say
                    raise ArgumentError(
                        mismatch(
                            "--batch x --context",
                            "a step that fits host memory (try a smaller --max-step-tokens)",
                            "",
                            f"{b} x {context}: MemoryError ({err})",
                        )
                    ) from err
    if args.json:
        out = {"backend": args.backend, "model": name, "dtype": dtype, "results": rows}
        print(json.dumps(out))
    else:
        print(format_rows(args.backend, name, dtype, rows))
    return 0
