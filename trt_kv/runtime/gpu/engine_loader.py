"""Engine file -> deserialized ICudaEngine, alias pairs checked (GPU only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trt_kv import engine_file
from trt_kv._trt import logger, trt
from trt_kv.builder.contract import DecoderRoles, check_roles
from trt_kv.engine_file import EngineMeta, check_engine_aliases
from trt_kv.errors import EngineFileError, TrtKvError, check_int, mismatch
from trt_kv.runtime.gpu.cuda import require_gpu


def check_decoder_engine(path: str | Path, meta: EngineMeta) -> DecoderRoles:
    """The decoder roles of an engine's sidecar (:mod:`trt_kv.builder.contract`: what a
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


def load_cuda_engine(path: str | Path) -> tuple[object, bytes, EngineMeta]:
    """Read, verify and deserialize an engine; check ``get_aliased_input_tensor`` against
    the sidecar. Returns ``(engine, engine bytes, sidecar)``."""
    require_gpu(f"loading {path}")
    data, meta = engine_file.load_engine_file(path)  # by attribute: the emulator records it
    if meta.cache_update == "plugin":
        from trt_kv.plugin import register_creator

        register_creator()
    engine = trt.Runtime(logger()).deserialize_cuda_engine(data)
    if engine is None:
        raise EngineFileError(
            mismatch(
                str(path),
                "an engine this GPU can deserialize",
                "ICudaEngine",
                "None (see the TensorRT log)",
            )
        )
    check_engine_aliases(engine, meta)
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
