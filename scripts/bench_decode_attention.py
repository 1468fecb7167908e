"""Decode-step attention: the native helper's against NumPy's passes, per key count.

    python scripts/bench_decode_attention.py
    python scripts/bench_decode_attention.py --batch 1 8 --keys 32 128 1024 --heads 9 3

q ``[B, Nq, 1, H]`` (float32, H = 64) against windows ``k, v [B, Nkv, n, H]`` of caches
``[B, Nkv, n + 64, H]`` with a decode step's bool mask ``[B, 1, 1, S_max]`` (SmolLM2-135M's
heads by default: 9 query heads on 3 KV heads), each side as the fast plan's attention layer
runs it: ``native`` builds the keep mask and calls :func:`trt_kv.interpreter.native.attention`,
``numpy`` is :func:`trt_kv.reference.ops.attention` with the fast plan's scores product (the
helper's product on ``--threads`` threads; the attention itself runs on one, BLAS on one). A
cell is the best of ``--repeats`` medians of ``--calls`` calls, in microseconds; ``ratio`` is
native / numpy (below 1: the helper is faster), ``pays`` what
``attention.native_attention_pays`` chooses for the shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # NumPy's side: one thread, as the helper

import numpy as np

from trt_kv.interpreter import attention, native, products
from trt_kv.reference import ops

KEYS = (32, 64, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)


def _timed(fn: Callable[[], object], calls: int, repeats: int) -> float:
    """The best of ``repeats`` medians of ``calls`` calls of ``fn``, in microseconds."""
    best = float("inf")
    for _ in range(repeats):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        best = min(best, statistics.median(times))
    return best * 1e6


def _case(b: int, nq: int, nkv: int, n: int, h: int) -> tuple[np.ndarray, ...]:
    """q, the k and v windows and the decode mask ``[B, 1, 1, n]`` of one step."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, nq, 1, h), np.float32)
    caches = [rng.standard_normal((b, nkv, n + 64, h), np.float32) for _ in range(2)]
    mask = np.zeros((b, 1, 1, n + 64), bool)
    mask[..., :n] = True
    return q, caches[0][:, :, :n], caches[1][:, :, :n], mask[..., :n]


def _native_side(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, keep_args: tuple
) -> np.ndarray:
    """The fast plan's native route: the keep mask built, then the helper's attention."""
    keep = ops.causal_keep(*keep_args) & mask
    return native.attention(q, k, v, keep, scale=1.0)


def _numpy_side(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The fast plan's NumPy route: the reference's passes with its few-row scores product."""
    return ops.attention(
        q, k, v, causal="none", scale=1.0, mask=mask, scores_product=attention._few_row_scores
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--keys", type=int, nargs="+", default=list(KEYS))
    parser.add_argument("--heads", type=int, nargs=2, default=[9, 3], metavar=("NQ", "NKV"))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="the helper's product threads")
    args = parser.parse_args()
    products.set_threads(args.threads)
    if native.LIB is None:
        raise SystemExit("the native helper is not built: python setup.py build_ext --inplace")
    f32 = np.dtype(np.float32)
    print("| B | keys | native us | numpy us | ratio | pays |")
    print("|---|---|---|---|---|---|")
    for b in args.batch:
        for n in args.keys:
            q, k, v, mask = _case(b, *args.heads, n, 64)

            keep_args = (1, n, "none", None, b)
            run_native = partial(_native_side, q, k, v, mask, keep_args)
            run_numpy = partial(_numpy_side, q, k, v, mask)
            times = [_timed(fn, args.calls, args.repeats) for fn in (run_native, run_numpy)]
            pays = attention.native_attention_pays(q, k, v, mask, f32)
            ratio = times[0] / times[1]
            print(f"| {b} | {n} | {times[0]:.0f} | {times[1]:.0f} | {ratio:.2f} | {pays} |")


if __name__ == "__main__":
    main()
