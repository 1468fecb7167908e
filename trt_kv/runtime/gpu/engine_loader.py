"""Engine file -> deserialized ICudaEngine, alias pairs checked (GPU only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trt_kv import engine_file
from trt_kv._trt import logger, trt
from trt_kv.engine_file import EngineMeta, check_engine_aliases
from trt_kv.errors import EngineFileError, check_int, mismatch
from trt_kv.runtime.backend import long_rope_after_of
from trt_kv.runtime.gpu.cuda import require_gpu

DECODER_KEYS = ("config", "max_seq_len", "max_batch", "max_step_tokens")


def check_decoder_engine(path: str | Path, meta: EngineMeta) -> dict:
    """The sidecar metadata of a trt_kv decoder engine (what a session backend reads: the
    model config, ``max_seq_len``, ``max_batch``, ``max_step_tokens``).

    Raises:
        EngineFileError: naming the file and the missing keys (the KV-cache doc example, an
            engine written by other code).
    """
    md = meta.metadata
    missing = [k for k in DECODER_KEYS if k not in md]
    if missing or not isinstance(md["config"], dict):
        raise EngineFileError(
            mismatch(
                str(path),
                "a trt_kv decoder engine (sidecar metadata with",
                f"{', '.join(DECODER_KEYS)})",
                f"missing {missing}" if missing else "a config that is not an object",
            )
        )
    return md


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
    """A trt_kv decoder engine loaded for a GPU backend, and what every backend reads of its
    sidecar."""

    engine: object  # ICudaEngine
    meta: EngineMeta
    capacity: int  # sequences the backend's caches hold
    max_step_tokens: int
    vocab_size: int
    long_rope_after: int | None
    all_logits: bool


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
    md = check_decoder_engine(path, meta)
    return DecoderEngine(
        engine,
        meta,
        capacity or md["max_batch"],
        md["max_step_tokens"],
        md["config"]["vocab_size"],
        long_rope_after_of(md),
        bool(md.get("all_logits")),
    )
