"""Host work of one GPU decode step, counted on the emulated device (emulated figures).

    python scripts/bench_host.py                 # table
    python scripts/bench_host.py --json          # one JSON list

For the SmolLM2-135M shape (seeded random weights, float16 engine; host work depends on the
shape, not on the weights), batch 1 and 8, each capture mode: what one decode step in an
unchanged binding state asks of TensorRT and CUDA (calls by name, bytes each way,
synchronizations) and the host's own time for it, with the engine's execution and the copies
stubbed out (``trt_kv.emulator.counting(perform=False)``) and the time inside the emulated
calls taken off: Session planning, binding, staging, trt_kv's side of each call, and the
choice of the next ids (greedy). ``sampling``: ``"host"`` downloads the logits ``[B, V]``
and takes their argmax on the host; ``"device"`` runs the engine's own greedy choice
(``device_top_k=1``: ``Session.decode_top_k``, ``[B]`` int32 downloaded), as ``generate``
does on such an engine. One engine serves both: the default engine, built with no
``device_top_k`` given (1 by default, :mod:`trt_kv.build_defaults`; its logits are still an
output), so the figures are those a user gets; each row says its ``device_top_k``.
``host_us_per_step_before`` is the host-sampling step with every binding set again at every
step (``TrtBackend(rebind_every_step=True)``, the path before trt_kv bound once and sampled
on the device), timed in the same run. Medians over ``--steps`` steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from trt_kv.emulator import counting, emulated_gpu
from trt_kv.engine.store import build_model_engine
from trt_kv.models.llama import LlamaConfig, random_weights
from trt_kv.runtime import Session
from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
from trt_kv.runtime.gpu.trt_backend import TrtBackend
from trt_kv.runtime.sampling import Sampler

NAME = "smollm2-135m-random"
CAPTURES = {"none": False, "manual": "manual", "rtx": True}  # capture -> TrtBackend cuda_graph
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def per_step(backend: object, batch: int, steps: int, on_device: bool = False) -> dict:
    """Counts of ``steps`` greedy decode steps of ``backend`` (closed after) at one binding
    state, per step, and the median host time of one (microseconds); ``on_device``: the
    engine's own next ids instead of the logits' argmax."""
    sampler = Sampler()
    try:
        session = Session(backend)
        session.prefill([[1, 2, 3, 4]] * batch)
        tokens = np.full(batch, 5, np.int64)

        def step() -> np.ndarray:
            if on_device:
                return sampler.choose(*session.decode_top_k(tokens))
            return sampler(session.decode(tokens))

        for _ in range(3):  # bind, then capture (manual graphs), then replay: performed
            step()
        times = []
        with counting(perform=False) as counts:
            for _ in range(steps):
                start, inside = time.perf_counter(), counts.emulator_seconds
                step()
                emulator = counts.emulator_seconds - inside  # the stand-ins' own checks
                times.append(time.perf_counter() - start - emulator)
    finally:
        backend.close()
    return {
        "trt_calls_per_step": sum(counts.trt.values()) / steps,
        "cuda_calls_per_step": sum(counts.calls.values()) / steps,
        "h2d_bytes_per_step": counts.bytes["HD"] / steps,
        "d2h_bytes_per_step": counts.bytes["DH"] / steps,
        "syncs_per_step": sum(counts.calls[name] for name in SYNCS) / steps,
        "host_us_per_step": statistics.median(times) * 1e6,
        "trt_calls": dict(counts.trt),
        "cuda_calls": dict(counts.calls),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=50, help="decode steps timed (default 50)")
    p.add_argument("--json", action="store_true", help="one JSON list instead of a table")
    args = p.parse_args(argv)

    config = LlamaConfig.smollm2_135m()
    rows = []
    with tempfile.TemporaryDirectory() as out, emulated_gpu():
        built = build_model_engine(
            NAME,
            config,
            random_weights(config, seed=0),
            out_dir=Path(out),
            dtype="float16",
            max_seq_len=256,
            max_batch=max(args.batch),
            max_step_tokens=16,
        )  # every other option the default's: the engine a user gets
        engine, top_k = built.path, built.meta.roles.device_top_k
        for batch in args.batch:
            for capture, cuda_graph in CAPTURES.items():
                trt_backend = partial(TrtBackend, engine, capacity=batch, cuda_graph=cuda_graph)
                before = per_step(trt_backend(rebind_every_step=True), batch, args.steps)
                for sampling in ("host", "device") if top_k else ("host",):
                    now = per_step(trt_backend(), batch, args.steps, sampling == "device")
                    rows.append(
                        {
                            "backend": "tensorrt",
                            "batch": batch,
                            "cuda_graph": capture != "none",
                            "capture": capture,
                            "sampling": sampling,
                            "device_top_k": top_k,
                            **{k: v for k, v in now.items() if not k.endswith("_calls")},
                            "host_us_per_step_before": before["host_us_per_step"],
                            "trt_calls_per_step_before": before["trt_calls_per_step"],
                            "trt_calls": now["trt_calls"],
                            "cuda_calls": now["cuda_calls"],
                        }
                    )
            # measured and reported, not held to the TensorRT backend's targets
            poly = per_step(PolygraphyBackend(engine, capacity=batch), batch, args.steps)
            rows.append(
                {
                    "backend": "polygraphy",
                    "batch": batch,
                    "cuda_graph": False,
                    "capture": "none",
                    "sampling": "host",
                    "device_top_k": top_k,
                    **{k: v for k, v in poly.items() if not k.endswith("_calls")},
                    "host_us_per_step_before": None,
                    "trt_calls_per_step_before": None,
                    "trt_calls": poly["trt_calls"],
                    "cuda_calls": poly["cuda_calls"],
                }
            )
    if args.json:
        print(json.dumps(rows))
        return 0
    print(
        f"{NAME}, float16 engine {built.path.name} (device_top_k {top_k}), emulated device, "
        f"median of {args.steps} decode steps"
    )
    print(
        "| backend | batch | capture | sampling | TRT calls | CUDA calls | H2D B | D2H B | syncs "
        "| host us | host us before | TRT calls before |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        before = r["host_us_per_step_before"]
        print(
            f"| {r['backend']} | {r['batch']} | {r['capture']} | {r['sampling']} | "
            f"{r['trt_calls_per_step']:g} | "
            f"{r['cuda_calls_per_step']:g} | {r['h2d_bytes_per_step']:g} | "
            f"{r['d2h_bytes_per_step']:g} | {r['syncs_per_step']:g} | "
            f"{r['host_us_per_step']:.0f} | {'-' if before is None else f'{before:.0f}'} | "
            f"{r['trt_calls_per_step_before'] or '-'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
