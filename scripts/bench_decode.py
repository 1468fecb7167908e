"""Decode benchmark: tokens/s and ms/step per backend, and host overhead per step.

    python scripts/bench_decode.py                       # CPU: host overhead + interpreter
    python scripts/bench_decode.py --backends tensorrt polygraphy --new-tokens 256   # GPU

Host overhead is what the runtime does per decode step besides the device work (planning
the step from slot lengths, building the feed, committing): measured with a backend that
does no work. Target: <= 20 us per step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from trt_kv.contract import INPUT_ROLES, DecoderRoles
from trt_kv.models.llama.reference_backend import llama_cache_aliases
from trt_kv.models.loading import load_model
from trt_kv.runtime.backend import step_feed
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.session import Session
from trt_kv.runtime.storage import HostCaches

TARGET_US = 20.0


class NoWorkBackend:
    """Everything a backend does on the host except the device call."""

    name = "no-work"

    def __init__(self, config: object, capacity: int, max_seq_len: int) -> None:
        self.storage = HostCaches(llama_cache_aliases(config, max_seq_len, "float16"), capacity)
        self.max_step_tokens = max_seq_len
        self.vocab_size = config.vocab_size
        self.long_rope_after = None
        self.roles = DecoderRoles(
            inputs={
                r: INPUT_ROLES[r].default_name
                for r in ("token_ids", "positions", "write_indices", "kv_lengths")
            },
            logits="logits",
            caches=(),
            vocab_size=config.vocab_size,
            max_seq_len=max_seq_len,
            max_batch=capacity,
            max_step_tokens=max_seq_len,
            all_logits=False,
        )
        self.logits = np.zeros((capacity, config.vocab_size), np.float32)

    def run(self, plan: StepPlan) -> np.ndarray:
        step_feed(plan, self.roles)
        return self.logits[: len(plan.counts)]


def host_overhead_us(config: object, batch: int, prompt: int, steps: int) -> float:
    s = Session(NoWorkBackend(config, batch, prompt + steps + 1))
    s.prefill([[1] * prompt] * batch)
    tokens = np.ones(batch, dtype=np.int64)
    start = time.perf_counter()
    for _ in range(steps):
        s.decode(tokens)
    return (time.perf_counter() - start) / steps * 1e6


def make_backend(name: str, model: str, batch: int, s_max: int, prompt: int) -> object:
    m = load_model(model)
    run_name, config, weights = m.name, m.config, m.weights
    if name == "reference":
        from trt_kv.models.llama.reference_backend import ReferenceBackend

        return ReferenceBackend(config, weights, capacity=batch, max_seq_len=s_max)
    if name == "interpreter":
        from trt_kv.models.llama import build_llama_network
        from trt_kv.runtime.interpreter_backend import InterpreterBackend

        return InterpreterBackend(
            build_llama_network(
                config, weights, max_seq_len=s_max, max_batch=batch, max_step_tokens=prompt
            )
        )
    from trt_kv.engine.store import build_model_engine

    path = build_model_engine(
        run_name, config, weights, max_seq_len=s_max, max_batch=batch, max_step_tokens=prompt
    ).path
    if name == "polygraphy":
        from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend

        return PolygraphyBackend(path)
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    return TrtBackend(path, cuda_graph=name == "tensorrt-graph")


def time_decode(backend: object, batch: int, prompt: int, new: int) -> tuple[float, float]:
    s = Session(backend)
    s.prefill([list(range(1, prompt + 1))] * batch)
    tokens = np.ones(batch, dtype=np.int64)
    start = time.perf_counter()
    for _ in range(new):
        s.decode(tokens)
    seconds = time.perf_counter() - start
    return batch * new / seconds, seconds / new * 1e3


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, rows)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument(
        "--backends",
        nargs="*",
        default=["interpreter"],
        help="reference interpreter tensorrt tensorrt-graph polygraphy",
    )
    p.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=8, help="256 for the GPU targets")
    args = p.parse_args()
    config = load_model(args.model).config

    rows = []
    for b in args.batches:
        us = host_overhead_us(config, b, args.prompt, 2000)
        rows.append((str(b), f"{us:.1f}", f"{TARGET_US:.0f}", "ok" if us <= TARGET_US else "OVER"))
    print("host overhead per decode step (device calls left out)")
    print(table(("batch", "us/step", "target us", "verdict"), rows))

    rows = []
    s_max = args.prompt + args.new_tokens + 1
    for name in args.backends:
        for b in args.batches:
            backend = make_backend(name, args.model, b, s_max, args.prompt)
            tps, ms = time_decode(backend, b, args.prompt, args.new_tokens)
            rows.append(
                (name, str(b), str(args.prompt), str(args.new_tokens), f"{tps:.1f}", f"{ms:.2f}")
            )
    if rows:
        print(f"\ndecode ({args.model})")
        print(table(("backend", "batch", "prompt", "new", "tokens/s", "ms/step"), rows))


if __name__ == "__main__":
    main()
