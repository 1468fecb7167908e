"""Engine file -> deserialized ICudaEngine, checked against its sidecar (GPU only).

Before deserializing, the GPU's compute capability is compared with what the installed
TensorRT module and the engine's targets run (:mod:`trt_kv.gpu_targets`), and the module's
own ``Runtime.get_engine_validity`` is asked where it has one; after, the engine's I/O is
compared with the sidecar (:func:`trt_kv.engine.file.check_engine_io`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trt_kv._trt import logger, trt
from trt_kv.contract import DecoderRoles, check_roles
from trt_kv.engine.file import EngineMeta, check_engine_io, load_engine_file
from trt_kv.errors import EngineFileError, TrtKvError, check_int, mismatch
from trt_kv.runtime.gpu.cuda import require_gpu, require_tensorrt_gpu


def check_decoder_engine(path: str | Path, meta: EngineMeta) -> DecoderRoles:
    """The decoder roles of an engine's sidecar (:mod:`trt_kv.contract`: what a
    session backend reads), checked against the sidecar's inputs and outputs.

    Raises:
        EngineFileError: naming the file: no roles (the KV-cache doc example, an engine
            written by other code or by a trt_kv before the contract: rebuild it), or roles
            that do not fit the engine's I/O (the contract's error is the cause).
    """
    if meta.roles is None:
        raise EngineFileError(
            mismatch(str(path), "a decoder engine (sidecar with", "roles)", "no roles")
        )
    specs = lambda ts: {t.name: (t.shape, t.dtype) for t in ts}  # noqa: E731
    try:
        check_roles(meta.roles, specs(meta.inputs), specs(meta.outputs))
    except TrtKvError as err:
        raise EngineFileError(f"{path}: decoder roles: {err}") from err
    return meta.roles


def _validity_problem(runtime: object, data: bytes) -> str | None:
    """What ``Runtime.get_engine_validity`` (TensorRT-RTX) finds wrong with ``data``, as
    the names of its diagnostic flags; None when VALID or SUBOPTIMAL, or without the call."""
    ask = getattr(runtime, "get_engine_validity", None)
    if ask is None:
        return None
    validity, diagnostics = ask(data)
    if validity != trt.EngineValidity.INVALID:
        return None
    flags = trt.EngineInvalidityDiagnostics.__members__.items()
    named = [name for name, flag in flags if int(diagnostics) & int(flag)]
    return f"INVALID ({', '.join(named) or 'no diagnostic'})"


def load_cuda_engine(path: str | Path) -> tuple[object, bytes, EngineMeta]:
    """Read and verify an engine and its sidecar, check the GPU can run it, deserialize it
    and check its I/O against the sidecar. Returns ``(engine, engine bytes, sidecar)``.

    Raises:
        GpuUnavailableError: no GPU; a compute capability the installed TensorRT or the
            engine's targets do not run (before deserializing).
        EngineFileError: as :func:`trt_kv.engine.file.load_engine_file`; an engine
            ``get_engine_validity`` calls INVALID, or that does not deserialize; an engine
            whose I/O differs from its sidecar.
    """
    require_gpu(f"loading {path}")
    data, meta = load_engine_file(path)
    require_tensorrt_gpu(f"loading {path}", meta.targets, engine=Path(path).name)
    if meta.cache_update == "plugin":
        from trt_kv.plugin import register_creator

        register_creator()
    runtime = trt.Runtime(logger())
    problem = _validity_problem(runtime, data)
    if problem is not None:
        raise EngineFileError(
            mismatch(str(path), "an engine valid on this GPU (get_engine_validity)", "", problem)
        )
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise EngineFileError(
            mismatch(
                str(path),
                "an engine this GPU can deserialize",
                "ICudaEngine",
                "None (see the TensorRT log)",
            )
        )
    check_engine_io(engine, meta)
    return engine, data, meta


@dataclass(frozen=True)
class DecoderEngine:
    """A decoder engine loaded for a GPU backend, with its sidecar and decoder roles."""

    engine: object  # ICudaEngine
    meta: EngineMeta
    roles: DecoderRoles
    capacity: int  # sequences the backend's caches hold


def open_decoder_engine(path: str | Path, capacity: int | None) -> DecoderEngine:
    """Check ``capacity`` (None: the engine's ``max_batch``), then load and check the engine
    (:func:`load_cuda_engine`, :func:`check_decoder_engine`).

    Raises:
        ArgumentError: ``capacity`` is not an int >= 1 (checked before the file is read).
        EngineFileError, GpuUnavailableError: as :func:`load_cuda_engine`.
    """
    if capacity is not None:  # 0 is not "the engine's max_batch"
        check_int("capacity", capacity, 1)
    engine, _, meta = load_cuda_engine(path)
    roles = check_decoder_engine(path, meta)
    return DecoderEngine(engine, meta, roles, capacity or roles.max_batch)
