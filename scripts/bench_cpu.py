"""CPU benchmark: trt_kv's reference and interpreter against Hugging Face on the same CPU.

    python scripts/bench_cpu.py                        # all cases, 3 repeats (~15 min)
    python scripts/bench_cpu.py --cases 1x128 --sides hf-dynamic interpreter-f32 --repeats 1

Both sides load one saved folder (the SmolLM2-135M shape, seeded random weights written by
Hugging Face's ``save_pretrained``) and run in child processes of this one, one at a time,
each with 1 thread (OpenBLAS, OpenMP, torch), so the peak RSS of each child is its own.
Greedy decode: a prompt of ``context`` tokens (prefilled in steps of ``--prompt`` tokens,
S_max = context + 128, after a one-step warm-up), then ``--steps`` decode steps after 2
warm-up steps; a child reports its prefill time, median decode step and peak RSS. Hugging Face runs
``LlamaForCausalLM`` eager float32 with a DynamicCache, a StaticCache, and a StaticCache
decode step under ``torch.compile`` (``--sides`` picks; compiling takes minutes, so
``--once`` sides run in the first repeat only). A ratio divides by the best of them in the
same repeat, per metric; cells give the median over ``--repeats`` (values and ratios alike)
with the min-max spread.

``--clock cpu`` times each child's own CPU time instead of wall time: both sides run one
thread, so this is the same work measured without the waits a shared machine adds (other
jobs still share the memory bandwidth and caches).

Targets (issue 15): interpreter decode <= 0.8x, prefill <= 1.0x, peak RSS <= 1.5x;
reference decode <= 1.5x. Where OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set (older
OpenBLAS needs them on some processors), unset both for this command alone:
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python scripts/bench_cpu.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HF_SIDES = ("hf-dynamic", "hf-static", "hf-compile")
TRT_KV_SIDES = ("interpreter-f32", "interpreter-f16", "reference")
TARGETS = {  # side prefix -> (decode, prefill, peak RSS) ratio targets; None: no target
    "interpreter": (0.8, 1.0, 1.5),
    "reference": (1.5, None, None),
}
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
VOCAB = 49152  # SmolLM2-135M
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter  # a child's clock (--clock)


# -- children ------------------------------------------------------------------------------
def save_model(folder: str) -> None:
    """Seeded random SmolLM2-135M-shaped model, written with ``save_pretrained``."""
    import torch
    import transformers

    from trt_kv.models.llama import LlamaConfig

    shape = LlamaConfig.smollm2_135m().to_json()  # trt_kv's preset, in Hugging Face's words
    del shape["rope_scaling"]
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    model.save_pretrained(folder)


def _prompt(batch: int, context: int) -> np.ndarray:
    return np.random.default_rng(1).integers(1, VOCAB, (batch, context))


def _decode_ms(step: Callable[[np.ndarray], np.ndarray], first: np.ndarray, steps: int) -> float:
    """Median ms of ``steps`` greedy decode steps (after 2 warm-up steps)."""
    tokens, times = first, []
    for i in range(steps + 2):
        start = _clock()
        tokens = step(tokens)
        if i >= 2:
            times.append(_clock() - start)
    return statistics.median(times) * 1e3


def hf_side(side: str, folder: str, batch: int, context: int, chunk: int, steps: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(1)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    s_max = context + 128
    ids = torch.from_numpy(_prompt(batch, context))

    def new_cache() -> object:
        if side == "hf-dynamic":
            return transformers.DynamicCache(config=model.config)
        return transformers.StaticCache(config=model.config, max_cache_len=s_max)

    def forward(fn: Callable, x: torch.Tensor, cache: object, pos: int) -> torch.Tensor:
        at = torch.arange(pos, pos + x.shape[1])
        out = fn(input_ids=x, past_key_values=cache, cache_position=at, logits_to_keep=1)
        return out.logits[:, -1]

    def prefill(upto: int = context) -> tuple[object, torch.Tensor]:
        cache = new_cache()
        for lo in range(0, upto, chunk):
            logits = forward(model, ids[:, lo : lo + chunk], cache, lo)
        return cache, logits

    decode_fn = model
    if side == "hf-compile":
        decode_fn = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.inference_mode():
        prefill(chunk)  # warm-up: one step
        start = _clock()
        cache, logits = prefill()
        prefill_ms = (_clock() - start) * 1e3
        pos = [context]

        def step(tokens: np.ndarray) -> np.ndarray:
            out = forward(decode_fn, torch.from_numpy(tokens), cache, pos[0])
            pos[0] += 1
            return out.argmax(-1, keepdim=True).numpy()

        decode_ms = _decode_ms(step, logits.argmax(-1, keepdim=True).numpy(), steps)
    return {"prefill_ms": prefill_ms, "decode_ms": decode_ms}


def trt_kv_side(side: str, folder: str, batch: int, context: int, chunk: int, steps: int) -> dict:
    from trt_kv.models.llama import LlamaConfig, load_hf_weights
    from trt_kv.runtime import Session

    config = LlamaConfig.from_hf(folder)
    s_max = context + 128
    if side == "reference":
        from trt_kv.models.llama.reference_backend import ReferenceBackend

        backend = ReferenceBackend(
            config,
            load_hf_weights(folder, config),
            capacity=batch,
            max_seq_len=s_max,
            max_step_tokens=chunk,
        )
    else:
        from trt_kv.models.llama import build_llama_network
        from trt_kv.runtime.interpreter_backend import InterpreterBackend

        dtype = {"interpreter-f32": "float32", "interpreter-f16": "float16"}[side]
        net = build_llama_network(
            config,
            load_hf_weights(folder, config),
            max_seq_len=s_max,
            max_batch=batch,
            max_step_tokens=chunk,
            dtype=dtype,
        )
        backend = InterpreterBackend(net)
    session = Session(backend)
    ids = _prompt(batch, context)

    def prefill(upto: int = context) -> np.ndarray:
        logits = session.prefill(ids[:, :chunk])
        for lo in range(chunk, upto, chunk):
            logits = session.step(ids[:, lo : lo + chunk])
        return logits

    prefill(chunk)  # warm-up: one step
    start = _clock()
    logits = prefill()
    prefill_ms = (_clock() - start) * 1e3

    def step(tokens: np.ndarray) -> np.ndarray:
        return session.decode(tokens[:, 0]).argmax(-1)[:, None]

    decode_ms = _decode_ms(step, logits.argmax(-1)[:, None], steps)
    return {"prefill_ms": prefill_ms, "decode_ms": decode_ms}


def child(args: argparse.Namespace) -> None:
    global _clock
    _clock = CLOCKS[args.clock]
    run = hf_side if args.child in HF_SIDES else trt_kv_side
    result = run(args.child, args.folder, args.batch, args.context, args.prompt, args.steps)
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# -- parent --------------------------------------------------------------------------------
def _spawn(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **ONE_THREAD}
    return subprocess.run(
        [sys.executable, __file__, *argv], env=env, capture_output=True, text=True, check=False
    )


def _cell(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "-"
    mid = fmt.format(statistics.median(values))
    if len(values) == 1:
        return mid
    return f"{mid} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _ratio(runs: list[dict], hf_runs: list[dict], key: str, target: float | None) -> str:
    """Median (min-max) over repeats of ``value / best Hugging Face value of the same
    repeat``: children of one repeat run minutes apart at most, so a machine whose load
    drifts (2 shared cores) moves both sides of each ratio together."""
    ratios = []
    for r in runs:
        hf = [h[key] for h in hf_runs if h["repeat"] == r["repeat"]]
        if hf:
            ratios.append(r[key] / min(hf))
    if not ratios:
        return "-"
    mid = statistics.median(ratios)
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    verdict = "" if target is None else (" ok" if mid <= target else f" >{target}")
    return f"{mid:.2f}x{spread}{verdict}"


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, rows)])


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed: BLAS kernel unknown"
    return ", ".join(f"{i['internal_api']} {i.get('architecture', '?')}" for i in threadpool_info())


def report(results: dict, cases: list[tuple[int, int]], sides: list[str]) -> str:
    rows = []
    for b, c in cases:
        got = {s: results.get((b, c, s), []) for s in sides}
        hf = [r for s in HF_SIDES for r in got.get(s, [])]
        for s in sides:
            target = TARGETS.get(s.split("-")[0], (None, None, None))
            vals = {k: [r[k] for r in got[s]] for k in ("decode_ms", "prefill_ms", "rss_mb")}
            rows.append(
                (
                    str(b),
                    str(c),
                    s,
                    _cell(vals["decode_ms"]),
                    _ratio(got[s], hf, "decode_ms", target[0]),
                    _cell(vals["prefill_ms"], "{:.0f}"),
                    _ratio(got[s], hf, "prefill_ms", target[1]),
                    _cell(vals["rss_mb"], "{:.0f}"),
                    _ratio(got[s], hf, "rss_mb", target[2]),
                )
            )
    head = ("B", "context", "side", "decode ms", "vs HF", "prefill ms", "vs HF", "RSS MB", "vs HF")
    return table(head, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="*", default=["1x128", "8x128", "1x2048"], help="BxCONTEXT")
    p.add_argument("--sides", nargs="*", default=[*HF_SIDES, *TRT_KV_SIDES])
    p.add_argument("--prompt", type=int, default=128, help="tokens per prefill step")
    p.add_argument("--steps", type=int, default=16, help="timed decode steps per child")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--once", nargs="*", default=["hf-compile"], help="sides run in repeat 1 only")
    p.add_argument("--folder", help="saved model folder (default: a new temporary one)")
    p.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="cpu: each child's own CPU time (both sides run 1 thread): steadier than wall "
        "time on a machine other jobs share",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--context", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "save":
        return save_model(args.folder)
    if args.child:
        return child(args)

    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or tmp
        if not (Path(folder) / "config.json").is_file():
            done = _spawn(["--child", "save", "--folder", folder])
            if done.returncode:
                sys.exit(f"saving the model failed:\n{done.stderr}")
        print(f"BLAS: {_blas()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}")
        results: dict = {}
        for rep in range(args.repeats):
            for b, c in cases:
                for side in args.sides:
                    if rep and side in args.once:
                        continue
                    argv = ["--child", side, "--folder", folder, "--batch", str(b)]
                    argv += ["--clock", args.clock]
                    argv += ["--context", str(c), "--prompt", str(args.prompt)]
                    done = _spawn([*argv, "--steps", str(args.steps)])
                    if done.returncode:
                        last = (done.stderr.strip().splitlines() or ["?"])[-1]
                        print(f"  {side} B={b} context={c}: failed ({last})", file=sys.stderr)
                        continue
                    r = {**json.loads(done.stdout.strip().splitlines()[-1]), "repeat": rep}
                    results.setdefault((b, c, side), []).append(r)
                    print(
                        f"  [{rep + 1}/{args.repeats}] B={b} context={c} {side}: "
                        f"{r['decode_ms']:.1f} ms/step, prefill {r['prefill_ms']:.0f} ms, "
                        f"{r['rss_mb']:.0f} MB",
                        file=sys.stderr,
                        flush=True,
                    )
    print(
        f"\nCPU decode vs Hugging Face (best of {', '.join(HF_SIDES)} per column), "
        f"{args.clock} time"
    )
    print(report(results, cases, args.sides))


if __name__ == "__main__":
    main()
