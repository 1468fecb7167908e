"""``trt-kv inspect ENGINE``: what an engine file holds, read from its sidecar (no GPU):
I/O tensors with profiles, alias pairs, cache memory, routes, the build recipe, TensorRT
module and version, checksum; on a GPU (or with ``--emulate-gpu``) also TensorRT's per-layer
engine information."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_kv.cli import common
from trt_kv.cli.checks import integer

EXAMPLE = (
    "trt-kv inspect engines/smollm2-135m-random-de1707ae-float16-s512-b8-t128.engine --batch 4"
)
S_AXIS = 2  # caches are [B, N, S_max, H]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("engine", type=Path, help="engine file (its .json sidecar beside it)")
    p.add_argument("--batch", type=integer(1), help="batch for the cache total (None: profile max)")
    p.add_argument(
        "--max-seq-len",
        type=integer(1, 2**31 - 1),
        help="S_max for the cache total (None: engine's)",
    )
    p.add_argument("--json", action="store_true", help="everything as one JSON object")
    p.add_argument(
        "--emulate-gpu",
        action="store_true",
        help="deserialize on trt_kv's emulated GPU, on the CPU, for TensorRT's engine inspector "
        "(layers of the network as built, unfused: not what a GPU build fuses)",
    )
    p.add_argument(
        "--model",
        help="with --emulate-gpu: the checkpoint the engine was built from ('default', a "
        "folder or a .gguf file), from which the emulated GPU rebuilds its network",
    )


def _shape(dims: list | tuple) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def cache_memory(meta: object, batch: int | None, max_seq_len: int | None) -> dict:
    """Bytes of the cache inputs ``[B, N, S_max, H]``: per slot (one sequence at the
    engine's S_max), per token, and for ``batch`` slots at ``max_seq_len`` (defaults: the
    static batch or the profiles' largest, and the engine's S_max)."""
    from trt_kv import dtypes

    per_slot = 0
    s_max = None
    for a in meta.aliases:
        n = dtypes.to_numpy(a.dtype).itemsize
        for d in a.shape[1:]:
            n *= d
        per_slot += n
        s_max = a.shape[S_AXIS]
    if s_max is None:
        return {}
    if batch is None:  # a static batch, else the profiles' largest
        static = [a.shape[0] for a in meta.aliases if a.shape[0] != -1]
        maxima = [p.shapes[a.input][2][0] for p in meta.profiles for a in meta.aliases]
        batch = max(static + maxima, default=1)
    max_seq_len = max_seq_len or s_max
    per_token = per_slot // s_max
    return {
        "caches": len(meta.aliases),
        "engine_max_seq_len": s_max,
        "bytes_per_slot": per_slot,
        "bytes_per_token": per_token,
        "batch": batch,
        "max_seq_len": max_seq_len,
        "bytes": per_token * max_seq_len * batch,
    }


def engine_layers(path: Path) -> tuple[list | None, str]:
    """TensorRT's engine inspector output (one entry per layer: a name, or a dict when the
    engine was built with ``ProfilingVerbosity.DETAILED``) and where it came from, or None
    and why not: deserializing an engine takes a GPU (or the emulated one)."""
    from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is not None:
        return None, f"needs a GPU to deserialize the engine ({reason})"
    import json

    from trt_kv._trt import trt
    from trt_kv.errors import EngineFileError, GpuUnavailableError
    from trt_kv.runtime.gpu.engine_loader import load_cuda_engine

    try:
        engine, _, _ = load_cuda_engine(path)
    except (EngineFileError, GpuUnavailableError) as e:  # another TensorRT, another GPU...
        return None, str(e)
    if not hasattr(engine, "create_engine_inspector"):
        return None, f"{type(engine).__name__} has no engine inspector"
    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    verbosity = engine.profiling_verbosity.name
    if _emulated():
        source = f"emulated TensorRT engine inspector, {verbosity}: {info.get('Emulated')}"
    else:
        source = f"TensorRT engine inspector (GPU), {verbosity}"
    return info.get("Layers", []), source


def _emulated() -> bool:
    """Whether the emulated GPU is active (without importing the emulator when it is not)."""
    import sys

    emulator = sys.modules.get("trt_kv.emulator")
    return emulator is not None and emulator.is_active()


def _check_recipe(side: Path, md: dict) -> None:
    """EngineFileError naming ``side`` and the field when one of the ``metadata`` objects
    that ``inspect`` reads by key is not a JSON object (an edited or foreign sidecar)."""
    from trt_kv.errors import EngineFileError, mismatch

    for key in ("routes", "build_options", "config", "weights"):
        value = md.get(key)
        if value is not None and not isinstance(value, dict):
            kind = type(value).__name__
            raise EngineFileError(mismatch(f"{side}: metadata.{key}", "a JSON object", "", kind))


def report(path: Path, batch: int | None = None, max_seq_len: int | None = None) -> dict:
    """Everything ``inspect`` shows, as JSON-ready data.

    Raises:
        EngineFileError: a missing engine or sidecar; a sidecar that is not UTF-8 JSON, not
            a trt_kv sidecar, or whose ``metadata`` routes, build options or config are not
            JSON objects (each naming the sidecar and the field).
    """
    import hashlib

    from trt_kv import FEATURES
    from trt_kv.engine.file import check_engine_files, read_sidecar
    from trt_kv.engine.sidecar import targets_json

    side = check_engine_files(path)
    meta = read_sidecar(side)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    md = dict(meta.metadata)
    _check_recipe(side, md)
    tensors = [
        {
            "name": t.name,
            "mode": mode,
            "dtype": t.dtype,
            "shape": list(t.shape),
            "profiles": {  # profile name -> [min, opt, max] (engines may hold several)
                p.name: [list(s) for s in p.shapes[t.name]]
                for p in meta.profiles
                if t.name in p.shapes
            },
        }
        for mode, group in (("input", meta.inputs), ("output", meta.outputs))
        for t in group
    ]
    layers, layers_source = engine_layers(path) if digest == meta.sha256 else (None, "")
    return {
        "engine": str(path),
        "bytes": path.stat().st_size,
        "sha256": digest,
        "checksum": "ok" if digest == meta.sha256 else f"MISMATCH (sidecar: {meta.sha256})",
        "built_with": {"module": meta.trt_module, "version": meta.trt_version},
        "compute_capabilities": targets_json(meta.targets),
        "running": {"module": FEATURES.module, "version": FEATURES.version},
        "built_at": md.pop("built_at", None),
        "build_seconds": meta.build_seconds,
        "routes": {"cache_update": meta.cache_update, **md.pop("routes", {})},
        "recipe": md,
        "tensors": tensors,
        "roles": None if meta.roles is None else meta.roles.to_json(),
        "alias_pairs": [a.to_json() for a in meta.aliases],
        "write_indices": meta.write_indices,
        "profiles": [p.name for p in meta.profiles],
        "cache_memory": cache_memory(meta, batch, max_seq_len),
        "layers": layers,
        "layers_source": layers_source,
        "emulated_gpu": _emulated(),
    }


def _role_lines(roles: dict | None) -> list[str]:
    """What a session reads of the engine (its decoder roles), or why it cannot run one."""
    if roles is None:
        return ["roles        none: not a decoder engine (a session cannot run it)"]
    named = ", ".join(f"{role}: {name}" for role, name in roles["inputs"].items())
    lines = [
        f"roles        {named}; logits: {roles['logits']}; {len(roles['caches'])} caches",
        f"decoder      vocab {roles['vocab_size']}, S_max {roles['max_seq_len']}, "
        f"B <= {roles['max_batch']}, S <= {roles['max_step_tokens']} per step"
        + (", logits of every position" if roles["all_logits"] else ""),
    ]
    k = roles.get("device_top_k", 0)  # absent from sidecars written before it existed
    if k:
        what = "next_token [B]" if k == 1 else f"top_ids, top_logits [B, {k}]"
        lines.append(f"sampling     on the device: the {k} best next ids ({what})")
    if roles["long_rope_after"] is not None:  # longrope past its original length
        lines.append(
            "rope         longrope: a sequence whose rope_lengths > "
            f"{roles['long_rope_after']} reads the long table (prefilled again on crossing)"
        )
    return lines


def weights_line(w: dict) -> str:
    """``"keep: 210 Q4_1 -> int4 block 32 + mins; exact: Q4_1; in float16:
    model.embed_tokens.weight and 61 vectors"``: how the engine holds its weights (the
    sidecar's ``weights``)."""
    held = [f"{n} {kind}" for kind, n in w.get("quantized", {}).items()]
    if w.get("exact"):
        held.append(f"exact: {', '.join(w['exact'])}")
    requantized = w.get("requantized", {})
    if requantized.get("count"):
        errors = requantized.get("by_type") or {"": requantized["max_error"]}
        listed = ", ".join(f"{t} {e:.3g}".strip() for t, e in errors.items())
        held.append(f"{requantized['count']} re-quantized (max error {listed})")
    plain = w.get("activation_dtype", {})
    rest = [*plain.get("matrices", []), f"{plain.get('vectors', 0)} vectors"]
    shown = ", ".join(rest[:4]) + (f" and {len(rest) - 4} more" if len(rest) > 4 else "")
    quantized = "; ".join(held) + "; " if held else ""
    return f"{w.get('format')}: {quantized}in {w.get('dtype')}: {shown}"


def _mib(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.2f} MiB)"


def _rewrite_line(rewrite: dict, engine: str) -> str:
    """What the ONNX rewrite did (caches, layers, update op), and where its graph is."""
    from trt_kv.onnx.decoder import REWRITTEN_SUFFIX
    from trt_kv.onnx.rewrite import RewriteReport

    report = RewriteReport.from_json({k: v for k, v in rewrite.items() if k != "sha256"})
    graph = f"{Path(engine).name}{REWRITTEN_SUFFIX}"
    return f"{report.summary()}; the rewritten graph: {graph} (sha256 {rewrite['sha256'][:12]})"


def format_report(r: dict) -> str:
    """The report as text: key lines, then tensor, alias and layer tables."""
    built, running = r["built_with"], r["running"]
    same = built == running
    lines = [
        f"engine       {r['engine']}  ({r['bytes']:,} bytes, checksum {r['checksum']})",
        f"built with   {built['module']} {built['version']}"
        + ("" if same else f"  (running {running['module']} {running['version']}: rebuild)"),
        f"built        {r['built_at'] or 'time not recorded'}, in {r['build_seconds']:.2f} s",
        "GPU targets  "
        + (
            "portable"
            if r["compute_capabilities"] == "portable"
            else " ".join(r["compute_capabilities"])
        ),
        "routes       " + ", ".join(f"{k}: {v}" for k, v in r["routes"].items()),
    ]
    options = r["recipe"].get("build_options")
    if options:
        lines.append("build        " + " ".join(f"{k}={v}" for k, v in options.items()))
    weights = r["recipe"].get("weights")
    if weights:
        lines.append("weights      " + weights_line(weights))
    config = r["recipe"].get("config")
    if config:
        from trt_kv.models.architectures import describe_recipe

        model = r["recipe"].get("model", "?")
        brief = " ".join(f"{k}={v}" for k, v in describe_recipe(model, config))
        lines.append(f"model        {model} {brief}")
    rewrite = r["recipe"].get("onnx_rewrite")
    if rewrite:
        lines.append(f"onnx rewrite {_rewrite_line(rewrite, r['engine'])}")
    lines += _role_lines(r["roles"])
    mem = r["cache_memory"]
    if mem:
        lines.append(
            f"cache memory {mem['caches']} caches: {_mib(mem['bytes_per_slot'])} per slot at "
            f"S_max={mem['engine_max_seq_len']}, {mem['bytes_per_token']:,} bytes per token; "
            f"batch {mem['batch']} at S_max={mem['max_seq_len']}: {_mib(mem['bytes'])}"
        )
    head = ("tensor", "mode", "dtype", "shape")
    for name in r["profiles"]:
        head += (f"{name}: min", "opt", "max")
    body = [
        (
            t["name"],
            t["mode"],
            t["dtype"],
            _shape(t["shape"]),
            *(
                _shape(s) if p in t["profiles"] else ""
                for p in r["profiles"]
                for s in t["profiles"].get(p, ("", "", ""))
            ),
        )
        for t in r["tensors"]
    ]
    lines += ["", common.table(head, body), ""]
    pairs = [(a["input"], a["output"], _shape(a["shape"]), a["dtype"]) for a in r["alias_pairs"]]
    lines.append(common.table(("cache input", "aliased output", "shape", "dtype"), pairs))
    if r["layers"] is None:
        lines.append(f"\nlayers: not shown, {r['layers_source'] or 'checksum mismatch'}")
    else:
        names = [x if isinstance(x, str) else x.get("Name", str(x)) for x in r["layers"]]
        lines.append(f"\nlayers ({len(names)}, from {r['layers_source']}):")
        lines += [f"  {n}" for n in names]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    return common.run_on_device(args, _run)


def _run(args: argparse.Namespace) -> int:
    import json

    r = report(args.engine, args.batch, args.max_seq_len)
    print(json.dumps(r, indent=2) if args.json else format_report(r))
    return 0
