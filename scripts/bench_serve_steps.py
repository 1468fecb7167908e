"""The scheduler's step shapes on the CPU interpreter, default model: why a prefill chunk
runs as its own step beside the running sequences' decode step (never one padded step), and
which chunk size ``trt_kv.build_defaults.PREFILL_CHUNK`` takes.

    python scripts/bench_serve_steps.py                  # float16, 8 running sequences
    python scripts/bench_serve_steps.py --chunks 32 64 128 --repeat 5

For each chunk C: one decode step of B sequences (1 token each), one chunk step (1 x C),
their sum (what the scheduler runs per step boundary while a prompt prefills), and one padded
step of 1 x C + (B - 1) x 1 tokens (every row padded to C). Median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from trt_kv.models.architectures import architecture_of
from trt_kv.models.loading import load_model
from trt_kv.runtime.interpreter_backend import InterpreterBackend
from trt_kv.runtime.session import Session


def timed(run: Callable[[], object], repeat: int) -> float:
    """Median milliseconds of ``run()``."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = load_model("default", progress=False)
    arch = architecture_of(model.config)
    s_max, b = 1024, args.batch
    net = arch.build_network(
        model.config, model.weights, max_seq_len=s_max, max_batch=b,
        max_step_tokens=max(args.chunks), dtype=args.dtype,
    )  # fmt: skip
    session = Session(InterpreterBackend(net))
    history = [[1 + (7 * t + k) % 500 for t in range(64)] for k in range(b)]
    print(f"interpreter {args.dtype}, default model, {b} sequences at 64 tokens")
    print("| chunk C | decode B x 1 | chunk 1 x C | sum | padded 1 x C + (B-1) x 1 | chunk/token |")
    print("|---:|---:|---:|---:|---:|---:|")
    session.prefill(history)
    with session.frozen():  # steps run, lengths stay: every run from 64 tokens
        dec = timed(lambda: session.decode([5] * b), args.repeat)
        for c in args.chunks:
            prompt = [1 + (3 * t) % 500 for t in range(c)]
            chk = timed(lambda p=prompt: session.step([p], lo=0), args.repeat)
            pad = timed(lambda p=prompt: session.step([p] + [[5]] * (b - 1)), args.repeat)
            row = f"| {c} | {dec:.0f} ms | {chk:.0f} ms | {dec + chk:.0f} ms | {pad:.0f} ms |"
            print(row + f" {chk / c:.2f} ms |")


if __name__ == "__main__":
    main()
