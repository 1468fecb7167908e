"""Benchmark: what deciding to reuse an engine costs (issue 29): the weights' sha256 hashed
(the first run after the files change) and from the cache (``trt_kv.engine.digest``: keyed by
path, size and mtime), and the lookup that compares everything else (sidecar checks, the
engine's own sha256, config, options, TensorRT, GPU targets), for the default model
(SmolLM2-135M; seeded random weights of its shape when it cannot be fetched: never cached).

    python scripts/bench_reuse.py [--repeats 5]

Target (a benchmark, not a test): the weights' identity adds <= 0.5 s to a reuse.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from trt_kv.engine.digest import weights_digest, weights_sha256
from trt_kv.engine.store import BuildOptions, build_model_engine, find_model_engine
from trt_kv.models.loading import load_model

TARGET_S = 0.5


def timed(fn: object, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls of ``fn`` and its last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = load_model("default", progress=False)
    shapes = {"max_seq_len": 64, "max_batch": 1, "max_step_tokens": 16}
    arrays = [model.weights.embed, model.weights.final_norm, model.weights.lm_head]
    arrays += [a for layer in model.weights.layers for a in vars(layer).values()]
    nbytes = sum(a.nbytes for a in arrays if a is not None)
    with tempfile.TemporaryDirectory() as out:
        digest_s, digest = timed(lambda: weights_digest(model.weights), args.repeats)
        weights_sha256("default", model.weights)  # stored (the first reuse after a change)
        cached_s, _ = timed(lambda: weights_sha256("default", model.weights), args.repeats)
        build_model_engine(
            model.name, model.config, model.weights, out_dir=Path(out), weights_sha256=digest,
            **shapes,
        )  # fmt: skip
        options = BuildOptions(**shapes)
        lookup_s, (found, why) = timed(
            lambda: find_model_engine(model.name, model.config, options, Path(out), digest),
            args.repeats,
        )
        assert found is not None, why
        engine_mb = found.meta.nbytes / 1e6
    rows = [
        ("weights hashed", f"{nbytes / 1e6:,.0f} MB of arrays", digest_s),
        ("weights cached", f"target <= {TARGET_S} s", cached_s),
        ("lookup", f"{engine_mb:,.0f} MB engine + sidecar", lookup_s),
    ]
    print(f"{model.name}, median of {args.repeats}")
    print(f"{'step':<16}{'what':<28}{'seconds':>8}")
    for step, what, seconds in rows:
        print(f"{step:<16}{what:<28}{seconds:>8.3f}")
    print("OK" if cached_s <= TARGET_S else f"OVER the {TARGET_S} s target")


if __name__ == "__main__":
    main()
