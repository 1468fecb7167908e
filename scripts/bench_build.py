"""Benchmark: build the SmolLM2-135M-shaped float16 engine (random weights) on the CPU, and
time one interpreter decode step of the same network.

    python scripts/bench_build.py [--max-seq-len 512] [--out-dir DIR] [--sizes NAME ...]
    python scripts/bench_build.py --gguf [--max-seq-len 256]   # the real default model

Targets (benchmarks, not tests): network + engine build < 60 s on a 2-core machine; one
interpreter decode step < 1 s at B=1 and B=8 after a 16-token prefill; engine bytes <= 1.1x
the parameter bytes (decode + prefill profiles, weights stored once), printed per model size:
what a layer costs beyond its weights is compiled kernel code (about 0.7 MB a layer on
TensorRT-RTX 1.7.1, plus ~2 MB), so small models spend a larger share of the engine on it.

``--gguf``: the real default model (its Q4_1 GGUF) built with each ``weight_format``, engine
bytes against the GGUF file's (target for ``keep``: <= 1.6x), and where the bytes go per
GGUF tensor type (what the file stores, what the network's constants hold).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from trt_kv.engine.store import BuildOptions, build_to_file, model_engine_path
from trt_kv.models.llama import LlamaConfig, build_llama_network, random_weights, to_hf_tensors
from trt_kv.models.llama.weights import quantized_matrices
from trt_kv.runtime import Session
from trt_kv.runtime.interpreter_backend import InterpreterBackend

BUILD_TARGET_S = 60.0
DECODE_TARGET_S = 1.0
ENGINE_RATIO_TARGET = 1.1  # engine bytes / parameter bytes: weights stored once (2 profiles)
GGUF_RATIO_TARGET = 1.6  # engine bytes / GGUF file bytes with weight_format="keep"
WEIGHT_FORMATS = (None, "keep", "int8", "int4")
# Model shapes for the ratio table (random weights, float16, tied heads as the models have).
SIZES = {
    "smollm2-135m": LlamaConfig(),
    "smollm2-360m": LlamaConfig(
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
    ),
    "stories15m": LlamaConfig(  # llama2.c's TinyStories 15M shape
        vocab_size=32000,
        hidden_size=288,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=6,
        head_dim=48,
    ),
}
PREFILL_TOKENS = 16
DECODE_STEPS = 5


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    print(f"\n{title}")
    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def _verdict(seconds: float, target: float) -> str:
    return "ok" if seconds < target else "MISSED"


def _decode_seconds(session: Session, batch: int) -> tuple[float, float]:
    """``(prefill seconds, median decode-step seconds)`` for ``batch`` 16-token prompts."""
    prompts = [[(7 * b + t) % 1000 + 1 for t in range(PREFILL_TOKENS)] for b in range(batch)]
    start = time.perf_counter()
    logits = session.prefill(prompts)
    prefill = time.perf_counter() - start
    steps = []
    for _ in range(DECODE_STEPS):
        start = time.perf_counter()
        logits = session.decode(logits.argmax(axis=-1))
        steps.append(time.perf_counter() - start)
    return prefill, statistics.median(steps)


def _parameter_bytes(weights: object, itemsize: int) -> int:
    """Bytes of every weight array once (a tied head is the embedding: counted once)."""
    arrays = [weights.embed, weights.final_norm, weights.lm_head]
    arrays += [a for layer in weights.layers for a in vars(layer).values()]
    return itemsize * sum(a.size for a in arrays if a is not None)


def _ratio_verdict(ratio: float) -> str:
    return "ok" if ratio <= ENGINE_RATIO_TARGET else "MISSED"


def _engine_bytes(name: str, config: LlamaConfig, max_seq_len: int, out_dir: Path | None) -> tuple:
    """``(network, weights, network seconds, engine seconds, engine bytes)`` of a float16
    engine of ``config`` with random weights, written under ``out_dir`` (default: a temporary
    folder)."""
    weights = random_weights(config)
    start = time.perf_counter()
    net = build_llama_network(config, weights, max_seq_len=max_seq_len, dtype="float16")
    network_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        options = BuildOptions(max_seq_len=max_seq_len)
        path = model_engine_path(f"{name}-bench", options, out_dir or Path(tmp))
        built = build_to_file(net.builder, net.network, net.profiles, path, net.metadata())
    return net, weights, network_s, built.meta.build_seconds, built.meta.nbytes


def _ratio_table(first: tuple[str, int, int], sizes: list[str], args: argparse.Namespace) -> None:
    """Engine / parameter bytes of each model shape in ``sizes`` (``first``: a row measured
    already, ``(name, engine bytes, parameter bytes)``)."""
    rows = []
    for name in sizes:
        if name == first[0]:
            nbytes, params = first[1], first[2]
        else:
            _, weights, _, _, nbytes = _engine_bytes(name, SIZES[name], args.max_seq_len, None)
            params = _parameter_bytes(weights, 2)
        cfg = SIZES[name]
        shape = f"L={cfg.num_hidden_layers} D={cfg.hidden_size} V={cfg.vocab_size}"
        ratio = nbytes / params
        per_layer = (nbytes - params) / cfg.num_hidden_layers / 2**20
        rows.append(
            (
                name,
                shape,
                f"{params / 2**20:.1f} MiB",
                f"{nbytes / 2**20:.1f} MiB",
                f"{per_layer:.2f} MiB",
                f"{ratio:.3f}",
                _ratio_verdict(ratio),
            )
        )
    _table(
        f"Engine / parameter bytes per model size (float16, S_max={args.max_seq_len}, "
        f"decode + prefill profiles; target <= {ENGINE_RATIO_TARGET})",
        ("model", "shape", "parameters", "engine", "extra / layer", "ratio", "verdict"),
        rows,
    )


def _gguf_tables(max_seq_len: int) -> None:
    """Engine bytes against the default model's GGUF file per weight format; then per GGUF
    tensor type, the file's bytes and what a ``keep`` network's constants hold."""
    from gguf import GGUFReader

    from trt_kv.builder import build_engine
    from trt_kv.models.loading import load_model

    model = load_model("default", progress=False)
    path = Path(model.checkpoint.source)
    file_bytes = path.stat().st_size
    rows = []
    for fmt in WEIGHT_FORMATS:
        start = time.perf_counter()
        net = build_llama_network(
            model.config, model.weights, max_seq_len=max_seq_len, weight_format=fmt
        )
        nbytes = len(build_engine(net.builder, net.network, net.profiles).data)
        seconds = time.perf_counter() - start
        ratio = nbytes / file_bytes
        verdict = ("ok" if ratio <= GGUF_RATIO_TARGET else "MISSED") if fmt == "keep" else ""
        size = f"{nbytes / 2**20:.1f} MiB"
        name = fmt or "float16"
        rows.append(
            (name, str(len(net.profiles)), size, f"{ratio:.2f}x", f"{seconds:.1f} s", verdict)
        )
    _table(
        f"Default model engines (float16 activations, S_max={max_seq_len}) against its GGUF "
        f"file ({file_bytes / 2**20:.1f} MiB); target for keep <= {GGUF_RATIO_TARGET}x",
        ("weights", "profiles", "engine", "/ GGUF", "network + engine", "verdict"),
        rows,
    )
    by_type: dict[str, list[int]] = {}
    quantized = quantized_matrices(model.weights, "keep", "float16")  # as the network holds
    names = {t.name: t for t in GGUFReader(str(path)).tensors}
    for hf_name, array in to_hf_tensors(model.weights).items():
        kind = quantized[hf_name].source if hf_name in quantized else "F32"
        entry = by_type.setdefault(kind, [0, 0, 0])
        entry[0] += 1
        held = quantized.get(hf_name)
        entry[2] += 2 * array.size if held is None else held.nbytes
    for t in names.values():
        kind = t.tensor_type.name if t.tensor_type.name in by_type else "F32"
        by_type.setdefault(kind, [0, 0, 0])[1] += int(t.n_bytes)
    _table(
        "Where the bytes go (keep): per GGUF tensor type, the file's bytes and what the "
        "network's constants hold (INT4/INT8 codes, INT4 packed, float16 scales and offsets; "
        "the norms in float16; the Q8_0 embedding is read by the gather and the tied head)",
        ("GGUF type", "tensors", "file", "held"),
        [
            (kind, str(n), f"{f / 2**20:.1f} MiB", f"{h / 2**20:.1f} MiB")
            for kind, (n, f, h) in sorted(by_type.items())
        ],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--out-dir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument(
        "--sizes", nargs="+", choices=sorted(SIZES), default=list(SIZES), help="ratio table rows"
    )
    parser.add_argument(
        "--gguf", action="store_true", help="the default model per weight format, only"
    )
    args = parser.parse_args(argv)
    if args.gguf:
        _gguf_tables(args.max_seq_len)
        return

    net, weights, network_s, engine_s, nbytes = _engine_bytes(
        "smollm2-135m", SIZES["smollm2-135m"], args.max_seq_len, args.out_dir
    )

    cores = os.cpu_count()
    shape = (
        f"SmolLM2-135M float16 engine: S_max={net.max_seq_len}, B<={net.max_batch}, "
        f"S<={net.max_step_tokens}, {cores} CPU cores"
    )
    total_s = network_s + engine_s
    params = _parameter_bytes(weights, 2)
    ratio = nbytes / params
    target = f"< {BUILD_TARGET_S:.0f} s on this {cores}-core machine"
    _table(
        shape,
        ("step", "measured", "target", "verdict"),
        [
            ("network build", f"{network_s:.2f} s", "", ""),
            ("engine build", f"{engine_s:.2f} s", "", ""),
            ("network + engine", f"{total_s:.2f} s", target, _verdict(total_s, BUILD_TARGET_S)),
            ("engine bytes", f"{nbytes:,} ({nbytes / 2**20:.1f} MiB)", "", ""),
            ("parameter bytes", f"{params:,} ({params / 2**20:.1f} MiB)", "float16", ""),
            (
                "engine / parameters",
                f"{ratio:.3f}",
                f"<= {ENGINE_RATIO_TARGET} ({len(net.profiles)} profiles, weights once)",
                _ratio_verdict(ratio),
            ),
        ],
    )
    _ratio_table(("smollm2-135m", nbytes, params), args.sizes, args)

    start = time.perf_counter()
    session = Session(InterpreterBackend(net))
    compile_s = time.perf_counter() - start
    rows = [("interpreter compile", "", f"{compile_s:.2f} s", "", "")]
    for batch in (1, 8):
        prefill_s, step_s = _decode_seconds(session, batch)
        rows.append(
            (
                f"decode step, B={batch}",
                f"{prefill_s:.2f} s",
                f"{step_s:.3f} s",
                f"< {DECODE_TARGET_S:.0f} s",
                _verdict(step_s, DECODE_TARGET_S),
            )
        )
    _table(
        f"Interpreter on the same network ({PREFILL_TOKENS}-token prefill, "
        f"median of {DECODE_STEPS} decode steps)",
        ("step", "prefill", "measured", "target", "verdict"),
        rows,
    )


if __name__ == "__main__":
    main()
