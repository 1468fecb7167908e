"""Which backend runs a model for ``generate``, ``chat``, ``demo`` and ``bench``, and what
is judged of ``--engine`` before any model loads (its sidecar, its sizes, the model it was
built from)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trt_kv.cli import common, options
from trt_kv.cli.checks import check_backend_options, check_model
from trt_kv.errors import ArgumentError, mismatch

if TYPE_CHECKING:
    from trt_kv.contract import DecoderRoles
    from trt_kv.engine.file import EngineMeta

GPU_BACKENDS = options.GPU_BACKENDS


def pick_backend(asked: str, targets: tuple[tuple[int, int], ...] = ()) -> tuple[str, str]:
    """``(backend, note)``: ``asked`` as given, or for ``"auto"`` ``tensorrt`` where the
    installed TensorRT, and an engine built for ``targets`` (:func:`engine_targets`), run
    on the GPU found (a real one, or the emulated one with ``--emulate-gpu``), else
    ``interpreter`` with the note `` (auto's pick: no GPU)`` for error messages. A GPU whose
    compute capability the module (or that engine) does not run is said in one line on
    stderr, with what would run it (``tensorrt``/``polygraphy`` asked there are refused by
    :func:`trt_kv.runtime.gpu.cuda.require_tensorrt_gpu`, for the same reason).
    """
    from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason, tensorrt_refusal

    if asked != "auto":
        return asked, ""
    if gpu_unavailable_reason() is not None:
        return "interpreter", " (auto's pick: no GPU)"
    reason = tensorrt_refusal(targets)
    if reason is None:
        return "tensorrt", ""
    print(f"trt-kv: running on the CPU interpreter: {reason}", file=sys.stderr)
    return "interpreter", " (auto's pick: the GPU's compute capability)"


@contextmanager
def opened_backend(
    args: argparse.Namespace, name: str, config: object, weights: object, batch: int
) -> Iterator[object]:
    """:func:`make_backend`, closed when the block ends, however it ends (GPU backends: runner,
    graphs, stream; CPU backends have nothing to close)."""
    backend = make_backend(args, name, config, weights, batch)
    try:
        yield backend
    finally:
        getattr(backend, "close", lambda: None)()


def make_backend(
    args: argparse.Namespace, name: str, config: object, weights: object, batch: int
) -> object:
    """The backend ``args.backend`` for this model (building what it needs), with room for
    ``max(batch, --max-batch)`` sequences on every backend."""
    from trt_kv.engine.digest import weights_sha256
    from trt_kv.models.architectures import architecture_of
    from trt_kv.runtime.gpu.cuda import require_gpu

    batch = max(batch, args.max_batch)
    step_tokens = common.max_step_tokens(args)
    if args.backend in ("reference", "interpreter"):
        arch = architecture_of(config)
        arch.check_max_seq_len(config, args.max_seq_len, "--max-seq-len")
    if args.backend == "reference":
        return arch.reference_backend(
            config,
            weights,
            capacity=batch,
            max_seq_len=args.max_seq_len,
            max_step_tokens=step_tokens,
        )
    if args.backend == "interpreter":
        from trt_kv.interpreter import products
        from trt_kv.runtime.interpreter_backend import InterpreterBackend

        if getattr(args, "threads", None):  # else build_defaults.default_threads()
            products.set_threads(args.threads)

        net = arch.build_network(
            config,
            weights,
            max_seq_len=args.max_seq_len,
            max_batch=batch,
            max_step_tokens=step_tokens,
            dtype=args.dtype or common.DEFAULT_DTYPE,
            routes=args.routes,
            weight_format=args.weight_format,
            device_top_k=common.build_options(args, batch).device_top_k,
        )
        return InterpreterBackend(net)
    require_gpu(f"--backend {args.backend}")
    path = args.engine
    if path is not None:
        check_engine_model(path, name, config, weights_sha256(args.model, weights))
    else:
        built = common.model_engine(args, name, config, weights, batch)
        print(f"engine {built.path}: {common.engine_status(built)}", file=sys.stderr)
        path = built.path
    if args.backend == "polygraphy":
        from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend

        return PolygraphyBackend(path)
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    return TrtBackend(path, cuda_graph=args.cuda_graph, runtime_cache=args.runtime_cache)


def engine_meta(path: Path) -> EngineMeta:
    """``--engine``'s sidecar, once it is a decoder engine trt_kv built: judged from the
    files alone, before any model loads.

    Raises:
        EngineFileError: naming ``--engine``: the engine or its sidecar missing, a malformed
            sidecar, an engine that is no decoder.
    """
    from trt_kv.engine.file import check_engine_files, read_sidecar
    from trt_kv.errors import EngineFileError
    from trt_kv.runtime.gpu.engine_loader import check_decoder_engine

    try:
        meta = read_sidecar(check_engine_files(path))
        check_decoder_engine(path, meta)
    except EngineFileError as e:
        raise EngineFileError(f"--engine: {e}") from None
    return meta


def engine_sidecar(path: Path) -> DecoderRoles:
    """The decoder roles of ``--engine``'s sidecar (:func:`engine_meta`, whose errors it
    raises)."""
    from trt_kv.runtime.gpu.engine_loader import check_decoder_engine

    return check_decoder_engine(path, engine_meta(path))


def engine_targets(args: argparse.Namespace) -> tuple[tuple[int, int], ...]:
    """The GPU targets of the engine a GPU backend would run (``()``: portable): those
    ``--engine``'s sidecar records, else those ``--compute-capability`` builds for.

    Raises:
        EngineFileError: as :func:`engine_meta`. ArgumentError: a ``--compute-capability``
            the installed TensorRT cannot build for.
    """
    from trt_kv.engine.store import BuildOptions

    if getattr(args, "engine", None) is not None:
        return engine_meta(args.engine).targets
    given = getattr(args, "compute_capability", None)
    options = BuildOptions() if given is None else BuildOptions(compute_capability=given)
    return options.targets("--compute-capability")


def check_engine_model(path: Path, name: str, config: object, weights_sha256: str) -> None:
    """ArgumentError when ``--engine`` was built from another model config than ``--model``
    (its ids would be decoded with the wrong tokenizer and checked against the wrong
    vocabulary) or from weights other than ``weights_sha256`` (``--model``'s: it would run
    the engine's); EngineFileError for a missing or malformed sidecar or a non-decoder
    engine."""
    from trt_kv.engine.file import check_engine_files, read_sidecar
    from trt_kv.engine.store import weights_of
    from trt_kv.runtime.gpu.engine_loader import check_decoder_engine

    meta = read_sidecar(check_engine_files(path))
    check_decoder_engine(path, meta)
    built, wanted = meta.metadata.get("config") or {}, config.to_json()
    if built != wanted:
        differ = sorted(k for k in {*built, *wanted} if built.get(k) != wanted.get(k))
        raise ArgumentError(
            mismatch(
                "--engine",
                f"an engine of --model {name} (same config)",
                "",
                f"{path}, whose config differs in {differ}",
            )
        )
    built_from, ours = weights_of(meta.metadata), weights_sha256
    if built_from != ours:
        raise ArgumentError(
            mismatch(
                "--engine",
                f"an engine of --model {name}'s weights (sha256 {ours[:8]}...)",
                "",
                f"{path}, built from weights sha256 {(built_from or 'unrecorded')[:8]}...",
            )
        )


def choose_backend(args: argparse.Namespace, builds_engine: bool = False) -> str:
    """Set ``args.backend`` to the backend that runs (auto's pick made with the targets of
    the engine it would run, :func:`engine_targets`), refuse the options it would ignore
    (:func:`check_backend_options`, given ``builds_engine``) and, for a GPU backend, a GPU
    the installed TensorRT or that engine does not run; returns auto's note ("" if none).
    Raises ArgumentError, GpuUnavailableError, EngineFileError (``--engine``)."""
    from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason, require_tensorrt_gpu

    on_gpu = args.backend in GPU_BACKENDS or (
        args.backend == "auto" and gpu_unavailable_reason() is None
    )
    targets = engine_targets(args) if on_gpu else ()  # what the GPU would be asked to run
    args.backend, note = pick_backend(args.backend, targets)
    check_backend_options(args, args.backend, note, builds_engine)
    if args.backend in GPU_BACKENDS:  # no GPU, or one TensorRT does not run: refused now
        require_tensorrt_gpu(f"--backend {args.backend}", targets)
    return note


def check_before_loading(args: argparse.Namespace) -> None:
    """Every check of ``generate`` / ``chat`` that needs no model: backend and the options
    it ignores, a GPU the installed TensorRT runs for a GPU backend, ``--model``/``--out``/
    sizes, sampling options, ``--engine``'s files. Raises ArgumentError (or the error of the
    check that failed)."""
    choose_backend(args)
    check_model(args)
    options.check_sampling_options(args)
    if args.engine is not None:
        take_engine_sizes(args, engine_sidecar(args.engine))


def take_engine_sizes(args: argparse.Namespace, roles: DecoderRoles) -> None:
    """With ``--engine``, S_max, the step width and the device candidates are the engine's:
    ``--max-seq-len`` / ``--max-step-tokens`` / ``--device-top-k`` take them (prompt and
    new-token checks then judge against what runs). Raises ArgumentError for an option given
    with another value."""
    from trt_kv import build_defaults

    for option, attr, default in (
        ("--max-seq-len", "max_seq_len", build_defaults.MAX_SEQ_LEN),
        ("--max-step-tokens", "max_step_tokens", None),
        ("--device-top-k", "device_top_k", None),
    ):
        given, built = getattr(args, attr, None), getattr(roles, attr)
        if given not in (default, built):
            raise ArgumentError(
                mismatch(option, f"the --engine's {built} (or leave it out)", "", given)
            )
        setattr(args, attr, built)
