"""The CPU interpreter against llama.cpp on the same GGUF (issue 41): prefill and decode.

    python scripts/bench_llama_cpp.py                      # the default model, 1 and 2 threads
    python scripts/bench_llama_cpp.py --threads 1 --steps 16 --no-llama

For each weight format (``float16``: the float16 engine's network; ``keep``: the GGUF's
quantized matrices kept, run as block products), each thread count and batch (1, 8): a
128-token prefill (tokens/s) and decode steps after it (ms/step, ms/token), the time a step
spends in the products (``products.multiply``: every helper / BLAS product route) against
the rest, and with ``keep`` the bytes the interpreter holds for the quantized matrices
(codes + scales + offsets) against those tensors' bytes in the GGUF. llama.cpp's
``llama-bench -p 128 -n 128`` runs in the same process tree at each thread count
(``$LLAMA_BENCH``, else ``../shared/llama.cpp/run llama-bench``, beside the checkout or its
folder). Targets (issue 41): decode
B=1 keep <= 1.25x llama.cpp's ms/token; prefill not below llama.cpp's; held bytes <= 1.1x.
``--rounds`` rounds (default 3) each run llama.cpp, then every case of ours, so that each
ratio compares runs minutes apart: a machine others share moves both sides by 15-50%
within a few minutes. A figure is the median over the rounds of each round's median of its
steps (best: the least step); a ratio is the median of the rounds' own ratios, each listed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the BLAS routes: one thread, as timed

import numpy as np

from trt_kv.checkpoints import default_gguf
from trt_kv.interpreter import compile_network, products
from trt_kv.interpreter.blocks import BlockWeight
from trt_kv.models.llama import build_llama_network
from trt_kv.models.loading import load_model

PROMPT = 128
# ../shared/llama.cpp/run beside the checkout (or beside the folder of worktrees holding it)
ROOT = Path(__file__).resolve().parents[1]
LLAMA_RUNS = [folder / "shared" / "llama.cpp" / "run" for folder in (ROOT.parent, ROOT.parents[1])]


class ProductClock:
    """Seconds spent in the products: ``products.multiply`` (every helper / BLAS route), the
    calls ``products.block_caller`` binds for a plan's fused block products and the calls of
    the decode steps bound once (``products.block_binder``), all wrapped while the bench runs
    (created before the plans compile: their steps take the wrapped calls then); :meth:`close`
    puts them back."""

    def __init__(self) -> None:
        self.seconds, self._inside = 0.0, False  # inside: a product timed already (no twice)
        self.inner = products.multiply, products.block_caller, products.block_binder
        products.multiply = self._timed(products.multiply)
        caller, binder = products.block_caller, products.block_binder
        products.block_caller = lambda *args: self._timed(caller(*args))
        products.block_binder = lambda *args: self._binding(binder(*args))

    def _timed(self, fn: Callable[..., object]) -> Callable[..., object]:
        def timed(*args: object) -> object:
            if self._inside:  # a bound call's fallback through multiply: timed by the call
                return fn(*args)
            self._inside, start = True, time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - start
                self._inside = False

        return timed

    def _binding(self, bind: Callable[[list], tuple | None]) -> Callable[[list], tuple | None]:
        def timed_bind(args: list) -> tuple | None:
            made = bind(args)
            return None if made is None else (made[0], self._timed(made[1]))

        return timed_bind

    def close(self) -> None:
        products.multiply, products.block_caller, products.block_binder = self.inner


def _feed(plan: object, caches: dict, ids: np.ndarray, start: np.ndarray) -> dict:
    b, s = ids.shape
    feed = {
        "input_ids": ids.astype(np.int32),
        "position_ids": (start[:, None] + np.arange(s)[None]).astype(np.int64),
        "write_indices": start.astype(np.int32),
        "last_token_rows": (np.arange(b) * s + s - 1).astype(np.int32),
    }
    names = set(plan.input_names)
    return {k: v for k, v in (feed | caches).items() if k in names}


def run_case(plan: object, model: object, batch: int, steps: int, clock: ProductClock) -> dict:
    """One prefill of ``PROMPT`` tokens a sequence, then ``steps`` decode steps."""
    cfg, s_max = model.config, PROMPT + steps + 1
    shape = (batch, cfg.num_key_value_heads, s_max, cfg.head_dim)
    names = [n for n in plan.input_names if n.startswith("past_")]
    caches = {n: np.zeros(shape, np.float32) for n in names}
    rng = np.random.default_rng(0)
    ids = rng.integers(1, cfg.vocab_size, (batch, PROMPT))
    feed = _feed(plan, caches, ids, np.zeros(batch, np.int64))
    start = time.perf_counter()
    plan.run(feed)
    prefill = time.perf_counter() - start
    times, product_times = [], []
    for i in range(steps):  # the feed made before the clock starts: the plan's step alone
        feed = _feed(
            plan, caches, rng.integers(1, cfg.vocab_size, (batch, 1)), np.full(batch, PROMPT + i)
        )
        clock.seconds = 0.0
        start = time.perf_counter()
        plan.run(feed)
        times.append(time.perf_counter() - start)
        product_times.append(clock.seconds)
    return {
        "prefill_tok_s": batch * PROMPT / prefill,
        "step_ms": 1e3 * float(np.median(times)),
        "step_best_ms": 1e3 * min(times),
        "products_ms": 1e3 * float(np.median(product_times)),
    }


def held_block_bytes() -> int:
    """Bytes of the live :class:`BlockWeight` objects (the plan's quantized matrices)."""
    gc.collect()
    return sum(o.nbytes for o in gc.get_objects() if isinstance(o, BlockWeight))


def gguf_quantized_bytes(model: object, held_float: list[str]) -> int:
    """Bytes in the GGUF of the matrices the network keeps quantized (not those it holds in
    the activation dtype, ``held_float``: the tied embedding)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    total = 0
    for name, q in model.weights.quantized.items():
        if name not in held_float:
            weights, size = GGML_QUANT_SIZES[GGMLQuantizationType[q.source]]
            total += q.codes.size // weights * size
    return total


def llama_bench(path: Path, threads: list[int], repeats: int) -> dict[int, dict]:
    """llama-bench's prefill tok/s and decode ms/token per thread count (B=1)."""
    run = next((p for p in LLAMA_RUNS if p.is_file()), LLAMA_RUNS[0])
    command = shlex.split(os.environ.get("LLAMA_BENCH", "")) or [str(run), "llama-bench"]
    argv = [*command, "-m", str(path), "-p", str(PROMPT), "-n", "128", "-o", "json"]
    argv += ["-t", ",".join(map(str, threads)), "-r", str(repeats)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found: dict[int, dict] = {}
    for row in json.loads(out):
        entry = found.setdefault(int(row["n_threads"]), {})
        if row["n_prompt"]:
            entry["prefill_tok_s"] = float(row["avg_ts"])
        else:
            entry["ms_token"] = 1e3 / float(row["avg_ts"])
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--weights", nargs="+", default=["float16", "keep"])
    p.add_argument("--steps", type=int, default=32, help="decode steps timed")
    p.add_argument("--repeats", type=int, default=3, help="llama-bench repetitions")
    p.add_argument("--rounds", type=int, default=3, help="rounds of llama.cpp, then ours")
    p.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    args = p.parse_args()
    path = default_gguf()
    model = load_model("default")
    clock = ProductClock()
    plans = []
    for weights in args.weights:
        before = held_block_bytes()
        net = build_llama_network(
            model.config, model.weights, max_seq_len=PROMPT + args.steps + 1,
            max_batch=max(args.batch), max_step_tokens=PROMPT, dtype="float16",
            weight_format=None if weights == "float16" else weights,
        )  # fmt: skip
        plans.append((weights, compile_network(net.network, wide_float16_caches=True)))
        held = held_block_bytes() - before
        if held:
            gguf = gguf_quantized_bytes(model, net.weight_storage["activation_dtype"]["matrices"])
            print(f"{weights}: quantized matrices held {held / 2**20:.1f} MiB, in the GGUF "
                  f"{gguf / 2**20:.1f} MiB ({held / gguf:.2f}x; target <= 1.1x)")  # fmt: skip
        del net
    rounds = []
    for _ in range(args.rounds):
        llama = {} if args.no_llama else llama_bench(path, args.threads, args.repeats)
        rows = []
        for weights, plan in plans:
            for threads in args.threads:
                products.set_threads(threads)
                for batch in args.batch:
                    r = run_case(plan, model, batch, args.steps, clock)
                    rows.append({"weights": weights, "threads": threads, "batch": batch, **r})
        rounds.append((llama, rows))
    clock.close()
    print(format_table(rounds))


def format_table(rounds: list[tuple[dict[int, dict], list[dict]]]) -> str:
    """One row a side and case: the median over the rounds of each figure (best: the least),
    the ratio to llama.cpp the median of each round's own ratio, each round's listed."""
    med = lambda values: float(np.median(values))  # noqa: E731
    head = "| side | threads | B | prefill 128 tok/s | decode ms/step (best) | ms/token | "
    head += "products / rest ms a step | vs llama.cpp ms/token | each round |\n"
    lines = [head + "|---|---|---|---|---|---|---|---|---|"]
    for t in sorted(rounds[0][0]):
        runs = [llama[t] for llama, _ in rounds]
        each = " / ".join(f"{r['ms_token']:.2f}" for r in runs)
        prefill, per_token = (med([r[key] for r in runs]) for key in ("prefill_tok_s", "ms_token"))
        line = f"| llama.cpp | {t} | 1 | {prefill:.0f} | | {per_token:.2f} | | 1.00x | {each} ms |"
        lines.append(line)
    for i, first in enumerate(rounds[0][1]):
        runs = [rows[i] for _, rows in rounds]
        ratios = []
        for (llama, _), r in zip(rounds, runs):
            ref = llama.get(r["threads"], {}).get("ms_token") if r["batch"] == 1 else None
            ratios += [r["step_ms"] / r["batch"] / ref] if ref else []
        step, products_ms, prefill = (
            med([r[key] for r in runs]) for key in ("step_ms", "products_ms", "prefill_tok_s")
        )
        best = min(r["step_best_ms"] for r in runs)
        ratio = f"{med(ratios):.2f}x" if ratios else ""
        each = " / ".join(f"{x:.2f}x" for x in ratios) if ratios else ""
        each = each or " / ".join(f"{r['step_ms']:.2f}" for r in runs) + " ms"
        lines.append(
            f"| interpreter {first['weights']} | {first['threads']} | {first['batch']} | "
            f"{prefill:.0f} | {step:.2f} ({best:.2f}) | {step / first['batch']:.2f} | "
            f"{products_ms:.1f} / {step - products_ms:.1f} | {ratio} | {each} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
